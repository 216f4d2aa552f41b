"""Remote datasets (docs/remote.md) against real servers on loopback, started
and stopped by the tests: nginx serving a packed dataset, an S3 server that
checks SigV4 signatures, and a fault-injecting HTTP server. Each test compares
what arrives with the same shards read from local disk, bit for bit."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
STOKER = os.path.join(ROOT, "build", "release", "stoker")

import stk_servers  # noqa: E402  (tests/servers, stdlib only)

KEY_ID, SECRET = "stokerkey", "stokersecret+/="


def _batches(loader):
    out = []
    for images, labels in loader:
        out.append((np.array(images, copy=True), np.array(labels, copy=True)))
    return out


def _same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert np.array_equal(ya, yb)
        assert np.array_equal(xa, xb)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A packed dataset of real JPEGs (4 classes x 24 images) in 5+ shards."""
    from PIL import Image
    if not os.access(STOKER, os.X_OK):
        pytest.fail(f"{STOKER} is missing: the test command builds it first")
    base = tmp_path_factory.mktemp("remote")
    src = base / "src"
    rng = np.random.default_rng(7)
    for c in range(4):
        d = src / f"class{c}"
        d.mkdir(parents=True)
        for k in range(24):
            h, w = 40 + (k * 7) % 50, 48 + (k * 11) % 60
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(img).save(d / f"img{k:03d}.jpg", quality=90)
    out = base / "www" / "ds"
    out.parent.mkdir()
    subprocess.run([STOKER, "pack", str(src), str(out), "--shard-size", "40K", "--quiet"],
                   check=True)
    shards = sorted(p.name for p in out.iterdir() if p.name.endswith(".stk"))
    assert len(shards) >= 5
    return {"www": base / "www", "local": out, "shards": shards}


def _loader(path, **kw):
    kw.setdefault("transform", "imagenet-train")
    kw.setdefault("size", 32)
    return stoker.Loader(path, 8, output="numpy", seed=3, threads=2, **kw)


