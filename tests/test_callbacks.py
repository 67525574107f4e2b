from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BACKPROP, QOA, fit, tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.nn.attention import SDPBackend, sdpa_kernel

from cl_lightning.callbacks import ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.learners import Backprop, FullAttention, QueryOnlyAttention
from cl_lightning.metrics import (
    average_accuracy,
    backward_transfer,
    effective_rank,
    forgetting,
    forward_transfer,
    hessian_effective_rank,
    srank,
)

# every monitor at every task, the Lanczos/SLQ path kept small
ALL_MONITORS = [
    "--trainer.callbacks+=cl_lightning.callbacks.ForgettingMonitor",
    "--trainer.callbacks.plot_budget=1.0",  # every row drawn (a run never spends more than its time on drawing)
    "--trainer.callbacks+=cl_lightning.callbacks.PlasticityMonitor",
    "--trainer.callbacks.probe_size=32",
    "--trainer.callbacks+=cl_lightning.callbacks.HessianMonitor",
    "--trainer.callbacks.every_n_tasks=1",
    "--trainer.callbacks+=cl_lightning.callbacks.HessianMonitor",
    "--trainer.callbacks.method=lanczos",
    "--trainer.callbacks.every_n_tasks=2",
    "--trainer.callbacks.tol=0.01",
    "--trainer.callbacks.num_probes=1",
    "--trainer.callbacks.num_steps=4",
    "--trainer.callbacks+=cl_lightning.callbacks.CostMonitor",
]
CHECKPOINT_EVERY_TASK = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.save_top_k=-1",
    "--trainer.callbacks.every_n_epochs=1",
    "--trainer.callbacks.filename=task{epoch}",
]


def _optimizer_tensors(cli) -> dict[str, torch.Tensor]:
    state = cli.trainer.optimizers[0].state_dict()["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items() if isinstance(v, torch.Tensor)}


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory):
    """One 3-task Backprop fit with every monitor on and a checkpoint after each task."""
    root = tmp_path_factory.mktemp("monitored")
    return fit(
        root, BACKPROP, extra=[*ALL_MONITORS, *CHECKPOINT_EVERY_TASK, f"--trainer.callbacks.dirpath={root}/ckpt"]
    )


def _monitor(cli, cls: type):
    return next(c for c in cli.trainer.callbacks if isinstance(c, cls))


