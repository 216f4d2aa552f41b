"""MDS, LitData and TFRecord read from S3 (issue 21; src/source/remote_files.c,
docs/remote.md): copies of the fixtures written by each format's own writer
(../shared/fixtures) uploaded to an S3 server that checks SigV4 signatures,
read through the disk cache with fields, give the same dict batches as the
local read field for field, and the image bytes, captions and labels of the
fixtures' manifests; the second open downloads nothing (requests counted at
the server); a prefix of TFRecord files is listed. tests/c/test_remote.c
covers HTTP, the bad shards and the messages under the sanitizers."""

import hashlib
import json
import os
import pathlib
import sys

import pytest

import stoker

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "servers"))

import stk_servers  # noqa: E402  (tests/servers, stdlib only)

KEY_ID, SECRET = "stokerkey", "stokersecret+/="

# variant -> (image, caption, label) source fields, as the manifest names them.
SETS = {
    "mds/zstd": ("image", "caption", "label"),
    "litdata/plain": ("image", "caption", "label"),
    "tfrecord/plain": ("image/encoded", "caption", "image/class/label"),
}


def _fixtures():
    env = os.environ.get("STOKER_FIXTURES")
    for c in ([env] if env else []) + [ROOT / "../shared/fixtures", ROOT / "../../shared/fixtures",
                                       "/work/shared/fixtures"]:
        p = pathlib.Path(c)
        if (p / "mds" / "plain.manifest.json").is_file():
            return p
    pytest.fail("the fixtures (../shared/fixtures or $STOKER_FIXTURES) are missing")



def epoch(path, fields, **kw):
    out = []
    with stoker.Loader(path, 8, seed=3, threads=2, fields=fields, return_indices=True, **kw) as L:
        for b in L:
            out.append({k: (v.clone() if hasattr(v, "clone") else list(v)) for k, v in b.items()})
    return out


def put_files(srv, prefix, local):
    """Uploads the dataset's own files (not the index caches other tests
    write beside local fixtures)."""
    for p in sorted(pathlib.Path(local).rglob("*")):
        if p.is_file() and not p.name.endswith(".stkidx"):
            srv.put_file("bkt", f"{prefix}/{p.relative_to(local)}", str(p))


def test_s3_formats_through_the_cache(aws_env, tmp_path):
    fx = _fixtures()
    with stk_servers.S3Server(KEY_ID, SECRET) as srv:
        srv.create_bucket("bkt")
        for variant in SETS:
            put_files(srv, f"fx/{variant}", fx / variant)
        aws_env.setenv("AWS_ENDPOINT_URL", srv.endpoint)
        for variant, (img, cap, lab) in SETS.items():
            man = json.loads((fx / f"{variant}.manifest.json").read_text())["samples"]
            fields = {"image": stoker.Field(img, "bytes"), "caption": cap, "label": lab}
            local = epoch(str(fx / variant), fields)
            srv.clear_requests()
            remote = epoch(f"s3://bkt/fx/{variant}", fields, cache_dir=tmp_path / "c")
            cold = srv.requests()
            assert len(remote) == len(local) == 8, variant
            seen = set()
            for rb, lb in zip(remote, local):
                assert rb["__index__"].tolist() == lb["__index__"].tolist(), variant
                assert rb["caption"] == lb["caption"] and rb["image"] == lb["image"], variant
                assert rb["label"].tolist() == lb["label"].tolist(), variant
                for s, i in enumerate(rb["__index__"].tolist()):
                    m = man[i]
                    assert hashlib.sha256(rb["image"][s]).hexdigest() == m["sha256"], (variant, i)
                    assert rb["caption"][s] == m["caption"] and int(rb["label"][s]) == m["label"]
                    seen.add(i)
            assert seen == set(range(60)), variant
            assert all(r["signed"] for r in cold)
            whole = [r for r in cold if r["method"] == "GET" and not r.get("range")
                     and "list-type" not in r["uri"]]
            assert len(whole) >= 2, (variant, cold)
            # Warm: nothing downloaded again.
            srv.clear_requests()
            again = epoch(f"s3://bkt/fx/{variant}", fields, cache_dir=tmp_path / "c")
            warm = srv.requests()
            assert [b["__index__"].tolist() for b in again] == \
                [b["__index__"].tolist() for b in local]
            big = [r for r in warm if r["method"] == "GET" and not r.get("range")
                   and not r["path"].endswith(("index.json", "stoker.manifest"))
                   and "list-type" not in r["uri"]]
            assert big == [], (variant, big)