def _bench(path, *args):
    r = subprocess.run([STOKER, "bench", path, "--batch-size", "8", "--seed", "3", "--json",
                        *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---- HTTP (nginx) --------------------------------------------------------------

def test_http_directory_gives_the_local_batches(packed):
    with stk_servers.Nginx(packed["www"]) as srv:
        url = f"{srv.url}/ds"
        with _loader(url) as remote, _loader(packed["local"]) as local:
            assert remote.info()["source_kind"] == "stk"
            for epoch in range(2):
                remote.set_epoch(epoch)
                local.set_epoch(epoch)
                _same(_batches(remote), _batches(local))
            st = remote.stats()["fetch"]
            assert local.stats()["fetch"] is None
        assert st["requests"] > 0 and st["failures"] == 0 and st["retries"] == 0
        assert st["sample_bytes"] > 0
        # The request governor: nothing throttled, the budget at its default.
        assert st["throttled"] == 0 and st["rate_limit"] == 5500
        # Hedging is counted (a hedge is a request; at most 5 % of them).
        assert 0 <= st["hedge_wins"] <= st["hedges"] and st["hedges"] * 20 <= st["requests"]
        reqs = srv.requests()
        # Samples came by ranged GETs; nothing else was asked for.
        assert all(r["status"] in (200, 206) for r in reqs)
        assert any(r["range"] for r in reqs)


def test_http_pattern_single_shard_and_raw_bytes(packed):
    shards = packed["shards"]
    with stk_servers.Nginx(packed["www"]) as srv:
        one = f"{srv.url}/ds/{shards[1]}"
        with _loader(one, transform=None, size=None) as r, \
                _loader(packed["local"] / shards[1], transform=None, size=None) as l:
            rb = [([np.array(a, copy=True) for a in x], np.array(y, copy=True)) for x, y in r]
            lb = [([np.array(a, copy=True) for a in x], np.array(y, copy=True)) for x, y in l]
            assert len(rb) == len(lb)
            for (xr, yr), (xl, yl) in zip(rb, lb):
                assert np.array_equal(yr, yl)
                assert all(np.array_equal(a, b) for a, b in zip(xr, xl))
        first, last = shards[0][:-4], shards[2][:-4]  # part-000000 .. part-000002
        pat = f"{srv.url}/ds/part-{{{first[-6:]}..{last[-6:]}}}.stk"
        lpat = f"{packed['local']}/part-{{{first[-6:]}..{last[-6:]}}}.stk"
        with _loader(pat) as r, _loader(lpat) as l:
            _same(_batches(r), _batches(l))


def test_cli_bench_info_verify_over_http(packed):
    with stk_servers.Nginx(packed["www"]) as srv:
        url = f"{srv.url}/ds"
        rj, lj = _bench(url, "--transform", "imagenet-train", "--size", "32"), \
            _bench(str(packed["local"]), "--transform", "imagenet-train", "--size", "32")
        assert rj["checksum"] == lj["checksum"]
        assert rj["fetch"]["requests"] > 0 and "fetch" not in lj
        info = subprocess.run([STOKER, "info", url], capture_output=True, text=True)
        assert info.returncode == 0 and "96" in info.stdout, info.stderr
        ver = subprocess.run([STOKER, "verify", url], capture_output=True, text=True)
        assert ver.returncode == 0 and "96 samples checked, 0 corrupt" in ver.stdout


def test_http_missing_dataset_and_credentials_never_echoed(packed):
    with stk_servers.Nginx(packed["www"]) as srv:
        host = srv.url.split("://", 1)[1]
        with pytest.raises(Exception) as e:
            _loader(f"http://alice:hunter2@{host}/nothing-here")
        assert "hunter2" not in str(e.value) and "nothing-here" in str(e.value)
        r = subprocess.run([STOKER, "bench", f"http://alice:hunter2@{host}/ds/part-9.stk?sig=s3cr3t"],
                           capture_output=True, text=True)
        assert r.returncode == 1
        assert "hunter2" not in r.stderr and "s3cr3t" not in r.stderr
        assert "part-9.stk" in r.stderr and "404" in r.stderr


# ---- the disk cache ---------------------------------------------------------------

# The cache keeps its entries in this subdirectory of cache_dir, and touches
# nothing else (docs/remote.md).
SUB = "stoker-cache"


def _dir_bytes(d):
    total = 0
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if os.path.isfile(p) and not name.startswith("."):
            try:
                total += os.path.getsize(p)
            except FileNotFoundError:
                pass
    return total


def test_cache_cold_then_warm_reads_no_data(packed, tmp_path):
    cache = tmp_path / "cache"
    with stk_servers.Nginx(packed["www"]) as srv:
        url = f"{srv.url}/ds"
        with _loader(packed["local"]) as l:
            want = _batches(l)
        with _loader(url, cache_dir=cache) as r:
            _same(_batches(r), want)
            cold = r.stats()["fetch"]
        assert cold["cache_misses"] == len(packed["shards"])
        n_cold = len(srv.requests())
        with _loader(url, cache_dir=cache) as r:
            _same(_batches(r), want)
            warm = r.stats()["fetch"]
        assert warm["cache_hits"] >= len(packed["shards"]) and warm["cache_misses"] == 0
        # A warm run asks only for the manifest and the shards' headers,
        # footers and indexes: no payload byte.
        warm_reqs = srv.requests()[n_cold:]
        assert warm["sample_bytes"] > 0
        assert sum(r["bytes"] for r in warm_reqs) < 20000
    # Whole shards, under their URL-hash names, no partial downloads left.
    names = os.listdir(cache / SUB)
    assert not [n for n in names if n.endswith(".part")]
    assert sorted(n.split("-", 1)[1] for n in names if n.endswith(".stk")) == packed["shards"]


def test_cache_limit_holds_at_every_moment(packed, tmp_path):
    cache = tmp_path / "small"
    sizes = [os.path.getsize(packed["local"] / s) for s in packed["shards"]]
    limit = 2 * max(sizes) + 1000
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            if (cache / SUB).exists():
                peak[0] = max(peak[0], _dir_bytes(cache / SUB))
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    try:
        with stk_servers.Nginx(packed["www"]) as srv, _loader(packed["local"]) as l:
            want = _batches(l)
            with _loader(f"{srv.url}/ds", cache_dir=cache, cache_limit=limit) as r:
                for epoch in range(2):
                    r.set_epoch(epoch)
                    l.set_epoch(epoch)
                    _same(_batches(r), _batches(l) if epoch else want)
                st = r.stats()["fetch"]
    finally:
        stop.set()
        t.join()
    assert 0 < peak[0] <= limit
    assert st["cache_fallbacks"] > 0  # what did not fit was read by ranges


def test_cache_discards_stale_partial_and_reuses_complete(packed, tmp_path):
    cache = tmp_path / "c"
    with stk_servers.Nginx(packed["www"]) as srv:
        url = f"{srv.url}/ds"
        with _loader(url, cache_dir=cache) as r:
            _batches(r)
        cache = cache / SUB
        entries = sorted(n for n in os.listdir(cache) if n.endswith(".stk"))
        # A killed writer leaves KEY.part with nobody holding its lock; a
        # complete entry removed stands for one that was never finished.
        victim = entries[0]
        os.rename(cache / victim, cache / (victim + ".part"))
        with open(cache / (victim + ".part"), "r+b") as f:
            f.truncate(100)
        with _loader(url, cache_dir=cache.parent) as r, _loader(packed["local"]) as l:
            _same(_batches(r), _batches(l))
            st = r.stats()["fetch"]
        assert st["cache_misses"] == 1 and st["cache_hits"] >= len(entries) - 1
        assert not [n for n in os.listdir(cache) if n.endswith(".part")]


def test_kill_mid_download_then_restart(packed, tmp_path):
    cache = tmp_path / "k"
    # The first attempt of every request stalls half way: the index reads are
    # retried after the stall timeout, and the first shard download stays a
    # .part when the process is killed.
    plan = [{"kind": "stall", "seconds": 60, "fraction": 0.5, "first_attempts": 1,
             "path": "/ds/*.stk"}]
    with stk_servers.FaultServer(packed["www"], plan) as slow:
        p = subprocess.Popen([STOKER, "bench", f"{slow.url}/ds", "--cache-dir", str(cache),
                              "--batch-size", "8", "--fetch-timeout", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline and not ((cache / SUB).exists() and any(
                n.endswith(".part") for n in os.listdir(cache / SUB))):
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
    with stk_servers.Nginx(packed["www"]) as srv:
        with _loader(f"{srv.url}/ds", cache_dir=cache) as r, _loader(packed["local"]) as l:
            _same(_batches(r), _batches(l))
    assert not [n for n in os.listdir(cache / SUB) if n.endswith(".part")]


def test_cache_leaves_other_files_alone(packed, tmp_path):
    # Issue 18: every file in cache_dir was taken for an entry; a browser's
    # .part was deleted at open and a .tex evicted.
    cache = tmp_path / "downloads"
    cache.mkdir()
    mine = {"x.tex": b"\\documentclass{article}", "browser.part": b"half a file",
            "0123456789abcdef-old.stk": b"looks like an entry"}
    for name, data in mine.items():
        (cache / name).write_bytes(data)
    sizes = [os.path.getsize(packed["local"] / s) for s in packed["shards"]]
    kw = dict(order="shards", shard_window=1)
    # fetch_lookahead only on the remote loader: a local path refuses it.
    with stk_servers.Nginx(packed["www"]) as srv, _loader(packed["local"], **kw) as l:
        with _loader(f"{srv.url}/ds", cache_dir=cache, cache_limit=2 * max(sizes) + 1000,
                     options={"fetch_lookahead": "16"}, **kw) as r:
            for epoch in range(3):
                r.set_epoch(epoch)
                l.set_epoch(epoch)
                _same(_batches(r), _batches(l))
            st = r.stats()["fetch"]
    assert st["cache_evictions"] > 0 and st["cache_write_errors"] == 0
    for name, data in mine.items():
        assert (cache / name).read_bytes() == data
    assert (cache / SUB / "VERSION").is_file()


def test_two_processes_share_one_cache_and_download_each_shard_once(packed, tmp_path):
    cache = tmp_path / "shared"
    with stk_servers.Nginx(packed["www"]) as srv:
        url = f"{srv.url}/ds"
        procs = [subprocess.Popen([STOKER, "bench", url, "--cache-dir", str(cache),
                                   "--batch-size", "8", "--rank", str(r), "--world-size", "2",
                                   "--json"], stdout=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        # A download into the cache: ranged parts of 8 MiB, here one part (the
        # whole shard) each.
        sizes = {s: os.path.getsize(packed["local"] / s) for s in packed["shards"]}
        whole = [r for r in srv.requests() if r["path"].rsplit("/", 1)[1] in sizes and
                 r["range"] == f"bytes=0-{sizes[r['path'].rsplit('/', 1)[1]] - 1}"]
        paths = sorted(r["path"].rsplit("/", 1)[1] for r in whole)
        assert paths == packed["shards"]  # each shard downloaded exactly once
    assert sum(o["fetch"]["cache_misses"] for o in outs) == len(packed["shards"])


# ---- S3 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3(packed):
    with stk_servers.S3Server(KEY_ID, SECRET) as srv:
        srv.create_bucket("bkt")
        srv.put_dir("bkt", "sets/ds", packed["local"])
        # No manifest, keys that need encoding, and more keys than a page.
        for name in packed["shards"]:
            srv.put("bkt", f"odd keys/a b+c=d é/{name}",
                    (packed["local"] / name).read_bytes())
        for k in range(1005):
            srv.put("bkt", f"paged/aaa-{k:05d}.txt", b"x")
        for name in packed["shards"]:
            srv.put("bkt", f"paged/zzz-{name}", (packed["local"] / name).read_bytes())
        yield srv



def test_s3_manifest_listing_paging_and_odd_keys(packed, s3, aws_env):
    aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    with _loader(packed["local"]) as l:
        want = _batches(l)
    for url in ("s3://bkt/sets/ds", "s3://bkt/odd keys/a b+c=d é", "s3://bkt/paged"):
        with _loader(url) as r:
            _same(_batches(r), want)


def test_s3_endpoint_option_and_profile_credentials(packed, s3, aws_env, tmp_path):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[train]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n")
    aws_env.setenv("AWS_PROFILE", "train")
    with _loader("s3://bkt/sets/ds", options={"endpoint": s3.endpoint}) as r, \
            _loader(packed["local"]) as l:
        _same(_batches(r), _batches(l))


def test_mixture_of_http_s3_and_local_sources_gives_the_local_batches(packed, s3, aws_env,
                                                                    tmp_path):
    """A mixture of a local folder, a dataset over HTTP and the same over S3
    (two stores, one fetch stage, one disk cache) gives the batches of the
    mixture read from local copies, bit for bit (docs/mixing.md)."""
    aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    folder = packed["www"].parent / "src"

    def mix(a, b):
        return [stoker.Source(str(folder), weight=0.2), stoker.Source(str(a), weight=0.4),
                stoker.Source(str(b), weight=0.3)]

    with _loader(mix(packed["local"], packed["local"])) as l:
        want = [_batches(l)]
        l.set_epoch(1)
        want.append(_batches(l))
    with stk_servers.Nginx(packed["www"]) as srv:
        for cache in (None, tmp_path / "cache", tmp_path / "cache"):
            opts = {"cache_dir": str(cache)} if cache else {}
            with _loader(mix(f"{srv.url}/ds", "s3://bkt/sets/ds"), options=opts) as r:
                for epoch in range(2):
                    r.set_epoch(epoch)
                    _same(_batches(r), want[epoch])
                st = r.stats()["fetch"]
            assert st["failures"] == 0 and st["sample_bytes"] > 0
        # The warm run asked the stores for no sample.
        assert st["cache_misses"] == 0 and st["cache_hits"] > 0
        assert any(r["range"] for r in srv.requests())


def test_s3_wrong_secret_fails_fast_naming_bucket_and_code(s3, aws_env):
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    t0 = time.time()
    r = subprocess.run([STOKER, "info", "s3://bkt/sets/ds", "--endpoint", s3.endpoint],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "s3://bkt/sets/ds" in r.stderr and "SignatureDoesNotMatch" in r.stderr
    assert "not-the-secret" not in r.stderr
    assert time.time() - t0 < 5  # no retry storm


def test_s3_missing_profile_fails_at_open_naming_the_files(s3, aws_env, tmp_path):
    # It used to fall back to unsigned requests and a 403 much later.
    aws_env.setenv("AWS_PROFILE", "nope")
    aws_env.setenv("AWS_CONFIG_FILE", str(tmp_path / "cfg"))
    r = subprocess.run([STOKER, "info", "s3://bkt/sets/ds", "--endpoint", s3.endpoint],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    want = (f"AWS profile 'nope' could not be found (looked in {tmp_path}/.aws/credentials "
            f"and {tmp_path}/cfg)")
    assert want in r.stderr
    assert SECRET not in r.stderr
    with pytest.raises(Exception) as e:
        _loader("s3://bkt/sets/ds", options={"endpoint": s3.endpoint})
    assert "AWS profile 'nope' could not be found" in str(e.value)


def test_s3_web_identity_credentials_sign_for_a_real_s3(packed, s3, aws_env, tmp_path):
    # STS (a stand-in) hands out the key pair the S3 server checks signatures with.
    import http.server
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "jwt").write_text("a.b.c\n")
    asked = []

    class Sts(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            import urllib.parse
            n = int(self.headers["Content-Length"])
            asked.append(dict(urllib.parse.parse_qsl(self.rfile.read(n).decode())))
            body = (f"<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>"
                    f"<Credentials><AccessKeyId>{KEY_ID}</AccessKeyId><SecretAccessKey>"
                    f"{SECRET}</SecretAccessKey><SessionToken>tok</SessionToken>"
                    f"<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                    f"</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sts)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "jwt"))
        aws_env.setenv("AWS_ROLE_ARN", "arn:aws:iam::1:role/r")
        aws_env.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{srv.server_address[1]}")
        aws_env.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        with _loader("s3://bkt/sets/ds") as r, _loader(packed["local"]) as l:
            _same(_batches(r), _batches(l))
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(asked) == 1
    assert asked[0]["Action"] == "AssumeRoleWithWebIdentity"
    assert asked[0]["WebIdentityToken"] == "a.b.c" and asked[0]["RoleArn"] == "arn:aws:iam::1:role/r"


# ---- faults -----------------------------------------------------------------------

def test_retries_deliver_every_sample_exactly_once(packed):
    plans = [[{"kind": "status", "status": 503, "retry_after": 1, "first_attempts": 1}],
             [{"kind": "status", "status": 429, "code": "SlowDown", "every": 3}],
             [{"kind": "reset", "fraction": 0.5, "first_attempts": 1}],
             [{"kind": "truncate", "fraction": 0.5, "first_attempts": 1}]]
    with _loader(packed["local"]) as l:
        want = _batches(l)
    for plan in plans:
        with stk_servers.FaultServer(packed["www"], plan) as srv:
            with _loader(f"{srv.url}/ds", options={"fetch_timeout": 2}) as r:
                got = _batches(r)
                st = r.stats()["fetch"]
            _same(got, want)
            assert st["retries"] > 0, plan
            assert st["failures"] == 0, plan


def test_past_the_retry_budget_the_sample_fails_cleanly(packed, tmp_path):
    import shutil
    bad = packed["shards"][2]
    www = tmp_path / "www"
    shutil.copytree(packed["local"], www / "ds")
    shutil.copytree(packed["local"], www / "ds-old")
    man = www / "ds-old" / "stoker.manifest"
    man.write_text("".join(ln for ln in man.read_text().splitlines(True)
                           if not ln.startswith("index ")))
    plan = [{"kind": "status", "status": 500, "path": f"/ds*/{bad}"}]
    with stk_servers.FaultServer(www, plan) as srv:
        url = f"{srv.url}/ds"
        # The dataset opens from its consolidated index (stoker.index),
        # without a request to the shards; the bad shard's samples fail,
        # naming it.
        with pytest.raises(Exception) as e:
            with _loader(url, options={"fetch_retries": 1}) as L:
                for _ in L:
                    pass
        assert bad in str(e.value) and "500" in str(e.value)
        # Opened shard by shard (a pack from before the index), the open
        # reads the bad shard's index: that fails, naming it.
        with pytest.raises(Exception) as e:
            _loader(url.replace("/ds", "/ds-old"), options={"fetch_retries": 1})
        assert bad in str(e.value) and "500" in str(e.value)


def test_broken_index_warns_through_python_warnings(packed, tmp_path, capfd):
    """A damaged or missing stoker.index is a warning (the shards are then
    opened one by one, giving the same batches): it arrives as a
    stoker.StokerWarning from the line that made the Loader, and nothing is
    written on stderr. A filter that makes it an error fails the open."""
    import shutil
    import warnings
    www = tmp_path / "www"
    shutil.copytree(packed["local"], www / "corrupt")
    shutil.copytree(packed["local"], www / "gone")
    ix = www / "corrupt" / "stoker.index"
    b = bytearray(ix.read_bytes())
    b[-40] ^= 0x10
    ix.write_bytes(bytes(b))
    (www / "gone" / "stoker.index").unlink()
    with _loader(packed["local"]) as local:
        want = _batches(local)
    assert issubclass(stoker.StokerWarning, RuntimeWarning)
    with stk_servers.Nginx(www) as srv:
        for name, says in (("corrupt", "checksum"), ("gone", "not there")):
            capfd.readouterr()
            with pytest.warns(stoker.StokerWarning, match=says) as caught:
                with _loader(f"{srv.url}/{name}") as L:
                    got = _batches(L)
            _same(got, want)
            msgs = [str(w.message) for w in caught if w.category is stoker.StokerWarning]
            assert len(msgs) == 1 and "stoker.index" in msgs[0], msgs
            assert "opening each shard instead" in msgs[0]
            assert caught[0].filename == __file__
            assert capfd.readouterr().err == ""
        with warnings.catch_warnings():
            warnings.simplefilter("error", stoker.StokerWarning)
            with pytest.raises(stoker.StokerWarning, match="not there"):
                _loader(f"{srv.url}/gone")
    assert capfd.readouterr().err == ""


# ---- remote tar shards --------------------------------------------------------

def _make_tars(d, shards=3, per=7):
    import io
    import tarfile
    d.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(d / f"train-{s:06d}.tar", "w") as tf:
            for k in range(per):
                for ext, data in ((".bin", bytes((s * 31 + k * 7 + j) % 256
                                                 for j in range(50 + k * 13))),
                                  (".cls", str((s + k) % 4).encode())):
                    info = tarfile.TarInfo(f"s{s}k{k:03d}{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def test_tar_shards_come_through_the_cache(tmp_path):
    _make_tars(tmp_path / "www" / "tars")
    pat = "train-{000000..000002}.tar"
    with stk_servers.Nginx(tmp_path / "www") as srv:
        url = f"{srv.url}/tars/{pat}"
        with pytest.raises(Exception) as e:
            stoker.Loader(url, 4, output="numpy")
        assert "cache" in str(e.value)
        kw = dict(output="numpy", seed=5, threads=2)
        with stoker.Loader(url, 4, cache_dir=tmp_path / "c", **kw) as r, \
                stoker.Loader(str(tmp_path / "www" / "tars" / pat), 4, **kw) as l:
            def keep(loader):
                return [([np.array(a, copy=True) for a in x], np.array(y, copy=True))
                        for x, y in loader]
            rb, lb = keep(r), keep(l)
        assert len(rb) == len(lb) == 6
        for (xr, yr), (xl, yl) in zip(rb, lb):
            assert np.array_equal(yr, yl)
            assert all(np.array_equal(a, b) for a, b in zip(xr, xl))
        whole = [q for q in srv.requests() if q["path"].endswith(".tar") and not q["range"]]
        assert len(whole) == 3


# ---- issue 18: secrets, deadlines, verify ------------------------------------------

def _presigned(url):
    return (url + "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDCREDSECRET"
            "&X-Amz-Security-Token=TOKENSECRET&X-Amz-Signature=SIGNATURESECRET")


def _no_secret(text):
    return "hunter2" not in text and "SECRET" not in text and "alice" not in text


def test_secrets_never_in_messages_reprs_or_info(packed):
    shard = packed["shards"][0]
    with stk_servers.Nginx(packed["www"]) as srv:
        host = srv.url.split("://", 1)[1]
        ds = f"http://alice:hunter2@{host}/ds"
        # The loader's own message (a float dtype needs a transform), raised.
        with pytest.raises(Exception) as e:
            stoker.Loader(ds, 8, output="numpy", dtype="float32")
        assert "float32" in str(e.value) and _no_secret(str(e.value)), str(e.value)
        # A transfer's failure, for a presigned URL.
        with pytest.raises(Exception) as e:
            stoker.Loader(_presigned(f"http://alice:hunter2@{host}/ds/part-999999.stk"), 8)
        assert "part-999999.stk" in str(e.value) and _no_secret(str(e.value)), str(e.value)
        # repr of the loader and of its dataset (nginx ignores the query and
        # the credentials, so this opens).
        url = _presigned(f"http://alice:hunter2@{host}/ds/{shard}")
        with stoker.Loader(url, 8, output="numpy") as L:
            for text in (repr(L), repr(L.dataset)):
                assert shard in text and _no_secret(text), text
        # The command line: info, and bench's error.
        r = subprocess.run([STOKER, "info", url], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert shard in r.stdout and _no_secret(r.stdout + r.stderr), r.stdout
        r = subprocess.run([STOKER, "bench", ds, "--dtype", "float32"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "float32" in r.stderr
        assert _no_secret(r.stdout + r.stderr), r.stderr


def test_a_trickling_server_meets_the_attempt_deadline(packed, tmp_path):
    # 4 KiB/s is above the stall rule's 1 KiB/s: only the attempt's deadline
    # (fetch_timeout + 1 s per 16 KiB) ends the whole-shard download, which
    # would otherwise take about 10 s.
    sizes = {s: os.path.getsize(packed["local"] / s) for s in packed["shards"]}
    shard = max(sizes, key=sizes.get)
    assert sizes[shard] > 30000
    # The download only (one ranged part, the whole shard): after the cut the
    # shard's samples are read by ranges (the cache's fallback), which must
    # not trickle too.
    part = f"bytes=0-{sizes[shard] - 1}"
    plan = [{"kind": "trickle", "rate": 4096, "path": f"/ds/{shard}", "ranged": part}]
    with stk_servers.FaultServer(packed["www"], plan) as srv:
        t0 = time.monotonic()
        with stoker.Loader(f"{srv.url}/ds/{shard}", 8, output="numpy", on_error="skip",
                           cache_dir=tmp_path / "c",
                           options={"fetch_timeout": 1, "fetch_retries": 0}) as L:
            for _ in L:
                pass
            st = L.stats()["fetch"]
        took = time.monotonic() - t0
        whole = [q for q in srv.requests() if q["range"] == part]
    assert whole and not whole[0]["completed"], whole
    assert st["failures"] > 0
    assert took < sizes[shard] / 4096 - 2, took


def test_verify_over_http_checks_shard_by_shard(packed, tmp_path):
    import shutil
    www = tmp_path / "www"
    shutil.copytree(packed["local"], www / "ds")
    bad = packed["shards"][1]
    with open(www / "ds" / bad, "r+b") as f:  # the footer gone: the shard cannot open
        f.truncate(os.path.getsize(www / "ds" / bad) - 8)
    with stoker.Loader(packed["local"] / bad, 8, output="numpy") as L:
        bad_count = L.num_samples
    with stk_servers.Nginx(www) as srv:
        host = srv.url.split("://", 1)[1]
        r = subprocess.run([STOKER, "verify", f"http://alice:hunter2@{host}/ds"],
                           capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"{bad}: the whole shard ({bad_count} samples)" in r.stdout, out
    assert f"{96 - bad_count} samples checked, 0 corrupt" in r.stdout, out
    assert "hunter2" not in out


def test_ctrl_c_interrupts_an_open_against_a_silent_server(tmp_path):
    import socket
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)  # accepts (the kernel does), never answers
    port = lsock.getsockname()[1]
    code = f"""
import sys, time
sys.path.insert(0, {os.path.join(ROOT, "python")!r})
import stoker
print("opening", flush=True)
t0 = time.monotonic()
try:
    stoker.Loader("http://127.0.0.1:{port}/ds", 8, output="numpy")
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 2), flush=True)
"""
    try:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "opening"
        time.sleep(1.0)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        lsock.close()
    assert out.startswith("interrupted"), out
    assert took < 3, took


def test_a_redirect_never_downgrades_https_to_http(packed, monkeypatch):
    shard = packed["shards"][0]
    with stk_servers.Nginx(packed["www"]) as plain:
        to_http = {f"/down/{shard}": f"{plain.url}/ds/{shard}"}
        with stk_servers.Nginx(packed["www"], tls=True, redirects=to_http) as tls:
            monkeypatch.setenv("AWS_CA_BUNDLE", tls.cafile)
            # The certificate is trusted: https itself works.
            with stoker.Loader(f"{tls.url}/ds/{shard}", 8, output="numpy") as L:
                assert L.num_samples > 0
            with pytest.raises(Exception) as e:
                stoker.Loader(f"{tls.url}/down/{shard}", 8, output="numpy")
            assert "redirect" in str(e.value), str(e.value)
            assert not plain.requests()  # nothing went out in clear
        # From http, a redirect to http is followed as before.
        with stk_servers.Nginx(packed["www"], redirects=to_http) as srv:
            with stoker.Loader(f"{srv.url}/down/{shard}", 8, output="numpy") as L:
                assert L.num_samples > 0
