"""The docs' mermaid comes from the pinned tarball only (scripts/docs_mermaid.py): a download that
is not the pinned one is refused and nothing is cached, and a build without the cached copy fails
with the command that fetches it (it never falls back to a CDN)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "tools" / "mermaid" / "pins.env"


def _tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {"package/dist/mermaid.tiny.js": b"alert(1)", "package/LICENSE": b"MIT"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused(tmp_path):
    body, asked = _tarball(), []

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **os.environ,
            "LLMTRAIN_CACHE": str(tmp_path),
            "NPM_CONFIG_REGISTRY": f"http://127.0.0.1:{server.server_address[1]}/",
        }
        r = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "docs_mermaid.py")], env=env, capture_output=True, text=True
        )
    finally:
        server.shutdown()
    assert r.returncode != 0 and "sha256 mismatch" in r.stderr, r.stderr
    version = next(ln.split("=", 1)[1] for ln in PINS.read_text().splitlines() if ln.startswith("MERMAID_VERSION="))
    assert asked == [f"/@mermaid-js/tiny/-/tiny-{version}.tgz"], asked
    assert not list((tmp_path / "mermaid").glob("*/mermaid.tiny.js"))


def test_the_site_does_not_build_without_the_cached_copy(tmp_path):
    env = {**os.environ, "LLMTRAIN_CACHE": str(tmp_path / "empty")}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert "run `make venv`" in r.stdout + r.stderr, r.stdout + r.stderr
