from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from cl_lightning.data import PermutedMNIST, RescaledPermutedMNIST, SyntheticClasses
from cl_lightning.data.mnist import load_mnist, packaged_mnist_dir, read_idx, resize_like_pil


@pytest.fixture(scope="module")
def pmnist() -> PermutedMNIST:
    return PermutedMNIST(num_tasks=10, train_size=2000, query_size=500, chunk_size=400, seed=3)


def test_packaged_mnist_is_the_standard_set() -> None:
    images, labels = load_mnist(None, "train")
    assert images.shape == (60_000, 28, 28)
    assert images.dtype == torch.uint8
    assert torch.bincount(labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert abs(images.float().div(255).mean().item() - 0.1307) < 1e-4
    test_images, _ = load_mnist(None, "test")
    assert test_images.shape == (10_000, 28, 28)


def test_missing_mnist_names_the_fix(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="data_root: null"):
        load_mnist(tmp_path, "train")


def test_corrupt_idx_is_rejected(tmp_path) -> None:
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 5)
    with pytest.raises(ValueError, match="truncated"):
        read_idx(bad)
    assert read_idx(packaged_mnist_dir() / "train-labels-idx1-ubyte.gz").shape == (60_000,)


def test_resize_matches_pil_bilinear() -> None:
    images, _ = load_mnist(None, "train")
    ours = resize_like_pil(images[:50], 7)
    pil = np.stack([np.asarray(Image.fromarray(im.numpy()).resize((7, 7), Image.BILINEAR)) for im in images[:50]])
    diff = (ours * 255).round() - torch.from_numpy(pil).float()
    assert diff.abs().max() <= 1.0  # at most one grey level apart (rounding inside PIL's fixed-point filter)
    assert (diff == 0).float().mean() > 0.9


def test_task_regenerates_bit_for_bit(pmnist: PermutedMNIST) -> None:
    fresh = PermutedMNIST(num_tasks=10, train_size=2000, query_size=500, chunk_size=400, seed=3)
    a, b = pmnist.generate(4), fresh.generate(4)
    for u, v in zip(a, b, strict=False):
        assert torch.equal(u, v)
    assert torch.equal(pmnist.chunk(4, 2).x, fresh.generate(4).train_x[800:1200])


def test_tasks_differ_by_a_permutation(pmnist: PermutedMNIST) -> None:
    p0, p1 = pmnist.permutation(0), pmnist.permutation(1)
    assert sorted(p0.tolist()) == list(range(49))
    assert not torch.equal(p0, p1)
    other_seed = PermutedMNIST(num_tasks=10, train_size=2000, query_size=500, seed=4)
    assert not torch.equal(other_seed.permutation(0), p0)
    # un-permuting task 1's inputs gives the resized MNIST images it drew: the permutation is all that changes
    images, _ = load_mnist(None, "train")
    base = resize_like_pil(images, 7).flatten(1)
    x = pmnist.task(1).train_x
    assert torch.equal(x[:, torch.argsort(p1)], base[pmnist.split_indices(1)[0]])
    assert x.shape == (2000, 49)
    assert x.min() >= 0
    assert x.max() <= 1


def test_context_and_queries_are_disjoint(pmnist: PermutedMNIST) -> None:
    images, labels = load_mnist(None, "train")
    base = resize_like_pil(images, 7).flatten(1)
    train_idx, query_idx = pmnist.split_indices(2)
    assert not set(train_idx.tolist()) & set(query_idx.tolist())
    ep = pmnist.episode(2, context_size=1000)
    perm = pmnist.permutation(2)
    assert torch.equal(ep.context_x, base[train_idx[:1000]][:, perm])
    assert torch.equal(ep.context_y, labels[train_idx[:1000]])
    assert torch.equal(ep.query_x, base[query_idx][:, perm])
    assert torch.equal(ep.query_y, labels[query_idx])
    assert ep.query_x.shape == (500, 49)
    assert pmnist.episode(2, 10, num_queries=7).query_x.shape == (7, 49)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="60,000"):
        PermutedMNIST(train_size=59_000, query_size=2_000)
    with pytest.raises(ValueError, match="chunk_size"):
        PermutedMNIST(train_size=100, query_size=10, chunk_size=400)
    with pytest.raises(ValueError, match="num_tasks"):
        SyntheticClasses(num_tasks=0)


def test_full_resolution_works() -> None:
    s = PermutedMNIST(num_tasks=2, image_size=28, train_size=1000, query_size=100, chunk_size=100)
    assert s.input_shape == (784,)
    assert s.chunk(1, 0).x.shape == (100, 784)


