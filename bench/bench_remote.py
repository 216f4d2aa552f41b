#!/usr/bin/python3
"""Remote datasets against local disk, side by side in one run.

Packs a dataset (default data/default, made by `make run`) into .stk shards,
serves them with nginx and with the S3 test server (SigV4), puts a delaying
TCP proxy in front of each (RTT = 2 x --one-way-ms, default 50 ms; run in a
process of its own so that its CPU can be counted), and runs
`stoker bench --transform imagenet-train` on:

  local                the shards on local disk (the reference)
  local blocks         the same in the block order (the blocks rows' reference)
  warm                 through the proxy, a disk cache that holds every shard
  cold                 the same, the cache empty at the start (filled by this run)
  no cache             every sample a ranged GET
  no cache + blocks    the block order: one GET per block of ~5 MiB

for HTTP (nginx) and S3, each without a bandwidth cap and with one
(--bandwidth, default 1Gbit a connection: object stores give one connection
about 100 MB/s). Before that it measures the proxy's own ceiling: MB/s of 8
parallel downloads through it with no delay and no cap, against the same
downloads straight from nginx, and the proxy's CPU seconds per GB; and one
connection through the cap.

The table (one per backend and cap): samples/s; x local (against the local
run in the same order; counts everything the user waits for, open included);
requests; fetched/need (bytes received over the bytes that had to cross the
network: the shards' bytes once with a cache, once an epoch without); the peak of
requests in flight; hedged requests (fetch_hedge); open s (stk_loader_open:
manifest, headers, footers, indexes); and the CPU the proxy and the server
took, in cores (CPU seconds over the run's seconds): they share the machine
with the loader. Every run is checked to deliver the batches of its local
reference bit for bit.

    /usr/bin/python3 bench/bench_remote.py [--data DIR] [--epochs 2]
        [--one-way-ms 25] [--shard-size 256MiB] [--bandwidth 1Gbit]
        [--backends http,s3] [--no-uncapped] [--skip-ceiling]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
import stk_servers  # noqa: E402

STOKER = os.path.join(ROOT, "build", "release", "stoker")
KEY, SECRET = "benchkey", "benchsecret"


def cpu_s(pid):
    """CPU seconds (user + system) process pid has used so far."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state (field 3) ... utime (14), stime (15)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(path, args, env=None, watch=()):
    """stoker bench's JSON, plus the CPU seconds each pid in watch took."""
    cmd = [STOKER, "bench", path, "--transform", "imagenet-train", "--batch-size", "64",
           "--json"] + args
    before = [cpu_s(p) for p in watch]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        sys.exit(f"bench failed: {' '.join(cmd)}\n{r.stderr}")
    out = json.loads(r.stdout)
    out["cpu_watch"] = [cpu_s(p) - b for p, b in zip(watch, before)]
    return out


def proxy(port, one_way_ms, bandwidth=None, connect_rtt=True):
    args = [f"127.0.0.1:{port}", "--delay-ms", one_way_ms]
    if bandwidth:
        args += ["--bandwidth", bandwidth]
    if not connect_rtt:
        args.append("--no-connect-rtt")
    return stk_servers.ServerProcess("proxy", *args)


def curl_parallel(urls, parallel):
    """Downloads every URL (to /dev/null) with `parallel` transfers at once;
    returns (bytes, seconds)."""
    cmd = ["curl", "-s", "--fail", "--parallel", "--parallel-max", str(parallel),
           "-w", "%{size_download}\n"]
    for u in urls:
        cmd += ["-o", "/dev/null", u]
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    secs = time.monotonic() - t
    if r.returncode:
        sys.exit(f"curl failed ({r.returncode}): {r.stderr}")
    return sum(int(x) for x in r.stdout.split()), secs


