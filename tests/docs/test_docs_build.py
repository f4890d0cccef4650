"""The docs site builds with `mkdocs build --strict`: a broken link or anchor, a page missing from the
nav or a nav entry without its page fails `make test`. No network: the build uses only the built-in
search plugin (mkdocs.yml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()


def test_docs_do_not_point_outside_the_repository():
    """The product's docs never name the design notes kept outside the repository."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [str(p.relative_to(ROOT)) for p in pages if "design.md" in p.read_text()]
    assert not offenders, offenders
