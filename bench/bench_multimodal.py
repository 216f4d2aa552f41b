#!/usr/bin/python3
"""Samples with several fields, side by side in one run: stoker.Loader(fields=)
vs the usual PyTorch recipe, on the CLIP pipeline from a WebDataset tar set on
local disk.

    /usr/bin/python3 bench/bench_multimodal.py [--data data/bench-multimodal] [--epochs 2]

The data: a CLIP-style tar set (key.jpg ~400x350 q85-90, key.txt UTF-8
caption, key.json nested metadata, key.cls, and a .npy and a .seg.png that
neither side asks for), made by scripts/make-multimodal.py when missing.
The recipe, on both sides: RandomResizedCrop(224) + RandomHorizontalFlip on
the image (uint8 NCHW), the caption as str, the JSON parsed, the label as
int64; batches of 128 as dicts.

  - PyTorch: a DataLoader over an IterableDataset that reads the tar members
    with `tarfile` (streaming), groups them by key (WebDataset's rule),
    shuffles the shard order per epoch and the samples in a buffer
    (--shuffle-buffer, of undecoded samples, as webdataset's .shuffle()),
    splits the shards among the workers, decodes with PIL, applies the
    torchvision transforms + PILToTensor, decodes the caption and parses the
    JSON; default collate for the tensors, lists for str and JSON;
    persistent workers.
  - stoker: stoker.Loader(path, 128, fields={"image": "jpg", "caption": "txt",
    "meta": "json", "label": "cls"}, transform={"image": ...}), global
    shuffle, threads = the DataLoader's workers (--workers, default the
    online cores).
  - image only, on both sides: the same without caption and meta, to show
    what text and JSON cost (issue 20's target for stoker: at most +10% time).

Each configuration runs in its own process, --repeat times, interleaved, and
the best run counts (the machines are shared; the best run is the least
disturbed). The clock covers what a user waits for: from before the loader
is made (DataLoader workers forked, the stoker loader opened) to the last
batch of the last epoch, --epochs epochs, no warm-up left out; imports are
done before it starts. The page cache is warmed once before all runs. The
parent samples the proportional set size (PSS) of each run's processes
(the DataLoader's workers count) every 100 ms.

It also counts the CPU time (user + system) of each run's whole process tree
from its clock's start, per sample, median of the runs: on a shared machine
other work slows every run down (and the best of a few runs may still be
disturbed) while a run's CPU time a sample moves much less.

Prints samples/s, peak memory, CPU time a sample, the ratios stoker/DataLoader
(issue 20's target: >= 5x the samples/s on 2 cores) and the image-only
overheads.

The stoker side needs the multi-field Python API (issue 20); without it the
run stops with a message saying so. --skip-stoker measures the PyTorch side
alone.
"""
import argparse
import io
import json
import os
import random
import resource
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FULL = {"image": "jpg", "caption": "txt", "meta": "json", "label": "cls"}
IMAGE_ONLY = {"image": "jpg", "label": "cls"}
CONFIGS = {  # name: (loader, fields)
    "stoker": ("stoker", FULL),
    "stoker-image": ("stoker", IMAGE_ONLY),
    "dataloader": ("dataloader", FULL),
    "dataloader-image": ("dataloader", IMAGE_ONLY),
}


def shards(data):
    return sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".tar"))


# ---- the PyTorch side ---------------------------------------------------------------------

def tar_samples(path):
    """(key, {ext: bytes}) for each sample of a WebDataset tar, streaming: a
    sample is a run of members sharing a key, the path up to the first dot
    of the file name; the extension is all after it (key.seg.png: seg.png)."""
    key, members = None, {}
    with tarfile.open(path, mode="r|") as tf:
        for m in tf:
            if not m.isfile():
                continue
            d, _, base = m.name.rpartition("/")
            stem, _, ext = base.partition(".")
            k = d + "/" + stem if d else stem
            if k != key and members:
                yield key, members
                members = {}
            key = k
            members[ext] = tf.extractfile(m).read()
    if members:
        yield key, members


