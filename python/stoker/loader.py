"""stoker.Loader: the PyTorch-style front end of the C engine."""

import operator
import os
import re
import sys
import threading
import weakref

import numpy as np

from . import _stoker
from . import fields as _fields
from .transforms import _split_spec, to_spec

__all__ = ["Loader", "Records", "LoaderDataset", "LoaderSampler"]

_DTYPES = ("uint8", "float32", "float16", "bfloat16")
_STATE_KEYS = ("seed", "epoch", "batch")
_U64_MAX = 2 ** 64 - 1

#: Engine options that are Loader arguments: giving them in options= would
#: make the loader's attributes disagree with what the engine does.
_ARGUMENT_KEYS = ("layout", "dtype", "size", "depth", "device")


#: The library's option table (stk_option_next; docs/options.md), by key.
_OPTIONS = {o["name"]: o for o in _stoker.options()}


def _option_keys():
    """Keys of Loader(options={...}) and what each does, from the library's
    option table: every key stk_options_set() takes that is not a Loader
    argument."""
    return {k: f"{o['doc']} (default {o['default']})" for k, o in _OPTIONS.items()
            if k not in _ARGUMENT_KEYS}


def _range(key):
    """(min, max) of a numeric option, from the library's table."""
    return _OPTIONS[key]["min"], _OPTIONS[key]["max"]


def _sized_presets():
    """Presets whose output size size= sets (docs/transforms.md), from the library."""
    return [name for name, sized in _stoker.presets() if sized]


def _type_name(value):
    t = type(value)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def _describe(value):
    """value for a message: its repr, plus its type where the repr hides it
    (np.int64(8) prints as 8)."""
    if type(value) in (int, float, str, type(None)):
        return repr(value)
    return f"{value!r} ({_type_name(value)})"


def _is_bool(value):
    """Python, NumPy and torch booleans: they have __index__ but as a count
    or a size they are a mistake."""
    return isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) == \
        "torch.bool"


def _int(value, name, lo, hi):
    """value as a Python int in lo .. hi. Takes anything with __index__ (int,
    NumPy and torch integers) but not booleans; TypeError for other types,
    ValueError naming the range otherwise."""
    if _is_bool(value):
        raise TypeError(f"{name} must be an integer in {lo} .. {hi}, got {_describe(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer in {lo} .. {hi} (int, NumPy or torch "
                        f"integer), got {_describe(value)}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo} .. {hi}, got {_describe(value)}")
    return v
_FINGERPRINT_KEYS = ("num_samples", "batch_size", "world_size", "rank", "shuffle", "drop_last",
                     "transform_hash", "local_world_size", "mixture_hash")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _display(path):
    """path as reprs show it: for a URL, without the user:password@ of its
    authority and with its query and fragment (a presigned URL's
    X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token) replaced by
    "?..." -- the rule of the library's messages (stk__url_display)."""
    if not isinstance(path, str):
        return path
    m = _SCHEME.match(path)
    if not m:
        return path
    head, rest = path[:m.end()], path[m.end():]
    aend = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i >= 0:
            aend = min(aend, i)
    at = rest.rfind("@", 0, aend)
    if at >= 0:
        rest = rest[at + 1:]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    return head + (rest if cut < 0 else rest[:cut] + "?...")


class Source:
    """One source of a mixture (docs/mixing.md): Loader([Source(...), ...]).

    path: any dataset a Loader reads (a folder, .stk, tar, MDS, LitData,
    TFRecord, a URL). weight: its share of each epoch's samples_per_epoch
    (shares are normalised over the weighted sources); samples: instead, a
    fixed number of samples per epoch. Neither: in proportion to its size.
    A share above the source's size repeats it (a fresh permutation per
    pass); below, each epoch takes a prefix of a fresh permutation.

    transform: its own transform of the (first) image, a spec or a
    stoker.transforms pipeline as Loader's transform=; or a dict naming image
    fields of the loader's fields= ({"image": tf1, "depth": tf2}). A field
    it names no transform for takes the loader's. options: its own value of
    what is per source: order ("global", "shards", "blocks"), shard_window,
    block_bytes, cache (False: a remote .stk source stays out of the
    loader's disk cache, read by range); anything else is the loader's and
    refused, naming the source and the key."""

    def __init__(self, path, weight=None, samples=None, transform=None, **options):
        self.path = os.fspath(path)
        self.transform = transform
        self.options = dict(options)
        if weight is not None and samples is not None:
            raise ValueError("Source: give a weight or a number of samples, not both")
        if weight is not None:
            weight = float(weight)
            if not (weight > 0 and weight < float("inf")):
                raise ValueError(f"Source: weight must be a finite number > 0 (leave a source "
                                 f"out to give it none), got {weight!r}")
        self.weight = weight
        self.samples = None if samples is None else _int(samples, "Source: samples", 1,
                                                            _U64_MAX)

    def __setstate__(self, st):
        self.__dict__.update(st)
        self.__dict__.setdefault("options", {})   # pickled before options existed

    def _engine(self):
        """The Engine's tuple: (path, weight, samples, [(field, spec)],
        [(key, value)])."""
        t = self.transform
        if t is None:
            tfs = []
        elif isinstance(t, dict):
            tfs = []
            for name, tf in t.items():
                if not isinstance(name, str):
                    raise TypeError(f"Source({_display(self.path)!r}): transform= keys are "
                                    f"field names (str), got {_describe(name)}")
                tfs.append((name, to_spec(tf) or "none"))
        else:
            tfs = [(None, to_spec(t) or "none")]
        opts = []
        for k, v in self.options.items():
            if _is_bool(v):
                v = "1" if v else "0"
            elif hasattr(type(v), "__index__"):
                v = str(operator.index(v))
            opts.append((k, v if isinstance(v, str) else str(v)))
        return (self.path, self.weight or 0.0, self.samples or 0, tfs, opts)

    def __repr__(self):
        extra = (f", weight={self.weight!r}" if self.weight is not None else "") + \
                (f", samples={self.samples!r}" if self.samples is not None else "") + \
                "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"stoker.Source({_display(self.path)!r}{extra})"

    def __eq__(self, other):
        return (isinstance(other, Source) and
                (self.path, self.weight, self.samples, self.transform, self.options) ==
                (other.path, other.weight, other.samples, other.transform, other.options))


