"""Image transforms that run in stoker's C engine.

The names, arguments and defaults mirror torchvision 0.14's
(``torchvision.transforms``) for what the engine supports. A transform here is
a *description*: it renders a spec string (``str(t)`` or ``t.spec()``) that
the engine parses and runs on its native threads, per sample, on uint8 pixels.
No Python code runs per sample, so a Python callable cannot be a transform.

Supported: RandomResizedCrop, Resize, CenterCrop, RandomCrop, Pad,
RandomHorizontalFlip, RandomVerticalFlip, ToTensor (x / 255 as float32) and
Normalize (ToTensor's scaling, then (x - mean) / std), plus PILToTensor (a
no-op: the engine's output already is a uint8 tensor). Normalize and ToTensor
come after the geometric transforms (flips may follow) and make the output
float32 unless dtype="float16"/"bfloat16" is asked for. Presets: ``"imagenet-train"``, ``"imagenet-val"``, ``"cifar-train"``,
``"decode"`` (decode only: a list of HWC images of their own sizes) and
``"none"`` (raw bytes).

Example::

    from stoker import transforms as T
    t = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                   T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))])
    str(t)
    # 'RandomResizedCrop(224,scale=(0.08,1.0),ratio=(0.75,1.3333333333333333))|
    #  RandomHorizontalFlip(p=0.5)|Normalize(mean=(0.485,0.456,0.406),std=(0.229,0.224,0.225))'
"""

import math
import numbers
import operator
import re

__all__ = [
    "Transform", "Compose", "RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "Pad",
    "RandomHorizontalFlip", "RandomVerticalFlip", "Normalize", "ToTensor", "PILToTensor",
    "PRESETS", "SUPPORTED", "to_spec", "from_torchvision",
]

#: Preset names the engine knows.
PRESETS = ("imagenet-train", "imagenet-val", "cifar-train", "decode", "none")

#: Transform names the engine runs.
SUPPORTED = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "Pad",
             "RandomHorizontalFlip", "RandomVerticalFlip", "ToTensor", "Normalize")

_SUPPORTED_TEXT = (
    "Transforms supported by stoker's C engine: " + ", ".join(SUPPORTED) +
    " (PILToTensor is accepted as a no-op), or a preset: " + ", ".join(repr(p) for p in PRESETS) +
    ". Anything else (other torchvision transforms, Python callables, lambdas) must run on "
    "the batch after loading, in your training step.")


def _index(x):
    """x as an int when it is an integer (int, NumPy or torch integer:
    anything with __index__) other than a boolean; else None."""
    if isinstance(x, bool) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
        return None
    if not hasattr(type(x), "__index__"):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _num(x, what):
    """Renders one number: ints as ints, floats by repr (shortest exact form)."""
    i = _index(x)
    if i is not None:
        return str(i)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{what}: expected a number, got {x!r}")
    f = float(x)
    if not math.isfinite(f):
        raise ValueError(f"{what}: {x!r} is not finite")
    return repr(f)


def _seq(xs, what, n=None):
    xs = tuple(xs)
    if n is not None and len(xs) not in (n if isinstance(n, tuple) else (n,)):
        raise ValueError(f"{what}: expected {n} values, got {len(xs)}")
    return "(" + ",".join(_num(x, what) for x in xs) + ")"


def _size(size, what, square_as_int=False):
    """An int (square / shorter edge) or a (h, w) pair, as torchvision. For
    crops, whose int size means a square, (s, s) renders as s."""
    i = _index(size)
    if i is not None:
        if i < 1:
            raise ValueError(f"{what}: size must be >= 1, got {size!r}")
        return str(i)
    try:
        s = tuple(size)
    except TypeError:
        raise TypeError(f"{what}: size must be an int or a (h, w) sequence, got {size!r}") \
            from None
    if len(s) == 1 or (square_as_int and len(s) == 2 and s[0] == s[1]):
        return _size(s[0], what)
    s = tuple(_index(v) for v in s) if len(s) == 2 else s
    if len(s) != 2 or not all(v is not None and v >= 1 for v in s):
        raise ValueError(f"{what}: size must be an int or a (h, w) pair of ints >= 1, "
                         f"got {size!r}")
    return _seq(s, what)


def _interp(interpolation, antialias, what):
    name = getattr(interpolation, "value", interpolation)
    if str(name).lower() != "bilinear":
        raise ValueError(f"{what}: only bilinear interpolation is supported (PIL's antialiased "
                         f"bilinear, torchvision's default), got {interpolation!r}")
    if antialias is False:
        raise ValueError(f"{what}: antialias=False is not supported; stoker resizes as PIL "
                         f"does (antialiased), which is torchvision's result on PIL images")


