"""Binary-pair split streams over a labelled image source: Split Tiny ImageNet (the QOA paper) and Split MNIST.

The protocol (docs/protocol.md §4, after Dohare et al.'s Continual ImageNet): each task draws 2 distinct classes
uniformly from the first ``num_classes`` classes of the source (draws are independent, so classes recur across
tasks), relabels the first one 0 and the second 1, and streams ``train_size`` of their training images
(``train_size / 2`` per class, shuffled together) once in chunks of ``chunk_size``; the task's held-out queries
are ``query_size / 2`` held-out images per class (Tiny ImageNet: its ``val/`` images; MNIST: its test set). No
normalisation, no augmentation. Images are ``(C, size, size)`` in [0, 1]. The defaults are the paper's Split Tiny
ImageNet (:class:`SplitTinyImageNet`); Split MNIST runs the same protocol offline on the shipped MNIST, whose 28×28
images give the shared CNN 1,152 features, as 32×32 do.
"""

from __future__ import annotations

import hashlib
import urllib.request
import zipfile
from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cl_lightning.data.mnist import load_mnist, resize_like_pil
from cl_lightning.data.stream import TaskData, TaskStream, check_at_least, task_generator

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
TINY_IMAGENET_FOLDER = "tiny-imagenet-200"


class SplitImages(TaskStream):
    """The binary-pair split protocol over any labelled image source (subclasses provide the images).

    The head of the split streams: they take these arguments through ``**kwargs`` (all keyword-only).

    Args:
        num_tasks: Tasks in the stream (paper figures, Split Tiny ImageNet: 9,000).
        train_size: Training images per task, half per class (Tiny ImageNet: 1,000 = all 500 of each).
        query_size: Held-out queries per task, half per class (Tiny ImageNet: 100 = all 50 of each).
        chunk_size: Images per training chunk (paper: 10).
        num_classes: Classes the pairs are drawn from (the first ``num_classes`` of the source).
        seed: Stream seed; task ``t`` depends on ``(seed, t)`` only.
    """

    task_type = "classification"
    num_outputs = 2

    def __init__(
        self,
        *,
        num_tasks: int = 9_000,
        train_size: int = 1_000,
        query_size: int = 100,
        chunk_size: int = 10,
        num_classes: int,
        seed: int = 0,
    ) -> None:
        super().__init__(num_tasks, train_size, query_size, chunk_size, seed=seed)
        if train_size % 2 or query_size % 2:  # half of each per class
            raise ValueError(f"train_size and query_size must be even, got {train_size}, {query_size}")
        check_at_least(2, num_classes=num_classes)
        self.num_classes = num_classes

    @abstractmethod
    def class_images(self, label: int) -> tuple[Tensor, Tensor]:
        """uint8 ``(training images (N, C, H, W), held-out images (M, C, H, W))`` of source class ``label``."""

    def classes(self, task: int) -> tuple[int, int]:
        """The two source classes of ``task``: the first is relabelled 0, the second 1."""
        a, b = torch.randperm(self.num_classes, generator=task_generator(self.seed, task, salt=21))[:2].tolist()
        return a, b

    def _draw(self, images: Tensor, n: int, what: str, label: int, gen: torch.Generator) -> Tensor:
        if n > images.shape[0]:
            raise ValueError(
                f"a task needs {n} {what} images per class but class {label} has {images.shape[0]}: lower "
                f"data.stream.init_args.{'train_size' if what == 'training' else 'query_size'} to at most "
                f"{2 * images.shape[0]}"
            )
        return images[torch.randperm(images.shape[0], generator=gen)[:n]]

    def generate(self, task: int) -> TaskData:
        """Draw the pair, take half of each split per class, shuffle the training stream, scale to [0, 1]."""
        gen = task_generator(self.seed, task, salt=22)
        xs, qs = [], []
        for label in self.classes(task):
            train, held_out = self.class_images(label)
            xs.append(self._draw(train, self.train_size // 2, "training", label, gen))
            qs.append(self._draw(held_out, self.query_size // 2, "held-out", label, gen))
        order = torch.randperm(self.train_size, generator=gen)  # arrival order of the pair's images
        q_order = torch.randperm(self.query_size, generator=gen)  # so a prefix (eval_queries) holds both classes
        y = torch.arange(2).repeat_interleave(self.train_size // 2)
        qy = torch.arange(2).repeat_interleave(self.query_size // 2)
        x, qx = torch.cat(xs)[order].float() / 255, torch.cat(qs)[q_order].float() / 255
        return TaskData(x, y[order], qx, qy[q_order])


class SplitMNIST(SplitImages):
    """Split MNIST: pairs of distinct digits relabelled 0/1, the Split Tiny ImageNet protocol on shipped MNIST.

    Args:
        image_size: Side of the images (28 keeps the originals; other sizes use PIL-style bilinear resizing).
        num_classes: Digits the pairs are drawn from (10).
        data_root: Folder with the MNIST IDX files; ``None`` uses the copy shipped with the package.
        **kwargs: :class:`SplitImages`'s, with its defaults (as Split Tiny ImageNet); ``train_size`` is at most
            2 × 5,421 (digit 5's count), ``query_size`` (test-set images) at most 2 × 892.
    """

    def __init__(
        self, *, image_size: int = 28, num_classes: int = 10, data_root: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        if not 1 <= image_size <= 28:
            raise ValueError(f"image_size must be in 1..28, got {image_size}")
        if num_classes > 10:
            raise ValueError(f"num_classes must be <= 10 (MNIST has 10 digits), got {num_classes}")
        self.image_size, self.data_root = image_size, data_root
        self.input_shape = (1, image_size, image_size)
        self._by_class: list[tuple[Tensor, Tensor]] | None = None

    def prepare(self) -> None:
        """Load MNIST once (train and test splits)."""
        self._load()

    def _load(self) -> list[tuple[Tensor, Tensor]]:
        if self._by_class is None:
            splits = []
            for split in ("train", "test"):
                images, labels = load_mnist(self.data_root, split)
                images = (resize_like_pil(images, self.image_size) * 255).round().to(torch.uint8)[:, None]
                splits.append([images[labels == c] for c in range(10)])  # (N_c, 1, s, s) each
            self._by_class = list(zip(*splits, strict=True))
        return self._by_class

    def class_images(self, label: int) -> tuple[Tensor, Tensor]:
        """Digit ``label``'s training-set and test-set images."""
        return self._load()[label]


def download_tiny_imagenet(root: Path) -> Path:
    """Download the official ``tiny-imagenet-200.zip`` into ``root``, check its MD5, extract it, delete the zip."""
    root.mkdir(parents=True, exist_ok=True)
    archive = root / (TINY_IMAGENET_FOLDER + ".zip.part")
    digest = hashlib.md5()  # a checksum of the official archive, not security; taken as it is written
    with urllib.request.urlopen(TINY_IMAGENET_URL, timeout=60.0) as response, open(archive, "wb") as f:
        for block in iter(lambda: response.read(1 << 20), b""):
            digest.update(block)
            f.write(block)
    if digest.hexdigest() != TINY_IMAGENET_MD5:
        archive.unlink()
        raise OSError(f"the archive from {TINY_IMAGENET_URL} is corrupt (MD5 mismatch)")
    with zipfile.ZipFile(archive) as z:
        z.extractall(root)
    archive.unlink()
    return root / TINY_IMAGENET_FOLDER


def find_tiny_imagenet(data_root: str | Path, download: bool = True) -> Path:
    """The ``tiny-imagenet-200/`` folder under ``data_root`` (or ``data_root`` itself), downloaded if missing.

    Raises:
        FileNotFoundError: The folder is missing and could not be downloaded; the message says where to put it.
    """
    root = Path(data_root).expanduser().resolve()
    for folder in (root, root / TINY_IMAGENET_FOLDER):
        if (folder / "wnids.txt").is_file():
            return folder
    fix = (
        f"Tiny ImageNet not found: expected {root / TINY_IMAGENET_FOLDER}/ holding wnids.txt, train/ and val/. "
        f"Download {TINY_IMAGENET_URL} and extract it into {root}, or set data.stream.init_args.data_root to the "
        "folder that holds tiny-imagenet-200/"
    )
    if not download:
        raise FileNotFoundError(fix + " (download: false).")
    try:
        return download_tiny_imagenet(root)
    except OSError as err:  # no network, refused, corrupt: say how to do it by hand
        raise FileNotFoundError(f"{fix} (automatic download failed: {err}).") from err


def _decode(paths: list[Path], size: int) -> Tensor:
    """JPEGs → uint8 ``(N, 3, size, size)``: PIL RGB, bilinear resize (torchvision ``Resize`` on PIL images)."""
    from PIL import Image  # imported lazily: only this reader needs it

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, path in enumerate(paths):  # one decode per file: the per-class cache makes this a one-off
        with Image.open(path) as im:
            out[i] = np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


class SplitTinyImageNet(SplitImages):
    """Split Tiny ImageNet (Bekal et al. 2025): 2 random classes of 0..198 per task, 32×32 RGB in [0, 1].

    Reads the standard extracted ``tiny-imagenet-200/`` folder (``wnids.txt``, ``train/<wnid>/images/*.JPEG``,
    ``val/images/*.JPEG`` with ``val/val_annotations.txt``). Each class is decoded once and kept in memory as uint8
    (about 1.7 MB per class at 32×32, 340 MB for all), and saved to ``<folder>/cl_lightning_cache/<size>px/<wnid>.pt``
    so later runs skip the JPEG decoding (skipped silently when the folder is read-only).

    Args:
        image_size: Side of the resized images (32).
        num_classes: Classes the pairs are drawn from, in sorted-wnid order (199: the authors drop the last).
        data_root: The folder holding ``tiny-imagenet-200/`` (or that folder itself).
        download: Fetch and extract the official archive into ``data_root`` when the folder is missing.
        **kwargs: :class:`SplitImages`'s (``query_size``: validation images), with its defaults, the paper's.
    """

    def __init__(
        self,
        *,
        image_size: int = 32,
        num_classes: int = 199,
        data_root: str = "data",
        download: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.image_size, self.data_root, self.download = image_size, data_root, download
        self.input_shape = (3, image_size, image_size)
        self._folder: Path | None = None
        self._wnids: list[str] = []
        self._val: dict[str, list[str]] = {}
        self._images: dict[int, tuple[Tensor, Tensor]] = {}

    def prepare(self) -> None:
        """Find (or download) the folder and read its class list and validation annotations."""
        self._index()

    def _index(self) -> Path:
        if self._folder is None:
            folder = find_tiny_imagenet(self.data_root, self.download)
            wnids = sorted(w for w in (folder / "wnids.txt").read_text().split() if w)
            if len(wnids) < self.num_classes:
                raise ValueError(f"{folder}/wnids.txt lists {len(wnids)} classes, num_classes is {self.num_classes}")
            val: dict[str, list[str]] = {w: [] for w in wnids}
            for line in (folder / "val" / "val_annotations.txt").read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[1] in val:  # file, wnid, bounding box
                    val[parts[1]].append(parts[0])
            self._folder, self._wnids, self._val = folder, wnids, val
        return self._folder

    def class_images(self, label: int) -> tuple[Tensor, Tensor]:
        """Class ``label``'s training and validation images (uint8), from memory, the disk cache or the JPEGs."""
        if label not in self._images:
            folder = self._index()
            wnid = self._wnids[label]
            cache = folder / "cl_lightning_cache" / f"{self.image_size}px" / f"{wnid}.pt"
            if cache.is_file():
                train, val = torch.load(cache)
            else:
                train = _decode(sorted((folder / "train" / wnid / "images").glob("*.JPEG")), self.image_size)
                val = _decode([folder / "val" / "images" / name for name in self._val[wnid]], self.image_size)
                self._save(cache, (train, val))
            self._images[label] = (train, val)
        return self._images[label]

    @staticmethod
    def _save(path: Path, tensors: tuple[Tensor, Tensor]) -> None:
        try:  # write then rename: a killed run never leaves a half-written cache file
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(tensors, tmp)
            tmp.replace(path)
        except OSError:
            pass  # a read-only dataset folder: decode again next run
