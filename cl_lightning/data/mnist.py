"""MNIST from the IDX files that ship with the package (offline first), a user's copy, or a torchvision download."""

from __future__ import annotations

import gzip
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPE = {0x08: np.uint8}


def packaged_mnist_dir() -> Path:
    """The folder of the four MNIST IDX files shipped inside the package."""
    return Path(str(resources.files("cl_lightning.data") / "mnist"))


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzip-compressed or plain) into a writable numpy array of its declared shape, decompressed
    straight into the array (no intermediate copy)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPE:
                raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number); is the file corrupt?")
            dims = f.read(4 * head[3])
            shape = tuple(int.from_bytes(dims[4 * i : 4 * i + 4], "big") for i in range(head[3]))
            data = np.empty(int(np.prod(shape)), dtype=_IDX_DTYPE[head[2]])
            view, filled = memoryview(data), 0
            while filled < data.size and (n := f.readinto(view[filled:])):
                filled += n
            trailing = f.read(1)  # reading to the end makes gzip check the CRC: overwritten bytes are caught
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:  # a damaged compressed file: not a traceback
        raise ValueError(f"{path} cannot be decompressed ({error}); the file is corrupt or truncated") from error
    if trailing:
        raise ValueError(f"{path} is longer than its header says {shape}; is the file corrupt?")
    if filled != data.size or len(dims) != 4 * head[3]:
        raise ValueError(f"{path} holds {filled} values, its header says {shape}; the file is truncated")
    return data.reshape(shape)


def _find(root: Path, stem: str) -> Path | None:
    for folder in (root, root / "MNIST" / "raw", root / "mnist"):
        for name in (stem + ".gz", stem):
            if (folder / name).is_file():
                return folder / name
    return None


def load_mnist(root: str | Path | None = None, split: str = "train", download: bool = False) -> tuple[Tensor, Tensor]:
    """Load MNIST as ``(images uint8 (N, 28, 28), labels int64 (N,))``.

    Args:
        root: A folder holding the IDX files (``.gz`` or not; also torchvision's ``MNIST/raw`` layout).
            ``None`` uses the copy shipped with the package.
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
        download: If the files are not under ``root``, let torchvision download them there.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    folder = packaged_mnist_dir() if root is None else Path(root).expanduser()
    paths = [_find(folder, stem) for stem in _FILES[split]]
    if None in paths and download and root is not None:
        from torchvision.datasets import MNIST  # imported lazily: torchvision is only needed to download

        MNIST(str(folder), train=split == "train", download=True)
        paths = [_find(folder, stem) for stem in _FILES[split]]
    if None in paths:
        raise FileNotFoundError(
            f"MNIST {split} files not found under {folder}. Put the four IDX files there, set data_root: null to use "
            "the copy shipped with cl_lightning, or pass download: true when a network is available."
        )
    images, labels = (read_idx(p) for p in paths)  # type: ignore[arg-type]
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def resize_like_pil(images: Tensor, size: int) -> Tensor:
    """Resize uint8 images (N, H, W) to (N, size, size) as torchvision ``Resize`` does on PIL images.

    PIL's bilinear resize antialiases when it shrinks and returns uint8, so the result is rounded to 8 bits and
    then scaled to [0, 1], exactly what ``ToTensor()`` after ``Resize`` gives (the paper's recipe).
    """
    if images.shape[-1] == size and images.shape[-2] == size:
        return images.float() / 255.0
    out = torch.empty(images.shape[0], size, size)
    for lo in range(0, images.shape[0], 4096):  # in blocks: the float copy of 60,000 28×28 images is 188 MB
        x = images[lo : lo + 4096].float().unsqueeze(1)  # (n, 1, H, W)
        small = torch.nn.functional.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[lo : lo + 4096] = small.squeeze(1).round().clamp(0, 255) / 255.0
    return out
