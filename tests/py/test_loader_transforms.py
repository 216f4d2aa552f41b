"""stoker.transforms: torchvision's names and arguments rendered as engine
specs, and clear errors for what the engine cannot run. Pure Python: no
image is decoded here."""

import pytest
import torchvision.transforms as TV

import stoker
from stoker import transforms as T

IMAGENET = ("RandomResizedCrop(224,scale=(0.08,1.0),ratio=(0.75,1.3333333333333333))|"
            "RandomHorizontalFlip(p=0.5)|"
            "Normalize(mean=(0.485,0.456,0.406),std=(0.229,0.224,0.225))")


def test_compose_renders_the_spec():
    t = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                   T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))])
    assert str(t) == t.spec() == IMAGENET


@pytest.mark.parametrize("t,spec", [
    (T.Resize(256), "Resize(256)"),
    (T.Resize((224, 192)), "Resize((224,192))"),
    (T.Resize(256, max_size=300), "Resize(256,max_size=300)"),
    (T.CenterCrop(224), "CenterCrop(224)"),
    (T.CenterCrop([32, 48]), "CenterCrop((32,48))"),
    (T.RandomCrop(32, padding=4), "RandomCrop(32,padding=4)"),
    (T.RandomCrop(32, padding=(1, 2), pad_if_needed=True, fill=(1, 2, 3)),
     "RandomCrop(32,padding=(1,2),pad_if_needed=True,fill=(1,2,3))"),
    (T.RandomCrop(28), "RandomCrop(28)"),
    (T.Pad(2), "Pad(2)"),
    (T.Pad((1, 2, 3, 4), fill=7), "Pad((1,2,3,4),fill=7)"),
    (T.RandomHorizontalFlip(), "RandomHorizontalFlip(p=0.5)"),
    (T.RandomVerticalFlip(p=1), "RandomVerticalFlip(p=1.0)"),
    (T.RandomResizedCrop(64, scale=(0.5, 1), ratio=(1, 1)),
     "RandomResizedCrop(64,scale=(0.5,1),ratio=(1,1))"),
    (T.ToTensor(), "ToTensor()"),
])
def test_each_transform_renders_torchvision_arguments(t, spec):
    assert t.spec() == spec


def test_list_and_compose_give_the_same_spec():
    ts = [T.Resize(36), T.CenterCrop(32)]
    assert T.to_spec(ts) == T.to_spec(T.Compose(ts)) == "Resize(36)|CenterCrop(32)"


def test_torchvision_pipeline_is_converted():
    tv = TV.Compose([TV.RandomResizedCrop(224), TV.RandomHorizontalFlip(), TV.PILToTensor()])
    assert T.to_spec(tv) == IMAGENET.rsplit("|", 1)[0]
    tv = TV.Compose([TV.Resize(256), TV.CenterCrop(224), TV.ToTensor(),
                     TV.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    assert T.to_spec(tv) == ("Resize(256)|CenterCrop(224)|ToTensor()|"
                             "Normalize(mean=(0.485,0.456,0.406),std=(0.229,0.224,0.225))")
    assert T.to_spec(TV.RandomCrop(32, padding=4)) == "RandomCrop(32,padding=4)"


@pytest.mark.parametrize("bad", [
    TV.ColorJitter(0.4, 0.4, 0.4),
    TV.Compose([TV.RandomResizedCrop(224), TV.RandAugment()]),
    lambda img: img,
    object(),
])
def test_unsupported_transforms_say_what_is_supported(bad):
    with pytest.raises(TypeError, match="RandomResizedCrop, Resize, CenterCrop"):
        T.to_spec(bad)
    with pytest.raises(TypeError, match="supported"):
        T.Compose([T.Resize(8), bad])


@pytest.mark.parametrize("make,match", [
    (lambda: T.Resize(32, interpolation=TV.InterpolationMode.NEAREST), "bilinear"),
    (lambda: T.RandomResizedCrop(32, antialias=False), "antialias"),
    (lambda: T.RandomCrop(32, padding=2, padding_mode="reflect"), "constant"),
    (lambda: T.Pad(-1), "padding"),
    (lambda: T.Resize(0), "size"),
    (lambda: T.Resize((1, 2, 3)), "size"),
    (lambda: T.RandomHorizontalFlip(p=2), "probability"),
    (lambda: T.Normalize((0.5,), (0,)), "std"),
    (lambda: T.Normalize((0.5, 0.5), (1, 1)), "mean"),
    (lambda: T.RandomResizedCrop(32, scale=(0.9, 0.1)), "scale"),
    (lambda: T.Resize((32, 32), max_size=40), "max_size"),
    (lambda: T.Pad(1, fill=300), "fill"),
])
def test_invalid_arguments_are_rejected_in_python(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_torchvision_interpolation_mode_bilinear_is_accepted():
    t = T.Resize(32, interpolation=TV.InterpolationMode.BILINEAR)
    assert t.spec() == "Resize(32)"


def test_spec_strings_and_presets_pass_through():
    for p in T.PRESETS:
        assert T.to_spec(p) == p
    assert T.to_spec(IMAGENET) == IMAGENET
    assert T.to_spec("imagenet-train|Normalize(mean=(0.5,),std=(0.5,))").startswith("imagenet")
    with pytest.raises(ValueError, match="ColorJitter is not supported"):
        T.to_spec("Resize(32)|ColorJitter(0.4)")
    with pytest.raises(ValueError, match="cannot read"):
        T.to_spec("Resize(32)||")


def test_transforms_are_descriptions_not_callables():
    with pytest.raises(TypeError, match="Loader"):
        T.Resize(8)(object())


def test_loader_rejects_unsupported_transform_before_opening(make_records):
    with pytest.raises(TypeError, match="supported"):
        stoker.Loader(make_records(4), 2, transform=[T.Resize(8), print])
