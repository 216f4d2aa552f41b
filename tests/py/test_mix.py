"""Mixing datasets (docs/mixing.md): stoker.Loader([stoker.Source(...), ...])
over a folder of red JPEGs, a folder of green ones and a WebDataset tar of
blue ones. Each batch holds each source's share within the bound (2
samples), batch["source"] says where each sample came from (and the pixels
agree), every pass of a source is exactly once, stats() counts per source,
state_dict() resumes exactly, a changed mixture is refused unless
mix_resume="new", and a loader pickles."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

RED, GREEN, BLUE = (220, 20, 20), (20, 220, 20), (20, 20, 220)


def jpeg(col, k):
    img = np.zeros((20 + k, 30, 3), np.uint8) + np.array(col, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    paths = []
    for name, col, n in (("red", RED, 10), ("green", GREEN, 30)):
        d = root / name / "c0"
        d.mkdir(parents=True)
        for k in range(n):
            (d / f"{k:03d}.jpg").write_bytes(jpeg(col, k))
        paths.append(root / name)
    tar = root / "blue.tar"
    with tarfile.open(tar, "w") as t:
        for k in range(7):
            data = jpeg(BLUE, k)
            info = tarfile.TarInfo(f"s{k:03d}.jpg")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    paths.append(tar)
    return paths


def loader(sets, weights=(0.5, 0.3, 0.2), n=200, batch=20, **kw):
    return stoker.Loader([stoker.Source(p, weight=w) for p, w in zip(sets, weights)], batch,
                         fields={"image": "image;jpg"}, transform="Resize(16)|CenterCrop(16)",
                         samples_per_epoch=n, seed=3, **kw)


def colour(img):
    """Which of red/green/blue an image (C, H, W uint8) is."""
    return int(img.reshape(3, -1).float().mean(1).argmax())


def test_proportions_source_and_passes(sets):
    with loader(sets, threads=2, return_indices=True) as ld:
        assert len(ld) == 10
        seen = {0: [], 1: [], 2: []}
        for b in ld:
            src = b["source"]
            assert src.dtype == torch.int64
            counts = torch.bincount(src, minlength=3).tolist()
            for s, share in enumerate((10, 6, 4)):
                assert abs(counts[s] - share) < 2
            for k in range(len(src)):
                assert colour(b["image"][k]) == int(src[k])   # red, green, blue sources
            assert torch.equal(ld.sources_of(b["__index__"]), src)
            for s, i in zip(src.tolist(), b["__index__"].tolist()):
                seen[s].append(i)
        sizes = (10, 30, 7)
        for s, quota in enumerate((100, 60, 40)):
            assert len(seen[s]) == quota
            counts = np.bincount(np.array(seen[s]) - min(seen[s]), minlength=sizes[s])
            assert len(counts) == sizes[s]
            assert counts.min() >= quota // sizes[s] and counts.max() <= quota // sizes[s] + 1
        assert "stoker.Source(" in repr(ld)
        assert ld.dataset.kind == "mixture" and len(ld.dataset.root) == 3
        assert len(ld.dataset) == 10 + 30 + 7
        st = ld.stats()["sources"]
        assert [x["samples"] for x in st] == [100, 60, 40]
        assert [x["failed"] for x in st] == [0, 0, 0]
        assert st[2]["path"].endswith("blue.tar")


def batches(it, n=None):
    """(source, image) of the next n batches of iterator it (None: to the end)."""
    out = []
    for b in it:
        out.append((b["source"].clone(), b["image"].clone()))
        if n is not None and len(out) == n:
            break
    return out


def test_resume_and_refusals(sets):
    with loader(sets) as a:
        it = iter(a)
        batches(it, 3)
        state = a.state_dict()
        assert state.get("mixture_hash")
        rest = batches(it)
    with loader(sets) as b:
        b.load_state_dict(state)
        again = batches(b)
    assert len(again) == len(rest) == 7
    for (s1, i1), (s2, i2) in zip(rest, again):
        assert torch.equal(s1, s2) and torch.equal(i1, i2)
    with loader(sets, weights=(0.4, 0.4, 0.2)) as c:
        with pytest.raises(ValueError, match="another mixture.*mix_resume"):
            c.load_state_dict(state)
    with loader(sets, weights=(0.4, 0.4, 0.2), mix_resume="new") as d:
        d.load_state_dict(state)
        assert len(batches(d)) == 7


def test_threads_identical_and_pickle(sets):
    with loader(sets, threads=1) as a, loader(sets, threads=4) as b:
        for (s1, i1), (s2, i2) in zip(batches(a), batches(b)):
            assert torch.equal(s1, s2) and torch.equal(i1, i2)
    with loader(sets) as a:
        it = iter(a)
        batches(it, 2)
        copy = pickle.loads(pickle.dumps(a))
        try:
            mine, theirs = batches(it), batches(copy)
            assert len(mine) == len(theirs) == 8
            for (s1, i1), (s2, i2) in zip(mine, theirs):
                assert torch.equal(s1, s2) and torch.equal(i1, i2)
        finally:
            copy.close()


def test_errors(sets):
    with pytest.raises(TypeError, match="stoker.Source"):
        stoker.Loader([str(sets[0])], 4)
    with pytest.raises(ValueError, match="weight"):
        stoker.Source(sets[0], weight=-1)
    with pytest.raises(ValueError, match="samples_per_epoch"):
        stoker.Loader(sets[0], 4, samples_per_epoch=10)
    # The tar has no "image" field: the open names it.
    with pytest.raises(ValueError, match="mixture source 2 .*blue.tar.* has no such field"):
        stoker.Loader([stoker.Source(p) for p in sets], 4, fields={"image": "image"})


def test_per_source_transform(sets):
    """The green source's own transform pads with black and resizes back:
    exactly its samples have black corners."""
    srcs = [stoker.Source(sets[0], weight=0.4),
            stoker.Source(sets[1], weight=0.4,
                          transform="Resize((16, 16))|Pad(4)|Resize((16, 16))"),
            stoker.Source(sets[2], weight=0.2)]
    with stoker.Loader(srcs, 10, fields={"image": "image;jpg"},
                       transform="Resize((16, 16))|CenterCrop(16)", samples_per_epoch=50,
                       seed=1) as ld:
        n = 0
        for b in ld:
            for k, s in enumerate(b["source"].tolist()):
                corner = int(b["image"][k][:, 0, 0].max())
                assert (corner < 8) == (s == 1), (s, corner)
                n += 1
        assert n == 50
    # Another output size than the loader's: refused at open, naming it.
    srcs[1] = stoker.Source(sets[1], weight=0.4, transform="Resize((8, 8))")
    with pytest.raises(ValueError, match="mixture source 1 .*green.*another shape"):
        stoker.Loader(srcs, 10, fields={"image": "image;jpg"},
                      transform="Resize((16, 16))|CenterCrop(16)")
    with pytest.raises(ValueError, match="loader has none"):
        stoker.Loader(srcs, 10, fields={"image": "image;jpg"})


def test_remote_children_match_local(sets, tmp_path, monkeypatch):
    """A mixture of a local folder, a .stk over HTTP (nginx) and a tar on S3
    (through the cache) gives the batches of the same mixture read locally."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "servers"))
    import stk_servers
    www = tmp_path / "www"
    www.mkdir()
    r = stoker.pack(sets[1], www / "green", threads=2)
    assert r["samples"] == 30

    def run(paths, own=None, **kw):
        """own: per source, its own options (e.g. cache=False)."""
        own = own or [{}] * 3
        srcs = [stoker.Source(p, weight=w, **o) for p, w, o in zip(paths, (0.5, 0.3, 0.2), own)]
        with stoker.Loader(srcs, 10, fields={"image": "image;jpg"},
                           transform="Resize((16, 16))|CenterCrop(16)", samples_per_epoch=60,
                           seed=9, threads=2, **kw) as ld:
            out = [(b["source"].clone(), b["image"].clone()) for e in range(2)
                   for b in (ld.set_epoch(e) or ld)]
            run.fetch = ld.stats()["fetch"]
            return out, ld.stats()["sources"]

    want, _ = run([sets[0], www / "green", sets[2]])
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stokerkey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stokersecret")
    with stk_servers.Nginx(www) as http, stk_servers.S3Server("stokerkey", "stokersecret") as s3:
        s3.create_bucket("bkt")
        s3.put_file("bkt", "mix/blue.tar", str(sets[2]))
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        got, stats = run([sets[0], f"{http.url}/green", "s3://bkt/mix/blue.tar"],
                         cache_dir=tmp_path / "cache")
        assert any(q["path"].endswith(".stk") for q in http.requests())
        assert any(q["path"].endswith("blue.tar") for q in s3.requests())
        assert run.fetch["cache_misses"] >= 1      # the .stk shard went to the cache
        # The .stk source's own cache=False: the same batches, its shard read
        # by range and never admitted (the tar still comes from the cache).
        nocache, _ = run([sets[0], f"{http.url}/green", "s3://bkt/mix/blue.tar"],
                         own=[{}, {"cache": False}, {}], cache_dir=tmp_path / "cache2")
        assert run.fetch["cache_misses"] == 0 and run.fetch["cache_hits"] == 0
        assert run.fetch["requests"] > 0
        for (s1, i1), (s2, i2) in zip(nocache, want):
            assert torch.equal(s1, s2) and torch.equal(i1, i2)
        # A remote whole-file source cannot keep out of the cache.
        with pytest.raises(ValueError, match=r"mixture source 2 .*cache 0.*whole files"):
            run([sets[0], f"{http.url}/green", "s3://bkt/mix/blue.tar"],
                own=[{}, {}, {"cache": False}], cache_dir=tmp_path / "cache3")
    assert len(got) == len(want) == 12
    for (s1, i1), (s2, i2) in zip(got, want):
        assert torch.equal(s1, s2) and torch.equal(i1, i2)
    assert [x["samples"] for x in stats] == [60, 36, 24]


