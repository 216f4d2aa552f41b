"""One rank of the torchrun tests (tests/py/test_distributed.py): reads its
share of an epoch with stoker.Loader under torch.distributed (gloo, CPU),
in lockstep (a barrier per step, as DDP's all-reduce would), and writes what
it delivered to OUT/rank-R.json: per batch, the step, the labels and a hash
of the bytes. Rank 0 saves the loader's state dict to OUT/state.json after
--save-at steps; --resume STATE restores one first; --stop-after N stops
there (else at the end of the epoch); --sleep-after N makes every rank
stop after step N and sleep (to be killed); --vary KEY opens rank 1's loader
with another setting and records the error each rank gets. Each rank writes
its pid to OUT/pid-R first. DATA mix:SPEC.json reads a mixture
(docs/mixing.md; SPEC: {"sources": [[path, weight], ...], "samples_per_epoch",
"fields", "transform", and optionally "source_transforms": per source a
transform or null); a batch's labels are then its [source, dataset
index] pairs, its hash covers the images and "sample_hashes" holds each
sample's image's hash; --vary weights gives rank 1 other weights."""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import stoker  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--order", default="global")
    ap.add_argument("--cache-dir")
    ap.add_argument("--endpoint")
    ap.add_argument("--transform")
    ap.add_argument("--save-at", type=int)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--resume")
    ap.add_argument("--sleep-after", type=int)
    ap.add_argument("--vary",
                    choices=["seed", "shuffle", "drop_last", "size", "missing", "weights"],
                    help="rank 1 opens its loader with another value of this setting (size, "
                         "missing: another records file, DATA.small / DATA.missing; weights: "
                         "a mixture's, rotated); every "
                         "rank then writes the error it got to OUT/error-R.txt")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(os.path.join(a.out, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    kw = {}
    if a.cache_dir:
        kw["cache_dir"] = a.cache_dir
    if a.endpoint:
        kw["options"] = {"endpoint": a.endpoint}
    if a.transform:
        kw["transform"] = a.transform
        kw["size"] = 32
    data = a.data
    drop_last = False
    if a.vary and rank == 1:
        if a.vary == "seed":
            a.seed += 1
        elif a.vary == "shuffle":
            a.no_shuffle = not a.no_shuffle
        elif a.vary == "drop_last":
            drop_last = True
        elif a.vary != "weights":
            path, rb, lb = data.rsplit(":", 2)
            data = f"{path}.{'small' if a.vary == 'size' else 'missing'}:{rb}:{lb}"
    mix = None
    if data.startswith("mix:"):
        with open(data[len("mix:"):]) as f:
            mix = json.load(f)
        weights = [w for _, w in mix["sources"]]
        if a.vary == "weights" and rank == 1:
            weights = weights[1:] + weights[:1]
        tfs = mix.get("source_transforms") or [None] * len(weights)
        data = [stoker.Source(p, weight=w, **({"transform": t} if t else {}))
                for (p, _), w, t in zip(mix["sources"], weights, tfs)]
        kw.update(fields=mix["fields"], transform=mix["transform"], return_indices=True,
                  samples_per_epoch=mix["samples_per_epoch"])
    # records:PATH:RECORD_BYTES:LABEL_BYTES
    if isinstance(data, str) and data.startswith("records:"):
        path, rb, lb = data[len("records:"):].rsplit(":", 2)
        data = stoker.Records(path, int(rb), label_bytes=int(lb))
    try:
        loader = stoker.Loader(data, a.batch_size, seed=a.seed, shuffle=not a.no_shuffle,
                               order=a.order, output="numpy", threads=1, drop_last=drop_last,
                               **kw)
    except Exception as e:
        if not a.vary:
            raise
        with open(os.path.join(a.out, f"error-{rank}.txt"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        dist.barrier()
        dist.destroy_process_group()
        return
    assert loader.rank == rank and loader.world_size == dist.get_world_size()
    if a.resume:
        with open(a.resume) as f:
            loader.load_state_dict(json.load(f))
    out = {"rank": rank, "world_size": loader.world_size, "batches": [],
           "local_world_size": loader.local_world_size}
    step = 0
    for batch in loader:
        if mix is not None:
            data = batch["image"]
            labels = [[int(s), int(i)] for s, i in zip(batch["source"], batch["__index__"])]
        else:
            data, labels = batch
            labels = [int(x) for x in labels]
        h = hashlib.sha1(np.ascontiguousarray(data).tobytes()).hexdigest()
        out["batches"].append({"step": step, "labels": labels, "hash": h})
        if mix is not None:
            out["batches"][-1]["sample_hashes"] = [
                hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest() for x in data]
        step += 1
        dist.barrier()
        if a.save_at is not None and step == a.save_at and rank == 0:
            tmp = os.path.join(a.out, "state.json.tmp")
            with open(tmp, "w") as f:
                json.dump(loader.state_dict(), f)
            os.rename(tmp, os.path.join(a.out, "state.json"))
        if a.stop_after is not None and step >= a.stop_after:
            break
        if a.sleep_after is not None and step >= a.sleep_after:
            with open(os.path.join(a.out, f"rank-{rank}.json"), "w") as f:
                json.dump(out, f)
            time.sleep(300)  # killed here by the test
    st = loader.stats()
    out["stats_fetch"] = st["fetch"]
    if mix is not None:
        out["stats_sources"] = st["sources"]
    with open(os.path.join(a.out, f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
