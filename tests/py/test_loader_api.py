"""stoker.Loader's arguments, iteration, positions and counters, on record
files and raw-byte folders (no image decoding needed)."""

import os
import threading

import numpy as np
import pytest
import torch

import stoker
from conftest import payload, raw_content


def labels_of(loader):
    out = []
    for _, y in loader:
        out.extend(int(v) for v in y)
    return out


def batches_of(loader):
    return [(np.array(x, copy=True), np.array(y, copy=True)) for x, y in loader]


# ---- output types ----------------------------------------------------------------

def test_records_numpy_dense_batches_and_int64_labels(make_records):
    rec = make_records(50)
    with stoker.Loader(rec, 8, output="numpy", shuffle=False, threads=2) as L:
        assert len(L) == 7 and L.num_samples == 50
        got = batches_of(L)
    assert [len(y) for _, y in got] == [8] * 6 + [2]
    x, y = got[0]
    assert isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.shape == (8, 16)
    assert isinstance(y, np.ndarray) and y.dtype == np.int64
    assert y.tolist() == list(range(8))
    for k in range(8):
        assert bytes(x[k]) == payload(k)


def test_records_torch_tensors_through_dlpack(make_records):
    rec = make_records(20)
    with stoker.Loader(rec, 5, output="torch", shuffle=False) as L:
        x, y = next(iter(L))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.shape == (5, 16)
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2, 3, 4]
    assert bytes(x[3].numpy()) == payload(3)


def test_torch_is_default_output(make_records):
    with stoker.Loader(make_records(4), 2) as L:
        x, y = next(iter(L))
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)


def test_folder_raw_bytes_give_list_of_per_sample_arrays(make_folder):
    root = make_folder(classes=3, per_class=4)
    with stoker.Loader(root, 5, output="numpy", shuffle=False) as L:
        assert L.classes == ["class00", "class01", "class02"]
        assert L.num_classes == 3
        data, labels = [], []
        for x, y in L:
            assert isinstance(x, list) and all(a.dtype == np.uint8 and a.ndim == 1 for a in x)
            data += [bytes(a) for a in x]
            labels += y.tolist()
    assert labels == [c for c in range(3) for _ in range(4)]
    assert data == [raw_content(c, k) for c in range(3) for k in range(4)]


def test_folder_torch_list_output(make_folder):
    root = make_folder(classes=2, per_class=3)
    with stoker.Loader(root, 6, shuffle=False) as L:
        x, y = next(iter(L))
    assert isinstance(x, list) and all(isinstance(t, torch.Tensor) for t in x)
    assert bytes(x[0].numpy()) == raw_content(0, 0)


def test_return_indices(make_records):
    with stoker.Loader(make_records(30), 7, output="numpy", return_indices=True, seed=3) as L:
        for x, y, idx in L:
            assert idx.dtype == np.int64
            assert idx.tolist() == y.tolist()   # the label of record i is i
            assert [int.from_bytes(bytes(r[:8]), "little") for r in x] == idx.tolist()


# ---- arguments ---------------------------------------------------------------------

def test_shuffle_and_seed(make_records):
    rec = make_records(64)

    def order(**kw):
        with stoker.Loader(rec, 16, output="numpy", **kw) as L:
            return labels_of(L)

    assert order(shuffle=False) == list(range(64))
    a, b, c = order(seed=1), order(seed=1), order(seed=2)
    assert a == b and a != c and sorted(a) == list(range(64))
    assert a != list(range(64))


def test_drop_last(make_records):
    rec = make_records(23)
    with stoker.Loader(rec, 5, drop_last=True, output="numpy") as L:
        assert len(L) == 4
        assert [len(y) for _, y in L] == [5, 5, 5, 5]
    with stoker.Loader(rec, 5, drop_last=False, output="numpy") as L:
        assert len(L) == 5
        assert [len(y) for _, y in L] == [5, 5, 5, 5, 3]


@pytest.mark.parametrize("threads,depth", [(1, 2), (2, 3), (3, 5)])
def test_threads_and_depth(make_records, threads, depth):
    with stoker.Loader(make_records(40), 4, threads=threads, depth=depth, output="numpy") as L:
        assert L.threads == threads and L.info()["depth"] == depth
        # depth is passed to the engine as is: batches prepared ahead
        assert L.info()["ring_buffers"] == depth + 1
        assert sorted(labels_of(L)) == list(range(40))
        assert len(L.stats()["threads"]) == threads


def test_threads_default_is_cores(make_records):
    with stoker.Loader(make_records(4), 2) as L:
        assert L.threads == os.cpu_count()


