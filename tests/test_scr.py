from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, quiet_args

from cl_lightning.data import SlowlyChangingRegression
from cl_lightning.data.slowly_changing_regression import ltu_target, ltu_thresholds
from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.memory import sample_support, sliding_sample

# A hand-worked target net: m = 3 inputs, 2 LTUs, beta = 0.7, so beta (m + 1) = 2.8.
#   unit 0: w = [ 1, -1,  1], b =  1: S = (3 - 1 + 1) / 2 = 1.5, tau = 2.8 - 1.5 =  1.3
#   unit 1: w = [-1, -1, -1], b =  1: S = (3 + 3 + 1) / 2 = 3.5, tau = 2.8 - 3.5 = -0.7
#   output: v = [1, -1], c = 1
W = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, -1.0]])
B = torch.tensor([1.0, 1.0])
V = torch.tensor([[1.0, -1.0]])
C = torch.tensor([1.0])
X = torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
# pre-activations (unit 0, unit 1) -> features -> y:
#   [1,0,1]: ( 3, -1) -> (1, 0) -> 2      [0,0,0]: ( 1,  1) -> (0, 1) -> 0     [0,1,0]: (0,  0) -> (0, 1) -> 0
#   [1,1,1]: ( 2, -2) -> (1, 0) -> 2      [1,1,0]: ( 1, -1) -> (0, 0) -> 1     [1,0,0]: (2,  0) -> (1, 1) -> 1
Y = torch.tensor([[2.0], [0.0], [0.0], [2.0], [1.0], [1.0]])


def test_target_net_matches_hand_computed_outputs() -> None:
    torch.testing.assert_close(ltu_thresholds(W, B, 0.7), torch.tensor([1.3, -0.7]))
    torch.testing.assert_close(ltu_target(X, W, B, V, C, 0.7), Y)


def test_stream_target_is_the_reference_fix_ltu_net() -> None:
    s = SlowlyChangingRegression(num_tasks=3)
    assert s.weight.shape == (100, 20)
    assert s.out_weight.shape == (1, 100)
    for t in (s.weight, s.bias, s.out_weight, s.out_bias):
        assert set(t.unique().tolist()) <= {-1.0, 1.0}
    # the reference S_k = (m - sum_i w_ki + b_k) / 2 is "negative weights + b_k / 2"
    negatives = (s.weight < 0).sum(1).float()
    torch.testing.assert_close(ltu_thresholds(s.weight, s.bias, 0.7), 0.7 * 21 - negatives - s.bias / 2)
    x = s.task(0).train_x[:50]
    looped = torch.tensor(
        [
            [
                float(s.out_bias)
                + sum(
                    float(s.out_weight[0, k])
                    for k in range(100)
                    if float(x[n] @ s.weight[k] + s.bias[k]) > 0.7 * 21 - float(negatives[k]) - float(s.bias[k]) / 2
                )
            ]
            for n in range(50)
        ]
    )
    torch.testing.assert_close(s.target(x), looped)
    assert torch.equal(s.task(0).train_y[:50], looped)


def _slow_and_fast(s: SlowlyChangingRegression, task: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = s.task(task)
    x = torch.cat([d.train_x, d.query_x])  # the task's steps in stream order
    return x[:, :15], x[:, 15:]


def test_default_drift_redraws_all_slow_bits_and_nothing_else() -> None:
    s = SlowlyChangingRegression(num_tasks=60, train_size=900, query_size=100)
    changed = []
    for t in range(60):
        slow, fast = _slow_and_fast(s, t)
        assert (slow == slow[0]).all()  # held for the whole task, training and held-out steps alike
        assert torch.equal(slow[0], s.slow_bits(t))
        assert fast.shape == (1_000, 5)
        assert 0.45 < fast.mean() < 0.55  # fresh fair bits at every step
        assert (fast[1:] != fast[:-1]).any(1).float().mean() > 0.9
        if t:
            changed.append(int((s.slow_bits(t) != s.slow_bits(t - 1)).sum()))
    # a fresh uniform draw changes Binomial(15, 1/2) bits: mean 7.5, sd 0.25 over 59 boundaries
    assert 6.5 < sum(changed) / len(changed) < 8.5
    assert max(changed) > 1
    same_seed = SlowlyChangingRegression(num_tasks=60, train_size=900, query_size=100)
    assert torch.equal(s.weight, same_seed.weight)  # the target net never drifts


def test_flip_one_toggles_exactly_one_slow_bit_per_task() -> None:
    s = SlowlyChangingRegression(num_tasks=40, train_size=900, query_size=100, drift="flip_one")
    flipped = []
    for t in range(1, 40):
        diff = (s.slow_bits(t) != s.slow_bits(t - 1)).nonzero().flatten().tolist()
        assert diff == [s.flipped_bit(t)]
        flipped.append(diff[0])
        slow, _ = _slow_and_fast(s, t)
        assert (slow == s.slow_bits(t)).all()
    assert len(set(flipped)) > 5  # a random bit each time, not always the same one
    assert torch.equal(s.slow_bits(0), SlowlyChangingRegression(num_tasks=40).slow_bits(0))  # same start


@pytest.mark.parametrize("drift", ["redraw_all", "flip_one"])
def test_tasks_regenerate_bit_for_bit(drift: str) -> None:
    a = SlowlyChangingRegression(num_tasks=20, train_size=900, query_size=100, drift=drift, seed=3)
    b = SlowlyChangingRegression(num_tasks=800, train_size=900, query_size=100, drift=drift, seed=3)
    for u, v in zip(a.generate(7), b.generate(7), strict=True):  # independent of the run length too
        assert torch.equal(u, v)
    assert torch.equal(a.chunk(7, 5).x, b.task(7).train_x[5:6])
    other = SlowlyChangingRegression(num_tasks=20, train_size=900, query_size=100, drift=drift, seed=4)
    assert not torch.equal(other.generate(7).train_y, a.generate(7).train_y)


def test_episode_context_is_the_100_points_before_the_queries() -> None:
    s = SlowlyChangingRegression(num_tasks=2)
    ep, d = s.episode(1, context_size=100), s.task(1)
    assert torch.equal(ep.context_x, d.train_x[-100:])
    assert torch.equal(ep.context_y, d.train_y[-100:])
    assert torch.equal(ep.query_x, d.query_x)
    assert ep.query_y.shape == (1000, 1)
    assert ep.query_y.dtype == torch.float32
    assert s.episode(1, 100, num_queries=10).query_x.shape == (10, 20)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="drift"):
        SlowlyChangingRegression(drift="flip_two")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        SlowlyChangingRegression(train_size=5, chunk_size=10)


