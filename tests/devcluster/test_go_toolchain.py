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
            def do_GET(self):
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
    go_path = (
        str(_fake_go(tmp_path / "old" / "go", _version_str(older))) if go == "old" else str(tmp_path / "nowhere" / "go")
    )
    r = _run(tmp_path, go=go_path, proxy_url=proxy.url, sha256=proxy.sha256)
    assert r.returncode == 0, r.stderr
    want = tmp_path / "cache" / "go" / f"{PINNED}.linux-{ARCH}" / "bin" / "go"
    assert r.stdout.strip() == str(want)
    assert os.access(want, os.X_OK)
    assert subprocess.run([want, "version"], capture_output=True, text=True).stdout.startswith(f"go version {PINNED} ")
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


# --- Every script that builds Go finds it through go-toolchain.sh (issue 21) -----------------------
# On a machine without `go`, `make demo` worked (install-tools.sh bootstraps Go) while `make test`
# stopped at `install-kubeconform: 'go' is needed`: each script looked for Go its own way.

TOOL_SCRIPTS = ["install-kubeconform.sh", "infra-terraform.sh"]  # install-tools.sh: its own tests
# `go` run (or looked up) by its bare name at a command position, optionally after VAR=value
# prefixes, instead of the path go-toolchain.sh printed.
_BARE_GO = re.compile(r"(?:^|[;|&]|\$\()\s*(?:\w+=\S+\s+)*(?:go|command -v \"?go\"?)\s")


def test_no_script_runs_a_go_it_found_by_itself():
    for script in sorted((REPO / "scripts").glob("*.sh")) + sorted((REPO / "mk").glob("*.mk")):
        if script.name == "go-toolchain.sh":
            continue
        code = [ln.split("#", 1)[0] for ln in script.read_text().splitlines()]
        bare = [ln.strip() for ln in code if _BARE_GO.search(ln + " ")]
        assert not bare, f"{script.name} runs a go it found itself, not scripts/go-toolchain.sh's: {bare}"


def _logging_toolchain_zip(version: str) -> bytes:
    """The pinned toolchain's zip, whose `go` answers `version` and records (then fails) every build."""
    prefix = f"golang.org/toolchain@v0.0.1-{version}.linux-{ARCH}/"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo(prefix + "bin/go")
        info.external_attr = 0o755 << 16
        z.writestr(
            info,
            "#!/bin/sh\n"
            f"[ \"$1\" = version ] && [ $# = 1 ] && {{ echo 'go version {version} linux/{ARCH}'; exit 0; }}\n"
            'echo "$*" >> "$GO_CALLS"\nexit 3\n',
        )
    return buf.getvalue()


@pytest.mark.parametrize("script", TOOL_SCRIPTS)
def test_each_tool_script_bootstraps_go_when_path_has_none(tmp_path, script):
    data = _logging_toolchain_zip(PINNED)
    zpath = f"/golang.org/toolchain/@v/v0.0.1-{PINNED}.linux-{ARCH}.zip"
    proxy = _Proxy({zpath: data})
    path_env = "/usr/bin:/bin"
    assert all(not (Path(d) / "go").exists() for d in path_env.split(":")), "this PATH must have no go"
    pins = tmp_path / "pins.env"
    pins.write_text(
        f"GO_TOOLCHAIN_VERSION={PINNED}\nGO_TOOLCHAIN_SHA256_linux_{ARCH}={hashlib.sha256(data).hexdigest()}\n"
    )
    calls = tmp_path / "go-calls"
    env = {
        "PATH": path_env,
        "HOME": str(tmp_path / "home"),
        "LLMTRAIN_CACHE": str(tmp_path / "cache"),
        "LLMTRAIN_GO_PINS": str(pins),
        "GOPROXY": f"{proxy.url},direct",
        "GO_CALLS": str(calls),
        # go-toolchain.sh's last resort is /usr/local/go/bin/go; point it at nothing so that this
        # machine's own Go cannot stand in for the bootstrap.
        "GO": str(tmp_path / "nowhere" / "go"),
    }
    try:
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / script)], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        proxy.close()
    assert "is needed" not in r.stderr, r.stderr
    assert proxy.requests == [zpath], r.stderr  # the pinned toolchain was fetched ...
    assert calls.exists(), r.stderr  # ... and the script built with it
    assert calls.read_text().split()[0] == "install", calls.read_text()
    assert r.returncode != 0  # the stand-in go fails the build: nothing half-built is reported as done
