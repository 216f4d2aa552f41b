"""stoker.diagnose: is training waiting for data, and if so, why?

The training side of `stoker doctor` (docs/diagnosis.md). It runs the user's
own step twice for the same number of steps: fed by the loader, then fed by one
batch held in memory (on the device, when the loader delivers device tensors).
The difference is the time the step waited for input; the loader's own
counters then say which of its stages is the slow one.
"""

import math
import os
import time

__all__ = ["diagnose", "Diagnosis"]

# Below this share of the time spent waiting, a run counts as bound by its step.
INPUT_BOUND_SHARE = 0.10


def _hold(batch):
    """A copy of a batch that outlives the loader's buffer, on the batch's
    device (tensors) or in host memory (NumPy)."""
    if isinstance(batch, dict):   # a batch with fields (docs/multimodal.md)
        return {k: _hold(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_hold(x) for x in batch)
    if hasattr(batch, "clone") and hasattr(batch, "device"):
        return batch.clone()
    if hasattr(batch, "copy"):
        return batch.copy()
    return batch


def _sync(batch):
    """Waits for the device work queued by a step when the batch lives on a
    GPU, so that time is counted where it was spent."""
    if isinstance(batch, dict):   # a batch with fields: its first GPU tensor, if any
        batch = [v for v in batch.values()
                 if getattr(getattr(v, "device", None), "type", None) == "cuda"][:1]
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    dev = getattr(first, "device", None)
    if dev is not None and getattr(dev, "type", "cpu") == "cuda":
        import torch
        torch.cuda.synchronize(dev)


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Diagnosis(dict):
    """The result: a dict (JSON-friendly) whose str() is the report."""

    def __str__(self):
        d = self
        lines = [f"stoker.diagnose: {d['steps']} steps of batch {d['batch_size']}"]
        lines.append(f"  fed by the loader      {d['fed_step_s'] * 1e3:9.2f} ms/step "
                     f"({d['fed_samples_per_s']:.1f} samples/s)")
        lines.append(f"  fed one cached batch   {d['cached_step_s'] * 1e3:9.2f} ms/step "
                     f"({d['cached_samples_per_s']:.1f} samples/s)")
        lines.append(f"  waiting for input      {100 * d['wait_share']:8.1f}% of each step "
                     f"(measured in next(): {100 * d['measured_wait_share']:.1f}%)")
        if d["bound"] == "contention":
            lines.append("  verdict: CONTENTION: the step hardly waited for data but ran slower "
                         "beside the loader: they compete for the CPUs")
        elif d["bound"] == "step":
            lines.append("  verdict: the training STEP bounds throughput; the loader keeps up "
                         f"(its workers were busy {100 * d['loader_busy_share']:.0f}% of "
                         "their time)")
        else:
            lines.append(f"  verdict: INPUT-BOUND: the step waits for data; the loader's slowest "
                         f"stage is {d['bound'].upper()} ({d['stage_share'][d['bound']] * 100:.0f}% "
                         "of its workers' busy time)")
        if d["advice"]:
            lines.append("  advice:")
            lines.extend(f"  - {a['action']}: {a['why']}" for a in d["advice"])
        return "\n".join(lines)


def _stage_delta(s0, s1):
    out = {}
    for name, v in s1["stages"].items():
        b0 = s0["stages"].get(name, {"busy_s": 0.0, "items": 0})
        out[name] = {"busy_s": v["busy_s"] - b0["busy_s"], "items": v["items"] - b0["items"]}
    return out


def diagnose(loader, step=None, steps=30, warmup=2, verbose=False):
    """Times `step(batch)` fed by `loader` against the same step fed by one
    cached batch, and says whether training is input-bound.

    loader: a stoker.Loader (it is advanced by warmup + steps batches; call
        loader.set_epoch() afterwards to start an epoch afresh).
    step: the training step, called with each batch as the loop would give it
        (e.g. ``lambda b: train_step(model, *b)``); None measures the loader
        alone (a step that does nothing).
    steps: steps timed in each of the two runs; warmup: steps run first and not
        timed (the first steps allocate and compile).
    verbose: print the report.

    Returns a Diagnosis (a dict; str() is the report): "bound" is "step" when
    the step is the bottleneck; the loader's slowest stage ("storage" or
    "decode") when the loop waited in next() over 10 % of the time;
    "contention" when it did not wait but the step ran over 10 % slower fed by
    the loader than on a cached batch (they compete for CPUs). "wait_share":
    the share of each step lost to input (fed vs cached); "measured_wait_share":
    the share spent inside next(); "advice": a list of {"action", "why"}.
    """
    if step is None:
        def step(batch):
            return None
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    steps = int(steps.__index__()) if hasattr(steps, "__index__") else steps
    warmup = int(warmup.__index__()) if hasattr(warmup, "__index__") else warmup
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")

    it = iter(loader)

    def take():
        nonlocal it
        for _ in range(2):
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)  # the next epoch
        raise RuntimeError("stoker.diagnose: the loader delivered no batch")

    cached = None
    for _ in range(max(warmup, 1)):
        batch = take()
        step(batch)
        cached = _hold(batch)
        del batch
    _sync(cached)

    # Run 1: fed by the loader.
    s0 = loader.stats()
    waited = 0.0
    samples = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        w0 = time.perf_counter()
        batch = take()
        waited += time.perf_counter() - w0
        step(batch)
        first = batch[0] if isinstance(batch, (tuple, list)) else batch
        samples += len(first)
        del batch, first
    _sync(cached)
    fed = time.perf_counter() - t0
    s1 = loader.stats()

    # Run 2: the same step, fed by one batch already in memory.
    t0 = time.perf_counter()
    for _ in range(steps):
        step(cached)
    _sync(cached)
    held = time.perf_counter() - t0

    info = loader.info()
    batch_size = info["batch_size"]
    wait_share = max(0.0, min(1.0, (fed - held) / fed)) if fed > 0 else 0.0
    measured = waited / fed if fed > 0 else 0.0
    stages = _stage_delta(s0, s1)
    busy = {k: v["busy_s"] for k, v in stages.items()}
    fetch = s1.get("fetch")
    # Storage: the workers' reads, plus, for remote data, the time they waited
    # for the fetch stage (which runs ahead on its own thread).
    storage = busy.get("read", 0.0)
    if fetch and s0.get("fetch"):
        storage += max(0.0, fetch.get("wait_s", 0.0) - s0["fetch"].get("wait_s", 0.0))
    decode = busy.get("process", 0.0)
    total_busy = storage + decode
    stage_share = {"storage": storage / total_busy if total_busy > 0 else 0.0,
                   "decode": decode / total_busy if total_busy > 0 else 0.0}
    threads = info["threads"]
    loader_busy_share = total_busy / (threads * fed) if fed > 0 and threads else 0.0
    # Input-bound: the loop waited in next(). A step that only ran slower when
    # fed by the loader, without waiting, shares the CPUs (or memory
    # bandwidth) with the loader's threads: contention, not starvation.
    input_bound = measured > INPUT_BOUND_SHARE
    if input_bound:
        bound = "storage" if stage_share["storage"] > stage_share["decode"] else "decode"
    elif wait_share > INPUT_BOUND_SHARE:
        bound = "contention"
    else:
        bound = "step"

    cpus = _usable_cpus()
    advice = []
    if input_bound and bound == "decode" and threads < cpus:
        advice.append({"action": "more threads",
                       "why": f"threads={cpus}: the loader has {threads} worker thread(s) and "
                              f"{cpus} CPUs are usable (leave some to the training process if "
                              "its step uses the CPU)"})
    if input_bound and bound == "decode":
        advice.append({"action": "stoker doctor",
                       "why": "run `stoker doctor PATH` with the same options for the thread "
                              "sweep and whether smaller stored images (pack --max-side) help"})
    if input_bound and bound == "storage" and info.get("source_kind") == "folder":
        advice.append({"action": "stoker pack",
                       "why": "one file per sample: pack the folder into .stk shards "
                              "(stoker.pack or `stoker pack`) so reads are byte ranges of "
                              "large files"})
    if input_bound and bound == "storage" and fetch:
        advice.append({"action": "shard-aware order and a cache",
                       "why": "remote data: order='shards' with cache_dir= reads whole shards "
                              "once and keeps them on local disk (docs/remote.md)"})
    if bound == "contention":
        advice.append({"action": "fewer loader threads or more CPUs",
                       "why": f"each step lost {100 * wait_share:.0f}% of its time fed by the loader "
                              f"though it waited only {100 * measured:.1f}% of the time in "
                              f"next(): the loader's {threads} thread(s) and the step compete "
                              f"for {cpus} CPUs; try threads=\"auto\", or fewer threads, "
                              "or fewer torch threads (torch.set_num_threads)"})
    if bound == "step" and threads > 1 and loader_busy_share < 0.5:
        need = max(1, math.ceil(threads * loader_busy_share * 1.5))
        if need < threads:
            advice.append({"action": "fewer threads",
                           "why": f"the loader's {threads} threads were busy "
                                  f"{100 * loader_busy_share:.0f}% of the time: about {need} "
                                  "would keep up and leave CPUs to the step"})
    d = Diagnosis(
        steps=steps, batch_size=batch_size, bound=bound, input_bound=input_bound,
        wait_share=wait_share, measured_wait_share=measured,
        fed_step_s=fed / steps, cached_step_s=held / steps,
        fed_samples_per_s=samples / fed if fed > 0 else 0.0,
        cached_samples_per_s=samples / held if held > 0 else 0.0,
        stage_share=stage_share, loader_busy_share=loader_busy_share,
        loader_threads=threads, cpus=cpus, advice=advice)
    if verbose:
        print(d)
    return d