# open_clip's normalisation (--normalize): CLIP's mean and std.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def make_dataset(paths, fields, size, shuffle_buffer, seed, normalize=False):
    import torch
    import torchvision.transforms as TV
    from PIL import Image

    tail = ([TV.ToTensor(), TV.Normalize(CLIP_MEAN, CLIP_STD)] if normalize
            else [TV.PILToTensor()])
    image_tf = TV.Compose([TV.RandomResizedCrop(size), TV.RandomHorizontalFlip()] + tail)

    def decode(key, m):
        out = {}
        for name, ext in fields.items():
            if ext not in m:
                raise KeyError(f"sample {key!r} has no field {ext!r} (has: {', '.join(m)})")
            b = m[ext]
            if ext == "jpg":
                out[name] = image_tf(Image.open(io.BytesIO(b)).convert("RGB"))
            elif ext == "txt":
                out[name] = b.decode("utf-8")
            elif ext == "json":
                out[name] = json.loads(b)
            elif ext == "cls":
                out[name] = int(b)
            else:
                out[name] = b
        return out

    class TarDataset(torch.utils.data.IterableDataset):
        """The WebDataset-style iterable dataset people write by hand."""

        def __init__(self):
            self.epoch = 0  # each persistent worker counts its own epochs alike

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            order = list(paths)
            random.Random(seed * 1000003 + self.epoch).shuffle(order)
            rng = random.Random((seed * 1000003 + self.epoch) * 64 + wid)
            self.epoch += 1
            buf = []
            for p in order[wid::nw]:  # this worker's shards
                for key, m in tar_samples(p):
                    if len(buf) < shuffle_buffer:
                        buf.append((key, m))
                        continue
                    k = rng.randrange(len(buf))
                    buf[k], (key, m) = (key, m), buf[k]
                    yield decode(key, m)
            rng.shuffle(buf)
            for key, m in buf:
                yield decode(key, m)

    return TarDataset()


def collate(samples):
    """Tensors and ints by torch's default collate; str and JSON as lists."""
    from torch.utils.data import default_collate
    out = {}
    for name in samples[0]:
        vals = [s[name] for s in samples]
        if isinstance(vals[0], (str, dict, list, bytes)) or vals[0] is None:
            out[name] = vals
        else:
            out[name] = default_collate(vals)
    return out


def run_dataloader(a, fields):
    import torch
    import torchvision  # noqa: F401 (imports are the process's cost, not the loader's)
    torch.set_num_threads(1)
    cpu0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    ds = make_dataset(shards(a.data), fields, a.size, a.shuffle_buffer, a.seed, a.normalize)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                                     persistent_workers=a.workers > 0, collate_fn=collate)
    r = iterate(dl, a, fields, t0)
    r["cpu_before_s"] = cpu0
    del dl  # shuts the workers down and reaps them: their CPU time counts
    return r


# ---- the stoker side ----------------------------------------------------------------------

def run_stoker(a, fields):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import stoker
        from stoker import transforms as T
    except ImportError as e:
        sys.exit(f"bench_multimodal: cannot import stoker ({e}); build it first: "
                 f"make -j2 MODE=release python")
    import torch  # noqa: F401
    cpu0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    try:
        L = stoker.Loader(a.data, a.batch_size, seed=a.seed, threads=a.workers, fields=fields,
                          transform={"image": T.Compose(
                              [T.RandomResizedCrop(a.size), T.RandomHorizontalFlip()] +
                              ([T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)]
                               if a.normalize else []))},
                          output="torch")
    except TypeError as e:
        sys.exit(f"bench_multimodal: this stoker.Loader takes no fields= or per-field "
                 f"transform= (samples with several fields, issue 20's Python API): {e}")
    r = iterate(L, a, fields, t0)
    r["cpu_before_s"] = cpu0
    L.close()
    return r


# ---- one measured run (in a child process) --------------------------------------------------

