"""The docs site builds with `mkdocs build --strict`: a broken link or anchor, a page missing from the
nav or a nav entry without its page fails `make test`. No network: the build uses only the built-in
search plugin (mkdocs.yml)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_mkdocs_build_strict(site):
    assert (site / "index.html").is_file()
    assert (site / "reference" / "api" / "index.html").is_file()


def test_diagrams_render_without_internet_access(site):
    """Every page with a mermaid diagram loads mermaid from the site itself, in a plain <script>
    that runs before mkdocs-material's loader looks for it (which would otherwise fetch it from a
    CDN: a reader without internet access saw the diagrams' source)."""
    pages = [p for p in site.rglob("*.html") if 'class="mermaid"' in p.read_text()]
    assert {p.relative_to(site).as_posix() for p in pages} >= {
        "index.html",
        "concepts/lifecycle/index.html",
        "reference/state-machine/index.html",
    }
    for page in pages:
        scripts = re.findall(r"<script\b[^>]*\bsrc=\"([^\"]+)\"[^>]*>", page.read_text())
        assert not [s for s in scripts if "://" in s or s.startswith("//")], (page, scripts)
        local = [s for s in scripts if s.endswith("/mermaid.tiny.js") or s == "assets/javascripts/mermaid.tiny.js"]
        assert len(local) == 1, (page, scripts)
        assert (page.parent / local[0]).resolve().is_file()
    js = (site / "assets" / "javascripts" / "mermaid.tiny.js").read_text()
    assert 'globalThis["mermaid"]' in js
    assert "MIT" in (site / "assets" / "javascripts" / "mermaid.LICENSE").read_text()


def test_docs_do_not_point_outside_the_repository():
    """The product's docs never name the design notes kept outside the repository."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [str(p.relative_to(ROOT)) for p in pages if "design.md" in p.read_text()]
    assert not offenders, offenders


def test_readme_is_a_short_front_door_whose_links_resolve():
    """The README stays under 200 lines, and every relative link in it (GitHub renders them; mkdocs
    does not build the README) names a file of the repository and, with #anchor, a heading in it."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    # At most 8 headline figures, each linking to the page that has its method and command.
    figures = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in figures.splitlines() if r.startswith("| ") and r.strip("| ")]
    assert 1 <= len(rows) <= 8, rows
    assert all("](docs/performance/" in r or "](docs/trainer/" in r for r in rows), rows
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert links
    for target, anchor in links:
        if re.match(r"[a-z]+://", target):
            continue
        path = ROOT / target
        assert path.is_file(), target
        if anchor:
            slugs = {
                re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)
            }
            assert anchor in slugs, (target, anchor)
