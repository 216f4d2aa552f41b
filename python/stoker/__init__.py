"""stoker: a data-loading engine in C with a PyTorch-style Python front end.

    import stoker
    with stoker.Loader("data/train", batch_size=256, transform="imagenet-train") as loader:
        for epoch in range(epochs):
            for images, labels in loader:   # uint8 NCHW tensors, int64 labels
                ...

See docs/python.md for the tour, the migration table from DataLoader and the
API reference.
"""

from . import _stoker, transforms
from ._stoker import Error, SampleError, StokerWarning
from .loader import Loader, Records, Source
from .fields import Field, Ragged
from .diagnose import diagnose, Diagnosis
from .packing import Writer, pack

__version__ = _stoker.version()

__all__ = ["Loader", "Records", "Source", "Field", "Ragged", "pack", "Writer", "diagnose", "Diagnosis", "Error", "SampleError", "StokerWarning",
           "transforms", "__version__"]
