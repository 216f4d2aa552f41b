"""Arguments of the Python API (issue 13, items 4, 6 and 7): integers of any
kind with __index__, messages that name the range, the key, the variable or
the sample that is wrong, and options that are honoured or refused, never
ignored."""

import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import transforms as T
import stoker.loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- item 4: integers ------------------------------------------------------------

def test_numpy_and_torch_integers_are_accepted_everywhere(tmp_path, make_records):
    rec = make_records(12)
    r2 = stoker.Records(rec.path, np.int64(24), header_bytes=torch.tensor(0),
                        label_bytes=np.uint8(8))
    assert (r2.record_bytes, r2.header_bytes, r2.label_bytes) == (24, 0, 8)
    assert all(type(v) is int for v in (r2.record_bytes, r2.header_bytes, r2.label_bytes))
    with stoker.Loader(r2, np.int64(4), threads=np.int32(2), depth=torch.tensor(3),
                       seed=np.uint64(7), rank=np.int64(1), world_size=torch.tensor(2),
                       max_sample_bytes=np.int64(4096), output="numpy", shuffle=False) as L:
        assert type(L.batch_size) is int and L.batch_size == 4
        assert (L.seed, L.depth, L.rank, L.world_size) == (7, 3, 1, 2)
        assert type(L.seed) is int and type(L.rank) is int and type(L.world_size) is int
        assert len(L) == 2                       # 6 samples of rank 1, batches of 4
        L.set_epoch(np.int64(3))
        assert L.epoch == 3
        L.set_epoch(torch.tensor(4))
        assert L.epoch == 4
        sd = {k: np.int64(v) if isinstance(v, int) and not isinstance(v, bool) else v
              for k, v in L.state_dict().items()}
        sd["epoch"], sd["batch"] = np.uint64(5), torch.tensor(1)
        L.load_state_dict(sd)
        assert (L.state_dict()["epoch"], L.state_dict()["batch"]) == (5, 1)
    opts = {"max_dim": torch.tensor(4096), "exif": np.True_, "scratch_bytes": np.int64(1 << 20)}
    with stoker.Loader(rec, 4, output="numpy", options=opts) as L:
        assert len(L) == 3


def test_transform_integers_accept_torch_and_numpy():
    assert str(T.RandomCrop(torch.tensor(32), padding=torch.tensor(4), fill=np.uint8(3))) == \
        "RandomCrop(32,padding=4,fill=3)"
    assert str(T.RandomCrop((np.int64(32), torch.tensor(30)),
                            padding=(np.int64(1), torch.tensor(2)))) == \
        "RandomCrop((32,30),padding=(1,2))"
    assert str(T.Resize(np.int64(32), max_size=torch.tensor(40))) == "Resize(32,max_size=40)"
    assert str(T.CenterCrop([np.int32(5), np.int32(5)])) == "CenterCrop(5)"
    assert str(T.Pad(torch.tensor(2), fill=(1, 2, torch.tensor(3)))) == "Pad(2,fill=(1,2,3))"
    assert str(T.RandomResizedCrop(torch.tensor(24))).startswith("RandomResizedCrop(24,")
    for bad in (True, torch.tensor(True), 32.0, torch.tensor(32.0)):
        with pytest.raises(TypeError, match="size"):
            T.Resize(bad)
    with pytest.raises(TypeError, match="padding"):
        T.Pad(np.True_)
    with pytest.raises(ValueError, match="size must be >= 1"):
        T.CenterCrop(torch.tensor(0))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(batch_size=np.int64(0)), ValueError,
     r"batch_size must be in 1 \.\. 16777216, got 0 \(numpy\.int64\)"),
    (dict(batch_size=2 ** 24 + 1), ValueError, r"batch_size must be in 1 \.\. 16777216, got "),
    (dict(batch_size=8.0), TypeError, r"batch_size must be an integer .*got 8\.0$"),
    (dict(batch_size=np.float32(8)), TypeError, r"batch_size .*got 8\.0 \(numpy\.float32\)"),
    (dict(batch_size=True), TypeError, r"batch_size .*got True"),
    (dict(batch_size="8"), TypeError, r"batch_size .*got '8'"),
    (dict(threads=np.int64(300)), ValueError, r"threads .*0 \.\. 256, got 300 \(numpy\.int64\)"),
    (dict(depth=torch.tensor(64)), ValueError, r"depth must be in 1 \.\. 63, got tensor\(64\)"),
    (dict(seed=2 ** 64), ValueError, r"seed must be in 0 \.\. 18446744073709551615"),
    (dict(world_size=np.int64(0), rank=0), ValueError, r"world_size must be in 1 \.\. "),
    (dict(rank=np.int64(-1), world_size=2), ValueError, r"rank must be in 0 \.\. .*got -1"),
    (dict(rank=2, world_size=np.int64(2)), ValueError, r"need 0 <= rank < world_size"),
    (dict(max_sample_bytes=np.float64(4096)), TypeError, r"max_sample_bytes"),
])
def test_integer_argument_errors_give_range_and_type(make_records, kwargs, exc, match):
    kw = dict(batch_size=2, output="numpy")
    kw.update(kwargs)
    with pytest.raises(exc, match=match):
        stoker.Loader(make_records(4), **kw)