def test_header_bytes_and_label_bytes(tmp_path):
    path = tmp_path / "r.bin"
    recs = [bytes([k]) + bytes([k + 100] * 3) for k in range(6)]
    path.write_bytes(b"HEADER" + b"".join(recs))
    with stoker.Loader(stoker.Records(path, 4, header_bytes=6, label_bytes=1), 6,
                       shuffle=False, output="numpy") as L:
        x, y = next(iter(L))
    assert y.tolist() == list(range(6))
    assert x.shape == (6, 3) and x[:, 0].tolist() == [k + 100 for k in range(6)]
    with stoker.Loader(stoker.Records(path, 4, header_bytes=6), 6, shuffle=False,
                       output="numpy") as L:
        x, y = next(iter(L))
    assert y.tolist() == [-1] * 6 and x.shape == (6, 4)


def test_max_sample_bytes(make_folder):
    root = make_folder(classes=1, per_class=3)
    with stoker.Loader(root, 3, max_sample_bytes=8, output="numpy", on_error="skip") as L:
        assert list(L)[0][0] == []
        assert L.stats()["samples_skipped"] == 3
        assert "budget" in L.stats()["errors"][0]["reason"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0), "batch_size"),
    (dict(threads=-1), "threads"),
    (dict(threads=300), "threads"),
    (dict(depth=0), "depth"),
    (dict(depth=65), "depth"),
    (dict(output="jax"), "output"),
    (dict(on_error="ignore"), "on_error"),
    (dict(layout="chw"), "layout"),
    (dict(dtype="int32"), "dtype"),
    (dict(seed=-1), "seed"),
    (dict(rank=2, world_size=2), "rank"),
    (dict(output="numpy", dtype="bfloat16"), "bfloat16"),
    (dict(options={"max_dim": "huge"}), "max_dim"),
])
def test_invalid_arguments(make_records, kwargs, match):
    rec = make_records(4)
    kw = dict(batch_size=2)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stoker.Loader(rec, **kw)


def test_invalid_records():
    with pytest.raises(ValueError, match="label_bytes"):
        stoker.Records("x", 4, label_bytes=3)
    with pytest.raises(ValueError, match="label_bytes"):
        stoker.Records("x", 4, label_bytes=4)


