"""The device path from Python (docs/gpu.md).

On every machine: the output conversion (ToTensor/Normalize, dtype, layout)
against a reference computed here with NumPy and torch from the same
pipeline's uint8 pixels, for every dtype and layout; device="fake" (the CPU
stand-in whose copies and conversions run late on another thread) against
the CPU path, through torch and NumPy, with batches held, resumed and
abandoned; device="cuda" without a GPU raising a clear error.

On a machine with a GPU and CUDA-enabled torch (scripts/test-gpu.sh), the
same comparisons run on device="cuda", on the default stream and on a side
stream."""

import os

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SPEC = ("RandomResizedCrop(40)|RandomHorizontalFlip()|"
        f"Normalize(mean={MEAN}, std={STD})".replace(" ", ""))
GEOM = "RandomResizedCrop(40)|RandomHorizontalFlip()"


def have_cuda():
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """An ImageFolder of 30 JPEGs of varied sizes in 3 classes."""
    from PIL import Image
    root = tmp_path_factory.mktemp("device") / "imgs"
    rng = np.random.default_rng(5)
    for i in range(30):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = 30 + (i * 7) % 50, 34 + (i * 11) % 45
        base = rng.integers(0, 256, size=(h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)
        img = np.kron(base, np.ones((4, 4, 1), dtype=np.uint8))[:h, :w]
        Image.fromarray(img).save(d / f"{i:03d}.jpg", quality=92)
    return str(root)


def batches(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for x, y in loader:
            out.append((x.cpu().clone() if hasattr(x, "cpu") else np.array(x),
                        y.cpu().clone() if hasattr(y, "cpu") else np.array(y)))
    return out


def reference(u8, dtype, layout):
    """ToTensor + Normalize on uint8 NHWC pixels, as torchvision computes it
    in float32, then cast like torch's .half()/.bfloat16()."""
    x = torch.from_numpy(np.ascontiguousarray(u8)).float() / 255.0
    x = (x - torch.tensor(MEAN, dtype=torch.float32)) / torch.tensor(STD, dtype=torch.float32)
    if layout == "nchw":
        x = x.permute(0, 3, 1, 2).contiguous()
    return {"float32": x, "float16": x.half(), "bfloat16": x.bfloat16()}[dtype]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_conversion_matches_reference(images, dtype, layout):
    """The CPU path's conversion (the reference the GPU kernel shares its
    math with) equals ToTensor+Normalize computed by torch, bit for bit; and
    the fake device equals the CPU path."""
    kw = dict(batch_size=8, transform=None, threads=2, seed=3, layout="nhwc", dtype="uint8")
    raw = batches(stoker.Loader(images, **{**kw, "transform": GEOM}))
    cpu = batches(stoker.Loader(images, 8, transform=SPEC, threads=2, seed=3, layout=layout,
                                dtype=dtype))
    fake = batches(stoker.Loader(images, 8, transform=SPEC, threads=2, seed=3, layout=layout,
                                 dtype=dtype, device="fake"))
    assert len(raw) == len(cpu) == len(fake) == 4
    for (u8, y0), (x, y), (f, fy) in zip(raw, cpu, fake):
        want = reference(u8.numpy(), dtype, layout)
        assert x.dtype == want.dtype and x.shape == want.shape
        assert torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           want.view(torch.int16 if want.element_size() == 2 else torch.int32))
        assert torch.equal(y, y0)
        assert torch.equal(f.view(torch.int16 if f.element_size() == 2 else torch.int32),
                           x.view(torch.int16 if x.element_size() == 2 else torch.int32))
        assert torch.equal(fy, y)


def test_fake_device_numpy_and_uint8(images):
    """uint8 batches (copied, not converted) and NumPy output."""
    for layout in ("nchw", "nhwc"):
        a = batches(stoker.Loader(images, 7, transform=GEOM, seed=1, layout=layout,
                                  output="numpy", threads=2), epochs=2)
        b = batches(stoker.Loader(images, 7, transform=GEOM, seed=1, layout=layout,
                                  output="numpy", threads=2, device="fake"), epochs=2)
        assert len(a) == len(b) == 10
        for (x, y), (u, v) in zip(a, b):
            assert x.dtype == np.uint8 and np.array_equal(x, u) and np.array_equal(y, v)


def test_held_tensors_stay_valid(images):
    """Tensors kept while the loader moves on keep their values (their
    device buffers are not reused before they die)."""
    cpu = batches(stoker.Loader(images, 6, transform=SPEC, seed=2, threads=2))
    loader = stoker.Loader(images, 6, transform=SPEC, seed=2, threads=2, depth=3,
                           device="fake")
    kept = []
    for k, (x, y) in enumerate(loader):
        if k % 2 == 0:
            kept.append((k, x, y))
    assert len(kept) == 3
    for k, x, y in kept:
        assert torch.equal(x, cpu[k][0]) and torch.equal(y, cpu[k][1])
    loader.close()
    # Still valid after close, until they die.
    assert torch.equal(kept[0][1], cpu[0][0])


def test_resume_and_abandon(images):
    """state_dict is the loop's position, not the copy thread's."""
    kw = dict(transform=SPEC, seed=4, threads=2, dtype="float16")
    cpu = batches(stoker.Loader(images, 5, **kw), epochs=2)
    loader = stoker.Loader(images, 5, device="fake", **kw)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    assert state["batch"] == 2
    resumed = stoker.Loader(images, 5, device="fake", **kw)
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(rest) == 4
    for (x, _), (c, _) in zip(rest, cpu[2:6]):
        assert torch.equal(x.view(torch.int16), c.view(torch.int16))
    # An abandoned iterator: the next iter() starts the next epoch.
    nxt = batches(loader)
    assert len(nxt) == 6
    assert torch.equal(nxt[0][0].view(torch.int16), cpu[6][0].view(torch.int16))
    assert loader.stats()["device_memory_bytes"] > 0


def test_dlpack_protocol_on_fake(images):
    loader = stoker.Loader(images, 4, transform=SPEC, threads=1, device="fake")
    b = loader._engine.next()
    v = b.data()
    assert v.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        v.__dlpack__(stream=5)
    t = torch.utils.dlpack.from_dlpack(v)
    assert t.shape == (4, 3, 40, 40)
    del t, v, b
    loader.close()


def test_record_stream_on_fake(images):
    """Loader.record_stream finds the batch a tensor (or a view into it)
    belongs to and adds the stream to those its release waits for; the fake
    device's memory is the host's, which takes no stream (issue 18)."""
    loader = stoker.Loader(images, 4, transform=SPEC, threads=1, device="fake")
    it = iter(loader)
    x, y = next(it)
    loader.record_stream(x, None)
    loader.record_stream(x[1], None)  # a view into the batch
    with pytest.raises(ValueError, match="host"):
        loader.record_stream(x, 7)  # the fake device has no streams to name
    with pytest.raises(ValueError, match="not in a batch of this loader"):
        loader.record_stream(x.clone(), None)
    with pytest.raises(ValueError, match="not in a batch of this loader"):
        loader.record_stream(y, None)
    with pytest.raises(TypeError, match="stream must be"):
        loader.record_stream(x, "side")
    with pytest.raises(TypeError, match="data must be"):
        loader.record_stream([1, 2], None)
    # The engine's batch directly: the C API's limits and errors.
    b = loader._engine.next()
    b.record_stream(None)
    with pytest.raises(ValueError, match="host"):
        b.record_stream(3)
    del x, y, b
    # The batches released, the loader goes on (8 batches an epoch).
    got = batches(loader)
    assert len(got) == 8
    loader.close()
    # A host loader: nothing to wait for.
    cpu = stoker.Loader(images, 4, transform=SPEC, threads=1)
    x, _ = next(iter(cpu))
    cpu.record_stream(x, None)
    cpu.close()


@pytest.mark.skipif(not have_cuda(), reason="no CUDA GPU (torch.cuda.is_available() is False)")
def test_record_stream_on_cuda(images):
    """A batch read on a side stream that lags (a sleep kernel queued first)
    and released from the default stream: with record_stream the buffer is
    not rewritten before the side stream read it."""
    cpu = batches(stoker.Loader(images, 4, transform=SPEC, seed=3, threads=2, dtype="float32"))
    loader = stoker.Loader(images, 4, transform=SPEC, seed=3, threads=2, dtype="float32",
                           depth=1, device="cuda")
    side = torch.cuda.Stream()
    copies = []
    for x, _ in loader:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # about 10 ms: the side stream lags
            copies.append(x.clone())
        loader.record_stream(x, side)
        del x  # released on the default stream, which is long done with it
    torch.cuda.synchronize()
    assert len(copies) == len(cpu)
    for got, (want, _) in zip(copies, cpu):
        assert torch.equal(got.cpu(), want)


def test_bad_device_arguments(images):
    for bad in ("tpu", "cuda:x", "cpu:1", "cuda:", 3):
        with pytest.raises(ValueError, match="device must be"):
            stoker.Loader(images, 4, transform=SPEC, device=bad)
    with pytest.raises(ValueError, match='output="torch"'):
        stoker.Loader(images, 4, transform=SPEC, device="cuda", output="numpy")
    with pytest.raises(ValueError, match="one shape"):
        stoker.Loader(images, 4, transform="decode", device="fake")


@pytest.mark.skipif(have_cuda(), reason="this machine has a GPU: the CUDA tests below run")
def test_cuda_without_gpu_says_why(images):
    with pytest.raises(stoker.Error, match="cuda"):
        stoker.Loader(images, 4, transform=SPEC, device="cuda")
    with pytest.raises(stoker.Error, match="cuda"):
        stoker.Loader(images, 4, transform=SPEC, device=torch.device("cuda", 0))


@pytest.mark.skipif(not have_cuda(), reason="no CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float16", "bfloat16"])
def test_cuda_matches_cpu(images, dtype):
    spec = GEOM if dtype == "uint8" else SPEC
    cpu = batches(stoker.Loader(images, 8, transform=spec, seed=6, threads=2, dtype=dtype))
    loader = stoker.Loader(images, 8, transform=spec, seed=6, threads=2, dtype=dtype,
                           device="cuda")
    got = []
    side = torch.cuda.Stream()
    for k, (x, y) in enumerate(loader):
        assert x.is_cuda and y.is_cuda
        if k % 2:
            # Consumed on a side stream: the copy is waited for there.
            with torch.cuda.stream(side):
                x2 = x.float() * 1 if dtype != "bfloat16" else x.float()
            side.synchronize()
            got.append((x2.to(x.dtype).cpu(), y.cpu()))
        else:
            got.append((x.cpu(), y.cpu()))
    assert len(got) == len(cpu)
    for (x, y), (c, cy) in zip(got, cpu):
        assert torch.equal(x.float(), c.float()) and torch.equal(y, cy)