def check_batch(batch, fields, a):
    """The first batch holds what the recipe asks for, on either side: a
    bench that measured something else would be worthless."""
    import torch
    if not isinstance(batch, dict) or set(batch) != set(fields):
        sys.exit(f"bench_multimodal: a batch should be a dict of {sorted(fields)}, got "
                 f"{type(batch).__name__} {sorted(batch) if isinstance(batch, dict) else ''}")
    n = len(batch["label"])
    im = batch["image"]
    want = torch.float32 if a.normalize else torch.uint8
    if not (isinstance(im, torch.Tensor) and im.dtype == want and
            tuple(im.shape) == (n, 3, a.size, a.size)):
        sys.exit(f"bench_multimodal: image should be a {want} tensor ({n}, 3, {a.size}, "
                 f"{a.size}), got {type(im).__name__} {getattr(im, 'dtype', '')} "
                 f"{tuple(getattr(im, 'shape', ()))}")
    lab = batch["label"]
    if not (isinstance(lab, torch.Tensor) and lab.dtype == torch.int64):
        sys.exit(f"bench_multimodal: label should be an int64 tensor, got {lab!r:.80}")
    if "caption" in fields and not (isinstance(batch["caption"], list) and
                                    all(isinstance(c, str) for c in batch["caption"])):
        sys.exit("bench_multimodal: caption should be a list of str")
    if "meta" in fields and not (isinstance(batch["meta"], list) and
                                 all(isinstance(m, dict) for m in batch["meta"])):
        sys.exit("bench_multimodal: meta should be a list of parsed JSON objects")


def iterate(loader, a, fields, t0):
    t_made = time.perf_counter()
    epoch_s, samples, first = [], [], None
    chars = 0
    for e in range(a.epochs):
        t = time.perf_counter()
        k = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                check_batch(batch, fields, a)
            k += len(batch["label"])
            if "caption" in batch:  # touch the objects, as training would
                chars += sum(len(c) for c in batch["caption"])
        epoch_s.append(time.perf_counter() - t)
        samples.append(k)
    return {"all_s": time.perf_counter() - t0, "open_s": t_made - t0, "first_batch_s": first,
            "epoch_s": epoch_s, "samples": samples, "caption_chars": chars}


# ---- the parent: data, spawn, sample memory, compare ---------------------------------------

