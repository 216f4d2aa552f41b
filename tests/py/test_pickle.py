"""Pickling a Loader (issue 24 item 9), as Lightning's ddp_spawn and
hyper-parameter saving, accelerate and copy.deepcopy do: the pickle keeps
the arguments and the position; unpickling re-opens the dataset and goes on
with the same batches."""

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest

import stoker
from conftest import ROOT


def batches(it, n=None):
    out = []
    it = iter(it)
    for x, y in (it if n is None else (next(it) for _ in range(n))):
        x = [np.array(v, copy=True) for v in x] if isinstance(x, list) else np.array(x, copy=True)
        out.append((x, [int(v) for v in y]))
    return out


def same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert ya == yb and all(np.array_equal(p, q) for p, q in zip(xa, xb))


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copy_continues_with_the_same_batches(make_records, how):
    rec = make_records(40)
    with stoker.Loader(rec, 4, seed=11, output="numpy", threads=2, return_indices=False) as L:
        e0 = batches(iter(L))                  # epoch 0, whole
        it = iter(L)
        head = batches(it, 3)                  # 3 batches of epoch 1
        c = pickle.loads(pickle.dumps(L)) if how == "pickle" else copy.deepcopy(L)
        with c:
            assert c.state_dict() == L.state_dict()
            assert (c.batch_size, c.seed, c.shuffle, c.threads) == (4, 11, True, 2)
            rest = batches(it)                 # the original goes on ...
            same(batches(c), rest)             # ... and so does the copy
            assert len(head) + len(rest) == len(L)
            # Both go on into epoch 2 alike, and epoch 2 is not epoch 0.
            e2 = batches(L)
            same(batches(c), e2)
            assert [y for _, y in e2] != [y for _, y in e0]


def test_copy_of_a_fresh_loader_starts_at_epoch_zero(make_records, make_folder):
    with stoker.Loader(make_folder(), 3, output="numpy", shuffle=False) as L:
        c = pickle.loads(pickle.dumps(L))
        with c:
            assert c.epoch == 0 and c.classes == L.classes
            same(batches(L), batches(c))


def test_copy_in_another_process(make_records, tmp_path):
    rec = make_records(24)
    with stoker.Loader(rec, 4, seed=3, output="numpy") as L:
        it = iter(L)
        batches(it, 2)
        (tmp_path / "loader.pkl").write_bytes(pickle.dumps(L))
        want = [y for _, y in batches(it)]
    code = ("import pickle, sys; sys.path.insert(0, sys.argv[1] + '/python'); "
            "L = pickle.load(open(sys.argv[2], 'rb')); "
            "print([[int(v) for v in y] for _, y in L])")
    out = subprocess.run([sys.executable, "-c", code, ROOT, str(tmp_path / "loader.pkl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == want


def test_argument_that_cannot_be_pickled_says_why_and_what_to_do(make_records):
    rec = make_records(8)
    rec.note = lambda: None   # e.g. a user's attribute on the source
    with stoker.Loader(rec, 4, output="numpy") as L:
        with pytest.raises(TypeError, match=r"cannot pickle stoker.Loader: its argument "
                                            r"source=.*cannot be pickled .*re-opened from its "
                                            r"arguments in the receiving process"):
            pickle.dumps(L)
        with pytest.raises(TypeError, match=r"argument source="):
            copy.deepcopy(L)


def test_closed_loader_cannot_be_pickled(make_records):
    L = stoker.Loader(make_records(8), 4, output="numpy")
    L.close()
    with pytest.raises(TypeError, match=r"cannot pickle a closed stoker.Loader"):
        pickle.dumps(L)
