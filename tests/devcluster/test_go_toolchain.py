"""scripts/go-toolchain.sh: a fresh machine needs no Go preinstalled (issue 10, defect 11).

The script's decisions are tested cheaply: fake `go` binaries stand in for an old / new-enough
Go, and a loopback HTTP server stands in for the Go module proxy, serving a small zip laid out
like the real golang.org/toolchain module. The pinned sha256 of the real zip is checked against
the pins file's own format in test_real_pins_*.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import platform
import re
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "go-toolchain.sh"


def _pins(path: Path = REPO / "tools" / "go" / "pins.env") -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def _required_go() -> tuple[int, ...]:
    """The newest `go` directive of tools/*/go.mod, read independently of the script."""
    versions = []
    for gomod in (REPO / "tools").glob("*/go.mod"):
        m = re.search(r"^go (\d+(?:\.\d+)*)\s*$", gomod.read_text(), re.M)
        if m:
            versions.append(tuple(int(x) for x in m.group(1).split(".")))
    return max(versions)


PINNED = _pins()["GO_TOOLCHAIN_VERSION"]  # e.g. go1.26.11
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "amd64")


def _fake_go(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'go version go{version} linux/{ARCH}'\n")
    path.chmod(0o755)
    return path


def _toolchain_zip(version: str) -> bytes:
    """A zip laid out like golang.org/toolchain@v0.0.1-<version>.linux-<arch>.zip."""
    prefix = f"golang.org/toolchain@v0.0.1-{version}.linux-{ARCH}/"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo(prefix + "bin/go")
        info.external_attr = 0o755 << 16
        z.writestr(info, f"#!/bin/sh\necho 'go version {version} linux/{ARCH}'\n")
        z.writestr(prefix + "VERSION", version + "\n")
    return buf.getvalue()


class _Proxy:
    """A loopback stand-in for the Go module proxy, recording the paths it was asked for."""

    def __init__(self, files: dict[str, bytes]):
        self.requests: list[str] = []
        files_ = files
        requests = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                requests.append(self.path)
                body = files_.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    data = _toolchain_zip(PINNED)
    path = f"/golang.org/toolchain/@v/v0.0.1-{PINNED}.linux-{ARCH}.zip"
    p = _Proxy({path: data})
    p.zip_path, p.sha256 = path, hashlib.sha256(data).hexdigest()
    yield p
    p.close()


def _run(tmp_path: Path, *, go: str | None, proxy_url: str, sha256: str, path_env: str = "/usr/bin:/bin"):
    pins = tmp_path / "pins.env"
    pins.write_text(
        f"GO_TOOLCHAIN_VERSION={PINNED}\n"
        f"GO_TOOLCHAIN_SHA256_linux_amd64={sha256}\nGO_TOOLCHAIN_SHA256_linux_arm64={sha256}\n"
    )
    env = {
        "PATH": path_env,
        "HOME": str(tmp_path / "home"),
        "LLMTRAIN_CACHE": str(tmp_path / "cache"),
        "LLMTRAIN_GO_PINS": str(pins),
        "GOPROXY": f"{proxy_url},direct",
    }
    if go is not None:
        env["GO"] = go
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def _version_str(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def test_a_new_enough_go_is_used_as_is(tmp_path, proxy):
    need = _required_go()
    go = _fake_go(tmp_path / "new" / "go", _version_str(need))  # exactly the minimum
    r = _run(tmp_path, go=str(go), proxy_url=proxy.url, sha256=proxy.sha256)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(go)
    assert proxy.requests == []


@pytest.mark.parametrize("go", ["old", "missing"])
def test_an_old_or_missing_go_bootstraps_the_pinned_toolchain_once(tmp_path, proxy, go):
    need = _required_go()
    older = (*need[:-1], need[-1] - 1) if need[-1] > 0 else (need[0], need[1] - 1, 99)
    go_path = str(_fake_go(tmp_path / "old" / "go", _version_str(older))) if go == "old" \
        else str(tmp_path / "nowhere" / "go")
    r = _run(tmp_path, go=go_path, proxy_url=proxy.url, sha256=proxy.sha256)
    assert r.returncode == 0, r.stderr
    want = tmp_path / "cache" / "go" / f"{PINNED}.linux-{ARCH}" / "bin" / "go"
    assert r.stdout.strip() == str(want)
    assert os.access(want, os.X_OK)
    assert subprocess.run([want, "version"], capture_output=True, text=True).stdout.startswith(
        f"go version {PINNED} ")
    assert proxy.requests == [proxy.zip_path]
    # Second run: served from the cache, no download.
    r2 = _run(tmp_path, go=go_path, proxy_url=proxy.url, sha256=proxy.sha256)
    assert r2.returncode == 0 and r2.stdout.strip() == str(want), r2.stderr
    assert proxy.requests == [proxy.zip_path]


def test_a_checksum_mismatch_refuses_to_unpack(tmp_path, proxy):
    r = _run(tmp_path, go=str(tmp_path / "nowhere" / "go"), proxy_url=proxy.url, sha256="0" * 64)
    assert r.returncode != 0
    assert "sha256 mismatch" in r.stderr and proxy.sha256 in r.stderr
    assert not (tmp_path / "cache" / "go" / f"{PINNED}.linux-{ARCH}").exists()


def test_real_pins_cover_what_the_tools_modules_need():
    pins = _pins()
    v = tuple(int(x) for x in pins["GO_TOOLCHAIN_VERSION"].removeprefix("go").split("."))
    assert v >= _required_go()
    for arch in ("amd64", "arm64"):
        assert re.fullmatch(r"[0-9a-f]{64}", pins[f"GO_TOOLCHAIN_SHA256_linux_{arch}"])
