"""stoker doctor (CLI) and stoker.diagnose (Python): the verdict names the
stage a pipeline was built to be slow at. The tests assert the stage, not the
wording (docs/diagnosis.md)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
STOKER = os.path.join(ROOT, "build", "release", "stoker")

import stk_servers  # noqa: E402  (tests/servers, stdlib only)


def _doctor(path, *args, timeout=180):
    r = subprocess.run([STOKER, "doctor", path, "--json", "--seconds", "1", *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr  # no progress line when stderr is not a terminal
    return json.loads(r.stdout)


def _jpegs(root, n, h, w, classes=2, quality=92):
    from PIL import Image
    rng = np.random.default_rng(1)
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True)
        for k in range(n):
            # Smooth gradients plus noise: compresses like a photograph.
            y, x = np.mgrid[0:h, 0:w]
            img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], -1)
            img = (img + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)
            Image.fromarray(img).save(d / f"{k:03d}.jpg", quality=quality)
    return root


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    return _jpegs(tmp_path_factory.mktemp("large"), 6, 1800, 2400)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("doctor-remote")
    src = _jpegs(base / "src", 24, 48, 64, classes=4, quality=90)
    out = base / "www" / "ds"
    out.parent.mkdir()
    subprocess.run([STOKER, "pack", str(src), str(out), "--shard-size", "40K", "--quiet"],
                   check=True)
    return {"www": base / "www", "local": out}


def test_decode_bound_pipeline_is_named_decode(large):
    rep = _doctor(str(large), "--transform", "imagenet-train", "--threads", "1",
                  "--batch-size", "4")
    assert rep["verdict"]["bound"] == "decode"
    lv = rep["levels"]
    for name in ("storage", "storage_warm", "decode", "batching", "full"):
        assert lv[name]["measured"], (name, lv[name])
    # Each level's figure is its own measurement: storage of 1-3 MB files is
    # far faster than decoding 4.3 Mpx JPEGs on one thread.
    assert lv["storage"]["samples_per_s"] > 3 * lv["decode"]["samples_per_s"]
    assert rep["sweep"] and rep["sweep"][0]["threads"] == 1
    shares = rep["verdict"]["shares"]
    assert abs(sum(shares.values()) - 1) < 1e-3 and shares["decode"] > 0.5
    # 4.3 Mpx stored for 224x224 outputs: the advice names pack --max-side.
    assert any(a["action"] == "pack --max-side" for a in rep["advice"]), rep["advice"]


def test_storage_bound_remote_pipeline_is_named_storage(packed):
    # Every request waits 0.4 s (the shards', and the manifest's and the
    # consolidated index's that the open makes) and one request is in flight
    # at a time.
    plan = [{"kind": "stall", "seconds": 0.4, "path": "/ds/*"}]
    with stk_servers.FaultServer(packed["www"], plan) as srv:
        rep = _doctor(f"{srv.url}/ds", "--transform", "imagenet-train", "--size", "32",
                      "--batch-size", "8", "--fetch-concurrency", "1")
    assert rep["verdict"]["bound"] == "storage", rep["verdict"]
    assert rep["verdict"]["storage_overlaps"] is True
    st = rep["levels"]["storage"]
    assert st["requests"] > 0 and st["fetched_bytes"] > 0
    # Every request stalled 0.4 s before its first byte.
    assert st["first_byte_mean_s"] >= 0.35 and st["request_mean_s"] >= st["first_byte_mean_s"]
    assert any(a["stage"] == "storage" for a in rep["advice"]), rep["advice"]


def test_text_report_and_progress_line(large):
    r = subprocess.run([STOKER, "doctor", str(large), "--transform", "imagenet-val",
                        "--seconds", "0.5", "--threads", "1", "--batch-size", "2", "--progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "verdict: DECODE+AUGMENT bounds throughput" in r.stdout
    assert "thread sweep" in r.stdout and "full pipeline" in r.stdout
    assert "[1/5] storage" in r.stderr and "[5/5] full pipeline" in r.stderr


def test_bad_path_and_bad_seconds_are_clear_errors(tmp_path):
    r = subprocess.run([STOKER, "doctor", str(tmp_path / "nope"), "--seconds", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "nope" in r.stderr
    r = subprocess.run([STOKER, "doctor", str(tmp_path), "--seconds", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--seconds" in r.stderr
    r = subprocess.run([STOKER, "bench", str(tmp_path), "--seconds", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2  # --seconds belongs to doctor, not bench


def test_bench_progress_line_only_when_asked_or_on_a_terminal(large):
    args = [STOKER, "bench", str(large), "--transform", "imagenet-val", "--batch-size", "2",
            "--threads", "1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "\r" not in r.stderr
    r = subprocess.run(args + ["--progress"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "batches" in r.stderr and "samples/s" in r.stderr


# ---- stoker.diagnose -------------------------------------------------------------
def test_diagnose_slow_step_is_step_bound(large):
    import time as _t
    with stoker.Loader(str(large), 2, transform="imagenet-val", size=32, threads=2,
                       output="numpy") as loader:
        d = stoker.diagnose(loader, step=lambda b: _t.sleep(0.15), steps=6, warmup=1)
    assert d["bound"] == "step" and not d["input_bound"], str(d)
    assert 0 <= d["wait_share"] < 0.1
    assert d["cached_step_s"] >= 0.15 and d["steps"] == 6
    assert "STEP bounds throughput" in str(d)


def test_diagnose_slow_decode_is_input_bound_on_decode(large):
    with stoker.Loader(str(large), 2, transform="imagenet-train", threads=1,
                       output="numpy") as loader:
        d = stoker.diagnose(loader, steps=4, warmup=1)
    assert d["input_bound"] and d["bound"] == "decode", str(d)
    assert d["wait_share"] > 0.5 and d["stage_share"]["decode"] > 0.5


def test_diagnose_with_a_real_torch_model(large):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        images, labels = batch
        loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()

    with stoker.Loader(str(large), 4, transform="imagenet-val", size=64, threads=2) as loader:
        d = stoker.diagnose(loader, step, steps=4, warmup=1)
    assert d["bound"] in ("step", "decode", "storage")
    assert d["fed_step_s"] > 0 and d["cached_step_s"] > 0 and d["batch_size"] == 4
    assert 0 <= d["wait_share"] <= 1 and 0 <= d["measured_wait_share"] <= 1


def test_diagnose_rejects_bad_arguments(large):
    with stoker.Loader(str(large), 2, transform="imagenet-val", size=32,
                       output="numpy") as loader:
        with pytest.raises(TypeError):
            stoker.diagnose(loader, step=3)
        with pytest.raises(ValueError):
            stoker.diagnose(loader, steps=0)
        d = stoker.diagnose(loader, steps=np.int64(2), warmup=0)
        assert d["steps"] == 2


# ---- trace ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _jpegs(tmp_path_factory.mktemp("small"), 20, 60, 80, classes=3)


def test_trace_parses_and_covers_the_delivered_samples(small, tmp_path):
    trace = tmp_path / "run.json"
    delivered = set()
    with stoker.Loader(str(small), 7, transform="imagenet-train", size=32, threads=2,
                       output="numpy", return_indices=True, trace=trace, seed=5) as loader:
        for _, _, idx in loader:
            delivered.update(int(i) for i in idx)
        st = loader.stats()
    assert len(delivered) == 60
    t = json.loads(trace.read_text())
    meta = t["otherData"]
    ev = [e for e in t["traceEvents"] if e["ph"] != "M"]
    assert meta["dropped_events"] == 0 and meta["events"] == len(ev)
    spans = [e for e in ev if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in spans)
    # One track per thread: a worker's spans never overlap (it reads, then
    # processes, one sample at a time), and neither do the consumer's.
    by_tid = {}
    for e in spans:
        by_tid.setdefault(e["tid"], []).append(e)
    assert set(by_tid) == {0, 1, 2}
    for tid, es in by_tid.items():
        es.sort(key=lambda e: e["ts"])
        for a, b in zip(es, es[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (tid, a, b)
    # Every delivered sample was read and processed on a worker track.
    reads = [e for e in spans if e["name"] == "read"]
    decs = [e for e in spans if e["name"] == "decode"]
    trans = [e for e in spans if e["name"] == "transform"]
    assert delivered <= {e["args"]["sample"] for e in decs}
    assert delivered <= {e["args"]["sample"] for e in trans}
    assert delivered <= {e["args"]["sample"] for e in reads}
    # The process stage is a decode then a transform, back to back.
    ends = {(e["tid"], e["args"]["sample"], e["args"]["batch"]): e["ts"] + e["dur"] for e in decs}
    for e in trans:
        assert abs(ends[(e["tid"], e["args"]["sample"], e["args"]["batch"])] - e["ts"]) < 1e-3
    # The counts are the stage counters at close (>= those read before it).
    assert len(reads) == meta["read_items"] >= st["stages"]["read"]["items"]
    assert len(decs) == len(trans) == meta["process_items"] >= st["stages"]["process"]["items"]
    assert meta["samples_delivered"] == 60
    nexts = [e for e in spans if e["name"] == "next"]
    assert sum(e["args"]["result"] == "delivered" for e in nexts) == 9  # ceil(60 / 7)
    names = {e["args"]["name"] for e in t["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"consumer", "worker 0", "worker 1"}


def test_trace_from_the_cli_and_a_bad_trace_path(small, tmp_path):
    trace = tmp_path / "cli.json"
    r = subprocess.run([STOKER, "bench", str(small), "--transform", "imagenet-val", "--size",
                        "32", "--batch-size", "8", "--trace", str(trace)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    t = json.loads(trace.read_text())
    assert t["otherData"]["samples_delivered"] == 60
    with pytest.raises(stoker.Error, match="nonexistent"):
        stoker.Loader(str(small), 8, trace=tmp_path / "nonexistent" / "t.json")


# ---- doctor takes every bench option ------------------------------------------------
def _levels_all_measured(rep, levels=("storage", "storage_warm", "decode", "batching", "full")):
    for name in levels:
        assert rep["levels"][name]["measured"], (name, rep["levels"][name])


@pytest.mark.parametrize("device", ["fake", "fake:1"])
def test_doctor_with_a_device(small, device):
    # Issue 24.5: the storage level read the stored bytes (no transform, so
    # samples of varying size) into device batches and always failed with
    # "samples vary in size". The device applies to the full pipeline only.
    rep = _doctor(str(small), "--transform", "imagenet-val", "--size", "32", "--batch-size", "4",
                  "--threads", "1", "--device", device, "--dtype", "float32")
    _levels_all_measured(rep)
    assert rep["levels"]["full"]["samples_per_s"] > 0


def test_doctor_takes_every_bench_option(small, tmp_path):
    # Every option `stoker doctor --help` lists from bench, at once: each
    # level is measured and the trace is written by the full pipeline.
    trace = tmp_path / "doctor-trace.json"
    rep = _doctor(str(small), "--transform", "imagenet-train", "--size", "32",
                  "--batch-size", "4", "--threads", "2", "--depth", "3", "--seed", "7",
                  "--no-shuffle", "--drop-last", "--rank", "0", "--world-size", "1",
                  "--layout", "nhwc", "--dtype", "float16", "--device", "fake",
                  "--on-error", "skip", "--strict", "--batch-memory", "1MiB",
                  "--max-sample-bytes", "1MiB", "--max-input-bytes", "8MiB",
                  "--epochs", "1", "--trace", str(trace), "--trace-events", "4096",
                  "--order", "global", "--no-progress")
    _levels_all_measured(rep)
    assert json.loads(trace.read_text())["otherData"]["producer"] == "stoker"
    # --depth auto: the storage level (variable-size stored bytes) used to
    # fail "finds no depth within the memory budget".
    rep = _doctor(str(small), "--threads", "auto:2", "--depth", "auto", "--memory-budget",
                  "1GiB", "--transform", "imagenet-val", "--size", "32", "--batch-size", "4")
    _levels_all_measured(rep)


def test_doctor_on_records(tmp_path):
    rec = tmp_path / "data.rec"
    rec.write_bytes(b"H" * 16 + bytes(range(256)) * 40)  # 16-byte header, 160 records of 64
    rep = _doctor(str(rec), "--record-size", "64", "--header-bytes", "16", "--label-bytes", "1",
                  "--batch-size", "8", "--device", "fake")
    # No transform: nothing to decode or batch from memory; the rest measured.
    _levels_all_measured(rep, ("storage", "storage_warm", "full"))
    assert rep["levels"]["decode"]["note"] == "no transform: nothing to decode"


# ---- autotune ---------------------------------------------------------------------------
def _hashes(loader, nap=0.0):
    import hashlib
    import time as _t
    out = []
    for images, labels in loader:
        out.append(hashlib.sha1(np.ascontiguousarray(images).tobytes() +
                                np.asarray(labels).tobytes()).hexdigest())
        if nap:
            _t.sleep(nap)
    return out


@pytest.fixture(scope="module")
def medium(tmp_path_factory):
    return _jpegs(tmp_path_factory.mktemp("medium"), 40, 480, 640, classes=2)


def test_autotune_gives_back_then_takes_workers_same_batches(medium):
    kw = dict(transform="imagenet-train", size=64, output="numpy", seed=9)
    with stoker.Loader(str(medium), 2, threads=1, **kw) as fixed:
        want = [_hashes(fixed) for _ in range(3)]
    with stoker.Loader(str(medium), 2, threads="auto:3", **kw) as auto:
        assert auto.stats()["threads_max"] == 3
        # A consumer far slower than one worker (80 ms a batch of 2 against a
        # few ms of decoding): workers are given back, one per 3 calm windows.
        got = [_hashes(auto, nap=0.08)]
        assert auto.stats()["threads_active"] == 1, auto.stats()["threads_active"]
        # Then a consumer that takes batches as fast as they come: it waits,
        # and the pool grows.
        got += [_hashes(auto) for _ in range(2)]
        grown = auto.stats()["threads_active"]
    assert got == want
    assert grown >= 2


def test_autotune_argument_errors(small):
    for bad in ("auto:0", "auto:x", "fast", "auto:300"):
        with pytest.raises(ValueError, match="auto:N"):
            stoker.Loader(str(small), 4, threads=bad)
    r = subprocess.run([STOKER, "bench", str(small), "--threads", "auto:x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "auto:N" in r.stderr
    r = subprocess.run([STOKER, "bench", str(small), "--threads", "auto", "--json",
                        "--transform", "imagenet-val", "--size", "32", "--batch-size", "8"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert 1 <= json.loads(r.stdout)["threads_active"]


def test_depth_auto_from_a_memory_budget(small):
    with stoker.Loader(str(small), 4, transform="imagenet-val", size=32, depth=1,
                       output="numpy") as one:
        need1 = one.info()["memory_bound_bytes"]
    with stoker.Loader(str(small), 4, transform="imagenet-val", size=32, depth="auto",
                       memory_budget=10 * need1, output="numpy") as auto:
        assert auto.depth == auto.info()["depth"] == 8
        assert auto.info()["memory_bound_bytes"] <= 10 * need1
    with pytest.raises(stoker.Error, match="memory budget"):
        stoker.Loader(str(small), 4, transform="imagenet-val", size=32, depth="auto",
                      memory_budget=need1 - 1)
    with pytest.raises(TypeError, match="depth"):
        stoker.Loader(str(small), 4, depth="deep")


def test_doctor_on_unpacked_objects_says_so_and_suggests_pack(tmp_path):
    # Unpacked objects (an ImageFolder behind nginx's autoindex, issue 21
    # item 5), each GET waiting 50 ms before its first byte behind the
    # delaying proxy: the report says the dataset is unpacked objects, what
    # storage measured, an estimate of packed shards (larger: a request per
    # many samples), and the exact pack command.
    _jpegs(tmp_path / "www" / "imgs", 12, 40, 48, classes=2, quality=90)
    with stk_servers.Nginx(tmp_path / "www", autoindex="json") as ngx:
        with stk_servers.DelayProxy("127.0.0.1", ngx.port, 25) as px:
            url = f"http://127.0.0.1:{px.port}/imgs"
            rep = _doctor(url, "--batch-size", "4", "--fetch-concurrency", "4",
                          "--transform", "imagenet-train", "--size", "32")
            text = subprocess.run([STOKER, "doctor", url, "--seconds", "1", "--batch-size", "4",
                                   "--fetch-concurrency", "4"],
                                  capture_output=True, text=True, timeout=180)
    assert rep["source"] == "bucket", rep["source"]
    u = rep["unpacked"]
    assert u["objects"] == 24 and u["pack_command"] == f"stoker pack {url} OUT"
    st = rep["levels"]["storage"]
    assert u["measured_samples_per_s"] == pytest.approx(st["samples_per_s"])
    # Every request paid the 50 ms round trip before its first byte.
    assert u["first_byte_mean_s"] >= 0.045 and u["request_mean_s"] >= u["first_byte_mean_s"]
    assert 1000 < u["mean_object_bytes"] < 20000
    assert u["samples_per_packed_request"] > 100
    # At 50 ms a request for a few KB, packing is estimated far faster.
    assert u["estimated_speedup"] > 5
    assert u["estimated_packed_samples_per_s"] == pytest.approx(
        u["measured_samples_per_s"] * u["estimated_speedup"], rel=1e-3)
    # The pipeline's gain is bounded by the workers as measured.
    assert u["pipeline_samples_per_s"] == pytest.approx(rep["levels"]["full"]["samples_per_s"])
    work = 1 / (1 / rep["levels"]["decode"]["samples_per_s"] +
                1 / rep["levels"]["batching"]["samples_per_s"])
    assert u["estimated_packed_pipeline_samples_per_s"] == pytest.approx(
        min(work, u["estimated_packed_samples_per_s"]), rel=1e-3)
    adv = [a for a in rep["advice"] if a["action"] == "stoker pack"]
    assert len(adv) == 1 and u["pack_command"] in adv[0]["why"], rep["advice"]
    assert "estimate" in adv[0]["why"] and "unpacked objects" in adv[0]["why"]
    assert text.returncode == 0, text.stderr
    assert "unpacked objects: 24 objects" in text.stdout, text.stdout
    assert f"`stoker pack {url} OUT`" in text.stdout
    # A local folder gets no such section.
    assert "unpacked" not in _doctor(str(tmp_path / "www" / "imgs"))
