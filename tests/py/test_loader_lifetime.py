"""Zero-copy buffer lifetime, closing, garbage collection, Ctrl-C, fork, bad
input, and determinism across thread counts."""

import _thread
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import stoker
from conftest import native_threads, payload


def addr(x):
    return x.data_ptr() if isinstance(x, torch.Tensor) else x.__array_interface__["data"][0]


# ---- zero copy and buffer lifetime ----------------------------------------------------

@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_batches_view_the_ring_without_copying(make_records, output):
    with stoker.Loader(make_records(40), 4, output=output, depth=3, shuffle=False) as L:
        addresses = set()
        for x, y in L:
            addresses.add(addr(x))
        # 10 batches went through depth + 1 = 4 ring buffers
        assert len(addresses) <= 4


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_held_batch_keeps_its_data_while_loader_runs(make_records, output):
    with stoker.Loader(make_records(64), 4, output=output, depth=2, seed=1) as L:
        it = iter(L)
        x0, y0 = next(it)
        want_x, want_y = np.array(x0, copy=True), np.array(y0, copy=True)
        held = addr(x0)
        for _ in range(3):                 # 48 more batches through the other buffer
            for x, y in L if _ else it:
                assert addr(x) != held, "a held buffer was reused"
                del x, y
        assert np.array_equal(np.asarray(x0), want_x)
        assert np.array_equal(np.asarray(y0), want_y)
        for k, i in enumerate(want_y):
            assert bytes(want_x[k]) == payload(int(i))


def test_any_view_keeps_the_batch_alive(make_records):
    # depth 3: one batch held by the test, one by the loop variable, one filling
    with stoker.Loader(make_records(64), 4, output="torch", depth=3, seed=1) as L:
        it = iter(L)
        x0, y0 = next(it)
        want = x0[1:3].clone()
        part = x0[1:3]                     # a view of a view
        held = addr(x0)
        del x0, y0
        gc.collect()
        for x, _ in it:
            assert addr(x) != held
        assert torch.equal(part, want)
        del part
        gc.collect()
        seen = {addr(x) for x, _ in L}
        assert held in seen                # released once nothing referenced it


def test_labels_alone_keep_the_batch_alive(make_records):
    with stoker.Loader(make_records(32), 4, output="numpy", depth=3) as L:
        it = iter(L)
        x0, y0 = next(it)
        held = addr(x0)
        del x0
        for x, _ in it:
            assert addr(x) != held
        assert len(y0) == 4


def test_depth_one_with_a_held_batch_raises_instead_of_overwriting(make_records):
    with stoker.Loader(make_records(16), 4, output="numpy", depth=1, seed=3) as L:
        assert L.info()["ring_buffers"] == 2
        it = iter(L)
        x0, y0 = next(it)
        x, y = next(it)                    # one held batch is free of charge
        keep = np.array(x, copy=True)
        with pytest.raises(stoker.Error, match="held") as e:
            next(it)                       # two held: no buffer left
        assert e.value.code_name == "EBUSY" and "copy" in str(e.value)
        assert np.array_equal(x, keep)
        del x, y
        x, y = next(it)                    # released: the loader goes on
        assert len(y) == 4


def test_batch_in_a_reference_cycle_is_collected_when_ring_is_full(make_records):
    with stoker.Loader(make_records(16), 4, output="numpy", depth=1) as L:
        it = iter(L)
        held, _ = next(it)                 # takes the spare buffer
        x, y = next(it)
        cycle = [x]
        cycle.append(cycle)
        del x, y, cycle                    # only the cycle collector can free it
        x, y = next(it)
        assert len(y) == 4


def test_close_while_batches_are_held(make_records):
    L = stoker.Loader(make_records(40), 4, output="torch", depth=3, threads=2, seed=2)
    it = iter(L)
    held = [next(it) for _ in range(3)]
    want = [(x.clone(), y.clone()) for x, y in held]
    L.close()
    for (x, y), (wx, wy) in zip(held, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)
        for k, i in enumerate(y.tolist()):
            assert bytes(x[k].numpy()) == payload(i)
    del held, x, y
    gc.collect()