def _events(cli) -> EventAccumulator:
    acc = EventAccumulator(cli.trainer.logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("learner", ["backprop", pytest.param("qoa", marks=pytest.mark.slow)])
def test_monitors_leave_model_buffers_and_optimizer_bit_identical(tmp_path: Path, learner: str, monitored) -> None:
    args = {"backprop": BACKPROP, "qoa": QOA}[learner]
    plain = fit(tmp_path / "plain", args)
    watched = monitored if learner == "backprop" else fit(tmp_path / "watched", args, extra=ALL_MONITORS)
    a, b = plain.model.state_dict(), watched.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    oa, ob = _optimizer_tensors(plain), _optimizer_tensors(watched)
    assert oa.keys() == ob.keys()
    assert oa
    for k in oa:
        assert torch.equal(oa[k], ob[k]), k
    assert watched.model.training  # modes restored after every probe
    assert all(not m._forward_hooks for m in watched.model.modules())  # hooks removed
    metrics = watched.trainer.callback_metrics
    for name in ("forgetting/avg", "hessian/eff_rank", "hessian/lanczos/eff_rank", "memory/context_bytes"):
        assert torch.isfinite(metrics[name]), name


def test_logged_transfer_metrics_equal_the_functions_on_the_logged_matrix(monitored) -> None:
    events = _events(monitored)
    probes = [0, 1, 2]
    rows = np.array([[e.value for e in events.Scalars(f"eval/acc_matrix/task_{j}")] for j in probes]).T  # (3, 3)
    monitor = _monitor(monitored, ForgettingMonitor)
    np.testing.assert_allclose(monitor.matrix.numpy(), rows, rtol=1e-6)  # R is what the learner logged

    def last(tag: str) -> float:
        return events.Scalars(tag)[-1].value

    assert last("forgetting/avg") == pytest.approx(average_accuracy(rows), rel=1e-6)
    assert last("forgetting/bwt") == pytest.approx(backward_transfer(rows), rel=1e-6, abs=1e-7)
    assert last("forgetting/forgetting") == pytest.approx(forgetting(rows), rel=1e-6, abs=1e-7)
    b = monitor.baseline.numpy()
    assert not np.isnan(b).any()
    assert last("forgetting/fwt") == pytest.approx(forward_transfer(rows, b), rel=1e-6, abs=1e-7)
    assert last("forgetting/intransigence") == pytest.approx(float(np.mean(1 - np.diag(rows))), rel=1e-6, abs=1e-7)
    # one heatmap and one curve figure per probe row, in the TensorBoard event file
    images = events.Tags()["images"]
    assert {"forgetting/acc_matrix", "forgetting/curves"} <= set(images)
    assert len(events.Images("forgetting/acc_matrix")) == 3
    forward = np.array([e.value for e in events.Scalars("eval/forward_acc")])
    np.testing.assert_allclose(monitor.forward.numpy(), forward, rtol=1e-6)


def test_figures_are_drawn_within_the_time_budget_and_always_first_and_last() -> None:
    monitor = ForgettingMonitor(plot_budget=0.02)
    monitor.probe_tasks = [0, 5, 9, 14]
    monitor._fit_start, monitor._plot_seconds = time.monotonic() - 10.0, 1.0  # 10 % of 10 s spent drawing
    assert [monitor._within_budget(r) for r in range(4)] == [True, False, False, True]
    monitor.plot_budget = 0.2
    assert [monitor._within_budget(r) for r in range(4)] == [True, True, True, True]


def test_resumed_run_restores_the_accuracy_matrix(tmp_path: Path, monitored) -> None:
    ckpt = Path(monitored.trainer.checkpoint_callback.dirpath) / "taskepoch=0.ckpt"
    from cl_lightning.run.cli import main

    resumed = main(
        tiny_args(tmp_path, BACKPROP, extra=["--trainer.callbacks+=cl_lightning.callbacks.ForgettingMonitor"]),
        run=False,
    )
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=str(ckpt))
    straight, again = _monitor(monitored, ForgettingMonitor), _monitor(resumed, ForgettingMonitor)
    # row 0 was measured before the checkpoint: only a restored state can hold it
    assert not math.isnan(again.matrix[0, 0])
    for name in ("matrix", "baseline", "forward", "backward"):
        torch.testing.assert_close(getattr(again, name), getattr(straight, name), equal_nan=True, rtol=0, atol=0)


class _Trainer:  # what the monitors read from a Trainer outside a fit
    def __init__(self, datamodule) -> None:
        self.datamodule, self.current_epoch = datamodule, 0


def test_plasticity_numbers_equal_the_metrics_on_relu_features() -> None:
    torch.manual_seed(0)
    model = Backprop(input_shape=(6,), num_outputs=3, hidden_sizes=[8, 5])
    first = model.net.layers[0]
    with torch.no_grad():  # units 0 and 1 of the first layer can never fire: dead
        first.weight[:2] = 0.0
        first.bias[:2] = -1.0
    qx = torch.randn(40, 6)
    out = PlasticityMonitor(dormant_tau=0.1).measure(model, [qx[:0], torch.zeros(0, dtype=torch.long), qx, None])
    h0 = first(qx).relu()
    h1 = model.net.layers[1](h0).relu()
    assert set(model.probe_layers()) == {"net.layers.0", "net.layers.1"}  # the output layer is not probed
    assert out["plasticity/dead_frac/net.layers.0"].item() == pytest.approx(2 / 8)
    dead = [(h.abs().sum(0) == 0).sum().item() for h in (h0, h1)]
    assert out["plasticity/dead_frac"].item() == pytest.approx(sum(dead) / 13)
    for name, h in (("net.layers.0", h0), ("net.layers.1", h1)):
        sv = np.linalg.svd(h.detach().double().numpy(), compute_uv=False)
        p = sv / sv.sum()
        p = p[p > 0]
        assert out[f"plasticity/eff_rank/{name}"].item() == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)
        assert out[f"plasticity/eff_rank/{name}"].item() == pytest.approx(effective_rank(h.detach()).item())
        assert out[f"plasticity/srank/{name}"].item() == srank(torch.from_numpy(sv)).item()
    weights = torch.cat([layer.weight.detach().flatten() for layer in model.net.layers])
    assert out["plasticity/weight_magnitude"].item() == pytest.approx(weights.abs().double().mean().item())
    assert model.training
    assert all(not m._forward_hooks for m in model.modules())


