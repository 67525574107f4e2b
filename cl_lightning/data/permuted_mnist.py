"""Permuted MNIST, as the query-only attention paper runs it (docs/protocol.md §4), and a variant that is not an
isometry.

MNIST training images resized to ``image_size``² (7×7 by default, PIL-style bilinear) in [0, 1], flattened; each
task draws a new pixel permutation and a new order of the 60,000 images: the first ``train_size`` form the
training stream (chunks of ``chunk_size``), the last ``query_size`` are held out as that task's queries.

A permutation keeps Euclidean distances, so a fixed-metric kNN scores the same on every Permuted-MNIST task: the
stream is the kindest there is to a fixed metric. :class:`RescaledPermutedMNIST` also multiplies each pixel by a
random per-task gain, an invertible map (nothing is lost to a learner) that reweights the distances.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cl_lightning.data.mnist import load_mnist, resize_like_pil
from cl_lightning.data.stream import TaskData, TaskStream, task_generator


class PermutedMNIST(TaskStream):
    """Permuted MNIST: one pixel permutation per task, labels unchanged (10 classes).

    Args:
        num_tasks: Tasks in the stream (paper: 7,500).
        image_size: Side of the resized images (paper: 7; 28 keeps the originals).
        train_size: Training examples per task, in arrival order (paper: 58,000).
        query_size: Held-out queries per task (paper: 2,000). ``train_size + query_size`` ≤ 60,000.
        chunk_size: Examples per training chunk (paper: 400).
        seed: Stream seed; task ``t`` depends on ``(seed, t)`` only.
        data_root: Folder with the MNIST IDX files; ``None`` uses the copy shipped with the package.
        download: Let torchvision download MNIST into ``data_root`` if it is missing there.
        warmup_tasks: The first tasks, trained on their ``train_size + query_size`` images (training stream, then
            the held-out ones) and never evaluated (paper: 5, each on all 60,000: 150 chunks of 400; default 0).
        recur_every: If set, task t uses the permutation of task t mod recur_every (a fresh draw of images): every
            permutation returns after recur_every tasks. None (default): a new permutation per task.
    """

    task_type = "classification"
    num_outputs = 10

    def __init__(
        self,
        num_tasks: int = 7500,
        image_size: int = 7,
        train_size: int = 58_000,
        query_size: int = 2_000,
        chunk_size: int = 400,
        seed: int = 0,
        data_root: str | None = None,
        download: bool = False,
        warmup_tasks: int = 0,
        recur_every: int | None = None,
    ) -> None:
        super().__init__(
            num_tasks, train_size, query_size, chunk_size, seed=seed, warmup_tasks=warmup_tasks, recur_every=recur_every
        )
        if image_size < 1 or image_size > 28:
            raise ValueError(f"image_size must be in 1..28, got {image_size}")
        if train_size + query_size > 60_000:
            raise ValueError(f"train_size + query_size = {train_size + query_size} exceeds MNIST's 60,000 images")
        self.image_size = image_size
        self.input_shape = (image_size * image_size,)
        self.data_root = data_root
        self.download = download
        self._images: Tensor | None = None
        self._labels: Tensor | None = None

    def prepare(self) -> None:
        """Load (and if asked, download) MNIST once."""
        self._load()

    def _load(self) -> tuple[Tensor, Tensor]:
        if self._images is None or self._labels is None:
            images, labels = load_mnist(self.data_root, "train", download=self.download)
            self._images = resize_like_pil(images, self.image_size).flatten(1)  # (60000, D)
            self._labels = labels
        return self._images, self._labels

    def permutation(self, task: int) -> Tensor:
        """The pixel permutation of ``task`` (a fresh uniform permutation per task; task mod ``recur_every``'s)."""
        return torch.randperm(self.input_shape[0], generator=task_generator(self.seed, self.map_of(task), salt=1))

    def split_indices(self, task: int) -> tuple[Tensor, Tensor]:
        """MNIST indices of ``task``'s training stream (arrival order) and of its held-out queries (disjoint)."""
        order = torch.randperm(60_000, generator=task_generator(self.seed, task, salt=2))
        return order[: self.train_size], order[self.train_size : self.train_size + self.query_size]

    def generate(self, task: int) -> TaskData:
        """Permute the pixels, reshuffle the 60,000 images, split into training stream and held-out queries."""
        images, labels = self._load()
        idx_train, idx_query = self.split_indices(task)
        images = self.pixel_map(task, images)
        x_train = images.index_select(0, idx_train)  # (n_train, D)
        x_query = images.index_select(0, idx_query)  # (n_query, D)
        return TaskData(x_train, labels[idx_train], x_query, labels[idx_query])

    def pixel_map(self, task: int, images: Tensor) -> Tensor:
        """``task``'s map of flat images ``(N, D)``: its pixel permutation."""
        return images.index_select(1, self.permutation(task))  # index_select: ~7x faster than [:, perm]


class RescaledPermutedMNIST(PermutedMNIST):
    """Permuted MNIST whose tasks also rescale every pixel: ``x'_i = g_i · x_{π(i)}``, ``g_i = exp(σ z_i)``,
    ``z_i ~ N(0, 1)`` drawn afresh per task (per map, with ``recur_every``), like the permutation ``π``.

    The map is invertible (every gain is positive), so each task holds exactly Permuted MNIST's information: a
    learner that fits the task's own data loses nothing. But it is not an isometry: a few high-gain pixels dominate
    Euclidean distance, and which ones changes every task, so no fixed metric suits every task. kNN on the images
    before the map (Permuted MNIST's kNN, whose score the permutation leaves unchanged) is what a metric that
    undid each task's gains would reach: the ceiling.

    Args:
        gain_spread: ``σ``, the gains' log-standard deviation (1.0: about 95 % of gains in [0.14, 7.1]).
        **kwargs: :class:`PermutedMNIST`'s.
    """

    def __init__(self, *, gain_spread: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if gain_spread < 0:
            raise ValueError(f"gain_spread must be >= 0, got {gain_spread}")
        self.gain_spread = gain_spread

    def gains(self, task: int) -> Tensor:
        """The per-pixel gains ``(D,)`` of ``task`` (after its permutation), a pure function of ``(seed, map)``."""
        z = torch.randn(self.input_shape[0], generator=task_generator(self.seed, self.map_of(task), salt=3))
        return (self.gain_spread * z).exp()

    def pixel_map(self, task: int, images: Tensor) -> Tensor:
        """``task``'s permutation, then its gains."""
        return super().pixel_map(task, images) * self.gains(task)
