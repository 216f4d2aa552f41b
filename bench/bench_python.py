#!/usr/bin/python3
"""Side by side: stoker.Loader vs torch DataLoader, and stoker's Python front
end vs the C `stoker bench`, on the same pipeline.

    /usr/bin/python3 bench/bench_python.py [--data data/default] [--epochs 2]

Pipeline: RandomResizedCrop(224) + RandomHorizontalFlip, uint8 NCHW batches of
128 (DataLoader: torchvision ImageFolder with the same transforms and
PILToTensor, default collate). Same cores for both: stoker threads =
DataLoader workers = online cores (--workers), persistent workers, one warm-up
epoch before the timed ones. Each loader runs in its own process; the parent
samples the proportional set size (PSS) of that process and all its children
every 100 ms, so the DataLoader's worker processes count (PSS shares pages that
forked workers have in common fairly; plain RSS would count them once per
process).

Then `build/$MODE/stoker bench` runs the same pipeline for the same number of
epochs (warm-up included, as it has none of its own) and is compared with the
Python loader timed the same way, both from before the loader opens to the
last batch (`stoker bench` starts its clock before the open): the Python front
end's overhead.

Each configuration runs --repeat times, interleaved, and the best run counts:
the machines are shared, and the best run is the least disturbed one.
Prints images/s, peak memory and the ratios.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---- measured runs (in a child process) ---------------------------------------------------

def run_stoker(a):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import stoker
    from stoker import transforms as T
    # Imports are the process's cost, not the loader's: done before the clock
    # starts, so open_s is the Loader's own open (the C tool imports nothing).
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.utils.dlpack  # noqa: F401
    t_open = time.perf_counter()
    L = stoker.Loader(a.data, a.batch_size, seed=0, threads=a.workers, depth=a.depth,
                      transform=T.Compose([T.RandomResizedCrop(a.size),
                                           T.RandomHorizontalFlip()]),
                      output="torch")
    t0 = time.perf_counter()
    epoch_times, n = [], []
    for e in range(1 + a.epochs):
        t = time.perf_counter()
        k = 0
        for x, y in L:
            k += len(y)
        epoch_times.append(time.perf_counter() - t)
        n.append(k)
    total = time.perf_counter() - t0
    st = L.stats()
    L.close()
    return {"open_s": t0 - t_open, "epoch_s": epoch_times, "samples": n, "all_s": total,
            "starvation_s": st["starvation_s"], "memory_bound": st["memory_bound_bytes"],
            "threads": a.workers}


def run_dataloader(a):
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as TV
    torch.set_num_threads(1)
    ds = D.ImageFolder(a.data, transform=TV.Compose([TV.RandomResizedCrop(a.size),
                                                     TV.RandomHorizontalFlip(),
                                                     TV.PILToTensor()]))
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                     num_workers=a.workers, persistent_workers=True)
    epoch_times, n = [], []
    t0 = time.perf_counter()
    for e in range(1 + a.epochs):
        t = time.perf_counter()
        k = 0
        for x, y in dl:
            k += len(y)
        epoch_times.append(time.perf_counter() - t)
        n.append(k)
    total = time.perf_counter() - t0
    del dl
    return {"epoch_s": epoch_times, "samples": n, "all_s": total, "workers": a.workers}


# ---- the parent: spawn, sample memory, compare ---------------------------------------

def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(pid):
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def measure(kind, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--run", kind, "--data", a.data,
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--size", str(a.size),
           "--workers", str(a.workers), "--depth", str(a.depth)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.1):
            peak[0] = max(peak[0], sum(pss_kib(q) for q in tree(p.pid)))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = p.communicate()
    done.set()
    th.join()
    if p.returncode:
        sys.exit(f"bench: the {kind} run failed (exit {p.returncode})")
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_pss_bytes"] = peak[0] * 1024
    return r


def c_bench(a):
    exe = a.exe or os.path.join(ROOT, "build", a.mode, "stoker")
    if not os.access(exe, os.X_OK):
        return None
    spec = (f"RandomResizedCrop({a.size},scale=(0.08,1.0),ratio=(0.75,1.3333333333333333))|"
            f"RandomHorizontalFlip(p=0.5)")
    cmd = [exe, "bench", a.data, "--transform", spec, "--batch-size", str(a.batch_size),
           "--threads", str(a.workers), "--depth", str(a.depth), "--epochs",
           str(1 + a.epochs), "--json"]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description="stoker.Loader vs torch DataLoader vs C bench")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count(),
                    help="stoker threads = DataLoader workers (default: online cores)")
    ap.add_argument("--depth", type=int, default=2, help="stoker ring depth")
    ap.add_argument("--mode", default="release", help="build/MODE/stoker for the C bench")
    ap.add_argument("--exe", help="the stoker CLI to compare with (default build/MODE/stoker)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each")
    ap.add_argument("--skip-dataloader", action="store_true")
    ap.add_argument("--run", choices=["stoker", "dataloader"], help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.run:
        r = run_stoker(a) if a.run == "stoker" else run_dataloader(a)
        print(json.dumps(r))
        return 0

    print(f"bench_python: {a.data}, batch {a.batch_size}, crop {a.size}, uint8 NCHW, "
          f"{a.workers} threads/workers, 1 warm-up + {a.epochs} timed epochs, best of "
          f"{a.repeat} interleaved runs")

    def timed_rate(r):
        return sum(r["samples"][1:]) / sum(r["epoch_s"][1:])

    def all_rate(r):
        # Open included, as `stoker bench` counts it: its workers start
        # filling batches during the open.
        return sum(r["samples"]) / (r["open_s"] + r["all_s"])

    # Interleaved repetitions, best of each: on a shared machine the best run
    # is the one least disturbed by other processes.
    runs = {"stoker": [], "dataloader": [], "c": []}
    for _ in range(a.repeat):
        runs["stoker"].append(measure("stoker", a))
        c = c_bench(a)
        if c:
            runs["c"].append(c)
        if not a.skip_dataloader:
            runs["dataloader"].append(measure("dataloader", a))
    s = max(runs["stoker"], key=timed_rate)
    s_rate = timed_rate(s)
    s_mem = min(r["peak_pss_bytes"] for r in runs["stoker"])
    mib = 1 << 20
    print(f"  stoker.Loader     {s_rate:8.1f} images/s   peak PSS {s_mem / mib:7.1f} MiB  "
          f"(memory bound {s['memory_bound'] / mib:.1f} MiB)")
    if runs["dataloader"]:
        d = max(runs["dataloader"], key=timed_rate)
        d_rate = timed_rate(d)
        d_mem = min(r["peak_pss_bytes"] for r in runs["dataloader"])
        print(f"  torch DataLoader  {d_rate:8.1f} images/s   peak PSS {d_mem / mib:7.1f} MiB  "
              f"(main + {a.workers} worker processes)")
        print(f"  ratio stoker/DataLoader: {s_rate / d_rate:.2f}x images/s, "
              f"{s_mem / d_mem:.2f}x peak memory")
    if runs["c"]:
        c = max(runs["c"], key=lambda r: r["samples_per_s"])
        py = max(all_rate(r) for r in runs["stoker"])
        overhead = c["samples_per_s"] / py - 1
        print(f"  C stoker bench    {c['samples_per_s']:8.1f} images/s   peak RSS "
              f"{c['peak_rss_bytes'] / mib:7.1f} MiB  ({1 + a.epochs} epochs, no warm-up, open "
              f"{1000 * c['open_s']:.1f} ms, first batch after {1000 * c['first_batch_s']:.0f} ms)")
        print(f"  Python front end  {py:8.1f} images/s over the same {1 + a.epochs} epochs and open: "
              f"{100 * overhead:+.1f}% time vs C (target: at most +5%)")
        print("    all runs, images/s: python " +
              " ".join(f"{all_rate(r):.0f}" for r in runs["stoker"]) + " | C " +
              " ".join(f"{r['samples_per_s']:.0f}" for r in runs["c"]))
    else:
        print(f"  (build/{a.mode}/stoker not built: no C comparison)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