def test_per_source_batches(sets):
    """mix_batching="per_source": every batch from one source, 10/6/4 of the
    epoch's 20 batches."""
    with loader(sets, batch=10, mix_batching="per_source") as ld:
        per = [0, 0, 0]
        for b in ld:
            src = b["source"]
            assert bool((src == src[0]).all())
            per[int(src[0])] += 1
        assert per == [10, 6, 4]
    with pytest.raises(ValueError, match="mix_batching"):
        stoker.Loader(sets[0], 4, mix_batching="per_source")


def _mix_run(sets, world, steps, state, batch):
    """Every rank of `world` for `steps` batches (None: to the end) after
    restoring `state`: (Counter of (source, dataset index), rank 0's state,
    batches per rank)."""
    import collections
    seen, counts, sd0 = collections.Counter(), [], None
    for r in range(world):
        with stoker.Loader([stoker.Source(p, weight=w) for p, w in zip(sets, (0.5, 0.3, 0.2))],
                           batch, fields={"image": "image;jpg"}, return_indices=True,
                           transform="Resize((8, 8))", samples_per_epoch=240, seed=4,
                           rank=r, world_size=world, threads=1) as ld:
            if state is not None:
                ld.load_state_dict(state)
            it, n = iter(ld), 0
            while steps is None or n < steps:
                try:
                    b = next(it)
                except StopIteration:
                    break
                seen.update(zip(b["source"].tolist(), b["__index__"].tolist()))
                n += 1
            counts.append(n)
            if r == 0:
                sd0 = ld.state_dict()
    return seen, sd0, counts