def _row_by_row_hessian(loss: torch.Tensor, params: list[torch.Tensor]) -> np.ndarray:
    """The authors' way: double back-propagation, one Hessian row per parameter."""
    g = torch.cat([x.flatten() for x in torch.autograd.grad(loss, params, create_graph=True)])
    rows = [
        torch.cat([r.flatten() for r in torch.autograd.grad(g[i], params, retain_graph=True)]) for i in range(g.numel())
    ]
    return torch.stack(rows).double().numpy()


@pytest.mark.parametrize("query_chunk", [None, 3, 1])
def test_exact_hessian_of_qoa_last_layer_on_the_episode_equals_double_backprop(query_chunk: int | None) -> None:
    # query chunks of 3 (3 + 3 + 1 queries, unequal weights) and 1: the size-weighted sum of the chunks' Hessians
    torch.manual_seed(0)
    model = QueryOnlyAttention(
        input_shape=(5,), num_outputs=3, memory_size=40, support_size=12, hidden=8, num_hidden_layers=2
    ).double()
    cx, cy = torch.randn(12, 5, dtype=torch.float64), torch.randint(0, 3, (12,))
    qx, qy = torch.randn(7, 5, dtype=torch.float64), torch.randint(0, 3, (7,))
    monitor = HessianMonitor(clamp=None, jitter=0.0, query_chunk=query_chunk)
    assert monitor.block(model) == ["scorer.out.weight", "scorer.out.bias"]  # the paper's fc11
    out = monitor.measure(model, [cx, cy, qx, qy])
    params = [model.scorer.out.weight, model.scorer.out.bias]
    h = _row_by_row_hessian(model.loss(model.predict_episode(cx, cy, qx), qy), params)
    eig = np.linalg.eigvalsh((h + h.T) / 2)
    assert out["hessian/num_params"].item() == 9
    assert out["hessian/trace"].item() == pytest.approx(eig.sum(), rel=1e-9)
    assert out["hessian/top_eigval"].item() == pytest.approx(eig[np.abs(eig).argmax()], rel=1e-9)
    expected = hessian_effective_rank(torch.from_numpy(eig), jitter=0.0, clamp=None).item()
    assert out["hessian/eff_rank"].item() == pytest.approx(expected, rel=1e-9)
    assert all(p.grad is None for p in model.parameters())


def test_exact_hessian_of_a_regression_output_layer_is_2_over_n_a_transpose_a() -> None:
    # MSE is quadratic in the last layer: H = (2/N) Σ_n a_n a_nᵀ, a_n = [relu features; 1] (a hand-worked form).
    # torch 2.14's forward-over-reverse AD of F.mse_loss fails, which switched the monitor off on regression runs.
    torch.manual_seed(0)
    model = Backprop(input_shape=(20,), num_outputs=1, task_type="regression", hidden_sizes=[6]).double()
    qx, qy = torch.randint(0, 2, (50, 20)).double(), torch.randn(50, 1, dtype=torch.float64)
    out = HessianMonitor(clamp=None, jitter=0.0).measure(model, [qx[:0], qy[:0], qx, qy])
    with torch.no_grad():
        a = torch.cat([model.net.layers[0](qx).relu(), torch.ones(50, 1, dtype=torch.float64)], dim=1)  # (N, 7)
    eig = np.linalg.eigvalsh((2 / 50 * a.T @ a).numpy())
    assert out["hessian/num_params"].item() == 7
    assert out["hessian/trace"].item() == pytest.approx(eig.sum(), rel=1e-9)
    assert out["hessian/top_eigval"].item() == pytest.approx(eig.max(), rel=1e-9)


