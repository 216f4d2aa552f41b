"""stoker.Loader: the PyTorch-style front end of the C engine."""

import os
import threading

import numpy as np

from . import _stoker
from .transforms import to_spec

__all__ = ["Loader", "Records"]

_DTYPES = ("uint8", "float32", "float16", "bfloat16")
_STATE_KEYS = ("seed", "epoch", "batch")
_FINGERPRINT_KEYS = ("num_samples", "batch_size", "world_size", "rank", "shuffle", "drop_last",
                     "transform_hash")


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
        self.record_bytes = int(record_bytes)
        self.header_bytes = int(header_bytes)
        self.label_bytes = int(label_bytes)
        if self.record_bytes < 1 or self.header_bytes < 0:
            raise ValueError("Records: record_bytes must be >= 1 and header_bytes >= 0")
        if self.label_bytes not in (0, 1, 2, 4, 8) or self.label_bytes >= self.record_bytes:
            raise ValueError("Records: label_bytes must be 0, 1, 2, 4 or 8 and smaller than "
                             "record_bytes")

    def __repr__(self):
        return (f"stoker.Records({self.path!r}, record_bytes={self.record_bytes}, "
                f"header_bytes={self.header_bytes}, label_bytes={self.label_bytes})")


def _default_partition(rank, world_size):
    """rank/world_size: explicit values, else torch.distributed when it is
    initialised, else the RANK/WORLD_SIZE environment variables, else 0 of 1."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    r = w = None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if w is None and "WORLD_SIZE" in os.environ:
        w = int(os.environ["WORLD_SIZE"])
        r = int(os.environ.get("RANK", "0"))
    if w is None:
        r, w = 0, 1
    return (int(rank) if rank is not None else r), (int(world_size) if world_size is not None
                                                      else w)


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


class Loader:
    """Loads batches with stoker's C engine: native threads read, decode and
    transform samples into a bounded ring of batch buffers; each batch reaches
    Python as torch tensors (DLPack) or NumPy arrays that view the ring
    directly, with no copy.

    Loader(source, batch_size, *, shuffle=True, seed=0, drop_last=False,
           transform=None, threads=None, depth=2, output="torch", layout="nchw",
           dtype="uint8", on_error="raise", rank=None, world_size=None,
           size=None, max_sample_bytes=None, options=None, return_indices=False,
           strict=False)

    source: a directory in ImageFolder layout (ROOT/CLASS/IMAGE; labels are the
        class indices in sorted order, as torchvision), or a stoker.Records.
    transform: None (raw bytes: a list of uint8 arrays per batch, or a dense
        array for records), a preset name ("imagenet-train", "imagenet-val",
        "cifar-train", "decode", "none"), a spec string, a
        stoker.transforms.Compose or list of transforms, or a torchvision
        Compose of supported transforms (converted).
    threads: worker threads (None = the CPUs this process may use, shared
        among LOCAL_WORLD_SIZE ranks; see docs/engine.md). depth: batches prepared
        ahead; the ring has depth + 1 buffers, one for the batch your loop
        still holds.
    output: "torch" (tensors through DLPack) or "numpy".
    layout, dtype, size: image output options (dtype "bfloat16" needs torch).
    on_error: "raise" (a bad sample raises stoker.SampleError; calling next()
        again on the same iterator gives the batch without it) or "skip"
        (left out, counted and listed in stats()["errors"]).
    rank, world_size: this process's share of every epoch; default from
        torch.distributed when initialised, else RANK/WORLD_SIZE, else 0/1.
    return_indices: yield (data, labels, indices) with the dataset index of
        each sample (int64).
    strict: decoding checks each image's whole compressed stream, so a
        truncated or corrupt file fails in every epoch whatever its random
        crop (default False: a crop decodes only the rows it needs, faster;
        see docs/images.md).

    Iterating gives one epoch of (data, labels) batches. Iterating again
    continues with the next epoch; an iterator abandoned mid-epoch is
    superseded by the next iter(), which starts the following epoch, unless
    set_epoch() or load_state_dict() chose the position in between.
    Data is a tensor/array of shape (batch, *sample_shape) for dense batches,
    or a list of per-sample tensors/arrays for variable-size ones; labels are
    int64. A batch's memory returns to the ring once nothing references it
    (its arrays, tensors, or views of them).
    """

    def __init__(self, source, batch_size, *, shuffle=True, seed=0, drop_last=False,
                 transform=None, threads=None, depth=2, output="torch", layout="nchw",
                 dtype="uint8", on_error="raise", rank=None, world_size=None, size=None,
                 max_sample_bytes=None, options=None, return_indices=False, strict=False):
        self._engine = None
        if output not in ("torch", "numpy"):
            raise ValueError(f'output must be "torch" or "numpy", got {output!r}')
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        if layout not in ("nchw", "nhwc"):
            raise ValueError(f'layout must be "nchw" or "nhwc", got {layout!r}')
        dtype = _dtype_name(dtype)
        if output == "numpy" and dtype == "bfloat16":
            raise ValueError('NumPy has no bfloat16 type: use output="torch" with '
                             'dtype="bfloat16", or dtype="float16"/"float32" with NumPy')
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or not 1 <= threads <= 256):
            raise ValueError(f"threads must be None (all cores) or 1..256, got {threads!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 63:
            raise ValueError(f"depth must be 1..63, got {depth!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        rank, world_size = _default_partition(rank, world_size)
        if not (world_size >= 1 and 0 <= rank < world_size and world_size < 2 ** 32):
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
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
        if size is not None:
            opts["size"] = str(int(size))
        if strict:
            opts["strict"] = "1"
        for k, v in (options or {}).items():
            opts[str(k)] = str(int(v)) if isinstance(v, bool) else str(v)
        records = None
        if isinstance(source, Records):
            records = (source.record_bytes, source.header_bytes, source.label_bytes)
            path = source.path
        else:
            path = os.fspath(source)
        spec = to_spec(transform)

        self.source = source
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.transform = spec
        self.depth, self.output, self.layout, self.dtype = depth, output, layout, dtype
        self.on_error, self.rank, self.world_size = on_error, rank, world_size
        self.return_indices = bool(return_indices)
        self._engine = _stoker.Engine(
            path, batch_size, shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last),
            # depth means the same as in the engine: batches prepared ahead
            # of the one the loop holds (the ring has depth + 1 buffers).
            transform=spec, threads=threads or 0, depth=depth,
            on_error_skip=on_error == "skip", rank=rank, world_size=world_size,
            records=records, options=opts, max_sample_bytes=int(max_sample_bytes or 0))
        self._info = self._engine.info()
        self.threads = self._info["threads"]
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
        """Class names of a folder source (sorted, as torchvision's ImageFolder)."""
        if isinstance(self.source, Records):
            return []
        root = os.fspath(self.source)
        return sorted(e.name for e in os.scandir(root) if e.is_dir())

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
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        with self._lock:
            self._check_open()
            self._engine.set_epoch(epoch)
            self._generation += 1
            self._pinned = True

    def state_dict(self):
        """The position as a dict: resume exactly with load_state_dict(). It
        counts batches already handed out, so save it after finishing the
        step on the last batch you took."""
        self._check_open()
        seed, epoch, batch = self._engine.get_state()
        if batch >= len(self):   # every batch of the epoch was handed out
            epoch, batch = epoch + 1, 0
        fp = self._engine.fingerprint()
        return {"seed": seed, "epoch": epoch, "batch": batch, "batch_size": self.batch_size,
                "num_samples": self.num_samples, "rank": self.rank,
                "world_size": self.world_size, "drop_last": self.drop_last,
                "shuffle": self.shuffle, "transform_hash": fp["transform_hash"]}

    def load_state_dict(self, state):
        """Restores a position from state_dict() (possibly saved by another
        process). The next iteration continues from it exactly.

        The engine checks the seed and the fingerprint (num_samples,
        batch_size, world_size, rank, shuffle, drop_last, transform_hash) and
        refuses a mismatch naming the field. A fingerprint key missing from
        the dict (state dicts saved by older versions lack transform_hash) is
        not checked."""
        for k in _STATE_KEYS:
            if k not in state:
                raise ValueError(f"state dict lacks {k!r}")
        fp = {k: state[k] for k in _FINGERPRINT_KEYS if k in state}
        with self._lock:
            self._check_open()
            self._engine.set_state(int(state["seed"]), int(state["epoch"]), int(state["batch"]),
                                   fp)
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
            return _EpochIterator(self, self._generation)

    def _next_batch(self, generation):
        self._check_open()
        if generation != self._generation:
            raise RuntimeError("this iterator was superseded by a newer iter(), set_epoch() or "
                               "load_state_dict() on its loader")
        b = self._engine.next()
        if b is None:
            return None
        return self._convert(b)

    def _convert(self, b):
        if self._torch is not None:
            conv = self._from_dlpack
        else:
            conv = np.asarray
        if b.dense:
            data = conv(b.data())
        else:
            data = [conv(v) for v in b.samples()]
        labels = conv(b.labels())
        if not self.return_indices:
            return data, labels
        idx = np.asarray(b.indices()).astype(np.int64)
        if self._torch is not None:
            idx = self._torch.from_numpy(idx)
        return data, labels, idx

    # ---- observation -----------------------------------------------------------
    def stats(self):
        """Counters: per-stage items and busy seconds (summed and per thread),
        starvation (seconds next() waited), samples/batches delivered, skipped
        and failed samples, the memory bound, and the list of failed samples
        (path and reason; the first 1024 are kept)."""
        self._check_open()
        return self._engine.stats()

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
        src = self.source if isinstance(self.source, Records) else repr(os.fspath(self.source))
        return (f"stoker.Loader({src}, batch_size={self.batch_size}, transform="
                f"{self.transform!r}, threads={getattr(self, 'threads', None)}, "
                f"output={self.output!r}, dtype={self.dtype!r})")


class _EpochIterator:
    """One epoch of one Loader. Raising an exception (SampleError,
    KeyboardInterrupt) does not end it: calling next() again continues."""

    def __init__(self, loader, generation):
        self._loader = loader
        self._generation = generation
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._loader._next_batch(self._generation)
        if item is None:
            self._done = True
            raise StopIteration
        return item

    def __len__(self):
        return len(self._loader)