def test_garbage_collected_loader_stops_its_threads(make_records):
    rec = make_records(400)
    base = native_threads()
    L = stoker.Loader(rec, 4, threads=3, output="numpy")
    it = iter(L)
    next(it)
    assert native_threads() >= base + 3
    del L, it
    gc.collect()
    assert native_threads() == base


def test_loader_collected_while_a_batch_outlives_it(make_records):
    base = native_threads()
    L = stoker.Loader(make_records(40), 4, threads=2, output="torch", shuffle=False)
    x, y = next(iter(L))
    del L
    gc.collect()
    assert native_threads() == base
    assert y.tolist() == [0, 1, 2, 3] and bytes(x[2].numpy()) == payload(2)


# ---- Ctrl-C ------------------------------------------------------------------------------

def slow_folder(tmp_path, n=48):
    """A folder whose first batch takes seconds with one thread: n links to one
    1500x1500 noise PNG (no DCT scaling for PNG, so every sample is a full
    ~7 MB inflate + resize), so next() waits as long as the test needs."""
    import numpy as np
    from PIL import Image
    d = tmp_path / "slow" / "c0"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    png = tmp_path / "noise.png"
    Image.fromarray(rng.integers(0, 256, (1500, 1500, 3), dtype=np.uint8)).save(png, compress_level=1)
    for k in range(n):
        os.symlink(png, d / f"img{k:03d}.png")
    return d.parent


@pytest.mark.parametrize("how", ["interrupt_main", "sigalrm"])
def test_ctrl_c_interrupts_a_blocked_next_promptly(tmp_path, how):
    root = slow_folder(tmp_path)
    L = stoker.Loader(root, 48, shuffle=False, threads=1, output="numpy", transform="imagenet-val")
    it = iter(L)
    old = None
    t0 = time.monotonic()
    try:
        if how == "interrupt_main":
            timer = threading.Timer(0.3, _thread.interrupt_main)
            timer.start()
        else:
            def handler(signum, frame):
                raise KeyboardInterrupt
            old = signal.signal(signal.SIGALRM, handler)
            signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        waited = time.monotonic() - t0
    finally:
        if old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    assert 0.25 <= waited < 0.8, f"interrupt took {waited:.3f}s"
    # Nothing was lost: the same iterator goes on with the very batch it was
    # waiting for.
    x, y = next(it)
    assert x.shape == (48, 3, 224, 224) and list(y) == [0] * 48
    L.close()


def test_close_from_another_thread_wakes_a_blocked_next(tmp_path):
    root = slow_folder(tmp_path)
    L = stoker.Loader(root, 48, shuffle=False, threads=1, output="numpy", transform="imagenet-val")
    it = iter(L)
    closer = threading.Thread(target=L.close)
    threading.Timer(0.2, closer.start).start()
    t0 = time.monotonic()
    with pytest.raises(stoker.Error, match="closed"):
        next(it)
    closer.join(10)
    assert not closer.is_alive() and L.closed
    # close() waits for the worker's current sample only, not the whole batch.
    assert time.monotonic() - t0 < 1.5


def test_fifo_named_like_an_image_is_a_sample_error_not_a_hang(tmp_path):
    d = tmp_path / "fifo" / "c0"
    d.mkdir(parents=True)
    os.mkfifo(d / "a.jpg")
    (d / "b.jpg").write_bytes(b"x" * 10)
    with stoker.Loader(d.parent, 1, shuffle=False, threads=1, output="numpy") as L:
        it = iter(L)
        with pytest.raises(stoker.SampleError, match="a.jpg") as e:
            next(it)
        assert "not a regular file" in e.value.reason
        assert next(it)[0] == []           # its batch, without it: empty
        assert [bytes(a) for a in next(it)[0]] == [b"x" * 10]


# ---- fork ------------------------------------------------------------------------------