def ceiling(ngx, name, size, bandwidth):
    """The proxy's own limits, with nginx straight as the comparison."""
    if not shutil.which("curl"):
        print("proxy ceiling: no curl on PATH, skipped")
        return
    n = max(8, int(512e6 // max(size, 1)))  # about 512 MB in all
    direct = curl_parallel([f"{ngx.url}/ds/{name}"] * n, 8)
    with proxy(ngx.port, 0, connect_rtt=False) as px:
        c0 = cpu_s(px.pid)
        through = curl_parallel([f"{px.url}/ds/{name}"] * n, 8)
        pcpu = cpu_s(px.pid) - c0
    print(f"proxy ceiling ({n} downloads of {size / 1e6:.1f} MB, 8 at once, no delay, no cap): "
          f"{through[0] / through[1] / 1e6:.0f} MB/s through the proxy, "
          f"{direct[0] / direct[1] / 1e6:.0f} MB/s straight from nginx; the proxy took "
          f"{pcpu / through[1]:.2f} cores, {pcpu / (through[0] / 1e9):.2f} CPU s per GB")
    if bandwidth:
        with proxy(ngx.port, 0, bandwidth, connect_rtt=False) as px:
            one = curl_parallel([f"{px.url}/ds/{name}"], 1)
        cap = stk_servers.parse_bandwidth(bandwidth)
        print(f"one connection through the {bandwidth} cap ({cap / 1e6:.0f} MB/s): "
              f"{one[0] / one[1] / 1e6:.0f} MB/s")


ROWS = ("warm", "cold", "nocache", "blocks")


def remote_rows(url, ep, cache_root, env, watch, a, refs, packed):
    """cold, warm, no cache, no cache + blocks (those of --rows) against one
    proxied server; with --repeat N, each N times, each time right after a
    fresh run of its local reference (its own "x local"), so that a machine
    whose load changes still compares like with like."""
    out = []
    for rep in range(a.repeat):
        tag = f" #{rep + 1}" if a.repeat > 1 else ""
        cache = tempfile.mkdtemp(prefix="cache-", dir=cache_root)
        fresh = {}
        if a.repeat > 1:
            fresh = {"global": bench(packed, ep), "blocks": bench(packed, ep + ["--order", "blocks"])}
        rows = {}
        if "cold" in a.rows or "warm" in a.rows:
            rows["cold"] = bench(url, ep + ["--cache-dir", cache], env, watch)
            rows["warm"] = bench(url, ep + ["--cache-dir", cache], env, watch)
        if "nocache" in a.rows:
            rows["no cache"] = bench(url, ep, env, watch)
        if "blocks" in a.rows:
            rows["no cache + blocks"] = bench(url, ep + ["--order", "blocks"], env, watch)
            if a.compare_buffer:
                rows[f"blocks, buf {a.compare_buffer}"] = bench(
                    url, ep + ["--order", "blocks", "--fetch-buffer", a.compare_buffer], env, watch)
        shutil.rmtree(cache, ignore_errors=True)
        for k, r in rows.items():
            if k in ("cold", "warm") and k not in a.rows:
                continue
            r["ref"] = fresh or refs
            out.append((k + tag, r))
    return out


def print_table(title, rows, refs, epochs, data_bytes):
    print(f"\n{title}")
    head = (f"{'run':22} {'samples/s':>9} {'x local':>7} {'requests':>8} {'fetched/need':>12} "
            f"{'in flight':>9} {'buf MiB':>7} {'stall s':>7} {'req ms':>6} {'hedged':>6} "
            f"{'open s':>6} {'proxy CPU':>9} {'server CPU':>10}")
    print(head)
    print("-" * len(head))
    for name, r in rows:
        rr = r.get("ref") or refs
        ref = rr["blocks"] if "blocks" in name else rr["global"]
        f = r.get("fetch") or {}
        cached = f.get("cache_hits", 0) + f.get("cache_misses", 0) > 0
        need = data_bytes * (1 if cached else epochs)
        ratio = f"{f['bytes'] / need:.3f}" if f and need else "-"
        cpus = r.get("cpu_watch") or []
        secs = max(r["seconds"], 1e-9)
        pc = f"{cpus[0] / secs:.2f}" if len(cpus) > 0 else "-"
        sc = f"{cpus[1] / secs:.2f}" if len(cpus) > 1 else "-"
        buf = f"{f['buffered_peak_bytes'] / 2**20:.0f}" if f else "-"
        # stall: the workers' summed time waiting for the network over the
        # threads (about the wall time the run lost to it)
        stall = f"{f['wait_s'] / max(r.get('threads', 1), 1):.2f}" if f else "-"
        req = f"{f['request_mean_s'] * 1e3:.0f}" if f else "-"
        print(f"{name:22} {r['samples_per_s']:9.0f} {r['samples_per_s'] / ref['samples_per_s']:7.2f} "
              f"{f.get('requests', '-'):>8} {ratio:>12} {f.get('inflight_peak', '-'):>9} "
              f"{buf:>7} {stall:>7} {req:>6} "
              f"{f.get('hedges', '-'):>6} {r.get('open_s', 0):6.3f} {pc:>9} {sc:>10}")
        if f.get("cache_misses"):
            # a cold cache: where its samples came from, and the download's parts
            print(f"{'':22} {f.get('cache_partial_reads', 0)} samples read while their shard "
                  f"downloaded, {f.get('cache_cold_ranged', 0)} by range ahead of it; "
                  f"{f.get('cache_download_parts', 0)} download parts")
        if r["checksum"] != ref["checksum"]:
            sys.exit(f"{title}, {name}: the batches differ from the local run's")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--one-way-ms", type=float, default=25.0)
    ap.add_argument("--shard-size", default="256MiB")
    ap.add_argument("--bandwidth", default="1Gbit",
                    help="per-connection cap of the capped runs ('none': no capped runs)")
    ap.add_argument("--backends", default="http,s3")
    ap.add_argument("--no-uncapped", action="store_true", help="only the capped runs")
    ap.add_argument("--skip-ceiling", action="store_true")
    ap.add_argument("--rows", default=",".join(ROWS),
                    help="which remote runs: warm,cold,nocache,blocks (warm needs cold's cache)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the rows N times, each after a fresh local reference")
    ap.add_argument("--compare-buffer", default=None,
                    help="also run the blocks row with this fetch_buffer (e.g. 64M: the "
                         "budget before it was sized in windows)")
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"{a.data} is missing: run `make run` first (it makes the default dataset)")
    caps = ([] if a.no_uncapped else [None]) + ([] if a.bandwidth == "none" else [a.bandwidth])
    backends = [b for b in a.backends.split(",") if b]
    a.rows = [x for x in a.rows.split(",") if x]
    if any(x not in ROWS for x in a.rows):
        sys.exit(f"--rows: one of {','.join(ROWS)}")
    tmp = tempfile.mkdtemp(prefix="stk-bench-remote-")
    try:
        www = os.path.join(tmp, "www")
        os.mkdir(www)
        packed = os.path.join(www, "ds")
        subprocess.run([STOKER, "pack", a.data, packed, "--shard-size", a.shard_size,
                        "--quiet"], check=True)
        shards = sorted((os.path.getsize(os.path.join(packed, n)), n)
                        for n in os.listdir(packed) if n.endswith(".stk"))
        ep = ["--epochs", str(a.epochs)]
        refs = {"global": bench(packed, ep), "blocks": bench(packed, ep + ["--order", "blocks"])}
        local = refs["global"]
        print(f"imagenet-train, batch 64, {a.epochs} epoch(s) of {local['samples'] // a.epochs} "
              f"samples in {len(shards)} shard(s) of up to {shards[-1][0] / 1e6:.0f} MB, RTT "
              f"{2 * a.one_way_ms:.0f} ms through the delaying proxy, {local['threads']} threads, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
        print(f"local: {local['samples_per_s']:.0f} samples/s; local, order blocks: "
              f"{refs['blocks']['samples_per_s']:.0f} samples/s")
        tables = []
        if "http" in backends:
            with stk_servers.Nginx(www) as ngx:
                if not a.skip_ceiling:
                    ceiling(ngx, shards[-1][1], shards[-1][0],
                            None if a.bandwidth == "none" else a.bandwidth)
                for cap in caps:
                    with proxy(ngx.port, a.one_way_ms, cap) as px:
                        rows = remote_rows(f"{px.url}/ds", ep, tmp, None,
                                           (px.pid, ngx.proc.pid), a, refs, packed)
                    tables.append((f"HTTP (nginx), {'cap ' + cap if cap else 'no cap'} a "
                                   f"connection", rows))
        if "s3" in backends:
            with stk_servers.S3Server(KEY, SECRET) as s3:
                s3.create_bucket("bench")
                s3.put_dir("bench", "ds", packed)
                for cap in caps:
                    with proxy(s3.port, a.one_way_ms, cap) as px:
                        env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                                   AWS_ENDPOINT_URL=px.url)
                        rows = remote_rows("s3://bench/ds", ep, tmp, env, (px.pid, s3.proc.pid),
                                           a, refs, packed)
                    tables.append((f"S3 (s3rver, SigV4), {'cap ' + cap if cap else 'no cap'} a "
                                   f"connection", rows))
        for title, rows in tables:
            print_table(title, rows, refs, a.epochs, sum(sz for sz, _ in shards))
        print("\nchecksums: every run delivered the batches of the local run in its order, bit "
              "for bit (x local: against that run; proxy/server CPU: cores, of "
              f"{os.cpu_count()})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
