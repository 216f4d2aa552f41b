"""stoker.pack: write any dataset stoker reads as .stk shards (docs/shards.md).

The work is libstoker's stk_pack (the same code as ``stoker pack``): the
output is byte-identical to the command line's for the same options,
whatever the thread count.
"""

import io
import json
import numbers
import os

from . import _stoker
from .loader import Records, _U64_MAX, _int, _is_bool

__all__ = ["pack", "Writer"]


def _raw_shape(raw):
    if isinstance(raw, str):
        parts = raw.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"raw must be (H, W, C) or 'HxWxC', e.g. (32, 32, 3), got {raw!r}")
        parts = [int(p) for p in parts]
    else:
        try:
            parts = list(raw)
        except TypeError:
            raise TypeError(f"raw must be (H, W, C) or 'HxWxC', got {raw!r}") from None
        if len(parts) != 3:
            raise ValueError(f"raw must be (H, W, C) or 'HxWxC', got {raw!r}")
    h = _int(parts[0], "raw H", 1, 65535)
    w = _int(parts[1], "raw W", 1, 65535)
    c = _int(parts[2], "raw C", 1, 3)
    if c == 2:
        raise ValueError("raw C must be 1 or 3, got 2")
    return h, w, c


def pack(source, out, *, shard_size=256 << 20, max_side=None, quality=90, raw=None,
         threads=0, align=0, skip_bad=False, progress=None, restart=False):
    """Packs ``source`` into .stk shards plus a manifest in the directory ``out``.

    source: any dataset a Loader opens locally (ImageFolder tree, .tar shards,
        CIFAR batches, .stk shards) or a stoker.Records.
    out: the output directory; created if missing. It must not hold a packed
        dataset, and must not be the source, lie inside it or contain it.
    shard_size: target payload bytes per shard.
    max_side: re-encode images whose longer side exceeds this (JPEG of
        ``quality``); None keeps the bytes as they are. A source whose
        samples have fields (a .stk written with Writer.add(dict), a
        multi-field tar) is packed with every field as it is (payload
        "fields"), and refuses max_side and raw.
    raw: (H, W, C) or "HxWxC" with C 1 or 3: decode and resize to uint8 HWC
        tensors of that shape (CIFAR and raw .stk inputs stay raw by default).
    threads: worker threads (0: one per online core).
    align: 0, or a power of two in 512 .. 1 MiB to align payloads to.
    restart: rewrite JPEG payloads losslessly with restart markers and a
        segment index, so crops decode only their MCUs (docs/images.md); the
        result's "restart_indexed" counts them.
    skip_bad: skip samples that cannot be read or converted (they are listed
        in the result) instead of failing.
    progress: None, or a callable taking a dict (done, total, skipped, bytes,
        shards, seconds), called about every 0.1 s and at the end; a true
        return value cancels the pack.

    Runs without the GIL. Ctrl-C (KeyboardInterrupt) or an exception in
    ``progress`` cancels it, as does a failure: what it wrote is removed
    (and ``out`` itself if it created it). Errors are stoker.Error (with
    .code_name), ValueError for bad arguments, FileNotFoundError for a
    missing source; a failing sample's message names its index and key.

    Returns a dict: samples, skipped, shards, bytes, payload ("encoded",
    "resized", "raw" or "fields"), seconds, and skipped_samples, a list of
    (index, key, reason).
    """
    record_bytes = header_bytes = label_bytes = 0
    if isinstance(source, Records):
        record_bytes, header_bytes, label_bytes = (source.record_bytes, source.header_bytes,
                                                   source.label_bytes)
        source = source.path
    source = os.fspath(source)
    out = os.fspath(out)
    shard_size = _int(shard_size, "shard_size", 1, _U64_MAX)
    max_side = 0 if max_side is None else _int(max_side, "max_side", 1, 65535)
    quality = _int(quality, "quality", 1, 100)
    raw_h, raw_w, raw_c = (0, 0, 0) if raw is None else _raw_shape(raw)
    threads = _int(threads, "threads", 0, 256)
    align = _int(align, "align", 0, 1 << 20)
    if align and (align < 512 or align & (align - 1)):
        raise ValueError(f"align takes 0 or a power of two in 512 .. 1048576, got {align}")
    if not isinstance(skip_bad, bool) and not _is_bool(skip_bad):
        raise TypeError(f"skip_bad must be a bool, got {skip_bad!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be None or a callable taking a dict, got {progress!r}")
    return _stoker.pack(source, out, shard_size, max_side, quality, raw_h, raw_w, raw_c,
                        threads, align, bool(skip_bad), record_bytes, header_bytes,
                        label_bytes, progress, bool(restart))