def test_open_errors_name_the_source(tmp_path, make_records):
    with pytest.raises(FileNotFoundError, match="nope"):
        stoker.Loader(tmp_path / "nope", 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(stoker.Error, match="no class subfolders") as e:
        stoker.Loader(tmp_path / "empty", 2)
    assert e.value.code_name == "EEMPTY"
    bad = tmp_path / "partial.rec"
    bad.write_bytes(b"x" * 25)
    with pytest.raises(stoker.Error, match="partial.rec"):
        stoker.Loader(stoker.Records(bad, 24), 2)


def test_dtype_spellings_are_accepted(make_records):
    rec = make_records(4)
    for d in ("uint8", np.uint8, torch.uint8):
        with stoker.Loader(rec, 2, dtype=d) as L:
            assert L.dtype == "uint8"
    # torch.bfloat16 is read as "bfloat16"; records have no pixels to convert,
    # so the engine refuses it (it used to hand back uint8 silently).
    with pytest.raises(Exception, match="dtype bfloat16 needs an image transform"):
        stoker.Loader(rec, 2, dtype=torch.bfloat16)


# ---- ranks -------------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,world", [(103, 4), (30, 3), (64, 2)])
def test_ranks_partition_each_epoch_exactly_once(make_records, n, world, drop_last):
    rec = make_records(n)
    per_rank, counts = [], set()
    for r in range(world):
        with stoker.Loader(rec, 4, rank=r, world_size=world, drop_last=drop_last, seed=9,
                           output="numpy") as L:
            got = labels_of(L)
            counts.add((len(L), len(got)))
            per_rank.append(got)
    assert len(counts) == 1, f"ranks disagree on batch counts: {counts}"
    allgot = [i for g in per_rank for i in g]
    if drop_last:
        # floor(n / world) each, then the final partial batch is dropped
        assert len(allgot) == len(set(allgot)) == world * ((n // world) // 4) * 4
    else:
        # every sample at least once; the remainder is padded by wrapping
        assert set(allgot) == set(range(n))
        assert len(allgot) == -(-n // world) * world


def test_rank_defaults_from_environment(make_records, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with stoker.Loader(make_records(30), 5) as L:
        assert (L.rank, L.world_size) == (1, 3) and L.samples_per_epoch == 10
    with stoker.Loader(make_records(30), 5, rank=0, world_size=1) as L:
        assert (L.rank, L.world_size) == (0, 1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with stoker.Loader(make_records(30), 5) as L:
        assert (L.rank, L.world_size) == (0, 1)


def test_rank_defaults_from_torch_distributed(make_records, tmp_path, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "9")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        with stoker.Loader(make_records(30), 5) as L:
            assert (L.rank, L.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


# ---- epochs and positions ---------------------------------------------------------------

def test_iterating_again_continues_with_next_epoch(make_records):
    rec = make_records(40)
    with stoker.Loader(rec, 8, seed=4, output="numpy") as L:
        e0, e1 = labels_of(L), labels_of(L)
        assert L.epoch == 2
    assert sorted(e0) == sorted(e1) == list(range(40)) and e0 != e1
    with stoker.Loader(rec, 8, seed=4, output="numpy") as L:
        L.set_epoch(1)
        assert labels_of(L) == e1
        L.set_epoch(0)
        assert labels_of(L) == e0


def test_iterator_shared_by_threads_delivers_exactly_its_epoch(make_records):
    """Several threads calling next() on one iterator (issue 24 item 1): the
    end of the epoch seen by one of them ends it for all, so the epoch gives
    each of its batches once and nothing of the next epoch; the state then
    points at the next epoch's start, and the next loop delivers all of it."""
    n, bs, nthreads = 400, 4, 4
    rec = make_records(n)
    for trial in range(6):
        with stoker.Loader(rec, bs, seed=trial, output="numpy", threads=1,
                           depth=nthreads + 4, return_indices=True) as L:
            it = iter(L)
            got, lock = [], threading.Lock()
            errors = []

            def run():
                try:
                    for _, y, _ in it:
                        with lock:
                            got.append(tuple(int(v) for v in y))
                except Exception as e:  # noqa: BLE001 -- reported below
                    errors.append(e)

            ts = [threading.Thread(target=run) for _ in range(nthreads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert not errors and not any(t.is_alive() for t in ts)
            assert len(got) == len(L) == n // bs, f"trial {trial}: {len(got)} batches"
            assert sorted(v for b in got for v in b) == list(range(n))
            assert {k: L.state_dict()[k] for k in ("epoch", "batch")} == \
                {"epoch": 1, "batch": 0}
            with pytest.raises(StopIteration):
                next(it)
            # The next epoch is whole: its first batch is the first a fresh
            # loader gives in epoch 1.
            e1 = [tuple(int(v) for v in y) for _, y, _ in L]
            assert sorted(v for b in e1 for v in b) == list(range(n))
        with stoker.Loader(rec, bs, seed=trial, output="numpy") as ref:
            ref.set_epoch(1)
            assert e1 == [tuple(int(v) for v in y) for _, y in ref]


def test_set_epoch_same_as_reaching_it(make_records):
    rec = make_records(33)
    with stoker.Loader(rec, 4, seed=11, output="numpy") as L:
        epochs = [batches_of(L) for _ in range(4)]
    with stoker.Loader(rec, 4, seed=11, output="numpy", threads=1) as L:
        L.set_epoch(3)
        got = batches_of(L)
    for (a, la), (b, lb) in zip(epochs[3], got):
        assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_state_dict_round_trip_mid_epoch(make_records):
    rec = make_records(50)
    with stoker.Loader(rec, 6, seed=5, output="numpy", threads=2) as L:
        labels_of(L)                       # epoch 0
        it = iter(L)
        for _ in range(3):
            next(it)
        sd = L.state_dict()
        assert (sd["epoch"], sd["batch"]) == (1, 3)
        rest = [(np.array(x), np.array(y)) for x, y in it]
        nxt = batches_of(L)
    with stoker.Loader(rec, 6, seed=5, output="numpy", threads=1, depth=3) as L2:
        L2.load_state_dict(sd)
        got = batches_of(L2)
        assert L2.state_dict()["epoch"] == 2
        got_next = batches_of(L2)
    assert len(got) == len(rest) == len(L) - 3
    for (a, la), (b, lb) in zip(rest + nxt, got + got_next):
        assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_state_dict_at_epoch_end_points_to_next_epoch(make_records):
    with stoker.Loader(make_records(10), 5, output="numpy") as L:
        it = iter(L)
        next(it)
        next(it)                          # every batch, the end not yet seen
        assert L.state_dict()["epoch"] == 1 and L.state_dict()["batch"] == 0


def test_load_state_dict_checks_configuration(make_records):
    rec = make_records(20)
    with stoker.Loader(rec, 4, seed=1) as L:
        sd = L.state_dict()
    with stoker.Loader(rec, 4, seed=2) as L:
        with pytest.raises(ValueError, match="seed"):
            L.load_state_dict(sd)
    with stoker.Loader(rec, 5, seed=1) as L:
        L.load_state_dict(sd)  # another batch size: an elastic resume (test_elastic.py)
    with stoker.Loader(rec, 4, seed=1) as L:
        with pytest.raises(ValueError, match="batch"):
            L.load_state_dict({"seed": 1, "epoch": 0, "batch": 99})


def test_abandoned_iterator_mid_epoch(make_records):
    rec = make_records(40)
    with stoker.Loader(rec, 8, seed=2, output="numpy") as L:
        it1 = iter(L)
        next(it1)
        next(it1)
        it2 = iter(L)                     # starts epoch 1, whole
        got = []
        for _, y in it2:
            got += y.tolist()
        assert sorted(got) == list(range(40))
        with pytest.raises(RuntimeError, match="superseded"):
            next(it1)
    with stoker.Loader(rec, 8, seed=2, output="numpy") as L:
        L.set_epoch(1)
        assert labels_of(L) == got


def test_iterator_unused_does_not_waste_an_epoch(make_records):
    with stoker.Loader(make_records(12), 4, seed=1, output="numpy") as L:
        iter(L)
        assert L.epoch == 0
        labels_of(L)
        assert L.epoch == 1


def test_stats_counts_stages_and_delivery(make_records):
    with stoker.Loader(make_records(30), 4, output="numpy", threads=2) as L:
        labels_of(L)
        s = L.stats()
    assert s["samples_delivered"] == 30 and s["batches_delivered"] == 8
    assert s["stages"]["read"]["items"] >= 30
    # per-thread counters are read after the sums, while workers may still run
    assert sum(t["read"]["items"] for t in s["threads"]) >= s["stages"]["read"]["items"]
    assert s["starvation_s"] >= 0 and s["memory_bound_bytes"] == L.memory_bound > 0
    assert s["samples_skipped"] == s["samples_failed"] == 0 and s["errors"] == []


def test_close_twice_and_use_after_close(make_records):
    L = stoker.Loader(make_records(8), 4)
    it = iter(L)
    L.close()
    L.close()
    assert L.closed
    with pytest.raises(stoker.Error, match="closed"):
        next(it)
    with pytest.raises(stoker.Error, match="closed"):
        iter(L)
    with pytest.raises(stoker.Error, match="closed"):
        L.stats()


# ---- names that are not UTF-8 (found by review) ---------------------------------------

def test_non_utf8_file_name_gives_the_stoker_error_and_its_exact_path(tmp_path):
    d = os.path.join(os.fsencode(tmp_path), b"c0")
    os.makedirs(d)
    bad = os.path.join(d, b"bad\xff.jpg")
    with open(bad, "wb") as f:
        f.write(b"not a jpeg")
    root = os.fsdecode(os.fsencode(tmp_path))
    with stoker.Loader(root, 1, transform="decode", output="numpy") as L:
        with pytest.raises(stoker.SampleError) as e:
            next(iter(L))
        assert "bad" in str(e.value)
    with stoker.Loader(root, 1, transform="decode", output="numpy", on_error="skip") as L:
        assert [len(y) for _, y in L] == [0]
        errs = L.stats()["errors"]
        assert len(errs) == 1 and os.fsencode(errs[0]["path"]) == bad


def test_missing_non_utf8_path_is_file_not_found(tmp_path):
    missing = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"no-such-\xff"))
    with pytest.raises(FileNotFoundError):
        stoker.Loader(missing, 1)
    # A message cut by the engine's buffer in the middle of a character.
    long = os.path.join(str(tmp_path), "é" * 100, "é" * 100, "é" * 100)
    with pytest.raises(FileNotFoundError):
        stoker.Loader(long, 1)


def test_buffer_refuses_fortran_order_it_does_not_have(make_records):
    """The batch memory is C-ordered; a consumer asking the exporter for a
    Fortran-contiguous buffer gets BufferError, not C-ordered bytes."""
    with stoker.Loader(make_records(8), 4, output="numpy", shuffle=False) as L:
        x, y = next(iter(L))
        exporter = x.base if x.base is not None else x
        assert memoryview(exporter).c_contiguous
        with pytest.raises(BufferError):
            _pybuffer_f_contiguous(exporter)


def _pybuffer_f_contiguous(obj):
    """Requests a PyBUF_F_CONTIGUOUS buffer from obj through the C API."""
    import ctypes
    PyBUF_F_CONTIGUOUS = 0x0040 | 0x0018
    class Py_buffer(ctypes.Structure):
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]
    b = Py_buffer()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
    get.restype = ctypes.c_int
    if get(obj, ctypes.byref(b), PyBUF_F_CONTIGUOUS) == 0:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(b))
