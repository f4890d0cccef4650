"""No pipeline in the repo's scripts ends in a reader that may exit before its writer is done.

Under `set -o pipefail` such a pipeline fails whenever the writer is still writing when the reader
exits: the writer's next write gets SIGPIPE (exit 141) and pipefail reports it. Whether it does
depends on how the writer buffers and on scheduling, so it passes on one machine and fails one run
in twenty on another (issue 45: `terraform version -json | grep -q` erred 39 tests of a fresh
machine's first `make test`). The forms that avoid it: capture the output, then match it
(`out=$(cmd)`; `grep -q … <<<"$out"`), or let the reader consume everything (`sed -n 1p`, `sort -C`,
sed's own `q` on a file).

Checked everywhere a shell line lives: scripts/**/*.sh, mk/*.mk, the Makefile and .ci/run, pipefail or
not (a recipe or script may gain it later; the safe forms cost nothing).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(
    [*(REPO / "scripts").glob("**/*.sh"), *(REPO / "mk").glob("*.mk"), REPO / "Makefile", REPO / ".ci" / "run"]
)


_CONTROL = {";", ";;", "&&", "||", "&", "(", ")", "{", "}", "then", "do", "else", "elif", "fi", "done"}


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote (a here-doc's body): judge it by its words
        return line.split()


def _early_exit(words: list[str]) -> str | None:
    """Why a pipeline stage of these words may stop reading before its input ends, or None."""
    while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return None
    cmd, args = Path(words[0]).name, words[1:]
    if cmd in ("head", "read"):
        return cmd
    if cmd in ("grep", "egrep", "fgrep"):
        for a in args:
            if a in ("--quiet", "--silent") or a.startswith("--max-count"):
                return f"grep {a}"
            if re.fullmatch(r"-[A-Za-z]*[qm][A-Za-z0-9]*", a):
                return f"grep {a}"
    if cmd == "sed" and any(re.search(r"(^|[;{}\s])q\d*($|[;}\s])", a) for a in args if not a.startswith("-")):
        return "sed q"
    if cmd == "awk" and any(re.search(r"\bexit\b", a) for a in args):
        return "awk exit"
    return None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined and whole-line comments dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw
        line = re.sub(r"\s#\s.*$", "", line)  # a trailing comment (`# ` after a blank)
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    return out


def _substitutions(line: str) -> tuple[str, list[str]]:
    """The line with each outermost ``$(...)`` replaced by a word, and the commands inside them."""
    outer, inner, i = "", [], 0
    while (j := line.find("$(", i)) >= 0:
        depth, k = 1, j + 2
        while k < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[k], 0)
            k += 1
        outer += line[i:j] + "SUBST"
        inner.append(line[j + 2 : k - 1])
        i = k
    return outer + line[i:], inner


def _pipeline_readers(line: str) -> list[str]:
    outer, inner = _substitutions(line)
    found = [why for cmd in inner for why in _pipeline_readers(cmd)]
    stage: list[str] | None = None  # the words of a stage that reads a pipe
    for tok in [*_tokens(outer), ";"]:
        if tok in ("|", "|&") or tok in _CONTROL:
            if stage is not None and (why := _early_exit(stage)):
                found.append(why)
            stage = [] if tok in ("|", "|&") else None
        elif stage is not None:
            stage.append(tok)
    return found


def early_readers(text: str) -> list[tuple[int, str]]:
    """(line, why) for each pipeline stage after a `|` that may exit before its input ends."""
    return [(n, why) for n, line in _logical_lines(text) for why in _pipeline_readers(line)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_pipeline_ends_in_an_early_reader(path):
    found = early_readers(path.read_text())
    assert not found, f"{path.relative_to(REPO)}: a reader that may exit early (SIGPIPE under pipefail): {found}"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        # The forms issue 45 found, as they were.
        ('  "$tmp/terraform" version -json | grep -q "\\"terraform_version\\": \\"$VERSION\\"" ||', "grep -q"),
        ('  "$GO" version -m "$dest/bin/kubeconform" | grep -Eq "^\\s+mod\\s" ||', "grep -Eq"),
        ('at_least() { [[ "$(printf \'%s\\n%s\\n\' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }', "head"),
        ('mod_version() { sed -n "s|x|y|p" "$MOD/go.mod" | head -n1; }', "head"),
        ("cmd | grep -m1 foo", "grep -m1"),
        ("cmd | grep --quiet foo", "grep --quiet"),
        ("cmd | sed -n '1{p;q}'", "sed q"),
        ("cmd | awk '{print; exit}'", "awk exit"),
        ("cmd | \\\n  head -c 10", "head"),
    ],
)
def test_the_check_finds_each_form(line, why):
    assert [w for _, w in early_readers(line)] == [why]


@pytest.mark.parametrize(
    "line",
    [
        'grep -q "x" <<<"$out"',
        "cat a b | sha256sum | cut -c1-16",
        'printf \'%s\\n%s\\n\' "$2" "$1" | sort -V -C',
        "cmd | sed -n 1p | tr -s ' '",
        'sed -n "s|a|b|;T;p;q" go.mod',
        "a || b",
        "# cmd | head -n1",
        "go mod download -json x | sed -n 's/Dir/\\1/p'",
    ],
)
def test_the_check_passes_the_safe_forms(line):
    assert early_readers(line) == []