def test_exact_hessian_of_full_attention_equals_double_backprop() -> None:
    """SDPA's fused kernels have no forward-mode AD: the monitor runs attention on the math backend (it used to
    switch itself off on every full-attention run)."""
    torch.manual_seed(0)
    model = FullAttention(input_shape=(6,), num_outputs=3, memory_size=20, support_size=9, num_layers=2).double()
    cx, cy = torch.randn(9, 6, dtype=torch.float64), torch.randint(0, 3, (9,))
    qx, qy = torch.randn(5, 6, dtype=torch.float64), torch.randint(0, 3, (5,))
    monitor = HessianMonitor(clamp=None, jitter=0.0)
    out = monitor.measure(model, [cx, cy, qx, qy])
    layer = model.output_layer()
    with sdpa_kernel(SDPBackend.MATH):  # the fused kernel's backward is not differentiable either
        h = _row_by_row_hessian(model.loss(model.predict_episode(cx, cy, qx), qy), [layer.weight, layer.bias])
    eig = np.linalg.eigvalsh((h + h.T) / 2)
    assert out["hessian/num_params"].item() == layer.weight.numel() + layer.bias.numel()
    assert out["hessian/trace"].item() == pytest.approx(eig.sum(), rel=1e-9)
    assert out["hessian/top_eigval"].item() == pytest.approx(eig[np.abs(eig).argmax()], rel=1e-9)


