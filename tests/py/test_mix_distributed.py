"""A mixture (docs/mixing.md) read by real torchrun processes (gloo, CPU),
each rank tests/py/dist_worker.py: three sources of different kinds (a folder
of PNG and JPEG files, a .stk written by stoker.Writer, a WebDataset tar),
weights 0.6/0.3/0.1 over an epoch of 90 samples, so the 8-sample folder is
repeated (6 passes and 6 samples) and the others give a prefix of a fresh
permutation. A world of 2 (or 3) reads part of the epoch, rank 0's state
restores onto 3 (or 2) ranks with another batch size, and the (source,
sample) multiset over both parts and all ranks is the uninterrupted
1-process epoch's; ranks get equal batch counts; every window of each
rank's stream in an uninterrupted world holds each source's share within
the documented bound; exact resume in one process gives the same batches;
ranks that open the loader with other weights are refused at open; with
per-source transforms (a flip on one source, another on another), every
rank's image of each (source, sample) is the one-process loader's."""

import collections
import hashlib
import io
import json
import math
import os
import re
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

import stoker

pytest.importorskip("torch.distributed")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import torchrun  # noqa: E402

SIZES = (8, 40, 12)                 # folder, .stk, tar
WEIGHTS = (0.6, 0.3, 0.1)
N = 90                              # samples_per_epoch
QUOTAS = (54, 27, 9)                # largest remainder of 90 * weights
FIELDS = {"image": "image;jpg;png"}
TRANSFORM = "Resize((4, 4))"
SEED = 5


