from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import KNN as KNN_ARGS
from helpers import assert_checkpoint_round_trip, assert_resume_equals_uninterrupted, fit

from cl_lightning.learners import KNN
from cl_lightning.learners.knn import Kernel, KernelGrid, knn_predict

TINY = KNN_ARGS


def _brute_force(qx, sx, sy, k, weighting, h, eps=1e-8):
    out = []
    for q in qx:
        d = np.sqrt(((sx - q) ** 2).sum(1))
        order = np.argsort(d)[: k or len(d)]
        w = 1.0 / (d[order] + eps) if weighting == "inverse" else np.exp(-(d[order] ** 2) / (2 * h**2))
        out.append((w[:, None] * sy[order]).sum(0) / w.sum())
    return np.stack(out)


@pytest.mark.parametrize("weighting", ["inverse", "gaussian"])
@pytest.mark.parametrize("k", [1, 4, None])
def test_knn_equals_brute_force_numpy(weighting: str, k: int | None) -> None:
    rng = np.random.default_rng(0)
    qx, sx, sy = rng.normal(size=(6, 5)), rng.normal(size=(20, 5)), rng.normal(size=(20, 3))
    ours = knn_predict(torch.from_numpy(qx), torch.from_numpy(sx), torch.from_numpy(sy), k, weighting, 1.5)
    np.testing.assert_allclose(ours.numpy(), _brute_force(qx, sx, sy, k, weighting, 1.5), rtol=1e-10, atol=1e-12)


def test_knn_classification_and_regression_learners_match_brute_force() -> None:
    rng = np.random.default_rng(1)
    qx, sx = rng.normal(size=(7, 4)), rng.normal(size=(30, 4))
    labels = rng.integers(0, 3, size=30)
    clf = KNN(input_shape=(4,), num_outputs=3, memory_size=30, support_size=30, k=6).double()
    logp = clf.predict_episode(torch.from_numpy(sx), torch.from_numpy(labels), torch.from_numpy(qx))
    votes = _brute_force(qx, sx, np.eye(3)[labels], 6, "inverse", 1.0)
    np.testing.assert_allclose(logp.exp().numpy(), votes, rtol=1e-10, atol=2e-12)  # votes floored at 1e-12
    targets = rng.normal(size=(30, 2))
    reg = KNN(
        input_shape=(4,),
        num_outputs=2,
        task_type="regression",
        memory_size=30,
        support_size=30,
        k=None,
        weighting="gaussian",
        bandwidth=0.7,
    ).double()
    pred = reg.predict_episode(torch.from_numpy(sx), torch.from_numpy(targets), torch.from_numpy(qx))
    np.testing.assert_allclose(pred.numpy(), _brute_force(qx, sx, targets, None, "gaussian", 0.7), rtol=1e-10)


def test_far_gaussian_neighbours_do_not_underflow_to_nan() -> None:
    pred = knn_predict(torch.zeros(1, 2), torch.tensor([[100.0, 0.0], [101.0, 0.0]]), torch.eye(2), None, "gaussian")
    torch.testing.assert_close(pred, torch.tensor([[1.0, 0.0]]))  # the nearer one wins all the weight


def test_k1_recalls_every_stored_point() -> None:
    x, y = torch.randn(40, 6), torch.randint(0, 5, (40,))
    model = KNN(input_shape=(6,), num_outputs=5, memory_size=40, support_size=40, k=1)
    model.buffer.add(x, y, torch.zeros(40, dtype=torch.long))
    assert torch.equal(model(x).argmax(-1), y)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="memory_size"):
        KNN(memory_size=10, support_size=20)
    with pytest.raises(ValueError, match="bandwidth"):
        KNN(bandwidth=0.0)


def test_knn_runs_every_task_without_an_optimizer_and_beats_chance(tmp_path: Path) -> None:
    cli = fit(tmp_path, TINY)
    m = cli.trainer.callback_metrics
    assert cli.trainer.current_epoch == 3
    assert cli.model.configure_optimizers() is None
    assert int(cli.model.buffer.n_seen) == 3 * 256  # every chunk of every task was served
    assert m["eval/forward_acc"] > 0.25 + 0.2
    assert m["eval/backward_acc"] > 0.25 + 0.2  # the context is the support set: nothing to forget
    assert m["train/online_acc"] > 0.25 + 0.2
    assert all(f"eval/acc_matrix/task_{j}" in m for j in range(3))


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    assert_resume_equals_uninterrupted(tmp_path, TINY)


def test_checkpoint_round_trip_keeps_everything(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, TINY, KNN)


def test_an_untrained_knn_is_blind_to_the_pixel_permutation_of_permuted_mnist() -> None:
    """Euclidean distance is unchanged when one pixel permutation is applied to supports and queries alike, so kNN
    answers a permuted task exactly as the unpermuted one: on this stream a fixed similarity transfers perfectly.
    Paper size (knn_pmnist.yaml): 1,000 supports (the task's first images), 2,000 held-out queries, k = 10, 1/d."""
    from cl_lightning.data import PermutedMNIST

    stream = PermutedMNIST(num_tasks=2, train_size=1000, query_size=2000)
    episode = stream.episode(1, context_size=1000)
    unpermute = torch.argsort(stream.permutation(1))
    plain_context, plain_query = episode.context_x[:, unpermute], episode.query_x[:, unpermute]
    assert not torch.equal(plain_query, episode.query_x)
    # the distances agree up to the order of float32 sums
    torch.testing.assert_close(
        torch.cdist(episode.query_x, episode.context_x), torch.cdist(plain_query, plain_context), rtol=0, atol=1e-5
    )
    model = KNN(memory_size=1000, support_size=1000, k=10, weighting="inverse")
    permuted = model.predict_episode(episode.context_x, episode.context_y, episode.query_x)
    plain = model.predict_episode(plain_context, episode.context_y, plain_query)
    assert torch.equal(permuted.argmax(1), plain.argmax(1))  # the same answer to every query
    torch.testing.assert_close(permuted, plain, rtol=0, atol=1e-4)
    # and it is right about 87 % of the time with no training: the paper's final QOA V1 (0.865, after 7,500 tasks)
    assert int((permuted.argmax(1) == episode.query_y).sum()) == 1748  # of 2,000: 0.874