def test_s3_parquet_by_row_groups_without_a_cache(aws_env):
    """Parquet in S3 without cache_dir (issue 21: "a row group is the unit
    the fetch stage and cache fetch remotely"): read by ranged GETs, the
    footers at the open and one GET a row group, never a whole object; the
    same batches as the local read, field for field, and the manifest's."""
    fx = _fixtures()
    variant = "parquet/snappy"
    with stk_servers.S3Server(KEY_ID, SECRET) as srv:
        srv.create_bucket("bkt")
        put_files(srv, f"fx/{variant}", fx / variant)
        aws_env.setenv("AWS_ENDPOINT_URL", srv.endpoint)
        man = json.loads((fx / f"{variant}.manifest.json").read_text())["samples"]
        fields = {"image": stoker.Field("image", "bytes"), "caption": "caption", "label": "label"}
        local = epoch(str(fx / variant), fields)
        srv.clear_requests()
        remote = epoch(f"s3://bkt/fx/{variant}", fields)
        reqs = srv.requests()
        assert len(remote) == len(local) == 8
        for rb, lb in zip(remote, local):
            assert rb["__index__"].tolist() == lb["__index__"].tolist()
            assert rb["caption"] == lb["caption"] and rb["image"] == lb["image"]
            assert rb["label"].tolist() == lb["label"].tolist()
            for s, i in enumerate(rb["__index__"].tolist()):
                assert hashlib.sha256(rb["image"][s]).hexdigest() == man[i]["sha256"]
        gets = [r for r in reqs if r["method"] == "GET" and r["path"].endswith(".parquet")]
        assert gets and all(r.get("range") for r in gets), gets
        # 2 files of 2 row groups: a probe and a tail a file, a label chunk
        # and a unit a row group; not one a row (60).
        assert len(gets) == 2 * 2 + 4 + 4, gets


def test_s3_bucket_of_class_folders(aws_env, tmp_path):
    """Unpacked objects in a bucket (prefix/CLASS/NAME.jpg, issue 21 item
    5): listed below the prefix, each object a sample through the fetch
    stage; the same batches as the local ImageFolder they were uploaded
    from, each sample fetched by one GET of the whole object."""
    import numpy as np
    from PIL import Image
    src = tmp_path / "folder"
    rng = np.random.default_rng(5)
    n = 0
    for c in ("cat", "dog", "eel"):
        (src / c).mkdir(parents=True)
        for k in range(5 + len(c)):
            a = rng.integers(0, 255, (20 + k, 24, 3), dtype=np.uint8)
            Image.fromarray(a).save(src / c / f"{k:03d}.jpg", quality=90)
            n += 1
    (src / "README.txt").write_text("not a sample")

    def batches(path, **kw):
        with stoker.Loader(path, 4, seed=9, threads=2, transform="RandomResizedCrop(16)",
                           output="numpy", return_indices=True, **kw) as L:
            assert L.num_samples == n
            return [(x.copy(), y.copy(), i.copy()) for x, y, i in L]

    local = batches(str(src))
    # A plain HTTP server's index pages (nginx autoindex, HTML and JSON).
    for fmt in ("html", "json"):
        with stk_servers.Nginx(tmp_path, autoindex=fmt) as web:
            got = batches(f"{web.url}/folder")
            reqs = web.requests()
        assert len(got) == len(local), fmt
        for (xr, yr, ir), (xl, yl, il) in zip(got, local):
            assert (ir == il).all() and (yr == yl).all() and (xr == xl).all(), fmt
        pages = [r for r in reqs if r["path"].endswith("/") or r["path"].endswith("folder")]
        assert 4 <= len(pages) <= 6, (fmt, pages)  # the root (and its redirect), 3 classes
    with stk_servers.S3Server(KEY_ID, SECRET) as srv:
        srv.create_bucket("bkt")
        put_files(srv, "imgs", src)
        aws_env.setenv("AWS_ENDPOINT_URL", srv.endpoint)
        srv.clear_requests()
        remote = batches("s3://bkt/imgs")
        reqs = srv.requests()
        # Packed once to .stk (what the docs advise), it reads the same.
        r = stoker.pack("s3://bkt/imgs", tmp_path / "packed", threads=2)
        assert r["samples"] == n and r["skipped"] == 0
    assert [y.tolist() for _, y, _ in batches(str(tmp_path / "packed"))] == \
        [y.tolist() for _, y, _ in local]
    assert len(remote) == len(local)
    for (xr, yr, ir), (xl, yl, il) in zip(remote, local):
        assert (ir == il).all() and (yr == yl).all() and (xr == xl).all()
    assert sorted(set(int(y) for _, ys, _ in local for y in ys)) == [0, 1, 2]
    # Each sample is one GET of its whole object (the fetch stage plans
    # past the epoch's end, so a 24-sample epoch is fetched more than once).
    sizes = {f"/bkt/imgs/{p.relative_to(src)}": p.stat().st_size
             for p in src.rglob("*.jpg")}
    # (Requests the loader's close cancelled are logged unfinished, with
    # Koa's default status 404.)
    gets = [r for r in reqs if r["method"] == "GET" and r["path"].endswith(".jpg")
            and r["completed"]]
    assert {r["path"] for r in gets} == set(sizes)
    bad = [(r["path"], r["range"], r["status"]) for r in gets
           if r["status"] not in (200, 206) or r["range"] != f"bytes=0-{sizes[r['path']] - 1}"]
    assert bad == []
    assert any("list-type" in r["uri"] for r in reqs)


