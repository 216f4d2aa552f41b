"""stoker.pack: the library's packer from Python. Its output equals the
command line's byte for byte; it reads back through a Loader; arguments,
errors, skipped samples, progress and Ctrl-C behave as documented."""

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import stoker
from conftest import stoker_bin  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _jpeg_folder(root, classes=3, per=8):
    from PIL import Image
    rng = np.random.default_rng(5)
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for k in range(per):
            a = rng.integers(0, 256, (20 + k * 3, 24 + c * 5, 3), dtype=np.uint8)
            Image.fromarray(a).save(d / f"img{k:02d}.jpg", quality=85)
    return root


def _tree_bytes(d):
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(d).iterdir())}


@pytest.mark.parametrize("opts,cli", [
    ({}, []),
    ({"max_side": 20, "quality": 80, "shard_size": 3000, "threads": 3},
     ["--max-side", "20", "--quality", "80", "--shard-size", "3000", "--threads", "3"]),
    ({"raw": (12, 10, 1), "align": 4096}, ["--raw", "12x10x1", "--align", "4096"]),
])
def test_pack_equals_cli_byte_for_byte(tmp_path, opts, cli):
    exe = stoker_bin()
    if exe is None:
        pytest.skip("build/release/stoker not built")
    src = _jpeg_folder(tmp_path / "src")
    r = stoker.pack(src, tmp_path / "py", **opts)
    p = subprocess.run([exe, "pack", str(src), str(tmp_path / "cli"), "--quiet"] + cli,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    py, ref = _tree_bytes(tmp_path / "py"), _tree_bytes(tmp_path / "cli")
    assert py == ref
    assert r["samples"] == 24 and r["skipped"] == 0 and r["skipped_samples"] == []
    assert r["shards"] == len(py) - 2  # the shards, the manifest, stoker.index
    assert r["bytes"] == sum(len(v) for k, v in py.items() if k.endswith(".stk"))
    assert r["payload"] == ("raw" if "raw" in opts else "resized" if "max_side" in opts
                            else "encoded")


def test_pack_records_reads_back(tmp_path, make_records):
    recs = make_records(40)
    out = tmp_path / "packed"
    r = stoker.pack(recs, out, shard_size=100, threads=np.int64(2))
    assert r["samples"] == 40 and r["shards"] > 1
    with stoker.Loader(out, 8, shuffle=False, output="numpy") as L:
        got = [(int(lab), bytes(s)) for x, y in L for s, lab in zip(x, y)]
    from conftest import payload
    assert got == [(i, payload(i)) for i in range(40)]


def test_pack_skips_and_reports(tmp_path):
    src = _jpeg_folder(tmp_path / "src")
    (src / "class1" / "img03.jpg").write_bytes(b"plain text, not a JPEG")
    with pytest.raises(stoker.Error) as ei:
        stoker.pack(src, tmp_path / "out")
    assert ei.value.code_name == "EFORMAT"
    assert "sample 11 (class1/img03.jpg)" in str(ei.value)
    assert not (tmp_path / "out").exists()
    calls = []
    r = stoker.pack(src, tmp_path / "out", skip_bad=True, progress=calls.append)
    assert r["samples"] == 23 and r["skipped"] == 1
    (idx, key, reason), = r["skipped_samples"]
    assert (idx, key) == (11, "class1/img03.jpg") and "not an image" in reason
    assert calls and calls[-1]["done"] == calls[-1]["total"] == 24
    assert calls[-1]["skipped"] == 1


def test_pack_errors(tmp_path):
    src = _jpeg_folder(tmp_path / "src", classes=1, per=2)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        stoker.pack(tmp_path / "nothing-here", tmp_path / "o")
    with pytest.raises(ValueError, match="inside the source dataset"):
        stoker.pack(src, src / "packed")
    assert not (src / "packed").exists()
    with pytest.raises(ValueError, match="source dataset itself"):
        stoker.pack(src, src)
    with pytest.raises(ValueError, match="quality must be in 1 .. 100"):
        stoker.pack(src, tmp_path / "o", quality=0)
    with pytest.raises(ValueError, match="raw C must be 1 or 3"):
        stoker.pack(src, tmp_path / "o", raw="8x8x2")
    with pytest.raises(ValueError, match="align"):
        stoker.pack(src, tmp_path / "o", align=1000)
    with pytest.raises(TypeError, match="progress"):
        stoker.pack(src, tmp_path / "o", progress=3)
    with pytest.raises(ValueError, match="exclude each other"):
        stoker.pack(src, tmp_path / "o", raw=(8, 8, 3), max_side=16)
    assert not (tmp_path / "o").exists()
    stoker.pack(src, tmp_path / "o")
    with pytest.raises(ValueError, match="already holds a packed dataset"):
        stoker.pack(src, tmp_path / "o")


def _bad_tree(tmp_path):
    src = _jpeg_folder(tmp_path / "src")
    for k in range(0, 8, 2):
        (src / "class2" / f"img{k:02d}.jpg").write_bytes(b"not an image")
    return src


def test_pack_progress_exception_cancels(tmp_path):
    src = _bad_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()

    def progress(d):
        if d["skipped"]:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        stoker.pack(src, out, skip_bad=True, shard_size=500, threads=1, progress=progress)
    assert list(out.iterdir()) == []        # shards written before are taken back
    with pytest.raises(stoker.Error) as ei:
        stoker.pack(src, out, skip_bad=True, threads=1, progress=lambda d: d["skipped"] > 0)
    assert ei.value.code_name == "ECANCELED"
    assert list(out.iterdir()) == []


def test_pack_ctrl_c_raises_keyboard_interrupt(tmp_path):
    src = _bad_tree(tmp_path)
    out = tmp_path / "out"
    sent = []

    def progress(d):
        if d["skipped"] and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)   # as Ctrl-C would

    with pytest.raises(KeyboardInterrupt):
        stoker.pack(src, out, skip_bad=True, shard_size=500, threads=2, progress=progress)
    assert sent and not out.exists()