SELECT = [
    *KNN_ARGS,
    '--model.select={"k": [1, 5, null], "queries_per_task": 100}',
    "--data.stream.warmup_tasks=2",
    "--data.stream.noise=1.5",
]


def test_kernel_grid_lists_its_kernels_in_tie_breaking_order() -> None:
    kernels = KernelGrid().kernels()
    assert len(kernels) == 24
    assert len(set(kernels)) == 24
    assert kernels[0] == Kernel(1, "inverse", False)
    assert kernels[-1] == Kernel(50, "gaussian", True)
    assert str(Kernel(None, "inverse", True)) == "k=all, inverse weights, standardised inputs"
    with pytest.raises(ValueError, match="k of a KernelGrid"):
        KernelGrid(k=[0])


def test_standardised_knn_ignores_a_per_feature_gain_and_drops_constant_features() -> None:
    """z-scoring by the supports' statistics undoes any positive per-feature gain and offset exactly (up to
    rounding); a feature constant over the supports (a black border pixel) is dropped, however the query sets it."""
    rng = np.random.default_rng(2)
    qx, sx, sy = rng.normal(size=(9, 6)), rng.normal(size=(40, 6)), np.eye(3)[rng.integers(0, 3, 40)]
    gain, offset = np.exp(2.0 * rng.normal(size=6)), rng.normal(size=6)
    q, s, y = (torch.from_numpy(a) for a in (qx, sx, sy))
    plain = knn_predict(q, s, y, 5, "inverse", standardised=True)
    scaled = knn_predict(q * torch.from_numpy(gain) + torch.from_numpy(offset), s * torch.from_numpy(gain), y, 5,
                         "inverse", standardised=True)  # fmt: skip
    assert not torch.allclose(plain, scaled)  # the offset moved the queries alone: a different answer ...
    scaled = knn_predict(*(t * torch.from_numpy(gain) + torch.from_numpy(offset) for t in (q, s)), y, 5, "inverse",
                         standardised=True)  # fmt: skip
    torch.testing.assert_close(plain, scaled, rtol=1e-9, atol=1e-12)  # ... the same one to both: none
    s_const, q_const = s.clone(), q.clone()
    s_const[:, 0], q_const[:, 0] = 0.0, 1e6  # constant over the supports: the queries' value must not matter
    dropped = knn_predict(q_const, s_const, y, 5, "inverse", standardised=True)
    torch.testing.assert_close(dropped, knn_predict(q[:, 1:], s[:, 1:], y, 5, "inverse", standardised=True))


def test_the_kernel_is_chosen_on_the_warm_up_tasks_and_served_after(tmp_path: Path) -> None:
    """The grid's scores equal a hand computation over the warm-up tasks' first 64 (supports) and next 100
    examples (queries); the best serves every evaluated task and is logged; no evaluated task takes part."""
    cli = fit(tmp_path, SELECT)
    model, data = cli.model, cli.datamodule
    kernels = model.select.kernels()
    assert len(kernels) == 12
    assert int(model.kernel_choice) >= 0
    expected = torch.zeros(len(kernels), dtype=torch.float64)
    for task in range(2):  # the stream's two warm-up tasks, regenerated from (seed, task)
        x, y = _first(data, task, 164)
        for i, (k, weighting, standardised) in enumerate(kernels):
            votes = knn_predict(x[64:164], x[:64], torch.eye(4)[y[:64]], k, weighting, standardised=standardised)
            expected[i] += (votes.argmax(1) == y[64:164]).double().mean() / 2
    torch.testing.assert_close(model.selection_scores, expected)
    best = int(expected.argmax())
    assert int(model.kernel_choice) == best
    assert model.kernel == kernels[best]
    assert expected.max() - expected.min() > 0.02  # the grid's kernels differ on this noisy stream: a real choice
    m = cli.trainer.callback_metrics
    assert float(m["knn/k"]) == float(kernels[best].k or 0)
    assert float(m["knn/selection_score"]) == pytest.approx(float(expected[best]))
    assert m["eval/forward_acc"] > 0.25 + 0.2


def _first(data, task: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Epoch ``task``'s first ``n`` examples in arrival order."""
    batches = list(data.task_batches(task, n))
    return torch.cat([b.x for b in batches]), torch.cat([b.y for b in batches])


def test_a_chosen_kernel_survives_a_checkpoint(tmp_path: Path) -> None:
    assert_checkpoint_round_trip(tmp_path, SELECT, KNN)
    loaded = KNN.load_from_checkpoint(next((tmp_path / "ckpt").glob("*.ckpt")))
    assert int(loaded.kernel_choice) >= 0
    assert loaded.kernel == loaded.select.kernels()[int(loaded.kernel_choice)]


def test_selection_without_warm_up_tasks_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="warmup_tasks"):
        fit(tmp_path, [*SELECT, "--data.stream.warmup_tasks=0"])
