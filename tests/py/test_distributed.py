"""torchrun processes (gloo, CPU) reading one dataset with stoker.Loader
(docs/distributed.md): every sample of an epoch exactly once across ranks,
equal batch counts, each rank's batches bit-identical to a single-process
Loader opened as that rank; elastic resume after a rank is killed with
SIGKILL, onto fewer and more ranks; two ranks sharing one cache directory
download each shard once. Each rank is tests/py/dist_worker.py."""

import collections
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import stoker

pytest.importorskip("torch.distributed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
STOKER = os.path.join(ROOT, "build", "release", "stoker")
WORKER = os.path.join(ROOT, "tests", "py", "dist_worker.py")

import stk_servers  # noqa: E402


def torchrun(nproc, out, *args, wait=True, env=None, read=True):
    """Starts torchrun with nproc local ranks of dist_worker.py. The
    --redirects/--tee/--log_dir flags work around Debian's torch 1.13 on
    Python 3.11 (../shared/FACTS.md). The agent looks at its workers every
    --monitor_interval seconds (default 5): each run would idle up to that
    long after its ranks finished."""
    os.makedirs(out, exist_ok=True)
    cmd = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "--monitor_interval", "0.5",
           "--redirects", "2", "--tee", "2", "--log_dir",
           os.path.join(out, "logs"), WORKER, *[str(a) for a in args]]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1",
               **(env or {}))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, start_new_session=True)
    if not wait:
        return p
    try:
        log, _ = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    assert p.returncode == 0, log[-4000:]
    if not read:
        return None
    return [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(nproc)]


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """A record file of 103 samples whose label is the sample's index."""
    path = tmp_path_factory.mktemp("dist") / "data.rec"
    with open(path, "wb") as f:
        for i in range(103):
            f.write(i.to_bytes(8, "little") + bytes((i * 7 + k) % 256 for k in range(8)))
    return path


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_sample_once_and_same_batches_as_one_process(rec, tmp_path, nproc, shuffle):
    # dist_worker reads records through a Records source: pass it by path and
    # record size in the environment-free way the worker knows.
    args = [_records_spec(rec), tmp_path / "out", "--seed", "7"]
    if not shuffle:
        args.append("--no-shuffle")
    ranks = torchrun(nproc, tmp_path / "out", *args)
    counts = [len(r["batches"]) for r in ranks]
    assert len(set(counts)) == 1, counts
    seen = collections.Counter(x for r in ranks for b in r["batches"] for x in b["labels"])
    assert set(seen) == set(range(103))
    assert sum(seen.values()) - 103 < nproc  # DistributedSampler-style padding only
    # Each rank's batches are what one process opened as that rank delivers.
    for r in ranks:
        with stoker.Loader(stoker.Records(rec, 16, label_bytes=8), 4, seed=7, shuffle=shuffle,
                           rank=r["rank"], world_size=nproc, output="numpy",
                           threads=1) as L:
            want = [(hashlib.sha1(np.ascontiguousarray(d).tobytes()).hexdigest(),
                     [int(x) for x in y]) for d, y in L]
        assert [(b["hash"], b["labels"]) for b in r["batches"]] == want


@pytest.mark.parametrize("vary,what", [
    ("seed", r"seed: seed=7 on rank 0; seed=8 on rank 1"),
    ("shuffle", r"shuffle: shuffle=True on rank 0; shuffle=False on rank 1"),
    ("drop_last", r"drop_last: drop_last=False on rank 0; drop_last=True on rank 1"),
    ("size", r"the dataset's size \(num_samples\): num_samples=103 on rank 0; "
             r"num_samples=50 on rank 1"),
])
def test_ranks_that_disagree_are_refused_at_open(rec, tmp_path, vary, what):
    """Issue 24 item 2: 2 ranks with seed=rank silently duplicated and
    dropped samples (504 of each). Every rank now raises, naming the setting
    and the ranks."""
    small = f"{rec}.small"
    with open(rec, "rb") as f, open(small, "wb") as g:
        g.write(f.read(50 * 16))
    out = tmp_path / "out"
    torchrun(2, out, _records_spec(rec), out, "--seed", "7", "--vary", vary, read=False)
    for r in range(2):
        err = (out / f"error-{r}.txt").read_text()
        assert err.startswith("ValueError: the ranks of this job disagree on "), err
        assert re.search(what, err), err
        assert f"(this is rank {r})" in err and "docs/distributed.md" in err


def test_a_rank_that_cannot_open_does_not_leave_the_others_waiting(rec, tmp_path):
    out = tmp_path / "out"
    torchrun(2, out, _records_spec(rec), out, "--vary", "missing", read=False)
    assert (out / "error-1.txt").read_text().startswith("FileNotFoundError")
    err0 = (out / "error-0.txt").read_text()
    assert re.match(r"Error: rank 1 of 2 could not open its stoker.Loader \(FileNotFoundError: "
                    r".*data.rec.missing", err0), err0


