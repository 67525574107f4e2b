"""The fused engine (``step_kernel: fused``, ``learn_fused``: hand-written gradients, one fused Adam over views of a
flat tensor) computes what the autograd engine computes, bit for bit (tolerance 0): the same per-point predictions,
losses, weights and optimiser state after three tasks of slowly changing regression; a resumed fused run equals an
uninterrupted one; what it cannot serve is refused before the first batch.

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

from cl_lightning.lightning_compat import logged_steps
from cl_lightning.nn import MLP, AdamGnT, GenerateAndTest, PairScorer
from cl_lightning.nn.fused_steps import attention_mse_steps, mlp_steps
from cl_lightning.nn.optim import FlatAdam, FlatAdamGnT, adam_refusal

pytestmark = pytest.mark.usefixtures("one_thread")  # the SCR runs compared here, on one thread

TOL = {"rtol": 0, "atol": 0}


def _fit(config: str, root: Path, fused: bool, extra: list[str] | None = None, ckpt: str | None = None) -> Any:
    """A 3-task fit of 300 points a task, 64 steps a batch; records what ``learn_steps`` hands to the task means."""
    from cl_lightning.run.cli import main

    kernel = f"--model.init_args.step_kernel={'fused' if fused else 'autograd'}"
    cli = main(_args(config, root, 64, extra=[kernel, *(extra or [])]), run=False)
    model, seen = cli.model, {"online": [], "loss": []}
    add = model.add_task_terms

    def record(deferred: dict, online: list) -> None:
        seen["online"] += [p.detach().clone().reshape(-1) for p, _ in online]
        seen["loss"] += [v.detach().clone().reshape(-1) for v in deferred.get("train/loss", ([], []))[0]]
        add(deferred, online)

    model.add_task_terms = record
    cli.trainer.fit(model, cli.datamodule, ckpt_path=ckpt)
    cli.seen = {k: torch.cat(v) for k, v in seen.items()}
    return cli


def _optimizer_state(cli: Any) -> dict[str, Tensor]:
    state = cli.trainer.optimizers[0].state_dict()["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items()}


CBP_CORRECTED = ["--model.init_args.optimizer.init_args.update_rule=corrected"]  # standard Adam per element
IMAGES = ["--data.stream.init_args.train_size=2400"]  # Permuted MNIST: six chunks of 400 images a task
FAST_CBP = ["--model.init_args.maturity_threshold=2", "--model.init_args.replacement_rate=0.01"]
QOA_SMALL = [  # a buffer full after three chunks, 40 online queries a chunk (the window sampler's are not the step's)
    "--model.init_args.memory_size=1200", "--model.init_args.support_size=200", "--data.context_size=200",
    "--model.init_args.online_queries=40",
]  # fmt: skip
FITS = {  # id -> (config, extra arguments); CBP's generate-and-test replaces units from about step 250 on
    "bp_scr": ("bp_scr", []),
    "qoa_scr": ("qoa_scr", []),
    "cbp_scr": ("cbp_scr", CBP_CORRECTED),
    "cbp_scr-reference": ("cbp_scr", []),  # the config's rule: AdamGnT's snapshot, as the authors' code
    "bp_pmnist": ("bp_pmnist", IMAGES),  # classification: cross-entropy on 400-image chunks
    "cbp_pmnist": ("cbp_pmnist", [*IMAGES, *FAST_CBP]),  # replacing units from the third step on
    "qoa_pmnist": ("qoa_pmnist", [*IMAGES, *QOA_SMALL]),  # classification: one query over a window of 200 a step
    "qoa_pmnist-queries": ("qoa_pmnist", [*IMAGES, *QOA_SMALL, "--model.init_args.queries_per_step=10"]),
}


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (``torch.equal`` also takes -0 for +0 and fails on NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16}
        a, b = a.view(ints[a.dtype]), b.view(ints[b.dtype])
    return torch.equal(a, b)


@pytest.mark.parametrize("fit", list(FITS))
def test_the_fused_step_equals_the_autograd_chunk_step(fit: str, tmp_path: Path) -> None:
    config, extra = FITS[fit]
    plain = _fit(config, tmp_path / "plain", fused=False, extra=extra)
    fused = _fit(config, tmp_path / "fused", fused=True, extra=extra)
    adam = fused.model.engine._flat
    assert adam is not None  # each path ran
    assert not hasattr(plain.model.engine, "_flat")
    flat = range(adam.flat.data_ptr(), adam.flat.data_ptr() + adam.flat.numel() * 4)
    assert all(p.data_ptr() in flat for p in fused.model.parameters())  # views of the flat tensor
    state = fused.trainer.optimizers[0].state
    for key, moment in adam.moments.items():  # the optimiser's own state: views of the flat state
        span = range(moment.data_ptr(), moment.data_ptr() + moment.numel() * 4)
        assert all(state[p][key].data_ptr() in span for p in fused.model.parameters()), key
    for key in ("online", "loss"):
        assert plain.seen[key].numel() > (500 if key == "online" else 15), key
        assert _same_bits(fused.seen[key], plain.seen[key]), key
    a, b = plain.model.state_dict(), fused.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert _same_bits(a[k], b[k]), k  # weights, the replay buffer, generate-and-test's buffers, counters
    assert plain.trainer.global_step == fused.trainer.global_step > (15 if "pmnist" in config else 500)
    sa, sb = _optimizer_state(plain), _optimizer_state(fused)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert _same_bits(sa[k], sb[k]), k
    for name, value in plain.trainer.callback_metrics.items():
        assert _same_bits(fused.trainer.callback_metrics[name], value), name
    if config.startswith("cbp"):  # units were replaced, their AdamGnT state reset in the flat state (rows restarted)
        assert int(fused.model.gnt.buffer("replaced", 0)) >= 10
        steps = state[fused.model.net.layers[0].weight]["element_step"]
        assert steps.min() < steps.max() == fused.trainer.global_step


@pytest.mark.parametrize("fit", list(FITS))
def test_a_resumed_fused_run_equals_an_uninterrupted_one(fit: str, tmp_path: Path) -> None:
    config, extra = FITS[fit]
    straight = _fit(config, tmp_path / "a", fused=True, extra=[*extra, *_checkpoint_each_task(tmp_path)])
    resumed = _fit(config, tmp_path / "b", fused=True, extra=extra, ckpt=str(tmp_path / "ckpt" / "taskepoch=1.ckpt"))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert _same_bits(a[k], b[k]), k
    sa, sb = _optimizer_state(straight), _optimizer_state(resumed)
    for k in sa:
        assert _same_bits(sa[k], sb[k]), k
    assert straight.trainer.global_step == resumed.trainer.global_step
    n = resumed.seen["online"].numel()  # the resumed run's third task
    assert _same_bits(straight.seen["online"][-n:], resumed.seen["online"])
    for name, value in straight.trainer.callback_metrics.items():
        assert _same_bits(value, resumed.trainer.callback_metrics[name]), name


@pytest.mark.parametrize("config", ["bp_pmnist", "cbp_pmnist"])
def test_an_autograd_run_resumed_fused_a_task_a_batch_equals_the_uninterrupted_one(config: str, tmp_path: Path) -> None:
    """A run trained by autograd one chunk a batch and resumed (through the CLI's checks) by the fused engine with a
    task's chunks in one batch is the same run: the same weights and optimiser state bit for bit, the same steps."""
    from cl_lightning.run.cli import main

    extra = FITS[config][1]
    args = _args(config, tmp_path / "a", 1, extra=[*extra, "--model.init_args.step_kernel=autograd"])
    straight = main(["fit", *args, *_checkpoint_each_task(tmp_path)])
    ckpt = str(tmp_path / "ckpt" / "taskepoch=1.ckpt")
    args = _args(config, tmp_path / "b", 6, extra=[*extra, "--model.init_args.step_kernel=fused"])
    resumed = main(["fit", *args, "--ckpt_path", ckpt])
    assert resumed.model.engine._flat is not None
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert _same_bits(a[k], b[k]), k
    sa, sb = _optimizer_state(straight), _optimizer_state(resumed)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert _same_bits(sa[k], sb[k]), k
    assert straight.trainer.global_step == resumed.trainer.global_step == 18
    assert logged_steps(straight.trainer) == logged_steps(resumed.trainer) == 18  # the logging step: chunks
    for name, value in straight.trainer.callback_metrics.items():  # task means: float64 sums in another order
        torch.testing.assert_close(resumed.trainer.callback_metrics[name], value, msg=name)


def _refusal(config: str, root: Path, extra: list[str], kernel: str = "fused") -> str:
    """The one-line error of fitting ``config`` with ``step_kernel`` ``kernel``, raised before the first batch."""
    from cl_lightning.run.cli import main

    cli = main(_args(config, root, 64, tasks=1, extra=[f"--model.init_args.step_kernel={kernel}", *extra]), run=False)
    learned = []
    cli.model.learn_chunk = lambda *a: learned.append(1)
    with pytest.raises(ValueError, match="use step_kernel: autograd") as refused:
        cli.trainer.fit(cli.model, cli.datamodule)
    assert not learned
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_an_optimiser_the_fused_step_cannot_reproduce_is_refused(tmp_path: Path) -> None:
    sgd = ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.01"]
    message = _refusal("bp_scr", tmp_path, sgd)
    assert message == (
        "Backprop's step_kernel 'fused' cannot reproduce the optimiser is SGD, not Adam / AdamW / AdamGnT: "
        "use step_kernel: autograd"
    )


def test_a_forward_hook_is_refused_by_the_fused_engine(tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    cli = main(_args("bp_scr", tmp_path, 64, tasks=1, extra=["--model.init_args.step_kernel=fused"]), run=False)
    cli.model.net.layers[0].register_forward_hook(lambda *_: None)
    with pytest.raises(ValueError, match="step_kernel 'fused' would not call a module's forward hook"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_the_fused_engine_refuses_mixed_precision(tmp_path: Path) -> None:
    message = _refusal("bp_scr", tmp_path, ["--trainer.precision=bf16-mixed"])
    assert "step_kernel 'fused' computes in full precision only, not trainer.precision 'bf16-mixed'" in message


def test_mixed_precision_steps_through_the_autograd_engine(tmp_path: Path) -> None:
    """The autograd engine steps through Lightning's precision plugin, at any ``steps_per_batch``."""
    from cl_lightning.run.cli import main

    extra = ["--trainer.precision=bf16-mixed", "--model.init_args.step_kernel=autograd"]
    cli = main(_args("bp_scr", tmp_path, 64, tasks=1, extra=extra), run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 300


PMNIST = ["--data.stream.init_args.train_size=400"]  # one chunk of 400 a task


@pytest.mark.parametrize(
    ("config", "kernel", "extra", "message"),
    [
        (
            "bp_pmnist",
            "native",
            PMNIST,
            "Backprop's step_kernel 'native' fits regression only: use step_kernel: autograd",
        ),
        ("ewc_pmnist", "fused", PMNIST, "EWC has no fused step engine: use step_kernel: autograd"),
        (
            "qoa_scr",
            "fused",
            ["--model.init_args.sampler=uniform"],
            "QueryOnlyAttention's step_kernel 'fused' needs each step's query to be the incoming point",
        ),
        (
            "qoa_pmnist",
            "fused",
            [*PMNIST, "--model.init_args.queries_per_step=100"],
            "QueryOnlyAttention's step_kernel 'fused' takes at most 65536 pairs a step (queries × supports: 100000)",
        ),
    ],
    ids=["classification", "ewc", "qoa-uniform-sampler", "qoa-too-many-pairs"],
)
def test_an_engine_the_learner_lacks_is_refused_at_construction(
    config: str, kernel: str, extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """In one line, when the config is read (the CLI turns it into ``error: ...``), not at the first batch."""
    from cl_lightning.run.cli import main

    args = _args(config, tmp_path, 1, tasks=1, extra=[f"--model.init_args.step_kernel={kernel}", *extra])
    with pytest.raises(SystemExit) as exited:
        main(args, run=False)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_chosen_engine_is_what_runs(tmp_path: Path) -> None:
    """``fused`` runs the fused steps once the learner's buffer fills (QOA), ``autograd`` never does."""
    from cl_lightning.run.cli import main

    calls: dict[str, list[int]] = {}
    for kernel in ("fused", "autograd"):
        extra = [f"--model.init_args.step_kernel={kernel}"]
        cli = main(_args("qoa_scr", tmp_path / kernel, 64, tasks=1, extra=extra), run=False)
        learn_fused, seen = cli.model.learn_fused, calls.setdefault(kernel, [])
        cli.model.learn_fused = lambda batch, start, *a, f=learn_fused, s=seen: s.append(start) or f(batch, start, *a)
        cli.trainer.fit(cli.model, cli.datamodule)
    # batches of 64 points: from the point whose supports are the 100 before it (36 of the second batch) on
    assert calls == {"fused": [36, 0, 0, 0], "autograd": []}


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
    preds = mlp_steps(list(net.layers), adam, x, y)
    adam.release()
    expected = _autograd_steps(ref, list(ref.parameters()), ref_opt, list(zip(x, y, strict=True)))
    torch.testing.assert_close(preds, expected, **TOL)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    fresh = make_opt(list(ref.parameters()))  # the flat state saves and loads as the optimiser's own
    fresh.load_state_dict(opt.state_dict())
    assert fresh.state_dict()["state"][0]["step"] == 50


@pytest.mark.parametrize(
    ("rule", "gnt_options"),
    [("corrected", {}), ("reference", {"accumulate": False, "next_bias_correction": True})],
    ids=["corrected", "reference-drawn-counts"],
)
def test_mlp_steps_with_generate_and_test_equal_autograd_and_adam_gnt(rule: str, gnt_options: dict) -> None:
    """Two hidden layers, chunks of 3 points, 2 targets, weight decay; generate-and-test after every step replaces
    units of both layers and resets their AdamGnT state, in the flat state as on separate tensors."""
    torch.manual_seed(0)
    net, ref = MLP(6, 2, [8, 5]), MLP(6, 2, [8, 5])
    ref.load_state_dict(net.state_dict())
    x, y = torch.randn(200, 3, 6), torch.randn(200, 3, 2)
    opt, ref_opt = (
        AdamGnT(m.parameters(), lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, update_rule=rule)
        for m in (net, ref)
    )
    gnt, ref_gnt = (GenerateAndTest([8, 5], replacement_rate=0.05, maturity_threshold=5, **gnt_options) for _ in "ab")
    layers, draws = list(net.layers), iter(range(200))
    adam = FlatAdamGnT().bind(opt, list(net.parameters()))
    preds = mlp_steps(
        layers, adam, x, y, lambda hs: gnt.step(layers, hs, opt, torch.Generator().manual_seed(next(draws)))
    )
    adam.release()
    expected = []
    for t, (xt, yt) in enumerate(zip(x, y, strict=True)):  # ContinualBackprop.learn_chunk, by autograd
        h, features = xt, []
        for layer in ref.layers[:-1]:
            h = layer(h).relu()
            features.append(h.detach())
        pred = ref.layers[-1](h)
        expected.append(pred.detach())
        ref_opt.zero_grad()
        (pred - yt).pow(2).mean().backward()
        ref_opt.step()
        ref_gnt.step(list(ref.layers), features, ref_opt, torch.Generator().manual_seed(t))
    assert all(int(gnt.buffer("replaced", i)) > 10 for i in range(2))
    assert _same_bits(preds, torch.stack(expected))
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert _same_bits(p, q)
        assert all(_same_bits(opt.state[p][k], ref_opt.state[q][k]) for k in adam.state_keys)
    for k, v in ref_gnt.state_dict().items():
        assert _same_bits(gnt.state_dict()[k], v), k


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.Adam(p, lr=1e-3, fused=True),
        lambda p: AdamGnT(p, lr=1e-3),
        lambda p: AdamGnT(p, lr=1e-3, update_rule="reference"),
    ],
    ids=["fused-adam", "adam-gnt", "adam-gnt-reference"],
)
def test_attention_steps_equal_autograd_with_a_hidden_layer(make_opt: Any) -> None:
    torch.manual_seed(0)
    scorer, ref = PairScorer(5, 0, 7, 1), PairScorer(5, 0, 7, 1)
    ref.load_state_dict(scorer.state_dict())
    s, steps = 12, 40
    wx, wy = torch.randn(s + steps, 5), torch.randn(s + steps, 2)
    opt, ref_opt = (make_opt(list(m.parameters())) for m in (scorer, ref))
    adam = (FlatAdamGnT if isinstance(opt, AdamGnT) else FlatAdam)().bind(opt, list(scorer.parameters()))
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
    assert adam_refusal(AdamGnT(params), params) is None
    assert "SGD" in adam_refusal(torch.optim.SGD(params, lr=0.1), params)
    assert "amsgrad" in adam_refusal(torch.optim.Adam(params, amsgrad=True), params)
    assert "not the net's" in adam_refusal(torch.optim.Adam(params[:2]), params)


@pytest.mark.parametrize(
    ("extra", "hook", "runs"),
    [
        ([], False, "fused"),
        ([], True, "autograd"),  # a monitor's forward hook: the fused steps would skip it
        (["--trainer.precision=bf16-mixed"], False, "autograd"),
        (["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.01"], False,
         "autograd"),
    ],
    ids=["cpu", "forward-hook", "mixed-precision", "sgd"],
)  # fmt: skip
def test_auto_takes_the_fused_steps_where_the_run_allows_them(
    extra: list[str], hook: bool, runs: str, tmp_path: Path
) -> None:
    """``step_kernel: auto`` decides once, when training starts: the fused steps, or autograd for a run they would
    refuse (the run trains either way: no refusal)."""
    from cl_lightning.run.cli import main

    cli = main(_args("bp_scr", tmp_path, 64, tasks=1, extra=["--model.init_args.step_kernel=auto", *extra]), run=False)
    assert cli.model.engine.name == "auto"
    if hook:
        cli.model.net.layers[0].register_forward_hook(lambda *_: None)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.engine.name == runs
    assert cli.trainer.global_step == 300


@pytest.mark.parametrize(
    ("config", "extra"),
    [("ewc_pmnist", PMNIST), ("qoa_pmnist", [*PMNIST, "--model.init_args.queries_per_step=100"])],
    ids=["ewc", "qoa-too-many-pairs"],
)
def test_auto_is_autograd_for_a_learner_whose_fused_steps_refuse_its_settings(
    config: str, extra: list[str], tmp_path: Path
) -> None:
    """Where ``fused`` is refused when the config is read, ``auto`` is autograd (EWC: its own training step)."""
    from cl_lightning.learners.engines import AutogradEngine
    from cl_lightning.run.cli import main

    cli = main(_args(config, tmp_path, 1, tasks=1, extra=["--model.init_args.step_kernel=auto", *extra]), run=False)
    engine = cli.model.engine
    assert engine is None if config == "ewc_pmnist" else type(engine) is AutogradEngine
