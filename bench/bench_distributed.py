#!/usr/bin/python3
"""Distributed reads, on paper and measured (docs/distributed.md).

1. On paper, driven by stoker's own order code (bench/dist_sim.c, linked with
   libstoker): a 1 TB dataset (10,000 shards of 100 MB, 1,000 samples each),
   shard-aware order (windows of 8 shards), 8 ranks a node, batch 256, a cache
   of 64 shards (6.4 GB) per node shared by its ranks (LRU): shards fetched per
   node in one epoch and the cache hit rate of sample reads, for 1..16 nodes,
   with the ranks interleaved over the whole order (one node's layout) and
   with the node-aware layout (each node a contiguous part of the order).
2. Measured, side by side in one run: 2 ranks on one node (two `stoker
   bench` processes, --rank 0/1 --world-size 2, shard-aware order) reading
   the default dataset packed into shards from nginx through a delaying
   proxy (RTT 2 x --one-way-ms), sharing one cache directory vs each with its
   own: samples/s per rank, shards downloaded and bytes received per node.

    /usr/bin/python3 bench/bench_distributed.py [--one-way-ms 25] [--nodes 1,2,4,8,16]
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
SIM = os.path.join(ROOT, "build", "dist_sim")


def build_sim():
    src = os.path.join(ROOT, "bench", "dist_sim.c")
    lib = os.path.join(ROOT, "build", "release", "libstoker.a")
    if not os.path.exists(SIM) or os.path.getmtime(SIM) < max(os.path.getmtime(src),
                                                              os.path.getmtime(lib)):
        subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Iinclude", "-Isrc", "-o", SIM,
                        src, lib, "-ljpeg", "-lspng", "-lxxhash", "-lcurl", "-lpthread", "-lm"],
                       check=True, cwd=ROOT)


def on_paper(nodes_list):
    build_sim()
    print("1 TB (10,000 shards x 100 MB), shard-aware order, 8 ranks/node, batch 256, "
          "64-shard cache per node")
    print(f"  {'nodes':>5} {'layout':>12} {'GB/node':>9} {'GB total':>9} {'x dataset':>9} "
          f"{'hit rate':>9}")
    rows = []
    for nodes in nodes_list:
        for aware in (0, 1):
            out = subprocess.run([SIM, "10000", "1000", "100", str(nodes), "8", "256", "64", "8",
                                  str(aware)], check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            rows.append(r)
            print(f"  {nodes:5d} {'node-aware' if aware else 'interleaved':>12} "
                  f"{r['gb_per_node']:9.0f} {r['gb_total']:9.0f} "
                  f"{r['gb_total'] / 976.6:8.2f}x {100 * r['hit_rate']:8.2f}%", flush=True)
    return rows


def measured(one_way_ms, epochs):
    tmp = tempfile.mkdtemp(prefix="stk-bench-dist-")
    try:
        data = os.path.join(ROOT, "data", "default")
        if not os.path.isdir(data):
            sys.exit(f"{data} is missing: run `make run` first")
        www = os.path.join(tmp, "www")
        os.mkdir(www)
        subprocess.run([STOKER, "pack", data, os.path.join(www, "ds"), "--shard-size", "2M",
                        "--quiet"], check=True)
        nshards = len([f for f in os.listdir(os.path.join(www, "ds")) if f.endswith(".stk")])
        print(f"\n2 ranks on one node, {nshards} shards of ~2 MB from nginx through a "
              f"{2 * one_way_ms:.0f} ms RTT proxy, imagenet-train, {epochs} epochs")
        print(f"  {'cache':>9} {'rank 0':>10} {'rank 1':>10} {'downloads':>10} {'MB in':>8}")
        with stk_servers.Nginx(www) as srv:
            host, port = srv.url.split("//")[1].split(":")
            with stk_servers.DelayProxy(host, int(port), one_way_ms) as proxy:
                url = f"{proxy.url}/ds"
                for mode in ("shared", "separate"):
                    procs = []
                    for r in range(2):
                        cache = os.path.join(tmp, f"cache-{mode}" + ("" if mode == "shared"
                                                                     else f"-{r}"))
                        procs.append(subprocess.Popen(
                            [STOKER, "bench", url, "--transform", "imagenet-train",
                             "--batch-size", "32", "--threads", "1", "--epochs", str(epochs),
                             "--rank", str(r), "--world-size", "2", "--order", "shards",
                             "--cache-dir", cache, "--json"],
                            stdout=subprocess.PIPE, text=True))
                    outs = [json.loads(p.communicate(timeout=900)[0]) for p in procs]
                    dl = sum(o["fetch"]["cache_misses"] for o in outs)
                    mbytes = sum(o["fetch"]["bytes"] for o in outs) / 1e6
                    print(f"  {mode:>9} {outs[0]['samples_per_s']:8.0f}/s "
                          f"{outs[1]['samples_per_s']:8.0f}/s {dl:10d} {mbytes:8.1f}",
                          flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8,16")
    ap.add_argument("--one-way-ms", type=float, default=25.0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--skip-measured", action="store_true")
    a = ap.parse_args()
    on_paper([int(x) for x in a.nodes.split(",")])
    if not a.skip_measured:
        measured(a.one_way_ms, a.epochs)


if __name__ == "__main__":
    main()
