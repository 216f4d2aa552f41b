"""Errors as data (issue 19 item 2): every return code's name comes from the
library's one list (stk_errname), and a failed sample reaches Python as the
fields of stk_loader_last_error, not parsed out of the English message."""
import io
import pathlib
import re

import pytest

import stoker
from stoker import _stoker

HEADER = pathlib.Path(__file__).resolve().parents[2] / "include" / "stoker.h"


def header_codes():
    """{name: number} of every return code the public header defines."""
    text = HEADER.read_text()
    section = text[text.index("---- Return codes"):]
    section = section[:section.index("/* ----")]
    codes = {m.group(1): int(m.group(2) or m.group(3))
             for m in re.finditer(r"#define (STK_[A-Z]+)\s+(?:\((-\d+)\)|(\d+))", section)}
    assert len(codes) >= 16 and "STK_ESAMPLE" in codes
    return codes


TYPES = {"STK_EINVAL": ValueError, "STK_ENOENT": FileNotFoundError,
         "STK_ENOMEM": MemoryError, "STK_ESAMPLE": stoker.SampleError}


@pytest.mark.parametrize("name,code", sorted(header_codes().items()))
def test_every_code_is_named_by_the_library(name, code):
    assert _stoker.errname(code) == name
    e = _stoker._exception(code, "what happened")
    assert isinstance(e, TYPES.get(name, stoker.Error))
    assert e.code == code and e.code_name == name[len("STK_"):]
    assert str(e) == f"what happened [{_stoker.strerror(code)}]"


def test_unknown_numbers_have_no_name():
    assert _stoker.errname(-14) is None and _stoker.errname(3) is None
    assert _stoker._exception(-14, "x").code_name == "?"


def test_loader_errors_carry_the_library_name(tmp_path, make_folder):
    with pytest.raises(FileNotFoundError) as e:
        stoker.Loader(tmp_path / "missing", 2)
    assert e.value.code_name == _stoker.errname(e.value.code)[4:] == "ENOENT"
    (tmp_path / "empty" / "c").mkdir(parents=True)
    with pytest.raises(stoker.Error) as e:
        stoker.Loader(tmp_path / "empty", 2)
    assert e.value.code_name == _stoker.errname(e.value.code)[4:] == "EEMPTY"


def jpeg_folder(root, n=8, bad=(5,)):
    """n small JPEGs in one class; those in `bad` are bytes that no decoder
    takes (c/img05.jpg by default)."""
    from PIL import Image
    d = root / "c"
    d.mkdir(parents=True)
    for i in range(n):
        if i in bad:
            data = b"this is not a jpeg"
        else:
            buf = io.BytesIO()
            Image.new("RGB", (16, 16), (i * 20, 100, 50)).save(buf, "JPEG")
            data = buf.getvalue()
        (d / f"img{i:02d}.jpg").write_bytes(data)
    return root


@pytest.mark.parametrize("device", [None, "fake"])
def test_raise_names_the_sample_by_fields(tmp_path, device):
    root = jpeg_folder(tmp_path / "data")
    with stoker.Loader(root, 4, shuffle=False, transform="Resize(8)|CenterCrop(8)",
                       output="numpy", on_error="raise", device=device) as L:
        it = iter(L)
        next(it)
        with pytest.raises(stoker.SampleError) as ei:
            next(it)
        e = ei.value
        assert e.sample == 5 and e.epoch == 0
        assert e.path == str(root / "c" / "img05.jpg")
        assert e.reason and e.field == ""
        assert e.code == _stoker_code("STK_ESAMPLE") and e.code_name == "ESAMPLE"
        assert str(e).startswith(f"sample 5 ({e.path}): {e.reason}")
        assert [d["sample"] for d in e.errors] == [5]
        assert e.errors[0]["code_name"] == _stoker.errname(e.errors[0]["code"])[4:] == "EFORMAT"
        assert e.errors[0]["reason"] == e.reason and e.errors[0]["path"] == e.path
        x, y = next(it)
        assert len(y) == 3


def test_raise_several_in_one_batch(tmp_path):
    root = jpeg_folder(tmp_path / "data", bad=(4, 6, 7))
    with stoker.Loader(root, 4, shuffle=False, transform="Resize(8)|CenterCrop(8)",
                       output="numpy", on_error="raise", threads=1) as L:
        it = iter(L)
        next(it)
        with pytest.raises(stoker.SampleError) as ei:
            next(it)
        e = ei.value
        assert e.sample == 4 and e.path.endswith("img04.jpg")
        assert "(and 2 more failed samples in this batch)" in str(e)
        assert [d["sample"] for d in e.errors] == [4, 6, 7]


def test_skip_lists_the_sample_in_stats(tmp_path):
    root = jpeg_folder(tmp_path / "data")
    with stoker.Loader(root, 4, shuffle=False, transform="Resize(8)|CenterCrop(8)",
                       output="numpy", on_error="skip") as L:
        n = sum(len(y) for x, y in L)
        assert n == 7
        errs = L.stats()["errors"]
    assert len(errs) == 1
    d = errs[0]
    assert d["sample"] == 5 and d["epoch"] == 0 and d["path"].endswith("c/img05.jpg")
    assert d["code_name"] == _stoker.errname(d["code"])[4:] == "EFORMAT"


def _stoker_code(name):
    return header_codes()[name]