@pytest.mark.parametrize("plan", [[(2, 4, 6), (3, None, 5)], [(3, 3, 4), (2, None, 8)]])
def test_elastic_world_changes_keep_the_multiset(sets, plan):
    """2 -> 3 and 3 -> 2 ranks (batch sizes changing too): the (source,
    sample) multiset of the epoch is the uninterrupted one's."""
    want, _, _ = _mix_run(sets, 1, None, None, 8)
    assert sum(want.values()) == 240
    got, state = None, None
    import collections
    got = collections.Counter()
    for world, steps, batch in plan:
        seen, state, counts = _mix_run(sets, world, steps, state, batch)
        assert len(set(counts)) == 1, counts
        got += seen
    assert got == want


_STOKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "build", "release", "stoker")


@pytest.mark.skipif(not os.path.exists(_STOKER), reason="needs build/release/stoker (make)")
def test_cli_bench_mix(sets):
    """stoker bench --mix [WEIGHT:]PATH ...: the mixture through the tool."""
    import json
    import subprocess
    out = subprocess.run([_STOKER, "bench", "--mix", f"0.5:{sets[0]}", "--mix", f"0.3:{sets[1]}",
                          "--mix", f"0.2:{sets[2]}", "--samples-per-epoch", "100",
                          "--batch-size", "10", "--transform", "Resize((8, 8))", "--json"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    assert r["source"] == "mixture" and r["samples"] == 100 and r["batches"] == 10
    bad = subprocess.run([_STOKER, "bench", str(sets[0]), "--mix", str(sets[1])],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not both" in bad.stderr


def ramp_jpeg(w, h, k, blue):
    """A left-to-right ramp: mirrored, it differs from itself."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:, :, 0] = (np.arange(w) * 255 // w)[None, :]
    img[:, :, 1] = 40 + 20 * k
    img[:, :, 2] = blue
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def ramps(tmp_path_factory):
    root = tmp_path_factory.mktemp("ramps")
    out = []
    for s, (w, h, n) in enumerate(((24, 16, 8), (32, 20, 6))):
        d = root / f"r{s}" / "c0"
        d.mkdir(parents=True)
        for k in range(n):
            (d / f"{k:02d}.jpg").write_bytes(ramp_jpeg(w, h, k, 30 + 170 * s))
        out.append(root / f"r{s}")
    return out


FLIP = "|RandomHorizontalFlip(p=1)"


def _ramp_run(ramps, tf0=None, tf1=None, view2="Resize((6, 6))"):
    fields = {"image": "image", "view2": stoker.Field("image", kind="image")}
    with stoker.Loader([stoker.Source(ramps[0], weight=0.5, transform=tf0),
                        stoker.Source(ramps[1], weight=0.5, transform=tf1)], 7,
                       fields=fields, transform={"image": "Resize((8, 8))", "view2": view2},
                       samples_per_epoch=28, seed=5, threads=2) as ld:
        return [(int(s), b["image"][k].clone(), b["view2"][k].clone())
                for b in ld for k, s in enumerate(b["source"])]


def test_per_source_transforms_of_every_image_field(ramps):
    """Source 1 flips its "image", source 0 its "view2" (transform= dicts
    naming fields): exactly those fields of those samples are mirrored pixel
    for pixel against the run without them; the rest take the loader's."""
    ref = _ramp_run(ramps)
    got = _ramp_run(ramps, tf0={"view2": "Resize((6, 6))" + FLIP},
                    tf1={"image": "Resize((8, 8))" + FLIP})
    assert len(got) == len(ref) == 28
    assert sorted(s for s, _, _ in got) == [0] * 14 + [1] * 14
    for (s, img, v2), (rs, rimg, rv2) in zip(got, ref):
        assert s == rs
        assert not torch.equal(rimg, rimg.flip(-1))
        if s == 1:
            assert torch.equal(img, rimg.flip(-1)) and torch.equal(v2, rv2)
        else:
            assert torch.equal(img, rimg) and torch.equal(v2, rv2.flip(-1))


def test_per_source_transform_output_sizes(ramps):
    """A variable-size field (HWC): each source's own size lands on its samples."""
    got = _ramp_run(ramps, tf1={"view2": "Resize(4)"}, view2="Resize(12)")
    for s, _, v2 in got:
        assert min(v2.shape[:2]) == (4 if s == 1 else 12), (s, v2.shape)   # HWC
    # Refusals name the source and the field.
    with pytest.raises(ValueError, match=r"mixture source 0 .*field 'view2'.*another shape"):
        _ramp_run(ramps, tf0={"view2": "Resize((4, 4))"})
    with pytest.raises(ValueError, match=r"mixture source 1 .*'nosuch'.*'view2'"):
        _ramp_run(ramps, tf1={"nosuch": "Resize((4, 4))"})


def test_per_source_options(sets):
    """order= per source: the loader's order "shards" (folders have none:
    they keep the global order) is the tar's own; what is the loader's is
    refused naming the source and the key."""
    def run(srcs, **kw):
        with stoker.Loader(srcs, 10, fields={"image": "image;jpg"}, return_indices=True,
                           transform="Resize((8, 8))", samples_per_epoch=60, seed=2,
                           **kw) as ld:
            return [b["__index__"].tolist() for b in ld]
    plain = [stoker.Source(p, weight=w) for p, w in zip(sets, (0.5, 0.3, 0.2))]
    own = plain[:2] + [stoker.Source(sets[2], weight=0.2, order="shards", shard_window=1)]
    assert run(own) == run(plain, order="shards", options={"shard_window": 1})
    assert "order='shards'" in repr(own[2])
    assert pickle.loads(pickle.dumps(own[2])) == own[2]
    with pytest.raises(ValueError, match=r"mixture source 0 .*order \"shards\".*none"):
        run([stoker.Source(sets[0], weight=0.5, order="shards"), *plain[1:]])
    with pytest.raises(ValueError, match=r"mixture source 1 .*'cache_dir'.*one disk cache"):
        run([plain[0], stoker.Source(sets[1], weight=0.3, cache_dir="/tmp"), plain[2]])
    with pytest.raises(ValueError, match=r"mixture source 1 .*cache is 0 or 1"):
        run([plain[0], stoker.Source(sets[1], weight=0.3, cache="maybe"), plain[2]])
    # A local source never uses the cache: cache=False changes nothing.
    assert run([plain[0], stoker.Source(sets[1], weight=0.3, cache=False), plain[2]]) == \
        run(plain)
    with pytest.raises(ValueError, match=r"mixture source 2 .*'fetch_retries' is the loader's"):
        run([*plain[:2], stoker.Source(sets[2], weight=0.2, fetch_retries=3)])


def test_moved_dataset_resumes(sets, tmp_path):
    """The fingerprint leaves the paths out: a state saved before the
    datasets moved resumes at their new paths, with the batches the
    uninterrupted run had."""
    import shutil
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    for p in sets:
        (shutil.copytree if p.is_dir() else shutil.copy)(p, a / p.name)

    def make(root):
        return stoker.Loader([stoker.Source(root / p.name, weight=w)
                              for p, w in zip(sets, (0.5, 0.3, 0.2))], 10,
                             fields={"image": "image;jpg"}, transform="Resize((8, 8))",
                             samples_per_epoch=60, seed=6, threads=2)
    with make(a) as ld:
        it = iter(ld)
        for _ in range(2):
            next(it)
        state = ld.state_dict()
        rest = [x["image"].clone() for x in it]
    shutil.move(str(a), str(b))
    with make(b) as ld:
        ld.load_state_dict(state)
        got = [x["image"].clone() for x in ld]
    assert len(got) == len(rest) == 4
    assert all(torch.equal(x, y) for x, y in zip(got, rest))


def test_per_source_blocks_over_http(sets, tmp_path):
    """A remote .stk with its own order="blocks" (the loader's order global)
    is read through the fetch stage exactly as under the loader's blocks
    order, and as the same .stk read locally."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "servers"))
    import stk_servers
    www = tmp_path / "www"
    www.mkdir()
    assert stoker.pack(sets[1], www / "green", threads=2)["samples"] == 30

    def run(green, own, **kw):
        srcs = [stoker.Source(sets[0], weight=0.5),
                stoker.Source(green, weight=0.5,
                              **({"order": "blocks", "block_bytes": "8K"} if own else {}))]
        with stoker.Loader(srcs, 10, fields={"image": "image;jpg"}, return_indices=True,
                           transform="Resize((8, 8))", samples_per_epoch=40, seed=8,
                           threads=2, **kw) as ld:
            return [(b["__index__"].clone(), b["image"].clone()) for b in ld]

    def same(a, b):
        return len(a) == len(b) and all(torch.equal(i1, i2) and torch.equal(x1, x2)
                                        for (i1, x1), (i2, x2) in zip(a, b))

    want = run(www / "green", own=False, order="blocks", options={"block_bytes": "8K"})
    assert len(want) == 4
    assert same(run(www / "green", own=True), want)
    assert not same(run(www / "green", own=False), want)   # the order shows
    with stk_servers.Nginx(www) as http:
        got = run(f"{http.url}/green", own=True)
        assert any(q["path"].endswith(".stk") for q in http.requests())
    assert same(got, want)