def test_records_integer_errors():
    with pytest.raises(TypeError, match=r"record_bytes .*got 24\.5"):
        stoker.Records("x", 24.5)
    with pytest.raises(ValueError, match=r"record_bytes must be in 1 \.\. .*got 0 \(numpy"):
        stoker.Records("x", np.int64(0))
    with pytest.raises(ValueError, match="header_bytes must be in 0"):
        stoker.Records("x", 4, header_bytes=-1)


def test_set_epoch_errors_give_range_and_type(make_records):
    with stoker.Loader(make_records(8), 4, output="numpy") as L:
        with pytest.raises(ValueError, match=r"epoch must be in 0 \.\. \d+, got -1 \(numpy"):
            L.set_epoch(np.int64(-1))
        with pytest.raises(ValueError, match=r"epoch must be in 0 \.\. 6148914691236517204, "):
            L.set_epoch(2 ** 63)                 # 2 batches per epoch: 2**64 // 3 - 1 at most
        with pytest.raises(TypeError, match="epoch"):
            L.set_epoch(1.0)


# ---- item 6: messages ------------------------------------------------------------

def test_unknown_option_key_is_named_with_the_known_ones(make_records):
    with pytest.raises(ValueError) as e:
        stoker.Loader(make_records(4), 2, output="numpy", options={"max_dimm": 4096})
    msg = str(e.value)
    assert "unknown key 'max_dimm'" in msg and "invalid value" not in msg
    for k in stoker.loader._option_keys():
        assert k in msg
    # A value the library refuses is still reported as a bad value of that key.
    with pytest.raises(ValueError, match="max_dim"):
        stoker.Loader(make_records(4), 2, output="numpy", options={"max_dim": "huge"})


@pytest.mark.parametrize("key", ["dtype", "layout", "size", "depth", "device"])
def test_options_that_are_arguments_point_to_the_argument(make_records, key):
    with pytest.raises(ValueError, match=f"'{key}' is a Loader argument: pass {key}="):
        stoker.Loader(make_records(4), 2, output="numpy", options={key: "1"})


def test_option_keys_come_from_the_library():
    """Python's option keys are the library's table (stk_option_next), less
    the Loader arguments: a key added to the library is known to Python
    without an edit here, and each has its doc line."""
    table = {o["name"]: o for o in stoker._stoker.options()}
    assert "max_dim" in table and "fetch_timeout" in table
    assert set(stoker.loader._option_keys()) == set(table) - set(stoker.loader._ARGUMENT_KEYS)
    assert set(stoker.loader._ARGUMENT_KEYS) <= set(table)
    for name, o in table.items():
        assert o["doc"] and o["default"], name
    t = table["fetch_timeout"]
    assert (t["type"], t["min"], t["max"]) == ("uint", 1, 3600)
    assert table["layout"]["values"] == "nchw|nhwc"


def test_option_values_are_checked_by_the_library():
    """The library says which key, which value and what the key takes."""
    assert stoker._stoker.option_error("fetch_timeout", "30") is None
    msg = stoker._stoker.option_error("fetch_timeout", "0")
    assert msg == "fetch_timeout takes seconds, 1..3600, got '0'"
    assert "unknown option 'nope'" in stoker._stoker.option_error("nope", "1")
    assert stoker._stoker.option_error("cache_limit", "16MiB") is None
    assert "a size in bytes" in stoker._stoker.option_error("cache_limit", "16QB")