def test_sliding_sampler_is_the_current_point_and_the_100_before() -> None:
    q, s = sliding_sample(101, 100, 1)
    assert q.tolist() == [100]
    assert s.tolist() == list(range(100))
    q, s = sample_support("sliding", None, 150, 100, 2, torch.Generator())
    assert q.tolist() == [148, 149]
    assert s.tolist() == list(range(48, 148))
    with pytest.raises(ValueError, match="exceed"):
        sliding_sample(100, 100, 1)


def test_qoa_sliding_learns_on_the_current_point_against_the_previous_100() -> None:
    torch.manual_seed(0)
    stream = SlowlyChangingRegression(num_tasks=1, train_size=115, query_size=10)
    model = QueryOnlyAttention(
        input_shape=(20,), num_outputs=1, task_type="regression", memory_size=101, support_size=100,
        sampler="sliding", hidden=20, num_hidden_layers=0, use_labels=False, online_queries=1,
    )  # fmt: skip
    assert model.scorer.first.in_features == 40
    assert sum(p.numel() for p in model.parameters()) == 841  # the paper's 40 -> 20 -> 1 scorer
    optimizer = model.configure_optimizers()  # stand-ins for the Trainer (the learner may step manually)
    model.optimizers = lambda: optimizer
    model.manual_backward = lambda loss: loss.backward()
    d = stream.task(0)
    for i in range(115):
        with torch.no_grad():  # before the step: the current point against the 100 points before it
            expected = model.attend(
                d.train_x[i : i + 1], d.train_x[max(0, i - 100) : i], d.train_y[max(0, i - 100) : i]
            )
        loss = model.training_step(stream.chunk(0, i), i)
        assert (loss is None) == (i < 100)  # training starts at the 101st point, as the authors' code
        if loss is not None:
            torch.testing.assert_close(loss.detach(), torch.nn.functional.mse_loss(expected, d.train_y[i : i + 1]))


def test_scr_fit_logs_forward_mse_of_the_paper_episode(tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    cli = main(
        [
            "--config", str(CONFIGS / "qoa_scr.yaml"),
            "--data.stream.init_args.num_tasks=2", "--data.stream.init_args.train_size=120",
            "--data.stream.init_args.query_size=30", "--data.num_probe_tasks=0",
            *quiet_args(tmp_path),
        ],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    m = cli.trainer.callback_metrics
    assert int(cli.model.buffer.n_seen) == 240
    ep = cli.datamodule.stream.episode(1, 100)
    with torch.no_grad():
        mse = torch.nn.functional.mse_loss(cli.model.predict_episode(*ep[:3]), ep.query_y)
    torch.testing.assert_close(m["eval/forward_mse"], mse)
    assert torch.isfinite(m["eval/backward_mse"])
    assert torch.isfinite(m["train/online_mse"])


@pytest.mark.parametrize("config", ["bp_scr", "qoa_scr"])
@pytest.mark.parametrize("quick", [False, True], ids=["paper", "quick"])
def test_scr_configs_instantiate(config: str, quick: bool, tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    args = ["--config", str(CONFIGS / f"{config}.yaml")] + (["--config", str(CONFIGS / "quick.yaml")] if quick else [])
    cli = main([*args, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    assert cli.trainer.max_epochs == cli.datamodule.num_tasks == (30 if quick else 800)
    assert cli.model.input_shape == (20,)
    assert cli.model.task_type == "regression"
    assert cli.datamodule.backward_lags == [1, 2, 3, 4, 5]
    assert cli.datamodule.context_size == 100
    if not quick:  # the overlay may coarsen the chunks for speed; the paper streams one example per step
        assert cli.datamodule.stream.chunk_size == 1


@pytest.mark.parametrize("config", ["bp_scr", "qoa_scr", "cbp_scr", "knn_scr", "full_attention_scr"])
def test_quick_scr_overlay_keeps_the_one_point_per_step_protocol(config: str, tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    args = ["--config", str(CONFIGS / f"{config}.yaml"), "--config", str(CONFIGS / "quick_scr.yaml")]
    cli = main([*args, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    stream = cli.datamodule.stream
    assert (stream.chunk_size, stream.train_size, stream.query_size) == (1, 9000, 1000)  # the paper's tasks
    assert cli.trainer.max_epochs == cli.datamodule.num_tasks == 20
    assert cli.datamodule.eval_queries == 1000