class Records:
    """A file of fixed-size records, as a Loader source.

    Each record is ``record_bytes`` long; the file starts with
    ``header_bytes`` to skip; the first ``label_bytes`` (0, 1, 2, 4 or 8,
    little-endian unsigned) of each record are its label and are not part of
    the sample (labels are -1 when ``label_bytes`` is 0). Batches are dense:
    ``(batch, record_bytes - label_bytes)`` uint8 (without a transform).
    """

    def __init__(self, path, record_bytes, header_bytes=0, label_bytes=0):
        self.path = os.fspath(path)
        self.record_bytes = _int(record_bytes, "Records: record_bytes", 1, _U64_MAX)
        self.header_bytes = _int(header_bytes, "Records: header_bytes", 0, _U64_MAX)
        self.label_bytes = _int(label_bytes, "Records: label_bytes", 0, 8)
        if self.label_bytes not in (0, 1, 2, 4, 8) or self.label_bytes >= self.record_bytes:
            raise ValueError("Records: label_bytes must be 0, 1, 2, 4 or 8 and smaller than "
                             "record_bytes")

    def __repr__(self):
        return (f"stoker.Records({_display(self.path)!r}, record_bytes={self.record_bytes}, "
                f"header_bytes={self.header_bytes}, label_bytes={self.label_bytes})")


def _env_int(var):
    """The integer in environment variable var, or None when it is unset."""
    text = os.environ.get(var)
    if text is None:
        return None
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"environment variable {var}={text!r} is not an integer (stoker reads "
                         f"RANK and WORLD_SIZE for this process's share of each epoch; fix or "
                         f"unset it, or pass rank= and world_size=)") from None


def _default_partition(rank, world_size):
    """rank/world_size: explicit values, else torch.distributed when it is
    initialised, else the RANK/WORLD_SIZE environment variables, else 0 of 1.
    Returns (rank, world_size, where): where says which source gave them,
    for messages."""
    if rank is not None:
        rank = _int(rank, "rank", 0, 2 ** 32 - 2)
    if world_size is not None:
        world_size = _int(world_size, "world_size", 1, 2 ** 32 - 1)
    if rank is not None and world_size is not None:
        return rank, world_size, ""
    r = w = None
    where = ""
    # A process group exists only if the program imported torch.distributed
    # itself; importing it here would cost a numpy-only loader a second.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
        where = " (from torch.distributed)"
    if w is None:
        w = _env_int("WORLD_SIZE")
        if w is not None:
            r = _env_int("RANK")
            if r is None and rank is None:
                # Rank 0 of w would silently read only 1/w of every epoch
                # in every process that lacks RANK.
                raise ValueError(f"environment variable WORLD_SIZE={w} is set but RANK is not: "
                                 f"stoker cannot tell which of the {w} ranks this process is "
                                 f"(torchrun sets both); set RANK too, unset WORLD_SIZE, or "
                                 f"pass rank= and world_size=")
            where = " (from the RANK and WORLD_SIZE environment variables)"
            lws = _env_int("LOCAL_WORLD_SIZE")
            if lws is not None and lws > w:
                raise ValueError(f"environment variable LOCAL_WORLD_SIZE={lws} is larger than "
                                 f"WORLD_SIZE={w}: a node cannot hold more ranks than the world "
                                 f"(torchrun sets LOCAL_WORLD_SIZE <= WORLD_SIZE); fix or unset "
                                 f"them, or pass rank=, world_size= and local_world_size=")
    if w is None:
        if rank is not None and world_size is None and rank > 0:
            raise ValueError(f"rank={rank} is given without world_size, and neither "
                             f"torch.distributed nor the WORLD_SIZE environment variable gives "
                             f"one (a world of 1 has only rank 0): pass world_size= too")
        r, w = 0, 1
    return (rank if rank is not None else r), (world_size if world_size is not None else w), \
        where


def _process_group(rank, world_size):
    """torch.distributed when this loader is this process's share of an
    initialised process group of several ranks (the ranks then check that
    they agree, _check_ranks_agree), else None."""
    dist = sys.modules.get("torch.distributed")
    if (world_size > 1 and dist is not None and dist.is_available() and dist.is_initialized()
            and dist.get_world_size() == world_size and dist.get_rank() == rank):
        return dist
    return None


#: What every rank must open its Loader with, and how a message names it.
_RANK_SETTINGS = {"seed": "seed", "shuffle": "shuffle", "drop_last": "drop_last",
                  "num_samples": "the dataset's size (num_samples)", "batch_size": "batch_size",
                  "order": "order", "local_world_size": "local_world_size",
                  "mixture": "the mixture (its sources' weights, fixed samples and sizes, "
                             "samples_per_epoch, mix_batching)"}


def _mixture_shares(mixture, firsts, num_samples, samples_per_epoch, mix_batching):
    """What decides a mixture's schedule, as text the ranks compare at open
    (None without a mixture): per source its weight or fixed samples and its
    size and its own order options, the epoch length and the batching.
    Ranks that differ here lay out
    different schedules, so their shares overlap and miss samples. Paths and
    per-source transforms are not compared, as for one dataset (a rank may
    read its node's copy; transforms change pixels, not the shares)."""
    if mixture is None:
        return None
    sizes = [b - a for a, b in zip(firsts, [*firsts[1:], num_samples])]
    parts = [f"{'weight ' + repr(m.weight) if m.weight is not None else ''}"
             f"{str(m.samples) + ' samples' if m.samples is not None else ''}"
             f"{'by size' if m.weight is None and m.samples is None else ''} of {size}"
             f"{''.join(f', {k} {v}' for k, v in sorted(m._engine()[4]))}"
             for m, size in zip(mixture, sizes)]
    spe = "default" if samples_per_epoch is None else str(samples_per_epoch)
    return (f"{len(mixture)} sources ({'; '.join(parts)}), samples_per_epoch {spe}" +
            (f", mix_batching {mix_batching}" if mix_batching != "mixed" else ""))