def test_forked_child_gets_a_clear_error_and_can_open_its_own(make_records):
    rec = make_records(24)
    L = stoker.Loader(rec, 4, output="numpy", threads=2, depth=3)
    it = iter(L)
    x, y = next(it)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                           # child: report, never return to pytest
        try:
            try:
                next(it)
                msg = "no error"
            except RuntimeError as e:
                msg = f"{type(e).__name__}: {e}"
            try:
                L.stats()
            except RuntimeError as e:
                msg += f" | stats: {e}"
            with stoker.Loader(rec, 4, output="numpy") as L2:
                n = sum(len(b) for _, b in L2)
            msg += f" | own loader: {n}"
            del x, y, it, L                # inherited batch: must not touch the ring
            gc.collect()
            os.write(w, msg.encode())
        except BaseException as e:         # noqa: BLE001 - report anything
            os.write(w, f"child failed: {e!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert msg.startswith("Error: ") and "forked child" in msg, msg
    assert "stats: " in msg and "own loader: 24" in msg, msg
    # the parent is unaffected
    assert len(y) == 4
    assert sum(len(b) for _, b in it) == 20
    L.close()


# ---- bad input -------------------------------------------------------------------------

def folder_with_bad_sample(make_folder):
    root = make_folder(classes=2, per_class=4)
    os.symlink("/nonexistent/target", root / "class01" / "f001_broken.jpg")
    return root


def test_bad_sample_raises_naming_it_then_iteration_goes_on(make_folder):
    root = folder_with_bad_sample(make_folder)
    with stoker.Loader(root, 3, shuffle=False, output="numpy", on_error="raise") as L:
        it = iter(L)
        got = []
        errors = []
        while True:
            try:
                x, y = next(it)
            except stoker.SampleError as e:
                errors.append(e)
                continue
            except StopIteration:
                break
            got += y.tolist()
        assert len(errors) == 1
        e = errors[0]
        assert "f001_broken.jpg" in str(e) and "No such file" in str(e)
        assert e.path.endswith("f001_broken.jpg") and e.code_name == "ESAMPLE"
        assert e.errors[0]["code_name"] == "EIO" and e.sample == 6
        assert sorted(got) == [0] * 4 + [1] * 4      # 9 files, the bad one left out
        s = L.stats()
        assert s["samples_failed"] == 1 and s["samples_delivered"] == 8
        assert s["errors"][0]["path"].endswith("f001_broken.jpg")


def test_bad_sample_under_skip_is_counted_and_listed(make_folder):
    root = folder_with_bad_sample(make_folder)
    with stoker.Loader(root, 3, output="numpy", on_error="skip", seed=4) as L:
        for epoch in range(2):
            n = sum(len(y) for _, y in L)
            assert n == 8
            # stats()["errors"] lists the epoch just iterated
            errs = L.stats()["errors"]
            assert [e["epoch"] for e in errs] == [epoch]
            assert "No such file" in errs[0]["reason"]
        s = L.stats()
    assert s["samples_skipped"] == 2 and s["samples_failed"] == 0


def test_bad_record_in_dense_batch_shrinks_the_batch(tmp_path):
    path = tmp_path / "short.rec"
    path.write_bytes(b"".join(i.to_bytes(8, "little") + payload(i) for i in range(10)))
    rec = stoker.Records(path, 24, label_bytes=8)
    with stoker.Loader(rec, 4, shuffle=False, output="numpy", on_error="skip") as L:
        os.truncate(path, 24 * 9 + 5)      # the last record is now short
        L.set_epoch(1)                     # drops work prefetched before that
        sizes = [len(y) for _, y in L]
        assert sizes == [4, 4, 1]
        err = L.stats()["errors"][0]
    assert err["sample"] == 9 and "short read" in err["reason"]


# ---- determinism -----------------------------------------------------------------------

def test_same_seed_same_batches_for_any_thread_count(make_records):
    rec = make_records(90)
    runs = []
    for threads, depth in ((1, 2), (2, 3), (4, 2)):
        with stoker.Loader(rec, 7, seed=77, threads=threads, depth=depth,
                           output="numpy") as L:
            runs.append([(np.array(x), np.array(y)) for _ in range(2) for x, y in L])
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for (a, la), (b, lb) in zip(runs[0], other):
            assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_close_from_a_signal_handler_during_next(tmp_path):
    """The graceful-shutdown pattern: a signal handler calls close() while
    next() waits. The close completes inside that next(), which raises; the
    loader is closed, not left half-open (found by review)."""
    root = slow_folder(tmp_path)
    L = stoker.Loader(root, 48, shuffle=False, threads=1, output="numpy", transform="imagenet-val")
    it = iter(L)
    old = signal.signal(signal.SIGALRM, lambda signum, frame: L.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(stoker.Error, match="closed"):
            next(it)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert L.closed
    L.close()                              # harmless again