def test_bad_option_value_names_key_value_and_range(make_records):
    with pytest.raises(ValueError, match=r"options: max_dim takes a number of pixels, "
                                         r"1\.\.1048576, got 'huge'"):
        stoker.Loader(make_records(4), 2, output="numpy", options={"max_dim": "huge"})


def test_sized_presets_and_device_names_come_from_the_library():
    assert stoker.loader._sized_presets() == [p for p, sized in stoker._stoker.presets() if sized]
    assert "imagenet-train" in stoker.loader._sized_presets()
    assert stoker.loader._device_name("cuda:3") == "cuda:3"
    for bad in ("gpu", "cpu:0", "cuda:x", "cuda:1024"):
        with pytest.raises(ValueError, match="device must be"):
            stoker.loader._device_name(bad)


def test_load_state_dict_negative_epoch_names_the_epoch(make_records):
    with stoker.Loader(make_records(8), 4, output="numpy", seed=1) as L:
        with pytest.raises(ValueError) as e:
            L.load_state_dict({"seed": 1, "epoch": -1, "batch": 0})
        assert "epoch" in str(e.value) and "got -1" in str(e.value)
        assert "batch" not in str(e.value)
        with pytest.raises(ValueError, match=r"batch \(this loader has 2 batches per epoch\) "
                                             r"must be in 0 \.\. 2, got 3"):
            L.load_state_dict({"seed": 1, "epoch": 0, "batch": 3})
        with pytest.raises(ValueError, match=r"seed must be in 0 \.\. .*got -5"):
            L.load_state_dict({"seed": -5, "epoch": 0, "batch": 0})