def _check_ranks_agree(dist, rank, mine):
    """One collective at open (all_gather_object): every rank's settings, so
    each rank raises the same error when they differ. Ranks that shuffle
    with different seeds, or read datasets of different sizes, take shares
    of different permutations: samples are silently duplicated and dropped.
    mine is this rank's settings, or {"error": message} when its open
    failed (the others must not wait for it, and are told)."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    failed = [(r, d["error"]) for r, d in enumerate(every) if "error" in d]
    if "error" in mine:
        return   # the caller raises its own error
    if failed:
        r, msg = failed[0]
        raise _stoker.Error(f"rank {r} of {len(every)} could not open its stoker.Loader ({msg}); "
                            f"every rank opens the loader together (docs/distributed.md)")
    for key, what in _RANK_SETTINGS.items():
        values = {}
        for r, d in enumerate(every):
            values.setdefault(d.get(key), []).append(r)
        if len(values) > 1:
            parts = "; ".join(f"{key}={v!r} on rank{'s' if len(rs) > 1 else ''} "
                              f"{', '.join(map(str, rs[:8]))}{', ...' if len(rs) > 8 else ''}"
                              for v, rs in values.items())
            raise ValueError(f"the ranks of this job disagree on {what}: {parts} (this is rank "
                             f"{rank}). Every rank must open stoker.Loader with the same seed, "
                             f"shuffle, drop_last, batch_size, order and dataset (or mixture), "
                             f"or their shares of each epoch overlap and miss samples "
                             f"(docs/distributed.md)")


def _option_value(key, value):
    """One options={...} entry as the engine's string, or a ValueError that
    says what is wrong with the key."""
    if not isinstance(key, str):
        raise TypeError(f"options: keys are option names (str), got {_describe(key)}")
    if key in _ARGUMENT_KEYS:
        raise ValueError(f"options: {key!r} is a Loader argument: pass {key}= instead")
    keys = _option_keys()
    if key not in keys:
        known = "; ".join(f"{k}: {v}" for k, v in keys.items())
        raise ValueError(f"options: unknown key {key!r}; the known keys are {known}")
    if _is_bool(value):
        return "1" if value else "0"
    if isinstance(value, str):
        return value
    if hasattr(type(value), "__index__"):
        return str(operator.index(value))
    return str(value)


def _dtype_name(dtype):
    """Accepts "float16", np.float16, torch.float16 ..."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = str(dtype)
        if name.startswith("torch."):
            name = name[len("torch."):]
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                pass
    aliases = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
               "fp32": "float32"}
    name = aliases.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got {dtype!r}")
    return name


def _device_name(device):
    """device= as the engine's option: "cpu", "cuda", "cuda:N", "fake" or
    "fake:N"; takes a torch.device or anything whose str() is one."""
    if device is None:
        return "cpu"
    name = str(device)
    if _stoker.option_error("device", name) is not None:   # the library's device names
        raise ValueError(f'device must be None, "cpu", "cuda", "cuda:N" (a torch.device works '
                         f'too), or "fake"/"fake:N" (the CPU stand-in for a GPU that the tests '
                         f'use), got {device!r}')
    return name


def _bool(value, name):
    """A bool argument: Python, NumPy or torch booleans only, since a string
    such as "no" or "False" is true and would be taken as True."""
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool (True or False), got {_describe(value)}")
    return bool(value)


#: DataLoader arguments stoker.Loader does not take, and what to use instead
#: (docs/python.md, "Migrating from DataLoader").
_DATALOADER_ARGS = {
    "num_workers": "stoker decodes on native threads, not worker processes: use threads=N "
                   "(None or 0: all usable CPUs)",
    "pin_memory": "pinned memory comes with device=\"cuda\": batches are copied to the GPU from "
                  "page-locked buffers; on the CPU path batches are views of the ring and need "
                  "no pinning",
    "collate_fn": "stoker assembles batches in C (one tensor for fixed-size samples, a list for "
                  "variable ones, int64 labels): drop collate_fn and reshape the batch in your "
                  "training step",
    "sampler": "the order is a seeded permutation: use shuffle= and seed=, and rank=/world_size= "
               "for a distributed share (return_indices=True shows the order)",
    "batch_sampler": "batches are batch_size consecutive samples of the seeded order: use "
                     "batch_size=, shuffle=, seed= and drop_last=",
    "prefetch_factor": "use depth= (batches prepared ahead, default 2)",
    "persistent_workers": "stoker's threads always persist: drop it (depth= sets the batches "
                          "prepared ahead)",
    "worker_init_fn": "no Python runs on stoker's threads; randomness is keyed by (seed, epoch, "
                      "sample): use seed=",
    "generator": "use seed= (batches are bit-identical for any thread count)",
    "multiprocessing_context": "there are no worker processes: drop it",
    "timeout": "a stalled read is retried and reported by the engine; drop it",
}


def _refuse_dataloader_args(kwargs):
    for k in kwargs:
        if k in _DATALOADER_ARGS:
            raise TypeError(f"stoker.Loader has no {k}= (a DataLoader argument): "
                            f"{_DATALOADER_ARGS[k]}; see the migration table in docs/python.md")
        raise TypeError(f"stoker.Loader() got an unexpected keyword argument {k!r}")

def _auto_threads(spec):
    """threads="auto" or "auto:N" -> (cap or None, True)."""
    if spec == "auto":
        return None, True
    if spec.startswith("auto:"):
        try:
            n = int(spec[5:])
        except ValueError:
            n = 0
        if 1 <= n <= _stoker.THREADS_MAX:
            return n, True
    raise ValueError(f'threads must be an int 1..{_stoker.THREADS_MAX}, None, "auto" or "auto:N" '
                     f'(N the most threads, 1..{_stoker.THREADS_MAX}), got {spec!r}')