def cpu_s(who):
    """User + system CPU seconds of this process (RUSAGE_SELF: all its
    threads) or of its waited-for descendants (RUSAGE_CHILDREN)."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


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


def measure(config, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--run", config, "--data", a.data,
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--size", str(a.size),
           "--workers", str(a.workers), "--shuffle-buffer", str(a.shuffle_buffer),
           "--seed", str(a.seed)] + (["--normalize"] if a.normalize else [])
    cpu0 = cpu_s(resource.RUSAGE_CHILDREN)
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
        hint = ("; --skip-stoker measures the PyTorch side alone"
                if config.startswith("stoker") else "")
        sys.exit(f"bench_multimodal: the {config} run failed (exit {p.returncode}){hint}")
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_pss_bytes"] = peak[0] * 1024
    # CPU time of the run's whole process tree (DataLoader workers included),
    # less what the child spent before its clock (imports).
    r["cpu_s"] = cpu_s(resource.RUSAGE_CHILDREN) - cpu0 - r["cpu_before_s"]
    return r


def dataset(a):
    if not os.path.isdir(a.data):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-multimodal.py"),
                        a.data, "--samples", str(a.samples), "--shard-size",
                        str(a.shard_size)], check=True)
    paths = shards(a.data)
    if not paths:
        sys.exit(f"bench_multimodal: no .tar shards in {a.data}")
    total = 0
    for p in paths:  # warm the page cache: both sides read from memory
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
    return paths, total


def rate(r):
    return sum(r["samples"]) / r["all_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "bench-multimodal"),
                    help="a directory of multi-field .tar shards (made when missing)")
    ap.add_argument("--samples", type=int, default=1000, help="samples when making --data")
    ap.add_argument("--shard-size", type=int, default=125, help="samples a shard when making")
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed, open included")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count(),
                    help="stoker threads = DataLoader workers (default: online cores)")
    ap.add_argument("--shuffle-buffer", type=int, default=1000,
                    help="the DataLoader side's shuffle buffer, in samples per worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each")
    ap.add_argument("--skip-stoker", action="store_true",
                    help="measure the PyTorch side alone (stoker without fields= support)")
    ap.add_argument("--skip-image-only", action="store_true",
                    help="leave out the image-only runs")
    ap.add_argument("--normalize", action="store_true",
                    help="open_clip's preprocessing on both sides: ToTensor + Normalize "
                         "with CLIP's mean/std after the crop and flip (float32 images)")
    ap.add_argument("--run", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.run:
        loader, fields = CONFIGS[a.run]
        r = run_stoker(a, fields) if loader == "stoker" else run_dataloader(a, fields)
        print(json.dumps(r))
        return 0

    paths, nbytes = dataset(a)
    configs = [c for c in ("stoker", "stoker-image", "dataloader", "dataloader-image")
               if not (a.skip_stoker and c.startswith("stoker"))
               and not (a.skip_image_only and c.endswith("-image"))]
    print(f"bench_multimodal: {a.data} ({len(paths)} shards, {nbytes / 2**20:.1f} MiB), "
          f"RandomResizedCrop({a.size}) + flip"
          f"{' + ToTensor + Normalize(CLIP), float32' if a.normalize else ', uint8'}, caption str, JSON parsed, label int64; "
          f"batch {a.batch_size}, {a.workers} threads/workers, {a.epochs} epochs timed from "
          f"before the loader is made, best of {a.repeat} interleaved runs")
    runs = {c: [] for c in configs}
    for _ in range(a.repeat):
        for c in configs:
            runs[c].append(measure(c, a))
    best = {c: max(rs, key=rate) for c, rs in runs.items()}

    def cpu(c):
        # CPU seconds a sample, the median run: other work on a shared machine
        # slows every run down but leaves its CPU time nearly as it is.
        v = sorted(r["cpu_s"] / sum(r["samples"]) for r in runs[c])
        return v[len(v) // 2]

    mib = 1 << 20
    print(f"  {'configuration':18} {'samples/s':>10} {'open':>8} {'1st batch':>9} "
          f"{'per epoch':>9} {'peak PSS':>10} {'CPU/sample':>11}")
    for c in configs:
        r = best[c]
        mem = min(x["peak_pss_bytes"] for x in runs[c])
        print(f"  {c:18} {rate(r):10.1f} {1000 * r['open_s']:6.0f}ms "
              f"{1000 * r['first_batch_s']:7.0f}ms {r['samples'][0]:9d} "
              f"{mem / mib:7.1f} MiB {1000 * cpu(c):8.2f} ms")
    print("    all runs, samples/s: " + " | ".join(
        f"{c} " + " ".join(f"{rate(r):.0f}" for r in runs[c]) for c in configs))
    if "stoker" in best and "dataloader" in best:
        ratio = rate(best["stoker"]) / rate(best["dataloader"])
        print(f"  ratio stoker/DataLoader, all fields: {ratio:.2f}x samples/s "
              f"(target >= 5x on 2 cores), {cpu('dataloader') / cpu('stoker'):.2f}x less CPU "
              f"a sample")
    if "stoker-image" in best and "dataloader-image" in best:
        print(f"  ratio stoker/DataLoader, image only: "
              f"{rate(best['stoker-image']) / rate(best['dataloader-image']):.2f}x samples/s, "
              f"{cpu('dataloader-image') / cpu('stoker-image'):.2f}x less CPU a sample")
    for side in ("stoker", "dataloader"):
        if side in best and side + "-image" in best:
            extra = rate(best[side + "-image"]) / rate(best[side]) - 1
            extra_cpu = cpu(side) / cpu(side + "-image") - 1
            note = " (target: at most +10%)" if side == "stoker" else ""
            print(f"  {side}: caption + JSON cost {100 * extra:+.1f}% time{note}, "
                  f"{100 * extra_cpu:+.1f}% CPU over image only")
    if a.skip_stoker:
        print("  stoker: not measured (--skip-stoker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