def test_pack_ctrl_c_without_progress_function(tmp_path):
    """SIGINT arriving while C works (GIL released): the pack notices within
    its 0.1 s progress tick, stops, removes its output and raises."""
    import threading
    from PIL import Image
    src = tmp_path / "big"
    rng = np.random.default_rng(9)
    for c in range(2):
        d = src / f"c{c}"
        d.mkdir(parents=True)
        for k in range(150):
            a = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
            Image.fromarray(a).save(d / f"{k:03d}.png")
    out = tmp_path / "out"
    t = threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            stoker.pack(src, out, raw=(64, 64, 3), threads=1)
    finally:
        t.cancel()
    assert not out.exists()


def test_writer_equals_pack_and_reads_back(tmp_path):
    src = _jpeg_folder(tmp_path / "src")
    ref = stoker.pack(src, tmp_path / "packed", shard_size=4000)
    with stoker.Writer(tmp_path / "written", num_classes=3, shard_size=4000) as w:
        for c in range(3):
            w.set_class_name(c, f"class{c}")
            for k in range(8):
                key = f"class{c}/img{k:02d}.jpg"
                w.add((src / key).read_bytes(), label=np.int64(c), key=key)
        with pytest.raises(ValueError, match="label 3 is outside -1..2"):
            w.add(b"x", label=3)
    assert _tree_bytes(tmp_path / "written") == _tree_bytes(tmp_path / "packed")
    assert ref["samples"] == 24

    raw = np.arange(10 * 4 * 4 * 3, dtype=np.uint8).reshape(10, 4, 4, 3)
    with stoker.Writer(tmp_path / "raw", raw=(4, 4, 3), num_classes=2) as w:
        for i in range(10):
            w.add(raw[i], label=i % 2)
        with pytest.raises(ValueError, match="47 bytes, but a raw 4x4x3 sample has 48"):
            w.add(b"\0" * 47)
    with stoker.Loader(tmp_path / "raw", 5, shuffle=False, output="numpy") as L:
        xs, ys = zip(*[(x.copy(), y.copy()) for x, y in L])
    assert np.array_equal(np.concatenate(xs).reshape(10, 4, 4, 3), raw)
    assert np.concatenate(ys).tolist() == [i % 2 for i in range(10)]

    with pytest.raises(RuntimeError, match="boom"):
        with stoker.Writer(tmp_path / "aborted") as w:
            w.add(b"some bytes", key="a")
            raise RuntimeError("boom")
    assert not (tmp_path / "aborted").exists()
    with pytest.raises(ValueError, match="already holds a packed dataset"):
        stoker.Writer(tmp_path / "raw")


_HOLDER = """
import sys
sys.path.insert(0, sys.argv[1])
import stoker
w = stoker.Writer(sys.argv[2], num_classes=1)
w.set_class_name(0, "only")
w.add(b"first sample", label=0, key="a")
print("ready", flush=True)
cmd = sys.stdin.readline().strip()
if cmd == "finish":
    w.finish()
w.close()
print("done", flush=True)
"""