def _fill(fill, what):
    if _index(fill) is not None:
        fill = _index(fill)
    if isinstance(fill, numbers.Real) and not isinstance(fill, bool):
        if not 0 <= fill <= 255:
            raise ValueError(f"{what}: fill must be within 0..255, got {fill!r}")
        return _num(int(fill) if float(fill).is_integer() else fill, what)
    vals = tuple(fill)
    if len(vals) not in (1, 3) or not all(0 <= v <= 255 for v in vals):
        raise ValueError(f"{what}: fill must be a number or 3 numbers within 0..255, got {fill!r}")
    return _seq(vals, what)


def _padding(padding, what):
    i = _index(padding)
    if i is not None:
        if i < 0:
            raise ValueError(f"{what}: padding must be >= 0, got {padding!r}")
        return str(i)
    try:
        vals = tuple(_index(v) for v in padding)
    except TypeError:
        raise TypeError(f"{what}: padding must be an int or 1, 2 or 4 ints >= 0, got "
                        f"{padding!r}") from None
    if len(vals) not in (1, 2, 4) or not all(v is not None and v >= 0 for v in vals):
        raise ValueError(f"{what}: padding must be an int or 1, 2 or 4 ints >= 0, "
                         f"got {padding!r}")
    return _seq(vals, what)


def _padding_mode(mode, what):
    if mode != "constant":
        raise ValueError(f"{what}: only padding_mode='constant' is supported, got {mode!r}")


class Transform:
    """Base class: a transform the engine runs. ``str(t)`` is its spec."""

    def spec(self):
        raise NotImplementedError

    def __str__(self):
        return self.spec()

    def __repr__(self):
        return f"stoker.transforms.{self.spec()}"

    def __eq__(self, other):
        return isinstance(other, Transform) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.spec())

    def __call__(self, *args, **kwargs):
        raise TypeError("stoker transforms are descriptions run by the C engine: pass them "
                        "to stoker.Loader(transform=...) rather than calling them")


class Compose(Transform):
    """Runs transforms in order; the spec joins theirs with ``|``."""

    def __init__(self, transforms):
        self.transforms = [_coerce(t) for t in transforms]

    def spec(self):
        parts = [t.spec() for t in self.transforms]
        parts = [p for p in parts if p]
        return "|".join(parts) if parts else "decode"


class RandomResizedCrop(Transform):
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation="bilinear", antialias=None):
        self.size, self.scale, self.ratio = size, tuple(scale), tuple(ratio)
        self.interpolation, self.antialias = interpolation, antialias
        w = "RandomResizedCrop"
        _interp(interpolation, antialias, w)
        self._size = _size(size, w, True)
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"{w}: scale must be (min, max) with 0 < min <= max, got {scale!r}")
        if len(self.ratio) != 2 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"{w}: ratio must be (min, max) with 0 < min <= max, got {ratio!r}")
        self._scale, self._ratio = _seq(self.scale, w), _seq(self.ratio, w)

    def spec(self):
        return f"RandomResizedCrop({self._size},scale={self._scale},ratio={self._ratio})"


class Resize(Transform):
    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=None):
        self.size, self.interpolation = size, interpolation
        self.max_size, self.antialias = max_size, antialias
        _interp(interpolation, antialias, "Resize")
        self._size = _size(size, "Resize")
        self._max_size = None
        if max_size is not None:
            if _index(size) is None and len(tuple(size)) != 1:
                raise ValueError("Resize: max_size is only allowed when size is an int")
            self._max_size = _index(max_size)
            if self._max_size is None or self._max_size <= int(self._size):
                raise ValueError(f"Resize: max_size must be an int greater than size, "
                                 f"got {max_size!r}")

    def spec(self):
        if self._max_size is not None:
            return f"Resize({self._size},max_size={self._max_size})"
        return f"Resize({self._size})"


class CenterCrop(Transform):
    def __init__(self, size):
        self.size = size
        self._size = _size(size, "CenterCrop", True)

    def spec(self):
        return f"CenterCrop({self._size})"


class RandomCrop(Transform):
    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size, self.padding, self.pad_if_needed = size, padding, pad_if_needed
        self.fill, self.padding_mode = fill, padding_mode
        w = "RandomCrop"
        _padding_mode(padding_mode, w)
        self._size = _size(size, w, True)
        self._padding = None if padding is None else _padding(padding, w)
        self._fill = _fill(fill, w)

    def spec(self):
        s = f"RandomCrop({self._size}"
        if self._padding is not None:
            s += f",padding={self._padding}"
        if self.pad_if_needed:
            s += ",pad_if_needed=True"
        if self._fill != "0":
            s += f",fill={self._fill}"
        return s + ")"


class Pad(Transform):
    def __init__(self, padding, fill=0, padding_mode="constant"):
        self.padding, self.fill, self.padding_mode = padding, fill, padding_mode
        _padding_mode(padding_mode, "Pad")
        self._padding = _padding(padding, "Pad")
        self._fill = _fill(fill, "Pad")

    def spec(self):
        s = f"Pad({self._padding}"
        if self._fill != "0":
            s += f",fill={self._fill}"
        return s + ")"


