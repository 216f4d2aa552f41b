#!/usr/bin/python3
"""Remote datasets against local disk, side by side in one run.

Packs the default dataset (data/default, made by `make run`) into .stk shards,
serves them with nginx and with the S3 test server, puts a delaying TCP proxy
in front of each (RTT = 2 x --one-way-ms, default 50 ms), and runs
`stoker bench --transform imagenet-train` on:

  local          the shards on local disk (the reference)
  http ranged    through the proxy, no cache: every sample a ranged GET
  http shards    the same with the shard-aware order
  http blocks    the same with the block order: one GET per block of ~4 MiB
  http cold      through the proxy into an empty disk cache
  http warm      the same cache again
  s3 cold/warm   the same against the S3 server (SigV4), through its proxy

and prints samples/s, the ratio to local, bytes fetched per byte needed,
requests/s, peak requests in flight and the time workers waited for the
network. Every timer covers what the user waits for, open included (stoker
bench times from before the open).

    /usr/bin/python3 bench/bench_remote.py [--epochs 2] [--one-way-ms 25]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
import stk_servers  # noqa: E402

STOKER = os.path.join(ROOT, "build", "release", "stoker")


def bench(path, args, env=None):
    cmd = [STOKER, "bench", path, "--transform", "imagenet-train", "--batch-size", "64",
           "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        sys.exit(f"bench failed: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--one-way-ms", type=float, default=25.0)
    ap.add_argument("--shard-size", default="4MiB")
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"{a.data} is missing: run `make run` first (it makes the default dataset)")
    tmp = tempfile.mkdtemp(prefix="stk-bench-remote-")
    try:
        www = os.path.join(tmp, "www")
        os.mkdir(www)
        packed = os.path.join(www, "ds")
        subprocess.run([STOKER, "pack", a.data, packed, "--shard-size", a.shard_size,
                        "--quiet"], check=True)
        ep = ["--epochs", str(a.epochs)]
        rows = []
        local = bench(packed, ep)
        rows.append(("local", local))
        # Each order against local disk read in that same order (the orders
        # give different batches, so each has its own reference).
        refs = {}
        for order in ("shards", "blocks"):
            refs[order] = bench(packed, ep + ["--order", order])
            rows.append((f"local {order}", refs[order]))
        with stk_servers.Nginx(www) as ngx, \
                stk_servers.DelayProxy("127.0.0.1", ngx.port, a.one_way_ms) as px:
            url = f"http://127.0.0.1:{px.port}/ds"
            rows.append(("http ranged", bench(url, ep)))
            for order in ("shards", "blocks"):
                rows.append((f"http {order}", bench(url, ep + ["--order", order])))
            cache = os.path.join(tmp, "cache-http")
            rows.append(("http cold", bench(url, ep + ["--cache-dir", cache])))
            rows.append(("http warm", bench(url, ep + ["--cache-dir", cache])))
        with stk_servers.S3Server("benchkey", "benchsecret") as s3:
            s3.create_bucket("bench")
            s3.put_dir("bench", "ds", packed)
            with stk_servers.DelayProxy("127.0.0.1", s3.port, a.one_way_ms) as px:
                env = dict(os.environ, AWS_ACCESS_KEY_ID="benchkey",
                           AWS_SECRET_ACCESS_KEY="benchsecret",
                           AWS_ENDPOINT_URL=f"http://127.0.0.1:{px.port}")
                cache = os.path.join(tmp, "cache-s3")
                rows.append(("s3 cold", bench("s3://bench/ds", ep + ["--cache-dir", cache],
                                              env)))
                rows.append(("s3 warm", bench("s3://bench/ds", ep + ["--cache-dir", cache],
                                              env)))
        base = local["samples_per_s"]
        print(f"imagenet-train, batch 64, {a.epochs} epoch(s) of {local['samples'] // a.epochs}"
              f" samples, RTT {2 * a.one_way_ms:.0f} ms through a delaying proxy, "
              f"{local['threads']} threads")
        # x local counts the open (what the user waits for); "steady" leaves
        # out the time to the first batch, which for a remote dataset is a
        # few round trips (manifest, then headers/footers, then indexes).
        steady0 = local["samples"] / max(local["seconds"] - local["first_batch_s"], 1e-9)
        print(f"{'run':12} {'samples/s':>10} {'x local':>8} {'steady x':>8} "
              f"{'fetched/need':>13} {'requests/s':>11} {'MiB/request':>11} {'in flight':>9} "
              f"{'net wait s':>10} {'open s':>7}")
        for name, r in rows:
            ref = next((refs[o] for o in refs if name.endswith(o)), local)
            base = ref["samples_per_s"]
            steady0 = ref["samples"] / max(ref["seconds"] - ref["first_batch_s"], 1e-9)
            f = r.get("fetch") or {}
            # Bytes received per byte that had to come over the network: with
            # a cache, each sample once (the samples' bytes of one epoch);
            # without, every epoch's. 1.0 = no over-fetch.
            cached = f.get("cache_hits", 0) + f.get("cache_misses", 0) > 0
            need = f.get("sample_bytes", 0) / (a.epochs if cached else 1)
            ratio = f"{f['bytes'] / need:.3f}" if need else "-"
            rps = f"{f['requests'] / r['seconds']:.0f}" if f else "-"
            mpr = f"{f['bytes'] / f['requests'] / 2**20:.2f}" if f and f["requests"] else "-"
            steady = r["samples"] / max(r["seconds"] - r["first_batch_s"], 1e-9)
            print(f"{name:12} {r['samples_per_s']:10.0f} {r['samples_per_s'] / base:8.2f} "
                  f"{steady / steady0:8.2f} {ratio:>13} {rps:>11} {mpr:>11} "
                  f"{f.get('inflight_peak', '-'):>9} {f.get('wait_s', 0):10.3f} "
                  f"{r.get('open_s', 0):7.3f}")
            assert r["checksum"] == ref["checksum"], f"{name}: batches differ from local"
        print("checksums: every run delivered the batches of the local run in its order, bit "
              "for bit (x local: against that run)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