def _holder(out):
    """Another process with a live stoker.Writer on out (one sample added)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(ROOT / "python"), str(out)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("end", ["finish", "close", "kill"])
def test_second_writer_is_told_another_writer_is_using_the_directory(tmp_path, end):
    """Issue 24 item 12: a second writer (or pack) on a directory that a live
    writer in another process is filling used to be told the directory
    "holds an interrupted pack ... remove the directory"."""
    out = tmp_path / "out"
    p = _holder(out)
    try:
        for attempt in range(2):   # refused every time, changing nothing
            with pytest.raises(stoker.Error, match=r"is in use by another stoker writer or "
                                                   r"pack, which is still writing there") as e:
                stoker.Writer(out)
            assert e.value.code_name == "EBUSY"
            assert "interrupted" not in str(e.value) and "remove" not in str(e.value)
        src = _jpeg_folder(tmp_path / "src", classes=1, per=2)
        with pytest.raises(stoker.Error, match=r"in use by another stoker writer") as e:
            stoker.pack(src, out)
        assert e.value.code_name == "EBUSY"
        assert out.is_dir()
        if end == "kill":
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        else:
            p.stdin.write(end + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "done"
            assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if end == "finish":
        # The first writer's dataset is whole and readable; a new writer is
        # told it is a packed dataset.
        with stoker.Loader(out, 1, output="numpy") as L:
            assert [int(y[0]) for _, y in L] == [0] and L.classes == ["only"]
        assert sorted(os.listdir(out)) == ["part-000000.stk", "stoker.index", "stoker.manifest"]
        with pytest.raises(ValueError, match="already holds a packed dataset"):
            stoker.Writer(out)
    elif end == "close":
        # Closed without finish: it removed what it wrote, lock included.
        assert not out.exists()
        with stoker.Writer(out) as w:
            w.add(b"x", key="x")
    else:
        # Killed: its lock died with it; what is left is an interrupted pack.
        with pytest.raises(ValueError, match="holds an interrupted pack"):
            stoker.Writer(out)


# ---- issue 24 item 4: class names, all or none ------------------------------------

def test_writer_with_some_classes_named_is_refused_at_finish(tmp_path):
    out = tmp_path / "out"
    w = stoker.Writer(out, num_classes=4)
    try:
        w.set_class_name(0, "cat")
        w.set_class_name(2, "dog")
        for c in range(4):
            w.add(b"sample %d" % c, label=c, key=f"k{c}")
        with pytest.raises(ValueError, match=r"2 of 4 classes are named, and class 1 \(with "
                                             r"others\) is not: name every class"):
            w.finish()
        # The writer is still usable: name the rest and finish.
        w.set_class_name(1, "bird")
        w.set_class_name(3, "fish")
        w.finish()
    finally:
        w.close()
    with stoker.Loader(out, 2, output="numpy") as L:
        assert L.classes == ["cat", "bird", "dog", "fish"] and L.num_classes == 4
        assert L.dataset.class_to_idx == {"cat": 0, "bird": 1, "dog": 2, "fish": 3}


def test_writer_with_no_names_gives_no_names_and_the_class_count(tmp_path):
    with stoker.Writer(tmp_path / "out", num_classes=3) as w:
        w.add(b"x", label=2)
    with stoker.Loader(tmp_path / "out", 1, output="numpy") as L:
        assert L.classes == [] and L.num_classes == 3


@pytest.mark.parametrize("name", [3, None, b"cat", 1.5])
def test_class_names_must_be_str(tmp_path, name):
    with stoker.Writer(tmp_path / "out", num_classes=1) as w:
        with pytest.raises(TypeError, match=r"set_class_name: a class name is a str, got "):
            w.set_class_name(0, name)
        w.set_class_name(0, "cat")
        w.add(b"x", label=0)
    with stoker.Loader(tmp_path / "out", 1, output="numpy") as L:
        assert L.classes == ["cat"]


def test_pack_refuses_a_class_folder_name_with_a_newline(tmp_path, make_folder):
    src = make_folder(classes=3, per_class=2)
    os.rename(src / "class01", src / "class\n01")
    with pytest.raises(ValueError, match=r"class 0: the name \"class\\n01\" contains a newline, "
                                         r"which the manifest cannot store .*rename the class "
                                         r"folder"):
        stoker.pack(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()   # refused before writing anything


def test_pack_names_every_class_of_a_folder_and_of_a_repack(tmp_path):
    src = _jpeg_folder(tmp_path / "src", classes=4, per=2)
    with stoker.Loader(src, 2, output="numpy") as L:
        folder_classes = L.classes
    assert len(folder_classes) == 4
    stoker.pack(src, tmp_path / "out")
    stoker.pack(tmp_path / "out", tmp_path / "again")     # .stk to .stk keeps them
    for d in ("out", "again"):
        with stoker.Loader(tmp_path / d, 2, output="numpy") as L:
            assert L.classes == folder_classes and L.num_classes == 4


def test_classes_of_a_manifest_naming_only_some_is_full_length(tmp_path):
    """Datasets written before names were all-or-none: the list is still
    num_classes long, None where the manifest gives no name (it used to be
    [] or a list shorter than num_classes)."""
    out = tmp_path / "out"
    with stoker.Writer(out, num_classes=3) as w:
        for c in range(3):
            w.set_class_name(c, f"c{c}")
        w.add(b"x", label=0)
    m = out / "stoker.manifest"
    m.write_text("".join(l for l in m.read_text().splitlines(True) if not
                         l.startswith("class 2 ")))
    with stoker.Loader(out, 1, output="numpy") as L:
        assert L.classes == ["c0", "c1", None] and L.num_classes == 3
    m.write_text("".join(l for l in m.read_text().splitlines(True) if not
                         l.startswith("class 0 ")))
    with stoker.Loader(out, 1, output="numpy") as L:
        assert L.classes == [None, "c1", None]
