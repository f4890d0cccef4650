"""Write and read single-layer OCI image archives (an OCI image layout in a tar: ``oci-layout``,
``index.json``, ``blobs/sha256/...``), with no registry and no image builder.

``scripts/install-tools.sh`` packs the real node's images with it: the pause image (the kubelet's
pod sandbox, a ``gcc -static`` build of Kubernetes' own ``build/pause/linux/pause.c``) and a busybox
test image (Debian's ``busybox-static``). ``ctr images import`` names an image from the index entry's
``io.containerd.image.name`` annotation, which :func:`write_archive` sets.

The output is reproducible (every mtime 0, entries in the given order, JSON with sorted keys), so
the same inputs give the same manifest digest and :func:`.images.import_image` can skip an image
the node already holds.

Stdlib only: install-tools.sh runs this file as a script, with whatever ``python3`` it finds::

    python3 oci_archive.py OUT.tar --ref NAME:TAG [--entrypoint /pause] [--user 65535:65535] \\
        [--file SRC=DEST[:MODE]]... [--link DEST=TARGET]... [--dir DEST[:MODE]]...
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Entry", "ImageIndex", "read_index", "write_archive"]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Entry:
    """One entry of the image's only layer: a file (``data``), a directory or a symlink."""

    path: str
    data: bytes | None = None
    mode: int = 0o755
    link: str | None = None

    def tarinfo(self) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(self.path.lstrip("/"))
        ti.mtime = 0
        ti.mode = self.mode
        if self.link is not None:
            ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, self.link, 0o777
        elif self.data is None:
            ti.type = tarfile.DIRTYPE
        else:
            ti.size = len(self.data)
        return ti


@dataclass(frozen=True)
class ImageIndex:
    """What an archive's ``index.json`` says: the image's name and its manifest's digest."""

    name: str
    digest: str


def _tar(entries: Sequence[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            t.addfile(e.tarinfo(), io.BytesIO(e.data) if e.data is not None else None)
    return out.getvalue()


def _json(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(
    out: Path | str,
    ref: str,
    entries: Sequence[Entry],
    *,
    entrypoint: Sequence[str] = (),
    user: str = "",
    env: Sequence[str] = ("PATH=/bin:/usr/bin",),
    architecture: str = "amd64",
) -> ImageIndex:
    """Write an OCI archive of one layer holding ``entries``, named ``ref`` (``name:tag``)."""
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image reference {ref!r} has no tag (expected NAME:TAG)")
    diff = _tar(entries)
    layer = gzip.compress(diff, mtime=0)
    config = _json(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint), "User": user, "Env": list(env), "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(diff)]},
            "history": [{"created_by": "llmtrain_devcluster.node.oci_archive"}],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": architecture, "os": "linux"},
                    "annotations": {NAME_ANNOTATION: ref, REF_ANNOTATION: ref.rsplit(":", 1)[1]},
                }
            ],
        }
    )
    files = [
        Entry("oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644),
        Entry("index.json", index, 0o644),
        *(Entry(f"blobs/sha256/{_digest(b)[7:]}", b, 0o644) for b in (layer, config, manifest)),
    ]
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(_tar(files))
    os.replace(tmp, out)
    return ImageIndex(ref, _digest(manifest))


def read_index(archive: Path | str) -> ImageIndex:
    """The name and manifest digest of the (first) image in an OCI archive, from its
    ``index.json``; the name from containerd's annotation, else the OCI ref name."""
    with tarfile.open(archive) as t:
        member = next((m for m in t if m.name.lstrip("./") == "index.json"), None)
        f = t.extractfile(member) if member is not None else None
        if f is None:
            raise ValueError(f"{archive}: no index.json (not an OCI image archive)")
        index = json.load(f)
    manifests = index.get("manifests") or []
    if not manifests:
        raise ValueError(f"{archive}: index.json lists no manifest")
    m = manifests[0]
    ann = m.get("annotations") or {}
    name = ann.get(NAME_ANNOTATION) or ann.get(REF_ANNOTATION)
    if not name:
        raise ValueError(f"{archive}: its manifest has no {NAME_ANNOTATION} or {REF_ANNOTATION} annotation")
    return ImageIndex(name, m["digest"])


def _split_mode(spec: str, default: int) -> tuple[str, int]:
    path, sep, mode = spec.rpartition(":")
    return (path, int(mode, 8)) if sep and mode.isdigit() else (spec, default)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a single-layer OCI image archive.")
    ap.add_argument("out")
    ap.add_argument("--ref", required=True, help="NAME:TAG, the name ctr images import gives it")
    ap.add_argument("--entrypoint", action="append", default=[], help="one argv word (repeatable)")
    ap.add_argument("--user", default="")
    ap.add_argument("--file", action="append", default=[], metavar="SRC=DEST[:MODE]")
    ap.add_argument("--link", action="append", default=[], metavar="DEST=TARGET")
    ap.add_argument("--dir", action="append", default=[], metavar="DEST[:MODE]")
    a = ap.parse_args(argv)
    entries = []
    for d in a.dir:
        path, mode = _split_mode(d, 0o755)
        entries.append(Entry(path, mode=mode))
    for f in a.file:
        src, _, dest = f.partition("=")
        dest, mode = _split_mode(dest, 0o755)
        entries.append(Entry(dest, Path(src).read_bytes(), mode))
    for ln in a.link:
        dest, _, target = ln.partition("=")
        entries.append(Entry(dest, link=target))
    idx = write_archive(a.out, a.ref, entries, entrypoint=a.entrypoint, user=a.user)
    print(f"{a.out} {idx.name} {idx.digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
