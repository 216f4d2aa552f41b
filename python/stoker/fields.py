"""Samples with several fields (docs/multimodal.md): stoker.Field, the
Loader's fields= and per-field transform= arguments, and the dict batches.

The library checks the fields themselves (names, sources, kinds, which ones
take a transform) and says what is wrong; this module checks only the types
Python hands it, and turns each batch's columns into Python values: dense
columns are zero-copy views of the batch's buffer; text, JSON and bytes
become Python objects in one C loop (and one json.loads) per batch.
"""

import collections
import json

import numpy as np

from .transforms import to_spec

__all__ = ["Field", "Ragged"]

#: The key of the dataset indices in a dict batch (return_indices=True).
INDEX_KEY = "__index__"
#: An optional field's presence mask: batch[name + PRESENT_SUFFIX].
PRESENT_SUFFIX = "_present"
_BYTES_AS = ("bytes", "tensor")


class Field:
    """One output field of ``stoker.Loader(fields={name: ...})``.

    Field(sources=None, kind=None, optional=False)

    sources: the source's field names to take it from, ';'-separated
        alternatives of which the first a sample has wins ("jpg;png;webp":
        a tar member's extension after the key, a .stk field, a folder's
        "image" or "label"); None: the output name itself.
    kind: "image", "text", "json", "bytes", "int", "float" or "npy"; None:
        the kind the source gives the field, else the one its name implies
        (jpg/png/webp -> image, txt -> text, json -> json, cls -> int,
        npy -> npy, anything else bytes).
    optional: a sample without the field is delivered anyway: None in the
        field's list (text, json, bytes, npy, variable-size images), zeros in
        its tensor (int, float, fixed-size images), and
        ``batch[name + "_present"]`` says which samples have it. Without
        optional, such a sample is a sample error (on_error decides).

    A plain string is ``Field(sources)``; a ``(sources, kind)`` tuple is
    ``Field(sources, kind)``.
    """

    __slots__ = ("sources", "kind", "optional")

    def __init__(self, sources=None, kind=None, optional=False):
        if sources is not None and not isinstance(sources, str):
            raise TypeError(f"Field: sources must be a str (';'-separated source field names) "
                            f"or None, got {type(sources).__name__}")
        if kind is not None and not isinstance(kind, str):
            raise TypeError(f"Field: kind must be a str or None, got {type(kind).__name__}")
        if not isinstance(optional, (bool, np.bool_)):
            raise TypeError(f"Field: optional must be a bool, got {type(optional).__name__}")
        self.sources, self.kind, self.optional = sources, kind, bool(optional)

    def __eq__(self, other):
        return isinstance(other, Field) and (self.sources, self.kind, self.optional) == \
            (other.sources, other.kind, other.optional)

    def __hash__(self):
        return hash((self.sources, self.kind, self.optional))

    def __getstate__(self):
        return (self.sources, self.kind, self.optional)

    def __setstate__(self, st):
        self.sources, self.kind, self.optional = st

    def __repr__(self):
        args = [repr(self.sources)]
        if self.kind is not None:
            args.append(f"kind={self.kind!r}")
        if self.optional:
            args.append("optional=True")
        return f"stoker.Field({', '.join(args)})"


#: A variable field delivered without a copy (bytes_as="tensor"): sample k
#: is data[offsets[k] : offsets[k] + lengths[k]]; data is a uint8 tensor (or
#: array) viewing the batch's buffer, offsets and lengths int64.
Ragged = collections.namedtuple("Ragged", ["data", "offsets", "lengths"])
Ragged.__doc__ = ("A bytes field as one uint8 tensor viewing the batch (data) plus int64 "
                  "offsets and lengths: sample k is data[offsets[k]:offsets[k] + lengths[k]].")


def _field(name, value):
    if isinstance(value, Field):
        return value
    if isinstance(value, str):
        return Field(value)
    if isinstance(value, tuple) and len(value) == 2:
        return Field(value[0], value[1])
    raise TypeError(f"fields[{name!r}] must be a str of source field names, a (sources, kind) "
                    f"tuple or a stoker.Field, got {value!r}")