class _Flip(Transform):
    def __init__(self, p=0.5):
        name = type(self).__name__
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"{name}: p must be a probability in [0, 1], got {p!r}")
        self.p = p

    def spec(self):
        return f"{type(self).__name__}(p={_num(float(self.p), type(self).__name__)})"


class RandomHorizontalFlip(_Flip):
    pass


class RandomVerticalFlip(_Flip):
    pass


class ToTensor(Transform):
    """torchvision's ToTensor: pixel values / 255 as float32 (or the Loader's
    float dtype); the layout is the Loader's (CHW per sample by default)."""

    def spec(self):
        return "ToTensor()"


class Normalize(Transform):
    """torchvision's ToTensor + Normalize in one: out = (x / 255 - mean) / std,
    computed in float32 as torch does, written as float32 (or the Loader's
    float16/bfloat16 dtype)."""

    def __init__(self, mean, std, inplace=False):
        self.mean, self.std, self.inplace = tuple(mean), tuple(std), inplace
        self._mean = _seq(self.mean, "Normalize mean", (1, 3))
        self._std = _seq(self.std, "Normalize std", (1, 3))
        if any(s == 0 for s in self.std):
            raise ValueError("Normalize: std must not contain 0")

    def spec(self):
        return f"Normalize(mean={self._mean},std={self._std})"


class PILToTensor(Transform):
    """A no-op: the engine already delivers uint8 tensors (CHW with layout="nchw")."""

    def spec(self):
        return ""


_BY_NAME = {c.__name__: c for c in (RandomResizedCrop, Resize, CenterCrop, RandomCrop, Pad,
                                    RandomHorizontalFlip, RandomVerticalFlip, Normalize,
                                    ToTensor, PILToTensor)}


def from_torchvision(t):
    """Converts a torchvision transform (or Compose) into its stoker equivalent.
    Raises TypeError for anything the engine cannot run."""
    cls = type(t).__name__
    mod = type(t).__module__ or ""
    if not mod.startswith("torchvision"):
        raise TypeError(f"{t!r} is not a torchvision transform. {_SUPPORTED_TEXT}")
    if cls == "Compose":
        return Compose([from_torchvision(x) for x in t.transforms])
    if cls not in _BY_NAME:
        raise TypeError(f"torchvision.transforms.{cls} is not supported. {_SUPPORTED_TEXT}")
    if cls == "RandomResizedCrop":
        return RandomResizedCrop(t.size, t.scale, t.ratio, t.interpolation,
                                 getattr(t, "antialias", None))
    if cls == "Resize":
        return Resize(t.size, t.interpolation, t.max_size, getattr(t, "antialias", None))
    if cls == "CenterCrop":
        return CenterCrop(t.size)
    if cls == "RandomCrop":
        return RandomCrop(t.size, t.padding, t.pad_if_needed, t.fill, t.padding_mode)
    if cls == "Pad":
        return Pad(t.padding, t.fill, t.padding_mode)
    if cls in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        return _BY_NAME[cls](t.p)
    if cls == "Normalize":
        return Normalize(t.mean, t.std)
    if cls == "ToTensor":
        return ToTensor()
    return PILToTensor()


def _coerce(t):
    if isinstance(t, Transform):
        return t
    if type(t).__module__.startswith("torchvision"):
        return from_torchvision(t)
    if isinstance(t, str):
        raise TypeError(f"a transform string ({t!r}) cannot be part of a Compose; pass the whole "
                        f"spec string as transform=")
    what = "a Python callable" if callable(t) else f"an object of type {type(t).__name__}"
    raise TypeError(f"{t!r} is {what}, which stoker cannot run. {_SUPPORTED_TEXT}")


_NAME_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\(.*\))?\s*$", re.S)


def _split_spec(spec):
    """Splits a spec at top-level '|' (not inside parentheses)."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def to_spec(transform):
    """The engine spec of transform: None, a preset name or spec string, a
    stoker/torchvision transform or Compose, or a list of them."""
    if transform is None:
        return None
    if isinstance(transform, str):
        s = transform.strip()
        if s in PRESETS:
            return s
        for part in _split_spec(s):
            if part.strip() in PRESETS:
                continue
            m = _NAME_RE.match(part)
            if not m:
                raise ValueError(f"transform spec {transform!r}: cannot read {part.strip()!r} "
                                 f"(expected Name(args) joined by '|'). {_SUPPORTED_TEXT}")
            if m.group(1) not in SUPPORTED:
                raise ValueError(f"transform spec {transform!r}: {m.group(1)} is not supported. "
                                 f"{_SUPPORTED_TEXT}")
        return s
    if isinstance(transform, (list, tuple)):
        return Compose(transform).spec()
    return _coerce(transform).spec() or "decode"