class Loader:
    """Loads batches with stoker's C engine: native threads read, decode and
    transform samples into a bounded ring of batch buffers; each batch reaches
    Python as torch tensors (DLPack) or NumPy arrays that view the ring
    directly, with no copy.

    Loader(source, batch_size, *, shuffle=True, seed=0, drop_last=False,
           transform=None, threads=None, depth=2, output="torch", layout="nchw",
           dtype="uint8", on_error="raise", rank=None, world_size=None,
           size=None, max_sample_bytes=None, options=None, return_indices=False,
           strict=False, trace=None, device=None, fields=None, bytes_as="bytes")

    source: a directory in ImageFolder layout (ROOT/CLASS/IMAGE; labels are the
        class indices in sorted order, as torchvision), or a stoker.Records.
    transform: None (raw bytes: a list of uint8 arrays per batch, or a dense
        array for records), a preset name ("imagenet-train", "imagenet-val",
        "cifar-train", "decode", "none"), a spec string, a
        stoker.transforms.Compose or list of transforms, or a torchvision
        Compose of supported transforms (converted).
    threads: worker threads (None or 0 = the CPUs this process may use, shared
        among LOCAL_WORLD_SIZE ranks; see docs/engine.md), or "auto" /
        "auto:N": autotune -- up to that many (or N) threads, of which the
        loader keeps working the fewest that keep your loop from waiting
        (same batches as any fixed count; docs/diagnosis.md). depth: batches prepared
        ahead; the ring has depth + 1 buffers, one for the batch your loop
        still holds. depth="auto": the deepest ring (up to 8) whose memory
        bound fits memory_budget (bytes; default a quarter of the available
        memory, shared by LOCAL_WORLD_SIZE ranks).
    output: "torch" (tensors through DLPack) or "numpy".
    layout, dtype: image output options (dtype "bfloat16" needs torch).
    size: output size of the presets imagenet-train, imagenet-val and
        cifar-train (alone or in a spec string); refused with other transforms.
    max_sample_bytes: a cap on one sample of variable-size batches (None: no cap
        but the batch's own, options={"batch_memory": ...}, default 512 MiB;
        docs/memory.md).
    options: other engine options (docs/options.md); unknown keys are refused.
    cache_dir, cache_limit: for remote datasets (http://, https://, s3://
        URLs; docs/remote.md), a disk cache of whole shards shared by the
        processes of a node, and its size limit in bytes (default: 90 % of
        the free space).
    order: "global" (a shuffle of all samples, the default) or "shards"
        (shuffled shards, samples shuffled within windows of shard_window
        shards, default 8): keeps a small cache hitting (docs/remote.md).
    on_error: "raise" (a bad sample raises stoker.SampleError; calling next()
        again on the same iterator gives the batch without it) or "skip"
        (left out, counted and listed in stats()["errors"]).
    rank, world_size: this process's share of every epoch; default from
        torch.distributed when the program imported and initialised it, else
        RANK/WORLD_SIZE, else 0/1.
    device: None/"cpu" (host memory), or "cuda" / "cuda:N" / a torch.device:
        batches are copied to the GPU on a stream of the loader's own from
        page-locked buffers, converted there to dtype/layout (so uint8
        crosses the bus), and yielded as CUDA tensors whose consumer stream
        waits for the copy; labels follow to the same GPU (docs/gpu.md).
        Without a GPU and its driver it raises stoker.Error saying why.
        "fake" is the CPU stand-in the tests use.
    return_indices: yield (data, labels, indices) with the dataset index of
        each sample (int64); with fields=, the dict's "__index__" entry.
    fields: samples with several fields (docs/multimodal.md): {output name:
        source fields}, each a str of ';'-separated alternatives ("jpg;png"),
        a (sources, kind) tuple or a stoker.Field (optional fields); batches
        are then dicts: fixed-size images, int and float fields as tensors
        viewing the batch, text as lists of str, json as parsed values, bytes
        as lists of bytes, npy as one tensor or a list (docs/python.md).
        transform= may then be a dict {image field: transform}.
    bytes_as: "bytes" (lists of bytes) or "tensor": a stoker.Ragged
        (data, offsets, lengths) viewing the batch, no copy.
    trace: a file to write a Chrome trace-event JSON of the run into at close
        (open it in Perfetto or chrome://tracing; docs/diagnosis.md).
    strict: decoding checks each image's whole compressed stream, so a
        truncated or corrupt file fails in every epoch whatever its random
        crop (default False: a crop decodes only the rows it needs, faster;
        see docs/images.md).

    Iterating gives one epoch of (data, labels) batches. Iterating again
    continues with the next epoch; an iterator abandoned mid-epoch is
    superseded by the next iter(), which starts the following epoch, unless
    set_epoch() or load_state_dict() chose the position in between.
    Integer arguments take int or anything with __index__ (NumPy and torch
    integers), not bool; shuffle, drop_last, return_indices and strict take
    bools only. DataLoader arguments (num_workers=, pin_memory=,
    collate_fn=, ...) raise TypeError saying what to use instead. Under an
    initialised torch.distributed group the ranks check at open that they
    agree on seed, shuffle, drop_last, batch_size, order and the dataset's
    size, or a mixture's weights and sizes (one collective: every rank opens
    its loader). A loader pickles
    (and deepcopies) as its arguments and state_dict(), re-opened where it is
    unpickled. One iterator may be shared by several threads: each batch of
    its epoch goes to one of them, and none gets the next epoch's.
    loader.dataset and loader.sampler answer what
    DataLoader code asks of them (len, classes, set_epoch).
    Data is a tensor/array of shape (batch, *sample_shape) for dense batches,
    or a list of per-sample tensors/arrays for variable-size ones; labels are
    int64. A batch's memory returns to the ring once nothing references it
    (its arrays, tensors, or views of them).
    """

    def __init__(self, source, batch_size, *, shuffle=True, seed=0, drop_last=False,
                 transform=None, threads=None, depth=2, output="torch", layout="nchw",
                 dtype="uint8", on_error="raise", rank=None, world_size=None, size=None,
                 max_sample_bytes=None, options=None, return_indices=False, cache_dir=None,
                 cache_limit=None, order="global", shard_window=None, strict=False,
                 trace=None, memory_budget=None, local_world_size=None, device=None,
                 fields=None, bytes_as="bytes", samples_per_epoch=None, mix_resume="strict",
                 mix_batching="mixed", **kwargs):
        self._engine = None
        _refuse_dataloader_args(kwargs)
        # The arguments as given, for pickling (__getstate__): a copy re-opens
        # from them. Those converted below are replaced by their plain form.
        self._args = {k: v for k, v in locals().items() if k not in ("self", "kwargs")}
        device = _device_name(device)
        if device.startswith("cuda") and output != "torch":
            raise ValueError(f'device={device!r} delivers CUDA tensors: it needs output="torch"')
        if output not in ("torch", "numpy"):
            raise ValueError(f'output must be "torch" or "numpy", got {output!r}')
        if bytes_as not in _fields._BYTES_AS:
            raise ValueError(f'bytes_as must be "bytes" (a list of bytes per batch) or "tensor" '
                             f'(one uint8 tensor viewing the batch, plus offsets and lengths), '
                             f'got {bytes_as!r}')
        mixture = None
        if isinstance(source, (list, tuple)):
            if not source or not all(isinstance(x, Source) for x in source):
                raise TypeError("a mixture is a non-empty list of stoker.Source "
                                "(docs/mixing.md)")
            mixture = list(source)
        elif samples_per_epoch is not None:
            raise ValueError("samples_per_epoch sets a mixture's epoch: pass a list of "
                             "stoker.Source")
        if mix_batching not in ("mixed", "per_source"):
            raise ValueError(f'mix_batching must be "mixed" or "per_source", got '
                             f'{mix_batching!r}')
        if mixture is None and mix_batching != "mixed":
            raise ValueError("mix_batching applies to a mixture: pass a list of stoker.Source")
        if mix_resume not in ("strict", "new"):
            raise ValueError(f'mix_resume must be "strict" or "new", got {mix_resume!r}')
        if fields is not None:
            fields = _fields.normalize(fields)
            if mixture is not None and "source" not in fields:
                # Each sample's source index: batch["source"].
                fields["source"] = _fields.normalize({"source": ("source", "int")})["source"]
        elif isinstance(transform, dict):
            raise TypeError("transform: a dict of transforms names image fields: pass fields= "
                            "too (docs/multimodal.md), or a single transform")
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        if layout not in ("nchw", "nhwc"):
            raise ValueError(f'layout must be "nchw" or "nhwc", got {layout!r}')
        dtype = _dtype_name(dtype)
        if output == "numpy" and dtype == "bfloat16":
            raise ValueError('NumPy has no bfloat16 type: use output="torch" with '
                             'dtype="bfloat16", or dtype="float16"/"float32" with NumPy')
        batch_size = _int(batch_size, "batch_size", 1, _stoker.BATCH_SIZE_MAX)
        autotune = False
        if isinstance(threads, str):
            threads, autotune = _auto_threads(threads)
        elif threads is not None:
            # 0 is the command line's --threads 0: all usable CPUs, as None.
            threads = _int(threads, "threads (None or 0: all usable CPUs, \"auto\" or "
                           "\"auto:N\": autotune)", 0, _stoker.THREADS_MAX)
        depth_auto = depth == "auto"
        depth = 2 if depth_auto else _int(depth, "depth", *_range("depth"))
        seed = _int(seed, "seed", 0, _U64_MAX)
        shuffle, drop_last = _bool(shuffle, "shuffle"), _bool(drop_last, "drop_last")
        return_indices, strict = _bool(return_indices, "return_indices"), _bool(strict, "strict")
        rank, world_size, where = _default_partition(rank, world_size)
        if not (1 <= world_size < 2 ** 32 and 0 <= rank < world_size):
            raise ValueError(f"need 0 <= rank < world_size <= {2 ** 32 - 1}, got rank={rank}, "
                             f"world_size={world_size}{where}")
        if size is not None:
            size = _int(size, "size", *_range("size"))
        if max_sample_bytes is not None:
            max_sample_bytes = _int(max_sample_bytes, "max_sample_bytes (bytes; None: no "
                                    "cap but batch_memory)", 1, 2 ** 40)
        self._torch = None
        if output == "torch":
            try:
                import torch
                import torch.utils.dlpack
            except ImportError as e:
                raise ImportError('output="torch" needs PyTorch; install it or use '
                                  'output="numpy"') from e
            self._torch = torch
            self._from_dlpack = torch.utils.dlpack.from_dlpack

        opts = {"layout": layout, "dtype": dtype}
        if device != "cpu":
            opts["device"] = device
        if depth_auto:
            opts["depth"] = "auto"
        if memory_budget is not None:
            # A str is a size the library parses ("16GiB", "1.5G": docs/cli.md).
            opts["memory_budget"] = (memory_budget if isinstance(memory_budget, str) else
                                     str(_int(memory_budget, "memory_budget (bytes)", 1, 2 ** 50)))
        if autotune:
            opts["autotune"] = "1"
        if size is not None:
            opts["size"] = str(size)
        if strict:
            opts["strict"] = "1"
        for k, v in (options or {}).items():
            opts[k] = _option_value(k, v)
        if cache_dir is not None:
            opts["cache_dir"] = os.fspath(cache_dir)
        if cache_limit is not None:
            opts["cache_limit"] = (cache_limit if isinstance(cache_limit, str) else
                                   str(_int(cache_limit, "cache_limit (bytes)", *_range("cache_limit"))))
        opts["order"] = order
        if shard_window is not None:
            opts["shard_window"] = str(_int(shard_window, "shard_window", *_range("shard_window")))
        if trace is not None:
            opts["trace"] = os.fspath(trace)
        # Ranks per node: each node reads its own contiguous part of the
        # order, so with the shard-aware order a node-shared cache fetches
        # each shard about once per node (docs/distributed.md). By default
        # torchrun's LOCAL_WORLD_SIZE when order="shards", else one node.
        if local_world_size is None and order == "shards" and world_size > 1:
            local_world_size = _env_int("LOCAL_WORLD_SIZE")
            if local_world_size is not None and not 1 <= local_world_size <= world_size:
                raise ValueError(f"environment variable LOCAL_WORLD_SIZE={local_world_size} "
                                 f"is not in 1 .. world_size={world_size}{where}: a node holds "
                                 f"1 .. world_size ranks; fix or unset it, or pass "
                                 f"local_world_size=")
        if local_world_size is not None:
            local_world_size = _int(local_world_size, "local_world_size", 1, world_size)
            if world_size % local_world_size:
                raise ValueError(f"local_world_size={local_world_size} does not divide "
                                 f"world_size={world_size}: a world is a whole number of nodes")
            opts["local_world_size"] = str(local_world_size)
        engine_sources = None
        if mixture is not None:
            engine_sources = [m._engine() for m in mixture]
            if samples_per_epoch is not None:
                opts["samples_per_epoch"] = str(_int(samples_per_epoch, "samples_per_epoch", 1,
                                                     2 ** 62))
            opts["mix_resume"] = mix_resume
            if mix_batching != "mixed":
                opts["mix_batching"] = mix_batching
        records = None
        if mixture is not None:
            path = mixture[0].path
        elif isinstance(source, Records):
            records = (source.record_bytes, source.header_bytes, source.label_bytes)
            path = source.path
        else:
            path = os.fspath(source)
        if fields is not None:
            spec, field_specs = _fields.transforms(fields, transform)
            engine_fields = _fields.engine_fields(fields, field_specs)
        else:
            spec, field_specs, engine_fields = to_spec(transform), {}, None
        specs = [spec, *field_specs.values()]
        sized = _sized_presets()
        if size is not None and not any(p.strip() in sized for sp in specs
                                         for p in _split_spec(sp or "none")):
            shown = field_specs if field_specs else spec
            raise ValueError(f"size={size} sets the output size of the presets "
                             f"{', '.join(sized)}, and transform={shown!r} has none: "
                             f"it would be ignored. Give the size in the transforms themselves "
                             f"(e.g. RandomResizedCrop({size})), or drop size=")

        self._args.update(source=mixture if mixture is not None else
                          source if records else path,
                          transform=field_specs if field_specs else spec, fields=fields,
                          device=device,
                          dtype=dtype, options={k: _option_value(k, v)
                                                for k, v in (options or {}).items()} or None,
                          cache_dir=opts.get("cache_dir"), trace=opts.get("trace"))
        self.source = mixture if mixture is not None else source
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.transform = field_specs if field_specs else spec
        #: {output name: stoker.Field}, or None for (data, labels) batches.
        self.fields = fields
        self.bytes_as = bytes_as
        self.depth, self.output, self.layout, self.dtype = depth, output, layout, dtype
        self.on_error, self.rank, self.world_size = on_error, rank, world_size
        self.local_world_size = local_world_size or world_size
        self.return_indices = bool(return_indices)
        self.device = device
        # Device batches by data address, for record_stream: (weak reference
        # to the engine's Batch, bytes of its data). The yielded tensor keeps
        # its Batch alive, so an entry lives exactly as long as the batch.
        self._device_batches = {}
        self._label_device = None
        if device.startswith("cuda"):
            self._label_device = self._torch.device(device)
        group = _process_group(rank, world_size)
        try:
            self._engine = _stoker.Engine(
                path, batch_size, shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last),
                # depth means the same as in the engine: batches prepared ahead
                # of the one the loop holds (the ring has depth + 1 buffers).
                transform=spec, threads=threads or 0, depth=depth,
                on_error_skip=on_error == "skip", rank=rank, world_size=world_size,
                records=records, options=opts, max_sample_bytes=max_sample_bytes or 0,
                fields=engine_fields, sources=engine_sources)
        except Exception as e:
            if group is not None:   # the other ranks wait in the check: tell them
                _check_ranks_agree(group, rank, {"error": f"{type(e).__name__}: {e}"})
            raise
        self._info = self._engine.info()
        self._classes = self._engine.class_names()
        if group is not None:
            try:
                _check_ranks_agree(group, rank, {
                    "seed": seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                    "num_samples": self._info["num_samples"], "batch_size": batch_size,
                    "order": order, "local_world_size": self.local_world_size,
                    "mixture": _mixture_shares(
                        mixture, [f for _, _, f in self._engine.source_stats()],
                        self._info["num_samples"], samples_per_epoch, mix_batching)})
            except BaseException:
                self._engine.close()
                raise
        self.depth = self._info["depth"]
        self.threads = self._info["threads"]
        self._fields_conv = None
        if fields is not None:
            self._fields_conv = _fields.Converter(
                self._torch, getattr(self, "_from_dlpack", None), bytes_as, self.return_indices,
                self._note_device_batch if device != "cpu" else None)
        self._lock = threading.Lock()
        self._generation = 0   # bumped when an iterator is superseded
        self._pinned = False   # set_epoch/load_state_dict chose the next position

    # ---- facts -------------------------------------------------------------
    def __len__(self):
        """Batches per epoch for this rank."""
        return self._info["batches_per_epoch"]

    @property
    def num_samples(self):
        """Samples in the whole dataset."""
        return self._info["num_samples"]

    @property
    def samples_per_epoch(self):
        """Samples this rank delivers per epoch (with wrap-around padding when
        drop_last is off and the dataset does not divide evenly)."""
        return self._info["samples_per_epoch"]

    @property
    def num_classes(self):
        return self._info["num_classes"]

    @property
    def classes(self):
        """Class names: the subfolders of a folder source (sorted, as
        torchvision's ImageFolder), the names a .stk dataset's manifest
        lists, num_classes of them (None for a class an older manifest left
        unnamed); [] for sources that store no names (records, tar, CIFAR),
        whose labels are still counted by num_classes."""
        return list(self._classes)   # read at open, from the library

    @property
    def dataset(self):
        """What DataLoader users reach for as loader.dataset: len() is the
        number of samples in the whole dataset, plus classes, class_to_idx,
        num_classes. The samples themselves come only from iterating the
        loader."""
        return LoaderDataset(self)

    @property
    def sampler(self):
        """What DistributedSampler users reach for as loader.sampler: len() is
        the samples this rank gets per epoch; set_epoch(e) is the loader's."""
        return LoaderSampler(self)

    @property
    def memory_bound(self):
        """Bytes of every buffer the loader allocates (known before the first batch)."""
        return self._info["memory_bound_bytes"]

    @property
    def epoch(self):
        """The epoch the next batch belongs to."""
        return self.state_dict()["epoch"]

    @property
    def closed(self):
        return self._engine is None or self._engine.closed

    def info(self):
        """Static facts: counts, threads, depth (and ring_buffers = depth + 1),
        batch kind, source kind, memory bound."""
        return dict(self._info)

    # ---- position ------------------------------------------------------------
    def set_epoch(self, epoch):
        """Makes the next iteration epoch `epoch` from its first batch (the
        epoch keys the shuffle and the random transforms). Supersedes live
        iterators."""
        epoch = _int(epoch, "epoch", 0, self._max_epoch())
        with self._lock:
            self._check_open()
            self._engine.set_epoch(epoch)
            self._generation += 1
            self._pinned = True

    def _max_epoch(self):
        # The engine counts batches from epoch 0 in 64 bits (src/loader.c).
        return _U64_MAX // (len(self) + 1) - 1

    def state_dict(self):
        """The position as a dict: resume exactly with load_state_dict(). It
        counts batches already handed out, so save it after finishing the
        step on the last batch you took. In lockstep data-parallel training
        every rank's dict is the same: saving rank 0's is enough, and it
        restores onto any world size (elastic resume, docs/engine.md)."""
        self._check_open()
        seed = self._engine.get_state()[0]
        fp = self._engine.fingerprint()
        epoch, batch = fp["position"]
        if not fp["history"] and batch >= len(self):   # the epoch was handed out
            epoch, batch = epoch + 1, 0
        return {"seed": seed, "epoch": epoch, "batch": batch, "batch_size": self.batch_size,
                "num_samples": self.num_samples, "rank": self.rank,
                "world_size": self.world_size, "local_world_size": fp["local_world_size"],
                "drop_last": self.drop_last, "shuffle": self.shuffle,
                "transform_hash": fp["transform_hash"], "history": fp["history"],
                **({"mixture_hash": fp["mixture_hash"]} if fp.get("mixture_hash") else {})}

    def load_state_dict(self, state):
        """Restores a position from state_dict() (possibly saved by another
        process, or by a world of another size). The next iteration continues
        from it exactly.

        The engine checks the seed and the fingerprint (num_samples, shuffle,
        drop_last, transform_hash) and refuses a mismatch naming the field. A
        fingerprint key missing from the dict (state dicts saved by older
        versions lack transform_hash, local_world_size and history) is not
        checked. world_size, local_world_size and batch_size may differ from
        this loader's: the rest of the epoch is laid out over this world and
        every sample the saved world had not delivered comes exactly once
        across the new ranks (elastic resume, docs/engine.md); rank is not
        checked, since every rank's state is the same in lockstep training."""
        for k in _STATE_KEYS:
            if k not in state:
                raise ValueError(f"state dict lacks {k!r}")
        mix_new = isinstance(self.source, list) and self._args.get("mix_resume") == "new"
        for k in ("num_samples", "drop_last", "shuffle"):
            if k == "num_samples" and mix_new:
                continue   # a new mixture continues from the position (docs/mixing.md)
            if k in state and state[k] != getattr(self, k):
                raise ValueError(f"state was saved with {k}={state[k]!r} but this loader has "
                                 f"{k}={getattr(self, k)!r}: resuming would not be exact")
        seed = _int(state["seed"], "state dict seed", 0, _U64_MAX)
        epoch = _int(state["epoch"], "state dict epoch", 0, self._max_epoch())
        same_world = (state.get("world_size", self.world_size) == self.world_size and
                      state.get("batch_size", self.batch_size) == self.batch_size and
                      state.get("local_world_size", self.local_world_size) ==
                      self.local_world_size and not state.get("history"))
        if same_world:
            batch = _int(state["batch"], f"state dict batch (this loader has {len(self)} "
                         f"batches per epoch)", 0, len(self))
        else:  # another world's count: the engine checks it against that world
            batch = _int(state["batch"], "state dict batch", 0, 2 ** 62)
        fp = {}
        for k in _FINGERPRINT_KEYS:
            if k in state:
                try:  # NumPy and torch integers, as everywhere in the API
                    fp[k] = operator.index(state[k])
                except TypeError:
                    fp[k] = state[k]  # the engine names the field and the value
        if state.get("history") is not None:
            fp["history"] = list(state["history"])
        with self._lock:
            self._check_open()
            self._engine.set_state(seed, epoch, batch, fp)
            self._generation += 1
            self._pinned = True

    # ---- iteration -------------------------------------------------------------
    def __iter__(self):
        with self._lock:
            self._check_open()
            if not self._pinned:
                _, epoch, batch = self._engine.get_state()
                if batch != 0:
                    # An earlier iterator stopped mid-epoch (or took every
                    # batch without seeing the end): start the next epoch.
                    self._engine.set_epoch(epoch + 1)
            self._pinned = False
            self._generation += 1
            # The engine's turn ends with this epoch (or when something moves
            # the position): every next() of this iterator passes it, so
            # however many threads share the iterator, none of them gets a
            # batch of another epoch once one of them has seen the end.
            return _EpochIterator(self, self._generation, self._engine.begin())

    def _next_batch(self, generation, turn):
        self._check_open()
        if generation != self._generation:
            raise _superseded()
        b = self._engine.next(100, turn)
        if b is None:
            if generation != self._generation:
                raise _superseded()
            return None
        return self._convert(b)

    def _convert(self, b):
        if self._fields_conv is not None:
            return self._fields_conv(b)
        if self._torch is not None:
            conv = self._from_dlpack
        else:
            conv = np.asarray
        if b.dense:
            data = conv(b.data())
            if self.device != "cpu":
                self._note_device_batch(b, data)
        else:
            data = [conv(v) for v in b.samples()]
        labels = conv(b.labels())
        if self._label_device is not None:
            # Labels are small host arrays: they follow the data to its GPU.
            labels = labels.to(self._label_device, non_blocking=True)
        if not self.return_indices:
            return data, labels
        idx = np.asarray(b.indices()).astype(np.int64)
        if self._torch is not None:
            idx = self._torch.from_numpy(idx)
        return data, labels, idx

    def _note_device_batch(self, b, data):
        if len(self._device_batches) >= 64:
            self._device_batches = {a: e for a, e in self._device_batches.items()
                                    if e[0]() is not None}
        if self._torch is not None:
            addr, nbytes = data.data_ptr(), data.numel() * data.element_size()
        else:
            addr, nbytes = data.__array_interface__["data"][0], data.nbytes
        # Keyed by the tensor's memory: with fields, each dense field of a
        # batch is a tensor of its own in device memory.
        self._device_batches[addr] = (weakref.ref(b), nbytes)

    def record_stream(self, data, stream):
        """For a device batch used on more than one CUDA stream, like torch's
        Tensor.record_stream (which does nothing for memory torch did not
        allocate, such as a batch's). A batch's device memory is reused once
        the work queued up to its release (when its last tensor dies) has run
        on the stream it was consumed on (the current stream when the tensor
        was made, the last one given to ``__dlpack__``); record_stream adds
        `stream` to the streams waited for, up to 8 a batch.

        data: a data tensor (or a view into one) this loader yielded and that
        is still alive. stream: a torch.cuda.Stream, a cudaStream_t as an
        int, or None (the default stream). Does nothing for a loader without
        a device. Labels moved to the GPU are ordinary torch tensors: use
        their own record_stream (docs/gpu.md)."""
        if self.device == "cpu":
            return
        if self._torch is not None and isinstance(data, self._torch.Tensor):
            ptr = data.data_ptr()
        elif isinstance(data, np.ndarray):
            ptr = data.__array_interface__["data"][0]
        else:
            raise TypeError(f"record_stream: data must be a tensor or array this loader "
                            f"yielded, not {type(data).__name__}")
        batch = None
        for addr, (ref, nbytes) in list(self._device_batches.items()):
            b = ref()
            if b is not None and addr <= ptr < addr + max(nbytes, 1):
                batch = b
                break
        if batch is None:
            raise ValueError("record_stream: data is not in a batch of this loader that is "
                             "still held (a copy, another loader's, or released)")
        if stream is not None and not isinstance(stream, int):
            handle = getattr(stream, "cuda_stream", None)
            if not isinstance(handle, int):
                raise TypeError(f"record_stream: stream must be a torch.cuda.Stream, a "
                                f"cudaStream_t as an int or None, not {type(stream).__name__}")
            stream = handle
        batch.record_stream(stream)

    # ---- pickling --------------------------------------------------------------
    def __getstate__(self):
        """What pickle and copy.deepcopy keep of a loader: its constructor
        arguments and its position (state_dict()), not its threads or
        buffers. The copy re-opens the dataset in the receiving process
        (__setstate__) and continues from that position, as a DataLoader is
        pickled by its arguments and re-created where it is unpickled."""
        import pickle
        if self.closed:
            raise TypeError("cannot pickle a closed stoker.Loader: pickling keeps the arguments "
                            "and the position (state_dict()), which a closed loader no longer "
                            "has; pickle it before close(), or pickle Loader arguments and a "
                            "state_dict() and open a new Loader from them")
        for k, v in self._args.items():
            try:
                pickle.dumps(v)
            except Exception as e:  # noqa: BLE001 -- any reason pickle gives
                raise TypeError(f"cannot pickle stoker.Loader: its argument {k}={v!r} cannot be "
                                f"pickled ({type(e).__name__}: {e}); a pickled loader is "
                                f"re-opened from its arguments in the receiving process, so "
                                f"each must pickle: pass {k} as plain values (str, int, "
                                f"stoker.Records, ...), or open the loader in the process that "
                                f"uses it") from e
        return {"args": dict(self._args), "state": self.state_dict()}

    def __setstate__(self, st):
        """Re-opens the loader from the pickled arguments and moves it to the
        pickled position. rank/world_size left to their defaults are found
        again in this process (its process group or environment)."""
        self.__init__(**st["args"])
        state = st["state"]
        try:
            if state["batch"] == 0 and not state.get("history"):
                # An epoch's start: no need for the saved world's layout,
                # which may differ from this process's (ddp_spawn pickles in
                # the parent, before the process group exists).
                if state["epoch"] != 0:
                    self.set_epoch(state["epoch"])
            else:
                self.load_state_dict(state)
        except BaseException:
            self.close()
            raise

    def sources_of(self, indices):
        """A mixture's source index (0, 1, ...) of each dataset index in
        `indices` (a batch's "__index__" with return_indices=True): an int64
        array of the same length (a tensor with output="torch")."""
        if not isinstance(self.source, list):
            raise TypeError("sources_of needs a mixture (a list of stoker.Source)")
        self._check_open()
        firsts = np.array([f for _, _, f in self._engine.source_stats()], dtype=np.int64)
        idx = np.asarray(indices.cpu() if hasattr(indices, "cpu") else indices, dtype=np.int64)
        out = np.searchsorted(firsts, idx, side="right").astype(np.int64) - 1
        return self._torch.from_numpy(out) if self._torch is not None else out

    # ---- observation -----------------------------------------------------------
    def stats(self):
        """Counters: per-stage items and busy seconds (summed and per thread),
        starvation (seconds next() waited), samples/batches delivered, skipped
        and failed samples, the memory bound, and the list of failed samples
        (path and reason; the first 1024 are kept)."""
        self._check_open()
        st = self._engine.stats()
        # Remote datasets: the fetch stage's requests, bytes, retries, cache
        # hits/misses/evictions and waits (None for a local dataset).
        st["fetch"] = self._engine.fetch_stats()
        if isinstance(self.source, list):
            # A mixture: samples delivered and failed per source, in order.
            st["sources"] = [{"path": m.path, "samples": got, "failed": failed}
                             for m, (got, failed, _) in zip(self.source,
                                                             self._engine.source_stats())]
        return st

    # ---- lifetime ----------------------------------------------------------------
    def close(self):
        """Stops the threads and frees the loader. Batches still held stay
        valid until their last reference goes. Safe to call twice."""
        if self._engine is not None:
            self._engine.close()
            self._generation += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._engine is None or self._engine.closed:
            raise _stoker.Error("the loader is closed")

    def __repr__(self):
        src = (self.source if isinstance(self.source, (Records, list))
               else repr(_display(os.fspath(self.source))))
        return (f"stoker.Loader({src}, batch_size={self.batch_size}, transform="
                f"{self.transform!r}, threads={getattr(self, 'threads', None)}, "
                f"output={self.output!r}, dtype={self.dtype!r}"
                f"{'' if self.fields is None else f', fields={self.fields!r}'})")


