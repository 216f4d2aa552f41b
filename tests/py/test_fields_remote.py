"""Samples with fields from every place a dataset can live (issue 20's tests,
docs/multimodal.md): a CLIP-style multi-field tar set made by
scripts/make-multimodal.py, and the same set packed into .stk shards by
stoker.pack (which keeps every field), read locally, over HTTP (nginx) and
over S3 (an S3 server that checks SigV4), the tars through the cache, give
the same dict batches field by field; and the batches are identical for 1, 2
and 8 threads with a second image field under its own transform."""

import importlib.util
import io
import os
import sys

import numpy as np
import pytest
import torch

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))

import stk_servers  # noqa: E402  (tests/servers, stdlib only)

# The generator's file name has a dash: import it by path.
_spec = importlib.util.spec_from_file_location(
    "make_multimodal", os.path.join(ROOT, "scripts", "make-multimodal.py"))
mm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mm)

KEY_ID, SECRET = "stokerkey", "stokersecret+/="
SAMPLES, SHARD = 30, 10
TARS = "mm-{000000..000002}.tar"
FIELDS = {"image": "jpg", "caption": "txt", "meta": "json", "label": "cls", "arr": "npy"}
RRC = "RandomResizedCrop(32)|RandomHorizontalFlip()"
SEG = "RandomResizedCrop(16)|RandomHorizontalFlip()"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """www/tars: the tar shards and manifest.json; www/stk: the same
    samples packed (several .stk shards and a stoker.manifest)."""
    www = tmp_path_factory.mktemp("fields-remote") / "www"
    m = mm.make(www / "tars", samples=SAMPLES, shard_size=SHARD, image_side=(40, 64), seed=11)
    assert [s["samples"] for s in m["shards"]] == [SHARD] * (SAMPLES // SHARD)
    r = stoker.pack(www / "tars", www / "stk", threads=2, shard_size=30000)
    assert r["payload"] == "fields" and r["samples"] == SAMPLES and r["skipped"] == 0
    assert r["shards"] >= 2
    return {"www": www, "manifest": m}


def keep(x):
    """A copy of a batch that holds no ring buffer."""
    if isinstance(x, dict):
        return {k: keep(v) for k, v in x.items()}
    if isinstance(x, list):
        return [keep(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.clone()
    return x


def same_batches(got, want, what):
    """Epochs of dict batches equal field by field: tensors of one dtype
    and shape equal, lists (str, parsed JSON) equal."""
    assert len(got) == len(want), what
    for e, (ge, we) in enumerate(zip(got, want)):
        assert len(ge) == len(we), (what, e)
        for n, (x, y) in enumerate(zip(ge, we)):
            assert list(x) == list(y), (what, e, n)
            for k in x:
                a, b = x[k], y[k]
                if isinstance(b, torch.Tensor):
                    assert isinstance(a, torch.Tensor) and a.dtype == b.dtype, (what, e, n, k)
                    assert a.shape == b.shape and torch.equal(a, b), (what, e, n, k)
                else:
                    assert isinstance(a, list) and a == b, (what, e, n, k)


def epochs(path, n=2, **kw):
    """n epochs of dict batches (with __index__) from a loader of path."""
    kw.setdefault("fields", FIELDS)
    kw.setdefault("transform", {"image": RRC})
    kw.setdefault("threads", 2)
    out = []
    with stoker.Loader(path, 7, seed=5, return_indices=True, **kw) as L:
        for e in range(n):
            L.set_epoch(e)
            out.append([keep(b) for b in L])
    return out


def check_against_manifest(runs, m):
    """Every sample once an epoch, each field what the generator wrote."""
    for run in runs:
        seen = []
        for b in run:
            assert b["image"].shape[1:] == (3, 32, 32) and b["image"].dtype == torch.uint8
            for s, i in enumerate(b["__index__"].tolist()):
                f = m["samples"][i]["fields"]
                assert b["caption"][s] == f["txt"]["text"]
                assert b["meta"][s] == f["json"]["value"]
                assert int(b["label"][s]) == f["cls"]["value"]
                assert b["arr"][s].tolist() == f["npy"]["values"]
                seen.append(i)
        assert sorted(seen) == list(range(SAMPLES))


@pytest.fixture(scope="module")
def local(data):
    """The reference: the local tars, checked against the manifest."""
    want = epochs(str(data["www"] / "tars" / TARS))
    check_against_manifest(want, data["manifest"])
    assert want[0] != [] and len(want[0]) == (SAMPLES + 6) // 7
    return want


def test_local_stk_packed_from_the_tars(data, local):
    same_batches(epochs(data["www"] / "stk"), local, "local .stk")
    # A directory of tars reads as the brace pattern does.
    same_batches(epochs(data["www"] / "tars"), local, "local tar directory")


def test_http_stk_and_tars_through_the_cache(data, local, tmp_path):
    with stk_servers.Nginx(data["www"]) as srv:
        same_batches(epochs(f"{srv.url}/stk"), local, ".stk over HTTP")
        same_batches(epochs(f"{srv.url}/tars/{TARS}", cache_dir=tmp_path / "c"), local,
                     "tar over HTTP")
        reqs = srv.requests()
    stk = [r for r in reqs if r["path"].endswith(".stk")]
    tars = [r for r in reqs if r["path"].endswith(".tar")]
    assert stk and all(r["status"] in (200, 206) for r in stk)
    # The tars came whole into the cache, each once.
    assert sorted(r["path"].rsplit("/", 1)[1] for r in tars if not r["range"]) == \
        ["mm-%06d.tar" % k for k in range(SAMPLES // SHARD)]



def test_s3_stk_and_tars_through_the_cache(data, local, aws_env, tmp_path):
    with stk_servers.S3Server(KEY_ID, SECRET) as srv:
        srv.create_bucket("bkt")
        srv.put_dir("bkt", "mm/stk", data["www"] / "stk")
        srv.put_dir("bkt", "mm/tars", data["www"] / "tars")
        aws_env.setenv("AWS_ENDPOINT_URL", srv.endpoint)
        same_batches(epochs("s3://bkt/mm/stk"), local, ".stk over S3")
        same_batches(epochs(f"s3://bkt/mm/tars/{TARS}", cache_dir=tmp_path / "c"), local,
                     "tar over S3")
        reqs = srv.requests()
    assert any(r["path"].endswith(".stk") for r in reqs)
    assert any(r["path"].endswith(".tar") for r in reqs)
    assert all(r["signed"] for r in reqs)


def test_threads_1_2_8_with_a_second_image_field(data):
    """Identical batches for any thread count, with seg.png decoded and
    cropped by its own transform (draws keyed by the field, not the thread)."""
    fields = dict(FIELDS, seg="seg.png")
    tf = {"image": RRC, "seg": SEG}
    runs = {t: epochs(data["www"] / "tars", fields=fields, transform=tf, threads=t)
            for t in (1, 2, 8)}
    check_against_manifest(runs[1], data["manifest"])
    for b in runs[1][0]:
        assert b["seg"].shape[1:] == (3, 16, 16) and b["seg"].dtype == torch.uint8
    same_batches(runs[2], runs[1], "2 threads")
    same_batches(runs[8], runs[1], "8 threads")


def test_second_image_field_is_the_seg_member(data):
    """Decoded without a crop, the seg field is the seg.png member's pixels
    (P mode, its palette applied), as PIL decodes them."""
    from PIL import Image
    m, tars = data["manifest"], data["www"] / "tars"
    with stoker.Loader(tars, 8, fields={"seg": "seg.png", "image": "jpg"}, shuffle=False,
                       transform={"seg": "decode", "image": RRC}, return_indices=True) as L:
        n = 0
        for b in L:
            assert b["image"].shape[1:] == (3, 32, 32)
            for s, i in enumerate(b["__index__"].tolist()):
                png = mm.member_bytes(tars, m["samples"][i], "seg.png")
                want = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
                assert b["seg"][s].shape == want.shape
                assert np.array_equal(b["seg"][s].numpy(), want), i
                n += 1
    assert n == SAMPLES