def normalize(fields):
    """fields= as a dict {name: Field}. Takes a dict {name: str | (sources,
    kind) | Field}, or a list of names (each its own source)."""
    if isinstance(fields, dict):
        items = list(fields.items())
    elif isinstance(fields, (list, tuple)) and all(isinstance(n, str) for n in fields):
        items = [(n, n) for n in fields]
    else:
        raise TypeError(f"fields must be a dict {{output name: source fields}} or a list of "
                        f"field names, got {type(fields).__name__}")
    out = {}
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"fields: output names are str, got {name!r}")
        out[name] = _field(name, value)
    # Keys the batch dict adds itself must not be field names.
    for name, f in out.items():
        if name == INDEX_KEY:
            raise ValueError(f"fields: {INDEX_KEY!r} is the key of the dataset indices in a "
                             f"batch (return_indices=True): rename the field")
        if f.optional and name + PRESENT_SUFFIX in out:
            raise ValueError(f"fields: {name + PRESENT_SUFFIX!r} is the key of the presence "
                             f"mask of the optional field {name!r}: rename one of them")
    return out


def transforms(fields, transform):
    """(loader spec, {name: spec}) from transform=: a dict names image fields
    (each value converted as transform= is), anything else is the loader's
    transform, which every image field without its own takes."""
    if not isinstance(transform, dict):
        return to_spec(transform), {}
    per = {}
    for name, t in transform.items():
        if name not in fields:
            raise ValueError(f"transform: {name!r} is not a field (the fields are "
                             f"{', '.join(map(repr, fields))})")
        per[name] = to_spec(t)
    return None, per


def engine_fields(fields, per):
    """The Engine's fields argument: (name, sources, kind, transform, optional)."""
    return [(name, f.sources, f.kind, per.get(name), f.optional) for name, f in fields.items()]


class Converter:
    """Turns a Batch with fields into the dict the loop gets."""

    def __init__(self, torch, from_dlpack, bytes_as, return_indices, note_device=None):
        self._torch = torch
        self._from_dlpack = from_dlpack
        # With a device: called with (batch, tensor) for each dense field, so
        # Loader.record_stream finds the batch a field's tensor views.
        self._note_device = note_device
        self._tensor_bytes = bytes_as == "tensor"
        self._return_indices = return_indices
        self._infos = None   # the fields' static facts, read from the first batch

    def _dense(self, view):
        if self._torch is not None:
            return self._from_dlpack(view)
        return np.asarray(view)

    def _array(self, arr):
        """A NumPy array as the loader's output type (torch has no uint16,
        uint32 or uint64 before 2.3: those stay NumPy arrays)."""
        if self._torch is None:
            return arr
        try:
            return self._torch.from_numpy(arr)
        except TypeError:
            return arr

    def _small(self, arr):
        return self._torch.from_numpy(arr) if self._torch is not None else arr

    def __call__(self, b):
        if self._infos is None:
            self._infos = [b.field_info(k) for k in range(b.nfields)]
        out = {}
        for k, info in enumerate(self._infos):
            name, kind = info["name"], info["kind"]
            dense = info["dense"] or (kind == "npy" and b.field_info(k)["dense"])
            if dense:
                # (With a device, an .npy column whose arrays share a dtype and
                # shape arrives stacked in device memory: dense for that batch.)
                value = self._dense(b.field(k))
                if self._note_device is not None:
                    self._note_device(b, value)
            elif kind == "json":
                value = json.loads(b.field(k))
            elif kind == "bytes" and self._tensor_bytes:
                data, off, ln = b.field_ragged(k)
                value = Ragged(self._dense(data), self._small(np.asarray(off).astype(np.int64)),
                               self._small(np.asarray(ln).astype(np.int64)))
            elif kind in ("text", "bytes"):
                value = b.field(k)   # lists of str / bytes, built in C
            elif kind == "npy":
                value = self._npy(b, k)
            else:   # variable-size images, and images without a transform (their bytes)
                value = [None if v is None else self._dense(v) for v in b.field(k)]
            out[name] = value
            if info["optional"]:
                out[name + PRESENT_SUFFIX] = self._small(
                    np.asarray(b.field_present(k)).astype(np.bool_))
        if self._return_indices:
            out[INDEX_KEY] = self._small(np.asarray(b.indices()).astype(np.int64))
        return out

    def _npy(self, b, k):
        """One array (batch, *shape) when every sample has the same dtype and
        shape (copied once, in C), else a list of per-sample arrays viewing
        the batch."""
        uniform = b.field_uniform(k)
        if uniform is not None:
            dtype, shape = uniform
            arr = np.empty((b.size,) + tuple(shape), dtype=dtype)
            b.field_gather(k, arr)
            return self._array(arr)
        return [None if v is None else self._array(np.asarray(v)) for v in b.field(k)]