@pytest.mark.parametrize("env,match", [
    ({"WORLD_SIZE": "2", "RANK": "x"}, r"environment variable RANK='x' is not an integer"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, r"environment variable WORLD_SIZE='two' is not an"),
    ({"WORLD_SIZE": "", "RANK": "0"}, r"environment variable WORLD_SIZE='' is not an"),
    ({"WORLD_SIZE": "2", "RANK": "5"},
     r"need 0 <= rank < world_size .*got rank=5, world_size=2 \(from the RANK and WORLD_SIZE "
     r"environment variables\)"),
])
def test_garbage_in_rank_environment_names_the_variable(monkeypatch, make_records, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        stoker.Loader(make_records(4), 2, output="numpy")
    # Explicit arguments win over the environment, garbage or not.
    with stoker.Loader(make_records(4), 2, output="numpy", rank=0, world_size=1) as L:
        assert len(L) == 2


def test_environment_partition_is_used(monkeypatch, make_records):
    monkeypatch.setenv("WORLD_SIZE", " 2 ")
    monkeypatch.setenv("RANK", "1")
    with stoker.Loader(make_records(8), 2, output="numpy") as L:
        assert (L.rank, L.world_size, len(L)) == (1, 2, 2)


def test_raise_names_the_first_failed_sample_in_batch_order(make_folder):
    """Two bad files in one batch: the message, .sample, .path and .errors[0]
    are the failure that comes first in the batch (in the epoch's shuffled
    order), not the first to fail, nor the lowest dataset index. One thread
    makes the later sample fail last, so the engine's list has it first."""
    root = make_folder(classes=1, per_class=8)
    names = sorted(os.listdir(root / "class00"))
    with stoker.Loader(root, 8, seed=3, output="numpy", return_indices=True) as L:
        order = next(iter(L))[2].tolist()
    # Two positions whose dataset indices are in the opposite order.
    p, q = next((p, q) for p in range(8) for q in range(p + 1, 8) if order[p] > order[q])
    for i in (order[p], order[q]):
        f = root / "class00" / names[i]
        f.unlink()
        os.symlink("/nonexistent/target", f)
    with stoker.Loader(root, 8, seed=3, threads=1, output="numpy", return_indices=True) as L:
        it = iter(L)
        with pytest.raises(stoker.SampleError) as e:
            next(it)
        first = order[p]
        assert str(e.value).startswith(f"sample {first} (")
        assert names[first] in str(e.value) and "and 1 more failed sample" in str(e.value)
        assert e.value.sample == first and e.value.path.endswith(names[first])
        assert [d["sample"] for d in e.value.errors] == [first, order[q]]
        x, y, idx = next(it)                     # the batch, without the two
        assert idx.tolist() == [i for i in order if i not in (order[p], order[q])]


# ---- item 7: honoured or refused ---------------------------------------------------

@pytest.fixture(scope="module")
def png_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for k in range(3):
            img = rng.integers(0, 256, (40 + k, 50, 3), dtype=np.uint8)
            Image.fromarray(img).save(root / f"c{c}" / f"i{k}.png")
    return root


@pytest.mark.parametrize("transform", [
    None, "none", "decode", "RandomCrop(8)", "Resize(20)|CenterCrop(16)",
    T.Compose([T.RandomResizedCrop(16)]), [T.CenterCrop(16), T.Normalize((0.5,), (0.5,))],
])
def test_size_without_a_sized_preset_is_refused(png_folder, transform):
    with pytest.raises(ValueError, match=r"size=24 sets the output size of the presets .* "
                                         r"it would be ignored"):
        stoker.Loader(png_folder, 2, output="numpy", transform=transform, size=24)


@pytest.mark.parametrize("transform,shape", [
    ("imagenet-val", (16, 16)),
    ("imagenet-train|Normalize(mean=(0.5,),std=(0.5,))", (16, 16)),
    ("cifar-train", (16, 16)),
])
def test_size_with_a_preset_in_a_spec_string_is_honoured(png_folder, transform, shape):
    with stoker.Loader(png_folder, 3, output="numpy", transform=transform, size=16) as L:
        x, _ = next(iter(L))
        assert x.shape[2:] == shape


def test_max_sample_bytes_zero_is_refused(make_records, make_folder):
    with pytest.raises(ValueError, match=r"max_sample_bytes .*must be in 1 \.\. 1099511627776, "
                                         r"got 0"):
        stoker.Loader(make_folder(), 2, output="numpy", max_sample_bytes=0)
    with pytest.raises(ValueError, match="max_sample_bytes"):
        stoker.Loader(make_folder(name="f2"), 2, output="numpy", max_sample_bytes=-1)
    with stoker.Loader(make_folder(name="f3"), 2, output="numpy", max_sample_bytes=None) as L:
        assert len(L) == 8                       # None: the default budget


def test_float_dtype_without_a_transform_is_refused_not_ignored(make_records, make_folder):
    """Issue 13 item 3: raw bytes and records have no pixels to convert; a
    float dtype used to come back as uint8 silently."""
    import subprocess
    recs = make_records(10)
    for src in (recs, make_folder()):
        with pytest.raises(Exception) as e:
            stoker.Loader(src, 2, dtype="float32", output="numpy")
        assert "dtype float32 needs an image transform" in str(e.value)
    with stoker.Loader(recs, 2, output="numpy") as L:  # uint8 still works
        assert next(iter(L))[0].dtype == np.uint8
    stoker_bin = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "build", "release", "stoker")
    r = subprocess.run([stoker_bin, "bench", recs.path, "--record-size", "24",
                        "--dtype", "float16"], capture_output=True, text=True)
    assert r.returncode == 1 and "dtype float16 needs an image transform" in r.stderr


# ---- issue 24 item 10: arguments a DataLoader user gets wrong ---------------------

@pytest.mark.parametrize("name", ["shuffle", "drop_last", "return_indices", "strict"])
@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, 1.0])
def test_bool_arguments_take_only_booleans(make_records, name, value):
    with pytest.raises(TypeError, match=rf"{name} must be a bool \(True or False\), got "
                                        rf"{re.escape(repr(value))}"):
        stoker.Loader(make_records(4), 2, output="numpy", **{name: value})


def test_bool_arguments_take_numpy_and_torch_booleans(make_records):
    with stoker.Loader(make_records(8), 2, output="numpy", shuffle=np.False_,
                       drop_last=torch.tensor(True), return_indices=np.bool_(True)) as L:
        assert (L.shuffle, L.drop_last, L.return_indices) == (False, True, True)
        assert [int(v) for v in next(iter(L))[1]] == [0, 1]


def test_threads_zero_means_all_usable_cpus_as_the_cli(make_records):
    rec = make_records(8)
    with stoker.Loader(rec, 2, output="numpy") as a, \
            stoker.Loader(rec, 2, output="numpy", threads=0) as b:
        assert a.threads == b.threads >= 1
        assert [int(v) for _, y in b for v in y] == [int(v) for _, y in a for v in y]