def test_recurring_permutations_return_after_k_tasks_with_fresh_images() -> None:
    stream = PermutedMNIST(num_tasks=12, train_size=100, query_size=20, chunk_size=50, seed=3, recur_every=4)
    plain = PermutedMNIST(num_tasks=12, train_size=100, query_size=20, chunk_size=50, seed=3)
    for t in range(12):
        assert torch.equal(stream.permutation(t), plain.permutation(t % 4))  # task t mod k's permutation
    assert len({tuple(stream.permutation(t).tolist()) for t in range(4)}) == 4  # k distinct tasks
    assert not torch.equal(stream.split_indices(5)[0], stream.split_indices(1)[0])  # a return draws new images
    for a, b in zip(stream.split_indices(1), plain.split_indices(1), strict=True):
        assert torch.equal(a, b)  # with the same permutation, the first visit is the plain stream's task
    with pytest.raises(ValueError, match="recur_every"):
        PermutedMNIST(recur_every=0)


def test_rescaled_tasks_are_permuted_mnist_tasks_times_their_gains(pmnist: PermutedMNIST) -> None:
    """Task for task the rescaled stream shows Permuted MNIST's images, order and permutation, each pixel times the
    task's gain: positive, log-normal with the stated spread, a pure function of (seed, task), new every task."""
    rescaled = RescaledPermutedMNIST(num_tasks=10, train_size=2000, query_size=500, chunk_size=400, seed=3)
    for task in (0, 7):
        plain, scaled, gains = pmnist.task(task), rescaled.task(task), rescaled.gains(task)
        assert torch.equal(plain.train_y, scaled.train_y)
        assert torch.equal(plain.query_y, scaled.query_y)
        assert torch.equal(scaled.train_x, plain.train_x * gains)
        assert torch.equal(scaled.query_x, plain.query_x * gains)
    assert torch.equal(rescaled.gains(4), RescaledPermutedMNIST(num_tasks=10, seed=3).gains(4))
    assert not torch.equal(rescaled.gains(4), rescaled.gains(5))
    logs = torch.stack([rescaled.gains(t).log() for t in range(10)])  # 490 draws of N(0, 1)
    assert abs(float(logs.mean())) < 0.15
    assert 0.9 < float(logs.std()) < 1.1
    flat = RescaledPermutedMNIST(num_tasks=10, train_size=2000, query_size=500, seed=3, gain_spread=0.0)
    assert torch.equal(flat.task(2).train_x, pmnist.task(2).train_x)  # no spread: Permuted MNIST itself
    with pytest.raises(ValueError, match="gain_spread"):
        RescaledPermutedMNIST(gain_spread=-1.0)


def test_the_gains_cost_a_fixed_metric_what_the_permutation_does_not() -> None:
    """Euclidean kNN (k = 10, 1/d, the package's default kNN) over a task's first 1,000 images answers 2,000 held-out
    queries: on Permuted MNIST as on the unpermuted images (0.874, test_knn.py), on the rescaled stream 0.13 lower;
    dividing the gains out (what a metric that undid them would do) gives the plain stream's answers back."""
    from cl_lightning.learners.knn import knn_predict

    plain = PermutedMNIST(num_tasks=2, train_size=1000, query_size=2000)
    rescaled = RescaledPermutedMNIST(num_tasks=2, train_size=1000, query_size=2000)

    def accuracy(x_support: torch.Tensor, x_query: torch.Tensor, episode) -> float:
        votes = knn_predict(x_query, x_support, torch.eye(10)[episode.context_y], 10, "inverse")
        return float((votes.argmax(1) == episode.query_y).double().mean())

    p, r = plain.episode(1, context_size=1000), rescaled.episode(1, context_size=1000)
    assert accuracy(p.context_x, p.query_x, p) == 0.874
    assert accuracy(r.context_x, r.query_x, r) < 0.874 - 0.1
    g = rescaled.gains(1)
    assert accuracy(r.context_x / g, r.query_x / g, r) == 0.874


def test_the_probe_set_spreads_over_probe_span_tasks() -> None:
    from cl_lightning.data import StreamDataModule

    def probes(**kwargs: int) -> list[int]:
        return StreamDataModule(SyntheticClasses(num_tasks=30), num_probe_tasks=4, **kwargs).probe_tasks

    assert probes() == [0, 10, 19, 29]
    assert probes(probe_span=10) == [0, 3, 6, 9]  # a run planned for 10 tasks and extended to 30 keeps its set
    assert probes(probe_span=100) == [0, 10, 19, 29]
    with pytest.raises(ValueError, match="probe_span"):
        probes(probe_span=0)


def test_an_episode_takes_the_evaluations_query_count_unless_told() -> None:
    """A custom evaluation calling episode(task) scores what the built-in one scores (eval_queries), not every query."""
    from cl_lightning.data import StreamDataModule

    dm = StreamDataModule(SyntheticClasses(num_tasks=3, query_size=64), context_size=16, eval_queries=20)
    assert dm.episode(1).query_x.shape[0] == 20
    assert dm.queries(1)[0].shape[0] == 20
    assert dm.episode(1, None).query_x.shape[0] == 64  # None: all of them
    assert dm.episode(1, 5).query_x.shape[0] == 5
    assert torch.equal(dm.episode(1).query_x, dm.episode(1, None).query_x[:20])
    assert StreamDataModule(SyntheticClasses(num_tasks=3, query_size=64)).episode(0).query_x.shape[0] == 64