def test_http_bucket_listing_kept_in_the_cache(tmp_path, capfd):
    """nginx autoindex pages (issue 21 item 5): with cache_dir the listing
    is kept, and the next open fetches no index page; listing_ttl=0 lists
    again; a damaged kept listing is ignored with a warning (a
    stoker.StokerWarning) and replaced."""
    from PIL import Image
    import numpy as np
    src = tmp_path / "www" / "folder"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(np.full((8, 8, 3), 40 * k, np.uint8)).save(src / c / f"{k}.jpg")
    cache = tmp_path / "cache"
    with stk_servers.Nginx(tmp_path / "www", autoindex="json") as web:
        url = f"{web.url}/folder"

        def pages(**kw):
            web.clear_requests()
            with stoker.Loader(url, 2, threads=1, transform="RandomResizedCrop(4)",
                               output="numpy", cache_dir=str(cache), **kw) as L:
                assert L.num_samples == 6
                assert sum(len(y) for _, y in L) == 6
            # The index pages (the manifest's and index.json's probes are
            # GETs of objects, made on every open).
            return [r for r in web.requests()
                    if r["path"].endswith("/") or r["path"] == "/folder"]

        assert len(pages()) >= 3  # the folder's page (and its redirect), each class's
        assert pages() == []
        assert len(pages(options={"listing_ttl": "0"})) >= 3
        assert pages() == []
        kept = list((cache / "stoker-listing").glob("*.stklist"))
        assert len(kept) == 1
        kept[0].write_bytes(kept[0].read_bytes()[:-1] + b"\0")
        capfd.readouterr()
        # The warning comes through Python's warnings, not stderr.
        with pytest.warns(stoker.StokerWarning, match="cached listing .*listing the objects"):
            assert len(pages()) >= 3
        assert "cached listing" not in capfd.readouterr().err
        assert pages() == []
        # Objects changed under a kept listing, read through the fetch stage
        # (a fresh object cache beside the kept listing): the removed one and
        # the resized one fail by name, the others are delivered, and nothing
        # is listed.
        import shutil
        (src / "cat" / "1.jpg").unlink()
        with open(src / "dog" / "2.jpg", "ab") as f:
            f.write(b"\0" * 50)
        fresh = [tmp_path / "fresh1", tmp_path / "fresh2"]
        for d in fresh:
            shutil.copytree(cache / "stoker-listing", d / "stoker-listing")
        web.clear_requests()
        with stoker.Loader(url, 2, threads=1, transform="RandomResizedCrop(4)", output="numpy",
                           cache_dir=str(fresh[0]), on_error="skip") as L:
            assert L.num_samples == 6
            assert sum(len(y) for _, y in L) == 4
        with pytest.raises(Exception, match=r"/folder/cat/1\.jpg.*404"):
            with stoker.Loader(url, 1, threads=1, transform="RandomResizedCrop(4)",
                               output="numpy", cache_dir=str(fresh[1]), shuffle=False) as L:
                for _ in L:
                    pass
        assert [r for r in web.requests() if r["path"].endswith("/")] == []
