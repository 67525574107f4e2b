"""The native step kernels (``step_kernel="native"``, ``cl_lightning/nn/native``): the fused steps' algorithm in C,
equal to the fused (torch) path to float32 rounding, deterministic (a resumed run equals an uninterrupted one bit for
bit), and refused clearly where they do not apply."""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import torch
from test_scr_steps import _args, _checkpoint_each_task
from torch import nn

from cl_lightning.nn import MLP, AdamGnT, GenerateAndTest, PairScorer, fused_steps, native
from cl_lightning.nn.optim.flat_adam import AdamHyperparameters, FlatAdam, FlatAdamGnT

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not native.available(), reason="no working C compiler: the native kernels cannot be built"),
]


def _bound(params: list[nn.Parameter], **adam: object) -> tuple[torch.optim.Adam, FlatAdam]:
    opt = torch.optim.Adam(params, **adam)
    return opt, FlatAdam().bind(opt, params)


def _mlp_run(kernel: str, hidden: list[int], batch: int, steps: int, opt_cls: type, **adam: object) -> dict:
    torch.manual_seed(0)
    net = MLP(20, 2, hidden)
    xs, ys = torch.randint(0, 2, (steps, batch, 20)).float(), torch.randn(steps, batch, 2)
    opt = opt_cls(net.parameters(), **adam)
    flat, run = FlatAdam(), fused_steps.mlp_steps if kernel == "torch" else native.mlp_mse_steps
    preds = []
    for x, y in zip(xs.split(steps // 3), ys.split(steps // 3), strict=True):  # three batches, as a learner runs
        preds.append(run(list(net.layers), flat.bind(opt, list(net.parameters())), x, y))
        flat.release()
    preds = torch.cat(preds)
    state = [opt.state[p] for p in net.parameters()]
    return {
        "preds": preds,
        "params": [p.detach().clone() for p in net.parameters()],
        "exp_avg": [s["exp_avg"].clone() for s in state],
        "exp_avg_sq": [s["exp_avg_sq"].clone() for s in state],
        "step": [float(s["step"]) for s in state],
    }


@pytest.mark.parametrize(
    ("hidden", "batch", "opt_cls", "adam"),
    [
        ([40], 1, torch.optim.Adam, {"lr": 1e-3}),
        ([16, 8], 3, torch.optim.Adam, {"lr": 1e-3, "weight_decay": 1e-2, "betas": (0.8, 0.99)}),
        ([40], 1, torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}),
        ([40], 1, torch.optim.Adam, {"lr": 1e-3, "fused": True}),
    ],
    ids=["scr-net", "two-hidden-coupled-decay", "adamw", "fused-adam"],
)
def test_native_mlp_steps_equal_the_torch_steps_to_rounding(hidden, batch, opt_cls, adam) -> None:
    a = _mlp_run("torch", hidden, batch, 600, opt_cls, **adam)
    b = _mlp_run("native", hidden, batch, 600, opt_cls, **adam)
    torch.testing.assert_close(b["preds"], a["preds"], rtol=1e-5, atol=1e-5)
    for key in ("params", "exp_avg", "exp_avg_sq"):
        for x, y in zip(b[key], a[key], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, msg=key)
    assert b["step"] == a["step"] == [600.0] * len(a["step"])


def _scorer(hidden_layers: int) -> tuple[PairScorer, list[nn.Parameter]]:
    torch.manual_seed(0)
    scorer = PairScorer(20, 0, 20, hidden_layers)
    return scorer, list(scorer.parameters())


def _attention(kernel: str, hidden_layers: int, steps: int, supports: int = 100) -> tuple[torch.Tensor, ...]:
    scorer, params = _scorer(hidden_layers)
    _, flat = _bound(params, lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 2, (supports + steps, 20), generator=gen).float()
    y = torch.randn(supports + steps, 1, generator=gen)
    run = fused_steps.attention_mse_steps if kernel == "torch" else native.attention_mse_steps
    preds = run(scorer.first, [*scorer.hidden, scorer.out], flat, x, y, supports)
    flat.release()
    return preds, flat.grad.clone(), y[supports:, None]


@pytest.mark.parametrize("hidden_layers", [0, 1], ids=["scr-scorer", "hidden-layer"])
def test_native_attention_step_equals_the_torch_step_to_rounding(hidden_layers: int) -> None:
    """One step: prediction and every gradient to float32 rounding. Not the parameters: on this scorer some
    gradients are exactly 0 in exact arithmetic (a shift common to every score of a query, and a unit active on
    every support, leave the softmax unchanged), so both paths compute rounding noise there, which Adam turns into
    steps of about ``lr`` of either sign."""
    pred_t, grad_t, _ = _attention("torch", hidden_layers, 1)
    pred_n, grad_n, _ = _attention("native", hidden_layers, 1)
    torch.testing.assert_close(pred_n, pred_t, rtol=1e-6, atol=1e-7)
    assert grad_t.abs().max() > 1e-3  # a real gradient; the tolerance: far below it, above the noise of the 0s
    torch.testing.assert_close(grad_n, grad_t, rtol=1e-4, atol=1e-6 * float(grad_t.abs().max()))


@pytest.mark.parametrize("hidden_layers", [0, 1], ids=["scr-scorer", "hidden-layer"])
def test_native_attention_learns_as_the_torch_steps_do(hidden_layers: int) -> None:
    """2,000 steps: the trajectories drift apart at the rounding level (see above), the learning does not: the mean
    online error agrees to 1 %, and each path beats predicting the mean of the targets."""
    errors = {}
    for kernel in ("torch", "native"):
        preds, _, y = _attention(kernel, hidden_layers, 2000, supports=20)
        errors[kernel] = float((preds - y).pow(2).mean())
    assert errors["native"] == pytest.approx(errors["torch"], rel=0.01)


def _generator(first: int, t: int) -> torch.Generator:
    return torch.Generator().manual_seed(first + t)


def _generate_and_test(gnt: GenerateAndTest, layers: list, opt: AdamGnT, seeds: Iterator[int], h: list) -> None:
    gnt.step(layers, h, opt, torch.Generator().manual_seed(next(seeds)))


def _cbp_run(kernel: str, hidden: list[int], batch: int, steps: int, gnt_args: dict, **adam: object) -> dict:
    """Continual Backprop's fused steps (AdamGnT on a flat tensor, generate-and-test after each update) in three
    batches, each step's draws from a generator seeded by its number; records every replacement as (step, layer,
    units)."""
    torch.manual_seed(0)
    net = MLP(20, 1, hidden)
    layers, params = list(net.layers), list(net.parameters())
    gen = torch.Generator().manual_seed(1)
    xs, ys = torch.randint(0, 2, (steps, batch, 20), generator=gen).float(), torch.randn(steps, batch, 1, generator=gen)
    opt, gnt, flat = AdamGnT(params, **adam), GenerateAndTest(hidden, maturity_threshold=10, **gnt_args), FlatAdamGnT()
    replaced, generate = [], gnt._generate

    def record(i: int, layer: nn.Linear, consumer: nn.Linear, index: torch.Tensor, *rest: object) -> None:
        replaced.append((rest[-1].initial_seed(), i, index.tolist()))  # the generator's seed is the step number
        generate(i, layer, consumer, index, *rest)

    gnt._generate = record
    preds, done = [], 0
    for x, y in zip(xs.split(steps // 3), ys.split(steps // 3), strict=True):
        bound, seeds = flat.bind(opt, params), itertools.count(done)
        if kernel == "torch":
            after = partial(_generate_and_test, gnt, layers, opt, seeds)
            preds.append(fused_steps.mlp_steps(layers, bound, x, y, after))
        else:
            preds.append(native.cbp_mse_steps(layers, bound, gnt, x, y, opt, partial(_generator, done)))
        done += x.shape[0]
    state = [opt.state[p] for p in params]
    return {
        "preds": torch.cat(preds),
        "replaced": replaced,
        "params": [p.detach().clone() for p in params],
        **{key: [s[key].clone() for s in state] for key in ("element_step", "exp_avg", "exp_avg_sq")},
        "gnt": {k: v.clone() for k, v in gnt.state_dict().items()},
    }


CBP_CASES = {  # id -> (hidden, batch, generate-and-test arguments, AdamGnT arguments)
    "scr-net": ([40], 1, {"replacement_rate": 2e-3}, {"lr": 1e-3}),
    "reference-rule": ([40], 1, {"replacement_rate": 2e-3}, {"lr": 1e-3, "update_rule": "reference"}),
    "no-replacement": ([40], 1, {"replacement_rate": 0.0}, {"lr": 1e-3}),  # no test either, as the reference
    "two-hidden-contribution-decay": (
        [16, 8],
        2,
        {"replacement_rate": 5e-3, "utility": "contribution", "next_bias_correction": True},
        {"lr": 1e-3, "weight_decay": 1e-2, "betas": (0.8, 0.99)},
    ),
}


CBP_TOL = {"rtol": 1e-5, "atol": 1e-6}  # measured: every difference within a quarter of it


@pytest.mark.parametrize("case", list(CBP_CASES))
def test_native_cbp_steps_equal_the_torch_steps_to_rounding(case: str) -> None:
    """300 steps with replacements: the same units replaced at the same steps with the same draws; weights, AdamGnT
    state and generate-and-test's buffers equal to float32 rounding, the step counts and ages exactly."""
    hidden, batch, gnt_args, adam = CBP_CASES[case]
    a = _cbp_run("torch", hidden, batch, 300, gnt_args, **adam)
    b = _cbp_run("native", hidden, batch, 300, gnt_args, **adam)
    assert len(a["replaced"]) >= 5 if gnt_args["replacement_rate"] else not a["replaced"]
    assert b["replaced"] == a["replaced"]
    torch.testing.assert_close(b["preds"], a["preds"], **CBP_TOL)
    for key in ("params", "exp_avg", "exp_avg_sq"):
        for x, y in zip(b[key], a[key], strict=True):
            torch.testing.assert_close(x, y, **CBP_TOL, msg=key)
    for x, y in zip(b["element_step"], a["element_step"], strict=True):
        assert torch.equal(x, y)  # restarted rows and columns included
    assert b["gnt"].keys() == a["gnt"].keys()
    for key, value in a["gnt"].items():  # utilities, mean activations: rounding; ages, counts, carried fractions: exact
        if value.dtype == torch.float32:
            torch.testing.assert_close(b["gnt"][key], value, **CBP_TOL, msg=key)
        else:
            assert torch.equal(b["gnt"][key], value), key


def _fit(config: str, root: Path, kernel: str, extra: list[str] | None = None, ckpt: str | None = None):
    from cl_lightning.run.cli import main

    cli = main(_args(config, root, 64, extra=[f"--model.init_args.step_kernel={kernel}", *(extra or [])]), run=False)
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt)
    return cli


@pytest.mark.parametrize("config", ["bp_scr", "qoa_scr", "cbp_scr"])
def test_a_native_run_equals_the_torch_run_to_rounding_and_resumes_exactly(config: str, tmp_path: Path) -> None:
    """CBP: units replaced in every task (about 12 a task), the same ones in both runs (its buffers compared)."""
    torch_run = _fit(config, tmp_path / "torch", "fused")
    straight = _fit(config, tmp_path / "native", "native", extra=_checkpoint_each_task(tmp_path))
    for name, value in torch_run.trainer.callback_metrics.items():  # task means of 300-point tasks
        torch.testing.assert_close(straight.trainer.callback_metrics[name], value, rtol=2e-3, atol=1e-5, msg=name)
    assert straight.trainer.global_step == torch_run.trainer.global_step > 0
    if config == "cbp_scr":  # the same units replaced at the same steps: equal ages and counts
        gnt_torch, gnt_native = torch_run.model.gnt, straight.model.gnt
        assert int(gnt_native.buffer("replaced", 0)) >= 20
        for name in ("age", "replaced", "to_replace"):
            assert torch.equal(gnt_native.buffer(name, 0), gnt_torch.buffer(name, 0)), name
    resumed = _fit(config, tmp_path / "resumed", "native", ckpt=str(tmp_path / "ckpt" / "taskepoch=1.ckpt"))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name, value in straight.trainer.callback_metrics.items():
        assert torch.equal(value, resumed.trainer.callback_metrics[name]), name


@pytest.mark.parametrize(
    ("config", "extra", "message"),
    [
        (
            "ewc_pmnist",
            ["--data.stream.init_args.train_size=400"],
            "EWC has no native step engine: use step_kernel: autograd",
        ),
        (
            "cbp_scr",
            ["--model.init_args.accumulate=false"],
            "ContinualBackprop's step_kernel 'native' needs accumulate=True",
        ),
    ],
    ids=["ewc", "cbp-accumulate-false"],
)
def test_what_the_native_kernels_do_not_implement_is_refused(
    config: str, extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from cl_lightning.run.cli import main

    with pytest.raises(SystemExit) as exited:
        main(_args(config, tmp_path, 64, extra=["--model.init_args.step_kernel=native", *extra]), run=False)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_compiler_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cl_lightning.learners import Backprop

    monkeypatch.setenv("CC", "no-such-compiler-cl")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built here yet
    native.library.cache_clear()
    try:
        with pytest.raises(native.NativeUnavailableError, match="no C compiler: 'no-such-compiler-cl'"):
            Backprop(input_shape=(20,), num_outputs=1, task_type="regression", step_kernel="native")
    finally:
        native.library.cache_clear()


@pytest.mark.parametrize(
    ("config", "extra", "reason"),
    [
        ("bp_scr", ["--model.init_args.optimizer=cl_lightning.nn.AdamGnT"], "implements Adam / AdamW, not AdamGnT"),
        ("cbp_scr", ["--trainer.precision=64-true"], "computes in float32 only"),
    ],
    ids=["bp-adamgnt", "cbp-float64"],
)
def test_what_the_kernel_does_not_implement_is_refused_before_the_first_batch(
    config: str, extra: list[str], reason: str, tmp_path: Path
) -> None:
    """Backprop configured with AdamGnT, CBP in float64: refused in one line when training starts."""
    from cl_lightning.run.cli import main

    kernel = "--model.init_args.step_kernel=native"
    cli = main(_args(config, tmp_path, 64, extra=[kernel, *extra, "--data.stream.init_args.num_tasks=1"]), run=False)
    with pytest.raises(ValueError, match="use step_kernel: autograd") as refused:
        cli.trainer.fit(cli.model, cli.datamodule)
    assert str(refused.value) == (
        f"{type(cli.model).__name__}'s step_kernel 'native' {reason}: use step_kernel: autograd"
    )
    assert cli.trainer.global_step == 0


def test_the_kernels_arguments_are_checked_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel's argument struct is compared with the C side's table on loading: a field out of place on the
    Python side (here ``grad`` and ``flat`` swapped) is a load error naming it, not memory corruption."""
    native._check_layouts(native.library(), native._SOURCE)  # as shipped: every struct agrees

    class Swapped(ctypes.Structure):
        _fields_ = [native._MlpArgs._fields_[1], native._MlpArgs._fields_[0], *native._MlpArgs._fields_[2:]]

    monkeypatch.setitem(native._KERNELS, "mlp_mse_adam", Swapped)
    with pytest.raises(native.NativeUnavailableError, match=r"mlp_mse_adam's arguments differ .* field 0 .*'flat'"):
        native._check_layouts(native.library(), native._SOURCE)


def test_the_shape_specialised_attention_kernel_equals_the_generic_one_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attention kernel built for the SCR scorer's shape (its widths compile-time constants) and the generic
    build: the same operations in the same order, the same numbers."""
    specialised = _attention("native", 0, 300, supports=20)
    monkeypatch.setattr(native, "_attention_library", lambda *shape: native.library())
    generic = _attention("native", 0, 300, supports=20)
    for a, b in zip(specialised, generic, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("opt_cls", "flat_cls", "adam", "expected"),
    [
        (torch.optim.Adam, FlatAdam, {"lr": 1e-3, "betas": (0.8, 0.99)}, (1e-3, 0.8, 0.99, 0.0, 1e-8, False, None)),
        (torch.optim.AdamW, FlatAdam, {"lr": 1e-3, "weight_decay": 0.1}, (1e-3, 0.9, 0.999, 0.1, 1e-8, True, None)),
        (AdamGnT, FlatAdamGnT, {"lr": 1e-4, "eps": 1e-6}, (1e-4, 0.9, 0.999, 0.0, 1e-6, False, "corrected")),
        (AdamGnT, FlatAdamGnT, {"update_rule": "reference"}, (1e-3, 0.9, 0.999, 0.0, 1e-8, False, "reference")),
    ],
    ids=["adam", "adamw", "adamgnt", "adamgnt-reference"],
)
def test_flat_optimisers_name_their_hyperparameters(opt_cls, flat_cls, adam, expected) -> None:
    net = MLP(20, 1, [4])
    flat = flat_cls().bind(opt_cls(net.parameters(), **adam), list(net.parameters()))
    assert flat.hyperparameters == AdamHyperparameters(*expected)


def test_the_interface_benchmark_builds_from_a_clean_cache_and_times_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``benchmarks/native_interface.py`` (ctypes rows: the torch extension's build takes a minute)."""
    from benchmarks import native_interface

    monkeypatch.setattr("sys.argv", ["native_interface"])
    result = native_interface.main(["--small", "--no-cpp", "--threads", "1"])
    assert set(result["build"]) == {"ctypes"}
    assert result["build"]["ctypes"][0]["wall"] > 0
    assert set(result["us_per_step"]) == {f"{net} T={t} ctypes" for net in ("bp", "qoa") for t in (1000, 1)}


def _dead_units(layer: nn.Linear, units: int) -> None:
    """Make the first ``units`` outputs of ``layer`` inactive on inputs in {0, 1}: a ReLU after it passes 0 for them,
    so their incoming weights and bias, and the next layer's weights from them, have an exact gradient of 0."""
    with torch.no_grad():
        layer.bias[:units] = -100.0


def _mlp_case(gnt: bool) -> tuple[list[nn.Parameter], torch.Tensor, object, object]:
    """Backprop's (Adam) or CBP's (AdamGnT, generate-and-test) MLP on one chunk: its parameters, the eager loss,
    the fresh optimiser and the network steps."""
    from cl_lightning.nn.network_steps import GenerateAndTestSteps, MLPSteps

    torch.manual_seed(0)
    net = MLP(20, 1, [40, 40])
    _dead_units(net.layers[0], 10)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 2, (1, 8, 20), generator=gen).float(), torch.randn(1, 8, 1, generator=gen)
    params, layers = list(net.parameters()), list(net.layers)
    loss = nn.functional.mse_loss(net(x[0]), y[0])
    if not gnt:
        return params, loss, torch.optim.Adam(params, lr=1e-3), MLPSteps(layers, x, y)
    opt = AdamGnT(params, lr=1e-3)
    steps = GenerateAndTestSteps(layers, x, y, GenerateAndTest([40, 40], 1e-2), opt, partial(_generator, 0))
    return params, loss, opt, steps


def _attention_case() -> tuple[list[nn.Parameter], torch.Tensor, object, object]:
    """Label-free QOA's scorer on one step (the 21st point the query over the 20 before it), as ``_mlp_case``."""
    from cl_lightning.nn.network_steps import WindowAttentionSteps

    scorer, params = _scorer(1)
    _dead_units(scorer.first, 5)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 2, (21, 20), generator=gen).float(), torch.randn(21, 1, generator=gen)
    sx, sy, qx, qy = x[:20], y[:20], x[20:], y[20:]
    h = torch.relu(scorer.first(torch.cat([sx, qx.expand(20, -1)], 1)))
    for layer in scorer.hidden:
        h = torch.relu(layer(h))
    p = scorer.out(h).view(1, -1).softmax(-1)
    loss = nn.functional.mse_loss(p @ sy, qy)
    steps = WindowAttentionSteps(scorer.first, [*scorer.hidden, scorer.out], x, y, 20)
    return params, loss, torch.optim.Adam(params, lr=1e-3, fused=True), steps


@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("case", ["backprop", "cbp", "qoa"])
def test_a_parameter_whose_eager_gradient_is_zero_stays_put_in_a_fast_step(case: str, kernel: str) -> None:
    """#46: one step from the same state (fresh optimiser: zero moments), eager autograd against the network's fast
    steps (torch and C): every element whose eager gradient is exactly 0 (here the units of a layer that no input
    activates, and the weights they feed) keeps its value bit for bit; Adam would turn any rounding noise there into
    a step of about ``lr``."""
    params, loss, opt, steps = _attention_case() if case == "qoa" else _mlp_case(gnt=case == "cbp")
    zero = [g == 0 for g in torch.autograd.grad(loss, params)]
    assert sum(int(z.sum()) for z in zero) >= 200  # the dead units' weights: the check is not empty
    before = [p.detach().clone() for p in params]
    flat = (FlatAdamGnT() if case == "cbp" else FlatAdam()).bind(opt, params)
    steps.torch(flat) if kernel == "torch" else steps.native(flat)
    flat.release()
    for p, b, z in zip(params, before, zero, strict=True):
        assert torch.equal(p.detach()[z], b[z])
        assert not torch.equal(p.detach(), b) or bool(z.all())  # the others did move