def _records_spec(rec):
    return f"records:{rec}:16:8"


def _first_run_deliveries(out, nproc, upto):
    seen = collections.Counter()
    for r in range(nproc):
        with open(os.path.join(out, f"rank-{r}.json")) as f:
            for b in json.load(f)["batches"]:
                if b["step"] < upto:
                    seen.update(b["labels"])
    return seen


@pytest.fixture(scope="module")
def rec_stk(rec, tmp_path_factory):
    """The same 103 samples packed into .stk shards of 8 (for order="shards")."""
    out = tmp_path_factory.mktemp("dist-stk") / "ds"
    subprocess.run([STOKER, "pack", str(rec), str(out), "--record-size", "16", "--label-bytes",
                    "8", "--shard-size", str(8 * 8), "--quiet"], check=True)
    return out


@pytest.mark.parametrize("new_world,seed,cut,shuffle,order", [
    (2, 1, 3, True, "global"), (4, 1, 3, True, "global"),
    (2, 5, 6, False, "global"), (4, 5, 6, False, "global"),
    (2, 2, 4, True, "shards"), (4, 3, 2, True, "shards"),
])
def test_elastic_resume_after_a_rank_is_killed(rec, rec_stk, tmp_path, new_world, seed, cut,
                                               shuffle, order):
    data = _records_spec(rec) if order == "global" else str(rec_stk)
    first = tmp_path / "first"
    args = [data, first, "--seed", seed, "--save-at", cut, "--sleep-after", cut + 1,
            "--order", order]
    if not shuffle:
        args.append("--no-shuffle")
    p = torchrun(3, first, *args, wait=False)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all(
                os.path.exists(first / f"rank-{r}.json") for r in range(3)):
            time.sleep(0.1)
        assert (first / "state.json").exists(), "rank 0 saved no state"
        os.kill(int((first / "pid-1").read_text()), signal.SIGKILL)  # a node dies
        try:
            p.wait(timeout=60)  # torchrun's agent stops the other ranks
        except subprocess.TimeoutExpired:
            pass
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    state = json.loads((first / "state.json").read_text())
    assert state["batch"] == cut and state["world_size"] == 3
    seen = _first_run_deliveries(first, 3, cut)
    second = tmp_path / "second"
    args = [data, second, "--seed", seed, "--resume", first / "state.json", "--order", order]
    if not shuffle:
        args.append("--no-shuffle")
    ranks = torchrun(new_world, second, *args)
    counts = [len(r["batches"]) for r in ranks]
    assert len(set(counts)) == 1, counts
    for r in ranks:
        for b in r["batches"]:
            seen.update(b["labels"])
    assert set(seen) == set(range(103))  # none skipped
    assert sum(seen.values()) - 103 <= (3 - 1) + (new_world - 1)  # padding only


def test_two_ranks_share_one_cache_and_download_each_shard_once(tmp_path):
    from PIL import Image
    src = tmp_path / "src"
    rng = np.random.default_rng(3)
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for k in range(16):
            Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(
                src / f"c{c}" / f"{k}.jpg")
    www = tmp_path / "www"
    www.mkdir()
    subprocess.run([STOKER, "pack", str(src), str(www / "ds"), "--shard-size", "8K", "--quiet"],
                   check=True)
    shards = sorted(p.name for p in (www / "ds").iterdir() if p.name.endswith(".stk"))
    assert len(shards) >= 4
    cache = tmp_path / "cache"
    key, secret = "distkey", "distsecret"
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "HOME": str(tmp_path)}
    with stk_servers.S3Server(key, secret) as srv:
        srv.create_bucket("bkt")
        srv.put_dir("bkt", "ds", www / "ds")
        srv.clear_requests()
        ranks = torchrun(2, tmp_path / "out", "s3://bkt/ds", tmp_path / "out", "--cache-dir",
                         cache, "--order", "shards", "--transform", "imagenet-val",
                         "--endpoint", srv.endpoint, env=env)
        reqs = srv.requests()
    # A download into the cache is ranged parts of 8 MiB (docs/remote.md): for
    # these small shards one part, the range of the whole object. Samples
    # read by range start past the shard's header, never at 0.
    sizes = {n: (www / "ds" / n).stat().st_size for n in shards}
    whole = [r for r in reqs if r["path"].endswith(".stk") and r.get("method", "GET") == "GET"
             and r.get("range") == f"bytes=0-{sizes[r['path'].rsplit('/', 1)[1]] - 1}"]
    seen = collections.Counter(x for r in ranks for b in r["batches"] for x in b["labels"])
    assert sum(seen.values()) >= 48
    # Each shard downloaded whole exactly once, over both ranks (counted at the server).
    assert sorted(r["path"].rsplit("/", 1)[1] for r in whole) == shards, whole
    assert sum(r["stats_fetch"]["cache_misses"] for r in ranks) == len(shards)