# enum stk_field_kind (include/stoker.h); -1: a str, text unless its name says
# JSON, then left to the name (the extension decides, by the library's rules).
_AUTO, _TEXT, _JSON, _INT, _FLOAT, _NPY, _STR = 0, 2, 3, 5, 6, 7, -1


def _field(name, value):
    """(name, bytes, kind) for one field of Writer.add(dict)."""
    if not isinstance(name, str):
        raise TypeError(f"Writer.add: a field name is a str, got {name!r}")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return name, value, _AUTO
    if isinstance(value, str):
        return name, value.encode("utf-8"), _STR
    if isinstance(value, numbers.Integral):
        # bool is an int: True is stored as 1.
        return name, str(int(value)).encode(), _INT
    if isinstance(value, numbers.Real):
        return name, repr(float(value)).encode(), _FLOAT
    if isinstance(value, (dict, list)):
        return name, json.dumps(value, ensure_ascii=False).encode("utf-8"), _JSON
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        import numpy  # only once an array is given: importing stoker stays cheap

        buf = io.BytesIO()
        numpy.save(buf, value, allow_pickle=False)
        return name, buf.getvalue(), _NPY
    raise TypeError(f"Writer.add: field {name!r}: a {type(value).__name__} is none of bytes, "
                    f"str, int, float, dict, list or a NumPy array")


class Writer:
    """Writes .stk shards sample by sample (stk_writer): for samples a program
    makes itself. The result opens with stoker.Loader like any packed dataset.

        with stoker.Writer("out", num_classes=2) as w:
            w.set_class_name(0, "cat")
            w.set_class_name(1, "dog")
            w.add(jpeg_bytes, label=0, key="cat/0001.jpg")
        # leaving the block finishes (shards + manifest); an exception
        # instead removes what was written

    out: a directory, created if missing, not holding a packed dataset.
    raw: (H, W, C) or "HxWxC" (C 1 or 3): every sample is exactly H*W*C bytes
        of HWC uint8 (dense batches when read); None: samples are files
        (encoded images or any bytes).
    num_classes: labels are -1 (none) or 0 .. num_classes-1.
    shard_size, align: as for stoker.pack.

    add(data, label=-1, key=None): data is any bytes-like object (bytes,
    a contiguous NumPy uint8 array). A bad sample (label out of range, wrong
    raw size) raises ValueError naming it and writes nothing; the writer
    stays usable.

    add(fields, label=-1, key=None) with a dict: one sample of named fields
    (docs/format.md, payload kind "fields"), read back with the loader's
    fields= ("image=jpg,caption=txt"), as WebDataset's tar members are:

        w.add({"jpg": jpeg_bytes, "txt": "a cat", "json": {"w": 640},
               "cls": 3, "npy": np.zeros((2, 3), np.float32)}, label=3)

    Keys are field names (str: no control characters, none of , ; =);
    values: bytes-like as they are (their kind then follows the name: jpg
    is an image), str as UTF-8 text (a JSON text under a name such as
    "json"), int as its decimal text (an int
    field), float likewise (a float field), dict or list as JSON text, a
    NumPy array as a .npy file (numpy.save). A sample may lack fields
    others have. label is kept in the index as for add (a "cls" field does
    not set it). A writer takes samples of one layout: bytes or dicts, not
    both. set_class_name(c, name): name is a str without a newline;
    name every class or none (finish() refuses a partial naming with
    ValueError, and the writer stays usable to complete it).
    finish() -> dict (samples, shards, bytes, payload);
    close() without finish() removes the shards. Use from one thread at a
    time.
    """

    def __init__(self, out, *, raw=None, num_classes=0, shard_size=256 << 20, align=0):
        shard_size = _int(shard_size, "shard_size", 1, _U64_MAX)
        num_classes = _int(num_classes, "num_classes", 0, 1 << 24)
        align = _int(align, "align", 0, 1 << 20)
        raw_h, raw_w, raw_c = (0, 0, 0) if raw is None else _raw_shape(raw)
        self._w = _stoker.ShardWriter(os.fspath(out), shard_size, align, raw_h, raw_w, raw_c,
                                      num_classes)

    def add(self, data, label=-1, key=None):
        label = _int(label, "label", -1, 2 ** 63 - 1)
        key = None if key is None else os.fspath(key)
        if isinstance(data, dict):
            self._w.add_fields([_field(name, value) for name, value in data.items()], label,
                               key)
        else:
            self._w.add(data, label, key)

    def set_class_name(self, c, name):
        # str() would store 3 as "3" and None as "None": a name is a str.
        if not isinstance(name, str):
            raise TypeError(f"set_class_name: a class name is a str, got {name!r} "
                            f"({type(name).__name__})")
        self._w.set_class_name(_int(c, "class", 0, _U64_MAX), name)

    def finish(self):
        return self._w.finish()

    def close(self):
        self._w.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.finish()
        finally:
            self.close()
        return False