def _image(k, fmt):
    a = np.zeros((6, 5 + k % 3, 3), np.uint8) + np.array([k * 37 % 256, k * 11 % 256, 90],
                                                          np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    """The three sources on disk and the worker's mixture spec (a JSON file)."""
    root = tmp_path_factory.mktemp("mixdist")
    folder = root / "folder" / "c0"
    folder.mkdir(parents=True)
    for k in range(SIZES[0]):
        fmt = "PNG" if k % 2 else "JPEG"
        (folder / f"{k:02d}.{fmt.lower().replace('jpeg', 'jpg')}").write_bytes(_image(k, fmt))
    with stoker.Writer(root / "set") as w:
        for k in range(SIZES[1]):
            w.add(_image(k, "PNG"), key=f"s{k:02d}.png")
    with tarfile.open(root / "web.tar", "w") as t:
        for k in range(SIZES[2]):
            data = _image(k, "JPEG")
            info = tarfile.TarInfo(f"t{k:02d}.jpg")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    paths = [str(root / "folder"), str(root / "set"), str(root / "web.tar")]
    path = root / "mix.json"
    path.write_text(json.dumps({"sources": [[p, w] for p, w in zip(paths, WEIGHTS)],
                                "samples_per_epoch": N, "fields": FIELDS,
                                "transform": TRANSFORM}))
    return {"paths": paths, "data": f"mix:{path}"}


def _loader(spec, batch, **kw):
    return stoker.Loader([stoker.Source(p, weight=w) for p, w in zip(spec["paths"], WEIGHTS)],
                         batch, fields=FIELDS, transform=TRANSFORM, samples_per_epoch=N,
                         seed=SEED, return_indices=True, output="numpy", threads=1, **kw)


def _pairs(batch):
    return [(int(s), int(i)) for s, i in zip(batch["source"], batch["__index__"])]


@pytest.fixture(scope="module")
def uninterrupted(spec):
    """The epoch read by one process without a stop: its (source, sample)
    pairs in order."""
    with _loader(spec, 5) as ld:
        return [p for b in ld for p in _pairs(b)]


def _check_bound(stream):
    """docs/mixing.md: every window of L consecutive samples of a rank's
    stream holds source s between floor(L*n_s/N) - 1 and ceil(L*n_s/N) + 1
    times."""
    src = np.array([s for s, _ in stream])
    for s, quota in enumerate(QUOTAS):
        cum = np.concatenate([[0], np.cumsum(src == s)])
        for length in range(1, len(src) + 1):
            got = cum[length:] - cum[:-length]
            lo, hi = math.floor(length * quota / N) - 1, math.ceil(length * quota / N) + 1
            assert got.min() >= lo and got.max() <= hi, (s, length, got.min(), got.max())


def test_one_process_epoch_passes_bound_and_exact_resume(spec, uninterrupted):
    assert len(uninterrupted) == N
    firsts = np.cumsum([0, *SIZES[:-1]])
    for s, (size, quota) in enumerate(zip(SIZES, QUOTAS)):
        local = collections.Counter(i - firsts[s] for src, i in uninterrupted if src == s)
        assert sum(local.values()) == quota
        assert set(local) <= set(range(size))
        # Each pass exactly once: the repeated folder 6 or 7 times per sample,
        # the others a prefix of one permutation (each sample at most once).
        assert min(local.values()) >= quota // size and max(local.values()) <= -(-quota // size)
        assert len(local) == min(size, quota)
    _check_bound(uninterrupted)
    with _loader(spec, 5) as a:
        it = iter(a)
        for _ in range(7):
            next(it)
        state = a.state_dict()
        rest = [(_pairs(b), b["image"].copy()) for b in it]
    with _loader(spec, 5) as b:
        b.load_state_dict(state)
        again = [(_pairs(x), x["image"].copy()) for x in b]
    assert len(rest) == len(again) == N // 5 - 7
    for (p1, i1), (p2, i2) in zip(rest, again):
        assert p1 == p2 and np.array_equal(i1, i2)
    assert [p for ps, _ in rest for p in ps] == uninterrupted[35:]


def _deliveries(ranks, upto=None):
    return collections.Counter(tuple(p) for r in ranks for b in r["batches"]
                               if upto is None or b["step"] < upto for p in b["labels"])


@pytest.mark.parametrize("first,cut,second,batch2", [(2, 3, 3, 5), (3, 2, 2, 4)])
def test_elastic_resume_across_torchrun_worlds(spec, uninterrupted, tmp_path, first, cut,
                                               second, batch2):
    """A world of `first` ranks reads the whole epoch (batches of 5) and rank
    0 saves its state after `cut` steps; a world of `second` ranks (batches
    of batch2) resumes from it. The first world's steps before the cut plus
    the second world's epoch give the uninterrupted multiset."""
    want = collections.Counter(uninterrupted)
    one = torchrun(first, tmp_path / "first", spec["data"], tmp_path / "first", "--seed", SEED,
                   "--batch-size", 5, "--save-at", cut)
    assert len({len(r["batches"]) for r in one}) == 1
    assert len(one[0]["batches"]) == N // (5 * first)
    # The uninterrupted world: the same multiset, each rank's stream within
    # the bound, per-source counts as delivered.
    assert _deliveries(one) == want
    for r in one:
        _check_bound([tuple(p) for b in r["batches"] for p in b["labels"]])
        mine = collections.Counter(p[0] for b in r["batches"] for p in b["labels"])
        assert [x["samples"] for x in r["stats_sources"]] == [mine[s] for s in range(3)]
    state = json.loads((tmp_path / "first" / "state.json").read_text())
    assert state["batch"] == cut and state["world_size"] == first and state["mixture_hash"]
    two = torchrun(second, tmp_path / "second", spec["data"], tmp_path / "second", "--seed",
                   SEED, "--batch-size", batch2, "--resume", tmp_path / "first" / "state.json")
    counts = [len(r["batches"]) for r in two]
    left = N - cut * 5 * first
    assert len(set(counts)) == 1 and counts[0] == -(-left // second // batch2), counts
    assert _deliveries(one, cut) + _deliveries(two) == want


def test_ranks_that_disagree_on_the_mixture_are_refused_at_open(spec, tmp_path):
    """Rank 1 opens the same sources with the weights rotated (0.3/0.1/0.6):
    both ranks raise, naming the mixture and each rank's weights."""
    out = tmp_path / "out"
    torchrun(2, out, spec["data"], out, "--seed", SEED, "--vary", "weights", read=False)
    for r in range(2):
        err = (out / f"error-{r}.txt").read_text()
        assert err.startswith("ValueError: the ranks of this job disagree on the mixture"), err
        assert re.search(r"weight 0\.6 of 8; weight 0\.3 of 40; weight 0\.1 of 12\), "
                         r"samples_per_epoch 90' on rank 0; .*weight 0\.3 of 8; weight 0\.1 of "
                         r"40; weight 0\.6 of 12\), samples_per_epoch 90' on rank 1", err), err
        assert f"(this is rank {r})" in err and "docs/distributed.md" in err


def _ramp(k):
    """A 6x6 PNG whose flips differ from it and from each other."""
    a = np.zeros((6, 6, 3), np.uint8)
    a[..., 0] = np.arange(6)[None, :] * 40 + k
    a[..., 1] = np.arange(6)[:, None] * 40
    a[..., 2] = 7 * k % 256
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


TF_SOURCES = (None, "Resize((4, 4))|RandomHorizontalFlip(p=1)",
              "Resize((4, 4))|RandomVerticalFlip(p=1)")


@pytest.fixture(scope="module")
def tf_spec(tmp_path_factory):
    """Three sources of ramp images (a folder, a .stk, a folder), each with
    its own transform (TF_SOURCES; None: the loader's Resize((4, 4)))."""
    root = tmp_path_factory.mktemp("mixtf")
    paths = []
    for s, n in enumerate((10, 20, 10)):
        if s == 1:
            with stoker.Writer(root / "set") as w:
                for k in range(n):
                    w.add(_ramp(100 + k), key=f"s{k:02d}.png")
            paths.append(str(root / "set"))
            continue
        d = root / f"f{s}" / "c0"
        d.mkdir(parents=True)
        for k in range(n):
            (d / f"{k:02d}.png").write_bytes(_ramp(50 * s + k))
        paths.append(str(root / f"f{s}"))
    path = root / "mix.json"
    path.write_text(json.dumps({"sources": [[p, 1.0 / 3] for p in paths],
                                "samples_per_epoch": 60, "fields": FIELDS,
                                "transform": TRANSFORM, "source_transforms": TF_SOURCES}))
    return {"paths": paths, "data": f"mix:{path}"}


def test_per_source_transforms_across_torchrun_ranks(tf_spec, tmp_path):
    """Two ranks read the mixture; the image every rank delivers for each
    (source, sample) pair is the one-process loader's for that pair, and
    the flips differ from the loader's own transform (so a rank applying
    another source's transform fails)."""
    def src(p, t, w=1.0 / 3):
        return stoker.Source(p, weight=w, **({"transform": t} if t else {}))

    def hashes(tfs):
        ref = {}
        with stoker.Loader([src(p, t) for p, t in zip(tf_spec["paths"], tfs)], 5,
                           fields=FIELDS, transform=TRANSFORM, samples_per_epoch=60, seed=SEED,
                           return_indices=True, output="numpy", threads=1) as ld:
            for b in ld:
                for pair, img in zip(_pairs(b), b["image"]):
                    h = hashlib.sha1(np.ascontiguousarray(img).tobytes()).hexdigest()
                    assert ref.setdefault(pair, h) == h   # a repeat gives the same image
        return ref

    ref, plain = hashes(TF_SOURCES), hashes((None, None, None))
    assert set(ref) == set(plain)
    for (s, i), h in ref.items():
        assert (h == plain[(s, i)]) == (s == 0), (s, i)
    ranks = torchrun(2, tmp_path / "out", tf_spec["data"], tmp_path / "out", "--seed", SEED,
                     "--batch-size", 5)
    seen = collections.Counter()
    for r in ranks:
        for b in r["batches"]:
            for (s, i), h in zip(b["labels"], b["sample_hashes"]):
                assert h == ref[(s, i)], (r["rank"], s, i)
                seen[s] += 1
    assert seen == {0: 20, 1: 20, 2: 20}
