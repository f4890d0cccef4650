"""The tokenizer `llmtrain prepare` encodes with: a `tokenizers` JSON file (`--tokenizer
tokenizer.json`, e.g. a Llama 3 tokenizer), or the byte-level fallback that needs no download:
token = UTF-8 byte (vocabulary 256, matching the `tiny` preset), with byte 0 (NUL, refused in text)
as the end-of-document token.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

EOS_CANDIDATES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")


@dataclass
class Tokenizer:
    name: str
    vocab_size: int
    eos_id: int
    json: str | None = None  # the tokenizers JSON (None: byte-level), what the workers load
    _tok: Any = None  # a tokenizers.Tokenizer, or None for bytes

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            return list(text.encode("utf-8"))
        return self._tok.encode(text, add_special_tokens=False).ids

    @classmethod
    def load(cls, path: str | None, eos_id: int | None = None) -> Tokenizer:
        if not path:
            return cls("byte", 256, 0 if eos_id is None else eos_id)._checked()
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"--tokenizer {path}: no such file (expected a `tokenizers` JSON file such as a model's tokenizer.json)"
            )
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return cls.from_json(text, os.path.basename(path), eos_id, f"--tokenizer {path}")

    @classmethod
    def from_json(cls, text: str, name: str, eos_id: int | None, what: str) -> Tokenizer:
        """A `tokenizers` JSON document, stored under `name` beside the shards."""
        from .loader import check_name

        check_name(name, f"{what}: the file name stored in index.json")
        hf = hf_tokenizer(text, what)
        if eos_id is None:
            eos_id = next((i for t in EOS_CANDIDATES if (i := hf.token_to_id(t)) is not None), None)
        if eos_id is None:
            raise ValueError(f"{what}: no end-of-document token among {EOS_CANDIDATES}; pass --eos-id")
        return cls(name, hf.get_vocab_size(with_added_tokens=True), eos_id, text, hf)._checked()

    def _checked(self) -> Tokenizer:
        if not 0 <= self.eos_id < self.vocab_size:  # would index past the embedding table in training
            raise ValueError(
                f"--eos-id {self.eos_id} is outside the vocabulary of {self.name} (ids 0..{self.vocab_size - 1})"
            )
        return self

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.vocab_size <= 1 << 16 else np.dtype("<u4")


def hf_tokenizer(text: str, what: str):
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_str(text)
    except Exception as err:  # noqa: BLE001 - the Rust side raises a bare Exception for any parse error
        raise ValueError(f"{what}: not a `tokenizers` JSON file ({err})") from None
    try:
        dropout = (json.loads(text).get("model") or {}).get("dropout")
    except (ValueError, AttributeError):
        dropout = None
    if dropout:  # BPE dropout draws a random segmentation per call: the output would differ per run
        raise ValueError(
            f"{what}: BPE dropout {dropout} makes tokenization random; save the tokenizer "
            "with dropout null for preparing data"
        )
    # A document's ids must not depend on the batch it is encoded in.
    hf.no_padding()
    hf.no_truncation()
    return hf
