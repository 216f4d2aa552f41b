"""Samples with several fields through stoker.Loader(fields=...)
(docs/multimodal.md, docs/python.md): dict batches, each kind's Python type,
values equal to what was written, the first image field bit-identical to the
loader without fields, determinism over threads, resume, errors that name
the field, pickling, and the refusals.

Folder sources have the generic fields "image" and "label"; a folder of
text, JSON or .npy files (named .jpg, read with an explicit kind) carries
variable-size values of every kind. The WebDataset tar tests write their
shards with tarfile (key.jpg, key.txt, key.json, key.cls, key.npy)."""

import io
import json
import pickle
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

COLORS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]
RRC = "RandomResizedCrop(24)|RandomHorizontalFlip()"


def jpeg_bytes(rng, col, h, w):
    img = np.clip(np.array(col) + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """3 classes x 6 JPEGs of varying sizes."""
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(1)
    for c, col in enumerate(COLORS):
        d = root / f"c{c}"
        d.mkdir()
        for k in range(6):
            (d / f"i{k}.jpg").write_bytes(jpeg_bytes(rng, col, 40 + 3 * k, 60 - 2 * k))
    return root


def caption(c, k):
    return f"class {c} photo {k}: café ☕ naïve 北京 {'é' * k}"


def meta(c, k):
    return {"c": c, "k": k, "tags": ["ü", {"deep": [k, None, True, 1.5]}], "s": caption(c, k)}


def folder_of(root, content):
    """A folder source whose file k of class c holds content(c, k) (bytes),
    2 classes x 5 files; returns {dataset index: content} (files in sorted
    order, as the folder source numbers them)."""
    want = {}
    i = 0
    for c in range(2):
        d = root / f"c{c}"
        d.mkdir(parents=True)
        for k in range(5):
            data = content(c, k)
            (d / f"f{k}.jpg").write_bytes(data)
            want[i] = (c, data)
            i += 1
    return want


def keep(x):
    """A copy of a batch (or part) that holds no ring buffer: kept batches
    would otherwise hold every buffer of the ring."""
    if isinstance(x, dict):
        return {k: keep(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(keep(v) for v in x)
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


def epoch(loader):
    return [keep(b) for b in loader]


def same(x, y):
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    return x == y


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert same(x[k], y[k]), k


# ---- folder sources: image + label --------------------------------------------

def test_dict_batch_keys_and_types(jpeg_folder):
    with stoker.Loader(jpeg_folder, 4, fields={"image": "image", "label": "label"},
                       transform=RRC, seed=3) as L:
        b = next(iter(L))
        assert set(b) == {"image", "label"}
        assert b["image"].dtype == torch.uint8 and b["image"].shape == (4, 3, 24, 24)
        assert b["label"].dtype == torch.int64 and b["label"].shape == (4,)
        assert L.fields == {"image": stoker.Field("image"), "label": stoker.Field("label")}


def test_image_bit_identical_to_loader_without_fields(jpeg_folder):
    kw = dict(transform=RRC, seed=11, threads=2)
    with stoker.Loader(jpeg_folder, 5, **kw) as plain, \
            stoker.Loader(jpeg_folder, 5, fields={"image": "image", "label": "label"}, **kw) as F:
        for e in range(2):
            got = epoch(F)
            want = epoch(plain)
            assert len(got) == len(want) == 4
            for b, (x, y) in zip(got, want):
                assert torch.equal(b["image"], x) and torch.equal(b["label"], y)


def test_one_and_two_threads_identical(jpeg_folder):
    fields = {"image": "image", "label": "label", "raw": ("image", "bytes")}
    runs = []
    for threads in (1, 2):
        with stoker.Loader(jpeg_folder, 4, fields=fields, transform={"image": RRC}, seed=5,
                           threads=threads, return_indices=True) as L:
            runs.append(epoch(L))
    same_batches(*runs)
    seen = sorted(i for b in runs[0] for i in b["__index__"].tolist())
    assert seen == list(range(18))   # every sample once


def test_second_image_field_with_its_own_transform(jpeg_folder):
    with stoker.Loader(jpeg_folder, 6, fields={"a": "image", "b": "image", "y": "label"},
                       transform={"a": RRC, "b": "decode"}, seed=2, shuffle=False,
                       return_indices=True) as L, \
            stoker.Loader(jpeg_folder, 6, transform=RRC, seed=2, shuffle=False) as plain:
        for b, (x, _) in zip(L, plain):
            assert torch.equal(b["a"], x)
            assert isinstance(b["b"], list) and len(b["b"]) == 6
            for img, i in zip(b["b"], b["__index__"].tolist()):
                c, k = divmod(i, 6)
                want = np.asarray(Image.open(jpeg_folder / f"c{c}" / f"i{k}.jpg").convert("RGB"))
                assert img.shape == want.shape and img.dtype == torch.uint8
                # libjpeg-turbo and PIL's libjpeg may differ by rounding.
                assert np.abs(img.numpy().astype(int) - want).mean() < 2


def test_state_dict_resume_mid_epoch(jpeg_folder):
    kw = dict(fields={"image": "image", "label": "label"}, transform=RRC, seed=9, threads=2)
    with stoker.Loader(jpeg_folder, 4, **kw) as L:
        full = epoch(L)
    with stoker.Loader(jpeg_folder, 4, **kw) as L:
        it = iter(L)
        head = [keep(next(it)), keep(next(it))]
        state = L.state_dict()
    same_batches(head, full[:2])
    with stoker.Loader(jpeg_folder, 4, **kw) as L:
        L.load_state_dict(state)
        same_batches(epoch(L), full[2:])


def test_set_epoch_len_stats_and_trace(jpeg_folder, tmp_path):
    trace = tmp_path / "t.json"
    with stoker.Loader(jpeg_folder, 4, fields={"image": "image", "label": "label"},
                       transform=RRC, trace=trace) as L:
        assert len(L) == 5
        L.set_epoch(1)
        n = sum(len(b["label"]) for b in L)
        st = L.stats()
        assert n == 18 and st["samples_delivered"] == 18 and st["batches_delivered"] == 5
    events = json.loads(trace.read_text())
    assert events


@pytest.mark.parametrize("device", [None, "fake"])
def test_diagnose_takes_dict_batches(jpeg_folder, device):
    with stoker.Loader(jpeg_folder, 4, fields={"image": "image", "label": "label"},
                       transform=RRC, device=device) as L:
        d = stoker.diagnose(L, step=lambda b: b["image"].float().mean(), steps=2, warmup=1)
        assert d["bound"] in ("step", "storage", "decode", "contention")


@pytest.mark.parametrize("device", [None, "fake"])
def test_numpy_output(jpeg_folder, device):
    with stoker.Loader(jpeg_folder, 4, fields={"image": "image", "label": "label"},
                       transform=RRC, output="numpy", return_indices=True, device=device) as L:
        b = next(iter(L))
        assert isinstance(b["image"], np.ndarray) and b["image"].dtype == np.uint8
        assert b["label"].dtype == np.int64 and b["__index__"].dtype == np.int64


def test_pickle_keeps_fields_and_dict_transforms(jpeg_folder):
    with stoker.Loader(jpeg_folder, 4, fields={"image": stoker.Field("image", kind="image"),
                                               "label": ("label", "int")},
                       transform={"image": RRC}, seed=4) as L:
        it = iter(L)
        next(it)
        copy = pickle.loads(pickle.dumps(L))
        try:
            assert copy.fields == L.fields and copy.transform == {"image": RRC}
            same_batches([keep(b) for b in it], epoch(copy))
        finally:
            copy.close()


def test_fields_as_a_list_of_names(jpeg_folder):
    with stoker.Loader(jpeg_folder, 4, fields=["image", "label"], transform=RRC, seed=6) as L, \
            stoker.Loader(jpeg_folder, 4, transform=RRC, seed=6) as plain:
        b, (x, y) = next(iter(L)), next(iter(plain))
        assert list(b) == ["image", "label"]
        assert torch.equal(b["image"], x) and torch.equal(b["label"], y)


def test_without_fields_batches_stay_tuples(jpeg_folder):
    with stoker.Loader(jpeg_folder, 4, transform=RRC) as L:
        b = next(iter(L))
        assert isinstance(b, tuple) and len(b) == 2 and L.fields is None


# ---- folder sources carrying text, JSON, bytes and .npy --------------------------

def test_text_json_bytes_equal_what_was_written(tmp_path):
    want = folder_of(tmp_path / "d", lambda c, k: json.dumps(meta(c, k), ensure_ascii=False)
                     .encode())
    fields = {"meta": ("image", "json"), "text": stoker.Field("image", kind="text"),
              "raw": ("image", "bytes"), "label": "label"}
    seen = []
    with stoker.Loader(tmp_path / "d", 3, fields=fields, return_indices=True, threads=2) as L:
        for b in L:
            assert isinstance(b["text"], list) and isinstance(b["raw"], list)
            for i, m, t, r, y in zip(b["__index__"].tolist(), b["meta"], b["text"], b["raw"],
                                     b["label"].tolist()):
                c, data = want[i]
                assert r == data and t == data.decode("utf-8") and m == json.loads(data)
                assert y == c and isinstance(t, str) and isinstance(r, bytes)
                seen.append(i)
    assert sorted(seen) == list(range(10))


def test_bytes_as_tensor_views_the_batch(tmp_path):
    want = folder_of(tmp_path / "d", lambda c, k: bytes(range(c, c + 7 * k + 1)))
    for output in ("torch", "numpy"):
        with stoker.Loader(tmp_path / "d", 4, fields={"raw": ("image", "bytes")},
                           bytes_as="tensor", return_indices=True, output=output) as L:
            for b in L:
                r = b["raw"]
                assert isinstance(r, stoker.Ragged)
                for s, i in enumerate(b["__index__"].tolist()):
                    o, n = int(r.offsets[s]), int(r.lengths[s])
                    assert bytes(np.asarray(r.data[o:o + n])) == want[i][1]
    with pytest.raises(ValueError, match="bytes_as"):
        stoker.Loader(tmp_path / "d", 4, fields={"raw": ("image", "bytes")}, bytes_as="view")


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_npy_same_shape_is_one_tensor(tmp_path):
    def arr(c, k):
        return (np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * c + k)
    folder_of(tmp_path / "d", lambda c, k: npy_bytes(arr(c, k)))
    with stoker.Loader(tmp_path / "d", 4, fields={"x": ("image", "npy")}, return_indices=True,
                       seed=1) as L:
        for b in L:
            x = b["x"]
            assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
            assert x.shape == (len(b["__index__"]), 2, 3)
            for row, i in zip(x, b["__index__"].tolist()):
                assert np.array_equal(row.numpy(), arr(*divmod(i, 5)))


def test_npy_varying_shapes_is_a_list(tmp_path):
    def arr(c, k):
        return np.arange(k + 1, dtype=np.int16) * (c + 1)
    folder_of(tmp_path / "d", lambda c, k: npy_bytes(arr(c, k)))
    with stoker.Loader(tmp_path / "d", 5, fields={"x": ("image", "npy")}, shuffle=False,
                       return_indices=True, output="numpy") as L:
        for b in L:
            assert isinstance(b["x"], list)
            for a, i in zip(b["x"], b["__index__"].tolist()):
                assert a.dtype == np.int16 and np.array_equal(a, arr(*divmod(i, 5)))


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint16", "float64"])
@pytest.mark.parametrize("shape", [(), (3,), "ragged"])
def test_npy_dtypes_and_shapes(tmp_path, dtype, shape):
    def arr(c, k):
        n = 10 * c + k
        sh = (n % 3 + 1,) if shape == "ragged" else shape
        return (np.arange(int(np.prod(sh)), dtype=np.int64).reshape(sh) + n).astype(dtype)
    folder_of(tmp_path / "d", lambda c, k: npy_bytes(arr(c, k)))
    with stoker.Loader(tmp_path / "d", 10, fields={"x": ("image", "npy")},
                       shuffle=False) as L:
        x = next(iter(L))["x"]
    want = [arr(c, k) for c in range(2) for k in range(5)]
    torch_has = dtype != "uint16"   # torch 1.13 has no uint16: NumPy arrays then
    if shape == "ragged":
        assert isinstance(x, list) and len(x) == 10
        for a, w in zip(x, want):
            assert isinstance(a, torch.Tensor if torch_has else np.ndarray)
            assert np.array_equal(np.asarray(a), w) and np.asarray(a).dtype == w.dtype
    else:
        assert isinstance(x, torch.Tensor if torch_has else np.ndarray)
        assert x.shape == (10, *shape)
        assert np.array_equal(np.asarray(x), np.stack(want))
        assert np.asarray(x).dtype == np.dtype(dtype)


def test_scalars_from_text(tmp_path):
    folder_of(tmp_path / "d", lambda c, k: f" {k * 0.25 + c} \n".encode())
    with stoker.Loader(tmp_path / "d", 10, fields={"v": ("image", "float")}, shuffle=False) as L:
        v = next(iter(L))["v"]
        assert v.dtype == torch.float32 and v.tolist() == [k * 0.25 + c for c in range(2)
                                                            for k in range(5)]


def test_bad_json_skip_drops_the_sample_and_names_the_field(tmp_path):
    def content(c, k):
        return b'{"broken": [1, 2' if (c, k) == (1, 2) else json.dumps({"c": c, "k": k}).encode()
    folder_of(tmp_path / "d", content)
    fields = {"meta": ("image", "json"), "label": "label"}
    with stoker.Loader(tmp_path / "d", 4, fields=fields, on_error="skip",
                       return_indices=True) as L:
        idx = sorted(i for b in L for i in b["__index__"].tolist())
        assert idx == [i for i in range(10) if i != 7]
        errs = L.stats()["errors"]
        assert len(errs) == 1 and errs[0]["sample"] == 7
        assert "meta" in errs[0]["reason"] and "JSON" in errs[0]["reason"]
    with stoker.Loader(tmp_path / "d", 4, fields=fields, shuffle=False) as L:
        it = iter(L)
        next(it)
        with pytest.raises(stoker.SampleError) as ei:
            next(it)
        assert ei.value.field == "meta" and ei.value.sample == 7
        assert "f2.jpg" in ei.value.path
        rest = next(it)   # the batch without it
        assert len(rest["meta"]) == 3


def test_invalid_utf8_text_is_a_sample_error(tmp_path):
    folder_of(tmp_path / "d", lambda c, k: b"ok" if k else b"\xff\xfe bad")
    with stoker.Loader(tmp_path / "d", 5, fields={"t": ("image", "text")}, on_error="skip",
                       shuffle=False) as L:
        got = [t for b in L for t in b["t"]]
        assert got == ["ok"] * 8
        assert all(e["reason"].count("UTF-8") for e in L.stats()["errors"])


# ---- arguments ------------------------------------------------------------------

def test_argument_types_and_library_refusals(jpeg_folder):
    with pytest.raises(TypeError, match="fields must be"):
        stoker.Loader(jpeg_folder, 4, fields=3)
    with pytest.raises(TypeError, match=r"fields\['a'\]"):
        stoker.Loader(jpeg_folder, 4, fields={"a": 3})
    with pytest.raises(TypeError, match="optional"):
        stoker.Field("txt", optional="yes")
    with pytest.raises(TypeError, match="fields="):
        stoker.Loader(jpeg_folder, 4, transform={"image": RRC})
    with pytest.raises(ValueError, match="'img' is not a field"):
        stoker.Loader(jpeg_folder, 4, fields={"image": "image"}, transform={"img": RRC})
    with pytest.raises(ValueError, match="which is none"):
        stoker.Loader(jpeg_folder, 4, fields={"image": ("image", "picture")})
    # The library's reasons, as it words them.
    with pytest.raises(ValueError, match="no field 'txt'"):
        stoker.Loader(jpeg_folder, 4, fields={"image": "image", "caption": "txt"})
    with pytest.raises(ValueError, match="only image fields take a transform"):
        stoker.Loader(jpeg_folder, 4, fields={"label": ("label", "int")},
                      transform={"label": RRC})
    with pytest.raises(ValueError, match="rename"):
        stoker.Loader(jpeg_folder, 4, fields={"__index__": "label"})


# ---- WebDataset tars ----------------------------------------------------------------

N_TAR = 12


def tar_add(t, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    t.addfile(ti, io.BytesIO(data))


def tar_arr(i):
    return np.arange(6, dtype=np.float32).reshape(2, 3) * (i + 1)


@pytest.fixture(scope="module")
def wds(tmp_path_factory):
    """Two WebDataset shards of N_TAR samples: key.jpg, key.txt (not in
    samples 3 and 8), key.json, key.cls, key.npy."""
    root = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(7)
    want = {}
    for shard in range(2):
        with tarfile.open(root / f"shard-{shard:06d}.tar", "w") as t:
            for j in range(N_TAR // 2):
                i = shard * (N_TAR // 2) + j
                key = f"sample{i:04d}"
                jpg = jpeg_bytes(rng, COLORS[i % 3], 36 + i, 48)
                txt = caption(i % 3, i) if i not in (3, 8) else None
                tar_add(t, f"{key}.jpg", jpg)
                if txt is not None:
                    tar_add(t, f"{key}.txt", txt.encode())
                tar_add(t, f"{key}.json", json.dumps(meta(i % 2, i)).encode())
                tar_add(t, f"{key}.cls", str(i % 3).encode())
                tar_add(t, f"{key}.npy", npy_bytes(tar_arr(i)))
                want[i] = {"jpg": jpg, "txt": txt, "json": meta(i % 2, i), "cls": i % 3}
    return root, want


TAR_FIELDS = {"image": "jpg;png;webp", "caption": stoker.Field("txt", optional=True),
              "meta": "json", "label": "cls", "arr": "npy", "raw": ("jpg", "bytes")}


def tar_loader(root, batch, **kw):
    return stoker.Loader(root, batch, **kw)   # a directory of shards, in name order


def test_tar_every_field_of_every_sample_once(wds):
    root, want = wds
    seen = []
    with tar_loader(root, 5, fields=TAR_FIELDS, transform={"image": RRC}, return_indices=True,
                    threads=2) as L:
        for b in L:
            assert b["image"].shape[1:] == (3, 24, 24)
            assert isinstance(b["arr"], torch.Tensor) and b["arr"].shape[1:] == (2, 3)
            assert b["caption_present"].dtype == torch.bool
            for s, i in enumerate(b["__index__"].tolist()):
                w = want[i]
                assert b["raw"][s] == w["jpg"]
                assert b["caption"][s] == w["txt"]           # None where absent
                assert bool(b["caption_present"][s]) == (w["txt"] is not None)
                assert b["meta"][s] == w["json"]
                assert int(b["label"][s]) == w["cls"]
                assert np.array_equal(b["arr"][s].numpy(), tar_arr(i))
                seen.append(i)
    assert sorted(seen) == list(range(N_TAR))


def test_tar_image_bit_identical_to_loader_without_fields(wds):
    root, _ = wds
    with tar_loader(root, 4, transform=RRC, seed=8) as plain, \
            tar_loader(root, 4, fields={"image": "jpg", "label": "cls"}, transform=RRC,
                       seed=8) as F:
        for b, (x, y) in zip(epoch(F), epoch(plain)):
            assert torch.equal(b["image"], x) and torch.equal(b["label"], y)


def test_tar_threads_and_resume(wds):
    root, _ = wds
    kw = dict(fields=TAR_FIELDS, transform={"image": RRC}, seed=21)
    runs = []
    for threads in (1, 2):
        with tar_loader(root, 4, threads=threads, **kw) as L:
            runs.append(epoch(L))
    same_batches(*runs)
    with tar_loader(root, 4, **kw) as L:
        it = iter(L)
        next(it)
        state = L.state_dict()
    with tar_loader(root, 4, **kw) as L:
        L.load_state_dict(state)
        same_batches(epoch(L), runs[0][1:])


def test_tar_missing_required_field_names_it(wds):
    root, _ = wds
    with tar_loader(root, 4, fields={"image": "jpg", "caption": "txt"}, on_error="skip",
                    return_indices=True) as L:
        idx = sorted(i for b in L for i in b["__index__"].tolist())
        assert idx == [i for i in range(N_TAR) if i not in (3, 8)]
        reasons = [e["reason"] for e in L.stats()["errors"]]
        assert len(reasons) == 2 and all("no field 'txt'" in r for r in reasons)
    with tar_loader(root, N_TAR, fields={"image": "jpg", "caption": "txt"},
                    shuffle=False) as L:
        with pytest.raises(stoker.SampleError) as ei:
            next(iter(L))
        assert ei.value.field == "caption" and "sample0003" in ei.value.path


def test_tar_numpy_output(wds):
    root, want = wds
    with tar_loader(root, 6, fields=TAR_FIELDS, output="numpy", shuffle=False) as L:
        b = next(iter(L))
        assert isinstance(b["label"], np.ndarray) and b["label"].dtype == np.int64
        assert isinstance(b["arr"], np.ndarray) and b["arr"].dtype == np.float32
        assert isinstance(b["image"], list)   # no transform: the encoded bytes
        assert bytes(b["image"][0]) == want[0]["jpg"]
        assert b["caption"][0] == want[0]["txt"] and b["meta"][0] == want[0]["json"]


def test_resume_under_other_fields_is_refused(jpeg_folder):
    """The resume fingerprint covers the fields: a state saved with one set
    of fields does not resume a loader asked for another."""
    src = jpeg_folder
    a = stoker.Loader(src, 4, fields={"image": "image", "label": "label"}, transform="imagenet-val",
                      output="numpy")
    it = iter(a)
    next(it)
    st = a.state_dict()
    a.close()
    b = stoker.Loader(src, 4, fields={"image": "image", "path": "path"}, transform="imagenet-val",
                      output="numpy")
    with pytest.raises(ValueError, match="transform"):
        b.load_state_dict(st)
    b.close()


# ---- fields on a device -------------------------------------------------------------

def assert_same_batch(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert isinstance(b[k], torch.Tensor), k
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k].cpu()), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("device", ["fake", "cuda"])
@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_tar_device_equals_cpu(wds, dtype, device):
    """device="fake" (the CPU stand-in whose copies run late on another
    thread; "cuda" on a GPU, scripts/test-gpu.sh) with every kind of field:
    the image (converted on the device), labels and the stacked .npy arrive
    as device tensors equal to the CPU run's; captions, JSON and bytes are
    equal too, also for a batch held while the next ones come, over two
    epochs; record_stream finds the batch of each device tensor."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root, _ = wds
    kw = dict(fields=TAR_FIELDS, transform={"image": RRC}, seed=3, dtype=dtype,
              return_indices=True)
    with tar_loader(root, 5, **kw) as C, \
            tar_loader(root, 5, device=device, threads=3, depth=2, **kw) as D:
        assert D.info()["memory_bound_bytes"] > C.info()["memory_bound_bytes"]
        n = 0
        for _ in range(2):
            held = None
            for a, b in zip(C, D):
                assert b["image"].dtype == getattr(torch, dtype)
                assert b["arr"].shape[1:] == (2, 3)
                assert b["__index__"].device.type == "cpu"
                if device == "cuda":
                    for k in ("image", "label", "arr"):
                        assert b[k].is_cuda, k
                for k in ("image", "label", "arr"):
                    D.record_stream(b[k], None)
                with pytest.raises(ValueError, match="not in a batch"):
                    D.record_stream(a["label"], None)
                if held is not None:
                    assert_same_batch(*held)   # the copy thread ran ahead meanwhile
                held = (a, b)
                n += 1
            assert_same_batch(*held)
        assert n == 2 * ((N_TAR + 4) // 5)
