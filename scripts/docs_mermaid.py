#!/usr/bin/env python3
"""mermaid for the docs site, from the pinned npm tarball (tools/mermaid/pins.env), served by the
site itself instead of mkdocs-material's CDN default.

Run as a script (``make venv`` does): download the tarball once into
``${LLMTRAIN_CACHE:-~/.cache/llmtrain}/mermaid/<version>/``, check its sha256 and keep the
browser build and its LICENSE; prints the script's path. ``NPM_CONFIG_REGISTRY`` is honoured.

Loaded by mkdocs as a hook (mkdocs.yml ``hooks:``): adds the cached script to every page, before
mkdocs-material's own loader runs, which then uses it. No network at build time: a missing cache
fails the build with the command that fills it.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tools" / "mermaid" / "pins.env"
SITE_PATH = "assets/javascripts/mermaid.tiny.js"  # where the site serves it
_MEMBERS = {"package/dist/mermaid.tiny.js": "mermaid.tiny.js", "package/LICENSE": "LICENSE"}


def pins() -> dict[str, str]:
    out = {}
    for line in PINS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    cache = Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")
    return cache / "mermaid" / pins()["MERMAID_VERSION"]


def cached_script() -> Path:
    return cache_dir() / "mermaid.tiny.js"


def fetch() -> Path:
    """The cached script, downloading and checking the pinned tarball when it is not there yet."""
    p, dest = pins(), cache_dir()
    if (dest / "mermaid.tiny.js").is_file():
        return dest / "mermaid.tiny.js"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clones running `make venv` at once
        if (dest / "mermaid.tiny.js").is_file():
            return dest / "mermaid.tiny.js"
        registry = (os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org").rstrip("/")
        package, version = p["MERMAID_PACKAGE"], p["MERMAID_VERSION"]
        url = f"{registry}/{package}/-/{package.rsplit('/', 1)[-1]}-{version}.tgz"
        print(f"docs_mermaid: download {url}", file=sys.stderr)
        with urllib.request.urlopen(url, timeout=300) as r:
            data = r.read(64 << 20)
        got = hashlib.sha256(data).hexdigest()
        if got != p["MERMAID_TARBALL_SHA256"]:
            sys.exit(f"docs_mermaid: sha256 mismatch for {url}: got {got}, pinned {p['MERMAID_TARBALL_SHA256']}")
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.mkdir(exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member, name in _MEMBERS.items():
                src = tar.extractfile(member)
                if src is None:
                    sys.exit(f"docs_mermaid: {url} has no {member}")
                (tmp / name).write_bytes(src.read())
        tmp.replace(dest)
    return dest / "mermaid.tiny.js"


# ----- mkdocs hooks --------------------------------------------------------------------------
def on_config(config):
    config.extra_javascript.append(SITE_PATH)
    return config


def on_files(files, config):
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    script = cached_script()
    if not script.is_file():
        raise PluginError(f"mermaid is not in {script.parent}: run `make venv` (scripts/docs_mermaid.py fetches it)")
    files.append(File.generated(config, SITE_PATH, abs_src_path=str(script)))
    license_path = str(script.parent / "LICENSE")
    files.append(File.generated(config, "assets/javascripts/mermaid.LICENSE", abs_src_path=license_path))
    return files


if __name__ == "__main__":
    print(fetch())
