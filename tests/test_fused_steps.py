"""The fused inner step (``learn_fused``: hand-written gradients, one fused Adam over views of a flat tensor)
computes what the autograd chunk-by-chunk path computes, bit for bit (tolerance 0): the same per-point predictions,
losses, weights and optimiser state after three tasks of slowly changing regression; a resumed fused run equals an
uninterrupted one; chunked stepping refuses mixed precision.

Bit for bit, not "to float32 rounding", because it has to be: on QOA's scorer several weights have an exact gradient
of 0 (a shift of every score of a query leaves the softmax unchanged) and a computed one of rounding noise, which
Adam normalises into steps of about ``lr``; any other rounding walks them elsewhere (measured: 8e-4 apart after 150
steps, online predictions 1e-2 apart a task later). The fused step therefore uses autograd's products in autograd's
layouts, parameters on 64-byte boundaries, and the configured Adam's own formulas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_scr_steps import _args, _checkpoint_each_task
from torch import Tensor, nn

from cl_lightning.nn import MLP, PairScorer
from cl_lightning.nn.fused_steps import FlatAdam, adam_refusal, attention_mse_steps, mlp_mse_steps

pytestmark = pytest.mark.usefixtures("one_thread")  # the SCR runs compared here, on one thread

TOL = {"rtol": 0, "atol": 0}


def _fit(config: str, root: Path, fused: bool, extra: list[str] | None = None, ckpt: str | None = None) -> Any:
    """A 3-task fit of 300 points a task, 64 steps a batch; records what ``learn_steps`` hands to the task means."""
    from cl_lightning.cli import main

    cli = main(_args(config, root, 64, extra=extra), run=False)
    model, seen = cli.model, {"online": [], "loss": []}
    model.fused_steps = fused
    add = model._add_deferred

    def record(deferred: dict, online: list, device: torch.device) -> None:
        seen["online"] += [p.detach().clone().reshape(-1) for p, _ in online]
        seen["loss"] += [v.detach().clone().reshape(-1) for v in deferred.get("train/loss", ([], []))[0]]
        add(deferred, online, device)

    model._add_deferred = record
    cli.trainer.fit(model, cli.datamodule, ckpt_path=ckpt)
    cli.seen = {k: torch.cat(v) for k, v in seen.items()}
    return cli


def _optimizer_state(cli: Any) -> dict[str, Tensor]:
    state = cli.trainer.optimizers[0].state_dict()["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items()}


@pytest.mark.parametrize("config", ["bp_scr", "qoa_scr"])
def test_the_fused_step_equals_the_autograd_chunk_step(config: str, tmp_path: Path) -> None:
    plain = _fit(config, tmp_path / "plain", fused=False)
    fused = _fit(config, tmp_path / "fused", fused=True)
    adam = fused.model.__dict__.get("_flat_adam")
    assert adam is not None  # each path ran
    assert "_flat_adam" not in plain.model.__dict__
    flat = range(adam.flat.data_ptr(), adam.flat.data_ptr() + adam.flat.numel() * 4)
    assert all(p.data_ptr() in flat for p in fused.model.parameters())  # views of the flat tensor
    for key in ("online", "loss"):
        assert plain.seen[key].numel() > 500, key
        torch.testing.assert_close(fused.seen[key], plain.seen[key], **TOL, msg=key)
    a, b = plain.model.state_dict(), fused.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # weights, the replay buffer, counters
    assert plain.trainer.global_step == fused.trainer.global_step > 500
    sa, sb = _optimizer_state(plain), _optimizer_state(fused)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    for name, value in plain.trainer.callback_metrics.items():
        torch.testing.assert_close(fused.trainer.callback_metrics[name], value, **TOL, msg=name)


@pytest.mark.parametrize("config", ["bp_scr", "qoa_scr"])
def test_a_resumed_fused_run_equals_an_uninterrupted_one(config: str, tmp_path: Path) -> None:
    straight = _fit(config, tmp_path / "a", fused=True, extra=_checkpoint_each_task(tmp_path))
    resumed = _fit(config, tmp_path / "b", fused=True, ckpt=str(tmp_path / "ckpt" / "taskepoch=1.ckpt"))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = _optimizer_state(straight), _optimizer_state(resumed)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert straight.trainer.global_step == resumed.trainer.global_step
    n = resumed.seen["online"].numel()  # the resumed run's third task
    assert torch.equal(straight.seen["online"][-n:], resumed.seen["online"])
    for name, value in straight.trainer.callback_metrics.items():
        assert torch.equal(value, resumed.trainer.callback_metrics[name]), name


def test_an_optimiser_the_fused_step_cannot_reproduce_falls_back_with_a_warning(tmp_path: Path) -> None:
    sgd = ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.01"]
    with pytest.warns(UserWarning, match="SGD"):
        cli = _fit("bp_scr", tmp_path, fused=True, extra=sgd)
    assert "_flat_adam" not in cli.model.__dict__
    assert cli.seen["loss"].numel() == 900  # every point learned, chunk by chunk


def test_a_forward_hook_keeps_the_autograd_path(tmp_path: Path) -> None:
    from cl_lightning.cli import main

    cli = main(_args("bp_scr", tmp_path, 64, tasks=1), run=False)
    calls = []
    cli.model.net.layers[0].register_forward_hook(lambda *_: calls.append(1))
    cli.trainer.fit(cli.model, cli.datamodule)
    assert "_flat_adam" not in cli.model.__dict__
    assert len(calls) >= 300  # the hook saw every training step


def test_chunked_stepping_refuses_mixed_precision(tmp_path: Path) -> None:
    from cl_lightning.cli import main

    cli = main(_args("bp_scr", tmp_path, 64, tasks=1, extra=["--trainer.precision=bf16-mixed"]), run=False)
    with pytest.raises(ValueError, match=r"precision.*steps_per_batch: 1"):
        cli.trainer.fit(cli.model, cli.datamodule)


def _autograd_steps(
    predict: Any, params: list[nn.Parameter], opt: torch.optim.Optimizer, batches: list[tuple]
) -> Tensor:
    preds = []
    for *inputs, y in batches:
        pred = predict(*inputs)
        preds.append(pred.detach().clone())
        opt.zero_grad()
        (pred - y).pow(2).mean().backward()
        opt.step()
    return torch.stack(preds)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.Adam(p, lr=1e-3),
        lambda p: torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, fused=True),
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    ],
    ids=["adam", "adam-hyper", "adamw"],
)
def test_mlp_steps_equal_autograd_with_the_optimiser_hyperparameters(make_opt: Any) -> None:
    """Two hidden layers, chunks of 3 points, 2 targets: the general shapes, not only SCR's."""
    torch.manual_seed(0)
    net, ref = MLP(6, 2, [8, 5]), MLP(6, 2, [8, 5])
    ref.load_state_dict(net.state_dict())
    x, y = torch.randn(50, 3, 6), torch.randn(50, 3, 2)
    opt, ref_opt = make_opt(list(net.parameters())), make_opt(list(ref.parameters()))
    adam = FlatAdam().bind(opt, list(net.parameters()))
    preds = mlp_mse_steps(list(net.layers), adam, x, y)
    adam.release()
    expected = _autograd_steps(ref, list(ref.parameters()), ref_opt, list(zip(x, y, strict=True)))
    torch.testing.assert_close(preds, expected, **TOL)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    fresh = make_opt(list(ref.parameters()))  # the flat state saves and loads as the optimiser's own
    fresh.load_state_dict(opt.state_dict())
    assert fresh.state_dict()["state"][0]["step"] == 50