class _CenteredBackprop(Backprop):
    """Queries that interact: each query's logits minus the mean over the episode's queries (not per-query)."""

    def predict_episode(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        logits = super().predict_episode(context_x, context_y, query_x)
        return logits - 0.5 * logits.mean(0, keepdim=True)


def test_hessian_query_chunks_fall_back_to_whole_episodes_when_queries_interact() -> None:
    torch.manual_seed(0)
    model = _CenteredBackprop(input_shape=(4,), num_outputs=3, hidden_sizes=[6]).double()
    qx, qy = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    episode = [qx[:0], qy[:0], qx, qy]
    whole = HessianMonitor(query_chunk=None).measure(model, episode)
    monitor = HessianMonitor(query_chunk=8)
    with pytest.warns(UserWarning, match="queries interact"):
        chunked = monitor.measure(model, episode)
    assert monitor.query_chunk is None
    assert {k: v.item() for k, v in chunked.items()} == {k: v.item() for k, v in whole.items()}
    plain = Backprop(input_shape=(4,), num_outputs=3, hidden_sizes=[6]).double()  # independent queries: chunks kept
    kept = HessianMonitor(query_chunk=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_chunks = kept.measure(plain, episode)
    assert kept.query_chunk == 8
    assert [x.shape[0] for x, _ in kept.query_chunks(plain, episode)] == [8, 8, 8, 6]
    at_once = HessianMonitor(query_chunk=None).measure(plain, episode)
    for key, value in at_once.items():
        assert by_chunks[key].item() == pytest.approx(value.item(), rel=1e-10), key


def test_lanczos_top_eigenvalue_equals_the_exact_one_on_the_whole_network() -> None:
    torch.manual_seed(0)
    model = Backprop(input_shape=(4,), num_outputs=3, hidden_sizes=[6]).double()
    qx, qy = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    names = [n for n, _ in model.named_parameters()]
    episode = [qx[:0], qy[:0], qx, qy]
    exact = HessianMonitor(parameters=names).measure(model, episode)
    lanczos = HessianMonitor(method="lanczos", tol=0.0, num_probes=1, num_steps=4).measure(model, episode)
    assert lanczos["hessian/lanczos/num_params"].item() == exact["hessian/num_params"].item() == 51
    assert lanczos["hessian/lanczos/top_eigval"].item() == pytest.approx(exact["hessian/top_eigval"].item(), rel=1e-6)


def test_cost_monitor_logs_the_buffers_bytes_and_the_step_time(tmp_path: Path) -> None:
    cli = fit(tmp_path, QOA, tasks=1, extra=["--trainer.callbacks+=cl_lightning.callbacks.CostMonitor"])
    model, metrics = cli.model, cli.trainer.callback_metrics
    buffer = sum(b.numel() * b.element_size() for b in model.buffer.buffers())
    assert model.context_memory_bytes() == buffer + 8  # the replay buffer + the learner's step counter
    assert metrics["memory/context_bytes"].item() == model.context_memory_bytes()
    assert metrics["memory/param_bytes"].item() == 4 * sum(p.numel() for p in model.parameters())
    steps = cli.datamodule.stream.num_chunks
    assert 0 < metrics["cost/step_seconds"].item() * steps == pytest.approx(metrics["cost/task_seconds"].item())


def test_plasticity_probe_of_a_functionally_adapting_learner_sees_its_layers() -> None:
    """MAML adapts under torch.func.grad: its layers' outputs reach the hooks wrapped; the probe still keeps them
    (a preallocated row buffer once failed on them: in-place write to a captured tensor inside a transform)."""
    from cl_lightning.learners import MAMLReplay

    torch.manual_seed(0)
    model = MAMLReplay(input_shape=(6,), num_outputs=3, hidden_sizes=[8], support_size=5, query_size=4)
    sx, sy, qx = torch.randn(12, 6), torch.randint(0, 3, (12,)), torch.randn(7, 6)
    feats = PlasticityMonitor(max_rows=64).features(model, [sx, sy, qx, None])
    assert set(feats) == set(model.probe_layers())
    assert all(f.shape[1] == 8 for f in feats.values())
    rows = next(iter(feats.values()))
    assert 7 <= rows.shape[0] <= 64
    assert torch.isfinite(rows).all()


def test_forgetting_monitor_recent_means_skip_unmeasured_tasks() -> None:
    monitor = ForgettingMonitor()
    monitor.forward = torch.tensor([0.1, 0.2, 0.3, 0.4, float("nan")], dtype=torch.float64)
    monitor.backward = torch.tensor([float("nan"), float("nan"), 0.25, 0.75, float("nan")], dtype=torch.float64)
    assert monitor.recent_means(3) == {"forward": (pytest.approx(0.3), 3), "backward": (0.5, 2)}
    monitor.backward[:] = float("nan")
    assert monitor.recent_means(10) == {"forward": (pytest.approx(0.25), 4)}


@pytest.mark.parametrize("num_hidden_layers", [0, 2])
def test_plasticity_probe_of_qoa_sees_the_scorer_first_layer(num_hidden_layers: int) -> None:
    """QOA's scorer computes its first layer from the weights (query and support parts added): a probe hooks the
    first layer all the same (the slowly-changing-regression scorer has no other hidden layer), with the same
    scores as unwatched."""
    torch.manual_seed(0)
    shapes = {"input_shape": (6,), "num_outputs": 1, "task_type": "regression"}
    model = QueryOnlyAttention(
        **shapes, hidden=8, num_hidden_layers=num_hidden_layers, use_labels=False, memory_size=20, support_size=10
    )
    sx, sy, qx = torch.randn(10, 6), torch.randn(10, 1), torch.randn(7, 6)
    with torch.no_grad():
        unwatched = model.predict_episode(sx, sy, qx)
    feats = PlasticityMonitor(max_rows=1000).features(model, [sx, sy, qx, None])
    assert (
        set(feats)
        == set(model.probe_layers())
        == {"scorer.first"} | {f"scorer.hidden.{i}" for i in range(num_hidden_layers)}
    )
    assert feats["scorer.first"].shape == (7 * 10, 8)  # one row per (query, support) pair
    handle = model.scorer.first.register_forward_hook(lambda *_: None)
    with torch.no_grad():
        torch.testing.assert_close(model.predict_episode(sx, sy, qx), unwatched)
    handle.remove()


def test_exact_hessian_above_max_exact_params_warns_once_and_measures_nothing(tmp_path: Path) -> None:
    """A block too large for an exact Hessian (P HVPs of the whole episode, a P × P matrix) must not stall a run:
    the monitor warns once, logs no ``hessian/*``, and the run goes on (Backprop [32, 32] on 4 classes: a block of
    132)."""
    monitor = ["--trainer.callbacks+=cl_lightning.callbacks.HessianMonitor", "--trainer.callbacks.every_n_tasks=1"]
    with pytest.warns(UserWarning, match="132 parameters, above max_exact_params=131") as caught:
        cli = fit(tmp_path, BACKPROP, tasks=2, extra=[*monitor, "--trainer.callbacks.max_exact_params=131"])
    assert sum("above max_exact_params" in str(w.message) for w in caught) == 1
    assert not any(k.startswith("hessian/") for k in cli.trainer.callback_metrics)
    assert cli.trainer.current_epoch == 2
    measured = fit(tmp_path / "bound", BACKPROP, tasks=1, extra=[*monitor, "--trainer.callbacks.max_exact_params=132"])
    assert measured.trainer.callback_metrics["hessian/num_params"].item() == 132
