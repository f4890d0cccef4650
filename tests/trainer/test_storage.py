"""The storage layer (llmtrain_trainer/storage): every guarantee checked on both backends, a local
directory and S3 (a moto server on loopback), with the same calls and the same expectations.

Ranged reads are exact or a `ShortRead` naming the object and range; a missing object is a
`FileNotFoundError` naming it; bounded reads refuse what is larger; writes are atomic (a failed
local write leaves the old file and no temporary); a response body that breaks off mid-transfer is
read again (a TCP proxy in front of moto cuts one response after its headers, as a reset
connection does).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading

import pytest

from llmtrain_devcluster.process import free_port

pytestmark = pytest.mark.trainer

DATA = bytes(range(256)) * 64  # 16 KiB, every offset distinguishable


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """An empty storage of each kind; its objects are named the same way on both."""
    from llmtrain_trainer.storage import open_storage

    if request.param == "local":
        st = open_storage(f"file://{tmp_path}/store")
    else:
        import boto3

        request.getfixturevalue("s3")
        bucket = f"st-{os.getpid()}-{len(os.listdir(tmp_path.parent))}-{tmp_path.name[-20:]}".lower().replace("_", "-")
        boto3.client("s3").create_bucket(Bucket=bucket[:63])
        st = open_storage(f"s3://{bucket[:63]}/some/prefix")
    yield st
    st.close()


def test_ranged_reads_are_exact_or_name_the_object_and_range(storage):
    from llmtrain_trainer.storage import ShortRead

    storage.write("d/data.bin", DATA)
    assert storage.read_range("d/data.bin", 1000, 300) == DATA[1000:1300]
    assert storage.read_range("d/data.bin", 0, len(DATA)) == DATA
    assert storage.read_range("d/data.bin", 5, 0) == b""
    for offset in (len(DATA) - 10, len(DATA) + 10):  # the last 10 bytes and 10 more; past the end
        with pytest.raises(ShortRead) as err:
            storage.read_range("d/data.bin", offset, 20)
        assert storage.url("d/data.bin") in str(err.value) and f"read bytes {offset}-{offset + 19}" in str(err.value)
        assert isinstance(err.value, EOFError)


def test_a_missing_object_is_not_found_naming_it(storage, tmp_path):
    calls = {
        "read": lambda: storage.read("nope/x.json"),
        "read_range": lambda: storage.read_range("nope/x.json", 0, 4),
        "size": lambda: storage.size("nope/x.json"),
        "download": lambda: storage.download("nope/x.json", str(tmp_path / "x")),
    }
    for what, call in calls.items():
        with pytest.raises(FileNotFoundError) as err:  # S3: NotFound; local: the OS's own, naming the file
            call()
        assert storage.url("nope/x.json") in str(err.value), (what, str(err.value))
    assert not storage.exists("nope/x.json")
    assert storage.list("nope/") == []


def test_reads_are_bounded(storage):
    storage.write("index.json", b"x" * 1001)
    assert storage.read("index.json", limit=1001) == b"x" * 1001
    with pytest.raises(ValueError, match=r"index.json: larger than 1,000 bytes"):
        storage.read("index.json", limit=1000)


def test_listing_names_sizes_and_prefixes(storage, tmp_path):
    for name, n in (("b/2.bin", 2), ("a/1.bin", 1), ("a/sub/3.bin", 3), ("ab.bin", 4)):
        storage.write(name, b"z" * n)
    assert [(e.name, e.size) for e in storage.list()] == [
        ("a/1.bin", 1),
        ("a/sub/3.bin", 3),
        ("ab.bin", 4),
        ("b/2.bin", 2),
    ]
    assert [e.name for e in storage.list("a/")] == ["a/1.bin", "a/sub/3.bin"]
    assert [e.name for e in storage.list("a")] == ["a/1.bin", "a/sub/3.bin", "ab.bin"]
    storage.copy("a/1.bin", "c/1.bin")
    storage.delete(["a/1.bin", "a/sub/3.bin", "never-there"])
    assert [e.name for e in storage.list()] == ["ab.bin", "b/2.bin", "c/1.bin"]
    src = tmp_path / "up.bin"
    src.write_bytes(DATA)
    storage.upload(str(src), "b/2.bin")  # replaces
    storage.download("b/2.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == DATA and storage.size("b/2.bin") == len(DATA)


def test_open_gives_a_seekable_file(storage):
    storage.write("f.parquet", DATA)
    with storage.open("f.parquet", buffer_size=4096) as f:
        f.seek(-8, os.SEEK_END)  # parquet reads its footer first
        assert f.read() == DATA[-8:]
        f.seek(100)
        assert f.read(50) == DATA[100:150] and f.tell() == 150
    from llmtrain_trainer.storage import S3Storage, ShortRead

    if isinstance(storage, S3Storage):  # ranged GETs up to the size listed: an object that shrank since
        with storage.open("f.parquet", size=len(DATA) + 100) as f, pytest.raises(ShortRead):
            f.read()


def test_a_failed_local_write_leaves_the_old_file_and_no_temporary(tmp_path):
    """The write runs into the file-size limit (EFBIG, as a full disk does) half way."""
    from llmtrain_trainer.storage import LocalStorage, StorageError

    st = LocalStorage(str(tmp_path / "out"))
    st.write("index.json", b"old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(StorageError) as err:
            st.write("index.json", b"n" * (2 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(err.value).startswith(f"{tmp_path}/out/index.json: write: File too large")
    assert (tmp_path / "out" / "index.json").read_bytes() == b"old"
    assert os.listdir(tmp_path / "out") == ["index.json"]


def test_check_writable_names_what_is_in_the_way(storage, tmp_path):
    from llmtrain_trainer.storage import NotFound, StorageError, open_storage

    storage.check_writable()
    assert storage.list() == []  # the probe is removed
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"Not a directory: '.*/file/x'"):
        open_storage(str(tmp_path / "file" / "x")).check_writable()
    if storage.url("").startswith("s3://"):
        with pytest.raises(StorageError, match=r"^s3://no-such-bucket-x/\.write-test-\d+: write: NoSuchBucket") as err:
            open_storage("s3://no-such-bucket-x/").check_writable()
        assert not isinstance(err.value, NotFound)  # a wrong location, not a missing object


class CuttingProxy:
    """A TCP proxy to `port` that cuts the next `cuts` responses to ranged GETs after their headers
    and `keep` bytes of body, closing the connection (a connection reset mid-transfer)."""

    def __init__(self, port: int, cuts: int, keep: int = 100):
        self.port, self.cuts, self.keep, self.cut_done = port, cuts, keep, 0
        self.server = socket.create_server(("127.0.0.1", free_port()))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.port))
        cut = threading.Event()

        def up() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    if self.cuts > 0 and data.startswith(b"GET ") and b"range: bytes=" in data.lower():
                        self.cuts -= 1
                        cut.set()
                    upstream.sendall(data)

        threading.Thread(target=up, daemon=True).start()
        held = b""
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if not cut.is_set():
                    client.sendall(data)
                    continue
                held += data
                end = held.find(b"\r\n\r\n")
                if end >= 0 and len(held) >= end + 4 + self.keep:
                    client.sendall(held[: end + 4 + self.keep])
                    self.cut_done += 1
                    break
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.server.close()


def test_a_response_that_breaks_off_is_read_again(s3, monkeypatch, caplog):
    """botocore retries failed requests, not a body that breaks off after the response began: the
    storage layer reads it again (the data loader, the prepare sources and the checkpoint reader
    each had their own GET before, none of which did)."""
    import boto3

    from llmtrain_trainer.storage import S3Storage, StorageError
    from llmtrain_trainer.storage import s3 as s3mod

    boto3.client("s3").create_bucket(Bucket="flaky")
    boto3.client("s3").put_object(Bucket="flaky", Key="shard.bin", Body=DATA)
    moto_port = int(s3["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proxy = CuttingProxy(moto_port, cuts=2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setattr(s3mod.time, "sleep", lambda s: None)  # the backoff between re-reads
    try:
        st = S3Storage("s3://flaky/")
        with caplog.at_level("WARNING"):
            assert st.read_range("shard.bin", 1000, 10000) == DATA[1000:11000]
        assert proxy.cut_done == 2
        assert caplog.text.count("s3://flaky/shard.bin: read bytes 1000-10999: the response broke off") == 2
        proxy.cuts = s3mod.READ_ATTEMPTS  # every attempt breaks off: an error naming the object
        with pytest.raises(StorageError, match=r"^s3://flaky/shard.bin: read bytes 0-9999: the response broke off 5"):
            st.read_range("shard.bin", 0, 10000)
    finally:
        proxy.close()
