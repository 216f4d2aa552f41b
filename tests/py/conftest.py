"""Shared fixtures of the Python tests. Puts python/ on sys.path (the test
command builds the extension first: make MODE=release python)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

RECORD_BYTES = 24  # 8 label bytes + 16 payload bytes


def stoker_bin():
    """The stoker CLI to run: $STOKER_BIN, else build/release/stoker; None
    when neither is an executable file."""
    env = os.environ.get("STOKER_BIN")
    for c in ([env] if env else []) + [os.path.join(ROOT, "build", "release", "stoker")]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return str(c)
    return None


def payload(i):
    """The 16 payload bytes of record i: its index, then a pattern of it."""
    return i.to_bytes(8, "little") + bytes((i * 7 + k) % 256 for k in range(8))


@pytest.fixture
def aws_env(monkeypatch, tmp_path, request):
    """An environment whose only AWS credentials are the test S3 server's
    (the test module's KEY_ID and SECRET): no AWS_* variable of the
    machine's, no ~/.aws, no instance metadata. Returns monkeypatch."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws of the machine's
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata either
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", request.module.KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", request.module.SECRET)
    return monkeypatch


@pytest.fixture
def make_records(tmp_path):
    """make_records(n) -> stoker.Records of n records whose label is the
    record's index and whose payload is payload(i)."""
    import stoker

    def make(n, name="data.rec", header=b""):
        path = tmp_path / name
        with open(path, "wb") as f:
            f.write(header)
            for i in range(n):
                f.write(i.to_bytes(8, "little") + payload(i))
        return stoker.Records(path, RECORD_BYTES, header_bytes=len(header), label_bytes=8)

    return make


def raw_content(cls, k):
    """Bytes of file k of class cls in a raw folder: varying lengths."""
    return f"class={cls} file={k} ".encode() + bytes(range(k % 50))


@pytest.fixture
def make_folder(tmp_path):
    """make_folder(classes, per_class) -> path of an ImageFolder tree of raw
    (not image) files named *.jpg: without a transform stoker delivers their
    bytes, which needs no image decoder."""

    def make(classes=3, per_class=5, name="folder"):
        root = tmp_path / name
        for c in range(classes):
            d = root / f"class{c:02d}"
            d.mkdir(parents=True)
            for k in range(per_class):
                (d / f"f{k:03d}.jpg").write_bytes(raw_content(c, k))
        return root

    return make


def native_threads():
    """Threads of this process, native ones included."""
    return len(os.listdir("/proc/self/task"))