def test_attention_steps_equal_autograd_with_a_hidden_layer() -> None:
    torch.manual_seed(0)
    scorer, ref = PairScorer(5, 0, 7, 1), PairScorer(5, 0, 7, 1)
    ref.load_state_dict(scorer.state_dict())
    s, steps = 12, 40
    wx, wy = torch.randn(s + steps, 5), torch.randn(s + steps, 2)
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=1e-3, fused=True) for m in (scorer, ref))
    adam = FlatAdam().bind(opt, list(scorer.parameters()))
    preds = attention_mse_steps(scorer.first, [*scorer.hidden, scorer.out], adam, wx, wy, s)
    adam.release()
    batches = [(wx[t + s : t + s + 1], wx[t : t + s], wy[t : t + s], wy[t + s : t + s + 1]) for t in range(steps)]
    expected = _autograd_steps(lambda q, sx, sy: ref(q, sx).softmax(-1) @ sy, [], ref_opt, batches)
    torch.testing.assert_close(preds, expected, **TOL)
    for p, q in zip(scorer.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_optimisers_the_flat_adam_cannot_reproduce_are_named() -> None:
    net = MLP(3, 1, [4])
    params = list(net.parameters())
    assert adam_refusal(torch.optim.Adam(params), params) is None
    assert "SGD" in adam_refusal(torch.optim.SGD(params, lr=0.1), params)
    assert "amsgrad" in adam_refusal(torch.optim.Adam(params, amsgrad=True), params)
    assert "not the net's" in adam_refusal(torch.optim.Adam(params[:2]), params)
