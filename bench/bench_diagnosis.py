#!/usr/bin/python3
"""Diagnosis costs and autotune, side by side in one run.

1. Trace overhead: `stoker bench --transform imagenet-train` on the default
   dataset with and without --trace, runs interleaved, median samples/s of
   each and their ratio (target: the trace costs under 2 %).
2. Autotune against fixed thread counts, with a training loop that takes a
   fixed time per step (--step-ms, default 40 ms for a batch of 64, a stand-in
   for a GPU step): samples/s, CPU seconds per 1000 samples and the threads
   left working, for threads=1, 2, ..., all usable CPUs, and threads="auto".
   Autotune should match the best fixed count's throughput with no more CPU
   than the smallest count that keeps up.

    /usr/bin/python3 bench/bench_diagnosis.py [--data data/default] [--runs 5]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
STOKER = os.path.join(ROOT, "build", "release", "stoker")


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench(path, args):
    """stoker bench's report, with "cpu_ms_per_sample" (the child's CPU time)."""
    cmd = [STOKER, "bench", path, "--transform", "imagenet-train", "--batch-size", "64",
           "--json"] + args
    c0 = child_cpu_s()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(f"bench failed: {' '.join(cmd)}\n{r.stderr}")
    rep = json.loads(r.stdout)
    rep["cpu_ms_per_sample"] = (child_cpu_s() - c0) * 1000 / rep["samples"]
    return rep


def trace_overhead(path, runs, epochs, tmp):
    off, on = [], []
    trace = os.path.join(tmp, "bench-trace.json")
    for _ in range(runs):
        off.append(bench(path, ["--epochs", str(epochs)]))
        on.append(bench(path, ["--epochs", str(epochs), "--trace", trace]))
    size = os.path.getsize(trace)
    os.unlink(trace)
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    mo, mn = med(off, "samples_per_s"), med(on, "samples_per_s")
    co, cn = med(off, "cpu_ms_per_sample"), med(on, "cpu_ms_per_sample")
    print(f"trace overhead ({runs} interleaved runs of {epochs} epochs; medians)")
    print(f"  {'':<12} {'samples/s':>10} {'CPU ms/sample':>14}")
    print(f"  {'trace off':<12} {mo:10.1f} {co:14.3f}")
    print(f"  {'trace on':<12} {mn:10.1f} {cn:14.3f}")
    print(f"  on/off: {mn / mo:.3f} x the samples/s, {cn / co:.3f} x the CPU per sample "
          f"(trace file {size / 1e6:.1f} MB)")
    return mn / mo


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def train_loop(path, threads, step_s, seconds):
    import stoker
    t0 = time.perf_counter()
    c0 = cpu_s()
    n = 0
    with stoker.Loader(path, 64, transform="imagenet-train", threads=threads,
                       output="numpy") as loader:
        while time.perf_counter() - t0 < seconds:
            for images, labels in loader:
                time.sleep(step_s)  # the training step (a GPU would be busy meanwhile)
                n += len(labels)
                if time.perf_counter() - t0 >= seconds:
                    break
        st = loader.stats()
    wall = time.perf_counter() - t0
    return n / wall, (cpu_s() - c0) / n * 1000, st["threads_active"], st["starvation_s"] / wall


def autotune(path, step_ms, seconds):
    cpus = len(os.sched_getaffinity(0))
    print(f"\nautotune vs fixed threads (a {step_ms:.0f} ms training step per batch of 64, "
          f"{seconds:.0f} s each, {cpus} usable CPUs)")
    print(f"  {'threads':<10} {'samples/s':>10} {'CPU s/1000':>11} {'working':>8} "
          f"{'starvation':>11}")
    rows = {}
    for t in list(range(1, cpus + 1)) + ["auto"]:
        rate, cpu, active, starve = train_loop(path, t, step_ms / 1000, seconds)
        rows[t] = (rate, cpu)
        print(f"  {str(t):<10} {rate:10.1f} {cpu:11.2f} {active:8d} {100 * starve:10.1f}%")
    best = max((v for k, v in rows.items() if k != "auto"), key=lambda v: v[0])
    a = rows["auto"]
    print(f"  auto / best fixed: {a[0] / best[0]:.3f} x the samples/s, "
          f"{a[1] / best[1]:.3f} x the CPU per sample")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=40.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"{a.data} is missing: run `make run` first (it makes the default dataset)")
    import tempfile
    with tempfile.TemporaryDirectory(prefix="stk-bench-diag-") as tmp:
        trace_overhead(a.data, a.runs, a.epochs, tmp)
    autotune(a.data, a.step_ms, a.seconds)


if __name__ == "__main__":
    main()