class LoaderDataset:
    """loader.dataset: the facts a DataLoader user reads from their Dataset.
    len() is the number of samples in the whole dataset (every rank's);
    classes, class_to_idx and num_classes as torchvision's ImageFolder; root
    and source name where it comes from. It holds no samples: indexing it
    raises TypeError (iterate the loader, or use return_indices=True to see
    which sample each row is)."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self):
        return self._loader.num_samples

    @property
    def source(self):
        """The source the loader was opened with (a path or a stoker.Records)."""
        return self._loader.source

    @property
    def root(self):
        s = self._loader.source
        if isinstance(s, list):   # a mixture: its sources' paths
            return [m.path for m in s]
        return s.path if isinstance(s, Records) else os.fspath(s)

    @property
    def kind(self):
        """"folder", "records", "stk", "tar" or "cifar"."""
        return self._loader._info["source_kind"]

    @property
    def classes(self):
        return self._loader.classes

    @property
    def class_to_idx(self):
        return {name: i for i, name in enumerate(self._loader.classes)}

    @property
    def num_classes(self):
        return self._loader.num_classes

    def __getitem__(self, index):
        raise TypeError("loader.dataset has no per-sample access: stoker's engine reads and "
                        "transforms samples into batches; iterate the loader (with "
                        "return_indices=True to get each row's dataset index)")

    def __repr__(self):
        return (f"<stoker dataset {_display(self.root)!r}: {len(self)} samples, {self.num_classes} "
                f"classes, {self.kind}>")


class LoaderSampler:
    """loader.sampler: what a DistributedSampler user reads and calls. len()
    is the samples this rank gets per epoch (with drop_last off, padded by
    wrapping around, as DistributedSampler pads); set_epoch(e) is
    loader.set_epoch(e): the next iteration is epoch e from its first batch.
    It yields no indices: use return_indices=True on the loader."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self):
        return self._loader.samples_per_epoch

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    @property
    def epoch(self):
        return self._loader.epoch

    @property
    def shuffle(self):
        return self._loader.shuffle

    @property
    def seed(self):
        return self._loader.seed

    @property
    def drop_last(self):
        return self._loader.drop_last

    @property
    def rank(self):
        return self._loader.rank

    @property
    def num_replicas(self):
        return self._loader.world_size

    def __repr__(self):
        return (f"<stoker sampler: {len(self)} samples per epoch for rank {self.rank} of "
                f"{self.num_replicas}, shuffle={self.shuffle}, seed={self.seed}>")


def _superseded():
    return RuntimeError("this iterator was superseded by a newer iter(), set_epoch() or "
                        "load_state_dict() on its loader")


class _EpochIterator:
    """One epoch of one Loader. Raising an exception (SampleError,
    KeyboardInterrupt) does not end it: calling next() again continues.
    Several threads may share it: each batch of the epoch goes to one of
    them, and once the epoch is over every next() raises StopIteration."""

    def __init__(self, loader, generation, turn):
        self._loader = loader
        self._generation = generation
        self._turn = turn
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._loader._next_batch(self._generation, self._turn)
        if item is None:
            self._done = True
            raise StopIteration
        return item

    def __len__(self):
        return len(self._loader)