def test_rank_without_world_size_says_world_size_is_missing(make_records, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=r"rank=1 is given without world_size.*pass "
                                         r"world_size= too"):
        stoker.Loader(make_records(4), 2, output="numpy", rank=1)
    with stoker.Loader(make_records(4), 2, output="numpy", rank=0) as L:
        assert (L.rank, L.world_size) == (0, 1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_workers=4), r"no num_workers= \(a DataLoader argument\): .*use threads=N"),
    (dict(pin_memory=True), r"no pin_memory=.*pinned memory comes with device=\"cuda\""),
    (dict(collate_fn=lambda b: b), r"no collate_fn=.*assembles batches in C"),
    (dict(prefetch_factor=4), r"no prefetch_factor=.*use depth="),
    (dict(persistent_workers=True), r"no persistent_workers=.*always persist"),
    (dict(sampler=None), r"no sampler=.*shuffle= and seed="),
    (dict(generator=None), r"no generator=.*use seed="),
    (dict(worker_init_fn=None), r"no worker_init_fn=.*use seed="),
    (dict(shufle=True), r"unexpected keyword argument 'shufle'"),
])
def test_dataloader_arguments_point_to_stokers(make_records, kwargs, match):
    with pytest.raises(TypeError, match=match) as e:
        stoker.Loader(make_records(4), 2, output="numpy", **kwargs)
    if "shufle" not in kwargs:
        assert "docs/python.md" in str(e.value)


def test_device_messages_keep_the_index_and_list_fake(make_records, make_folder):
    with pytest.raises(ValueError, match=r'"cuda:N".*"fake"/"fake:N".*got \'gpu\''):
        stoker.Loader(make_records(4), 2, device="gpu")
    # Records are dense, so the open goes on to the device, which names the
    # index the user gave (no GPU here: no driver, or an index it lacks).
    try:
        L = stoker.Loader(make_records(4), 2, device="cuda:1")
    except stoker.Error as e:
        assert 'device "cuda:1"' in str(e) and 'device "cuda"' not in str(e)
    else:
        L.close()
    # A device needs one shape: the message names the device as given.
    with pytest.raises(ValueError, match=r'device "fake:1" needs batches of one shape'):
        stoker.Loader(make_folder(), 2, device="fake:1")


# ---- issue 24 item 11: environment misconfiguration ---------------------------------

def test_world_size_without_rank_in_the_environment_is_refused(make_records, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=r"environment variable WORLD_SIZE=2 is set but RANK "
                                         r"is not"):
        stoker.Loader(make_records(4), 2, output="numpy")
    # rank= given: WORLD_SIZE alone is enough.
    with stoker.Loader(make_records(4), 2, output="numpy", rank=1) as L:
        assert (L.rank, L.world_size) == (1, 2)


@pytest.mark.parametrize("order", ["global", "shards"])
def test_local_world_size_larger_than_world_size_is_refused(make_records, monkeypatch, order):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"):
        stoker.Loader(make_records(4), 2, output="numpy", order=order)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    if order == "global":  # (order="shards" needs a dataset of shards)
        with stoker.Loader(make_records(4), 2, output="numpy", order=order) as L:
            assert (L.rank, L.world_size) == (0, 2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cache_dir="CACHE"), r"cache_dir applies to remote datasets .* local path"),
    (dict(options={"fetch_retries": 2}), r"fetch_retries applies to remote datasets"),
    (dict(cache_limit="16MiB"), r"cache_limit applies to remote datasets"),
])
def test_remote_options_on_a_local_path_are_refused(make_records, tmp_path, kwargs, match):
    # They would change nothing: refused by the library at open, naming the
    # option, as the CLI refuses the flags (issue 18).
    path = make_records(16)
    if "cache_dir" in kwargs:
        kwargs["cache_dir"] = tmp_path / "c"
    with pytest.raises(ValueError, match=match):
        stoker.Loader(path, 4, **kwargs)
    assert not (tmp_path / "c").exists()


def test_cache_limit_without_cache_dir_is_refused():
    # Against a URL (nothing listens there: the check comes first).
    with pytest.raises(ValueError, match=r"cache_limit .* set cache_dir too"):
        stoker.Loader("http://127.0.0.1:9/ds", 4, cache_limit="16MiB")
