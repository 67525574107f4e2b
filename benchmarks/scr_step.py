"""Slowly changing regression: µs per training step of Backprop, QOA and Continual Backprop with the configured
monitors, before and after chunked stepping, beside a bare PyTorch loop; and the Permuted-MNIST step time before and
after.

Every Lightning variant is one ``fit`` of the experiment config in a child process on one thread, its monitors as
configured (forgetting, plasticity, Hessian, cost; no checkpoint, no logger). The child times, in process CPU
seconds, each task from its first training batch's start to its last one's end (Lightning's loop, the learner,
every callback's per-batch hooks; not the evaluation or the monitors' once-per-task work) and divides by the
points trained on. Variants:

- ``before``: the code at ``--before REV`` (``git archive`` into a temporary folder), its own configs: one point per
  Lightning batch, and ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` left as Lightning sets it;
- ``one point`` (with ``--one-point``): this tree, ``--data.steps_per_batch=1``;
- ``autograd``: this tree as configured (``steps_per_batch: 100``) with ``--model.init_args.step_kernel=autograd``:
  100 predict-then-learn steps per batch through autograd and the optimiser, one chunk at a time;
- ``fused``: this tree as configured (``step_kernel: fused``): the same steps through ``learn_fused`` (hand-written
  gradients, one Adam over views of a flat tensor; bit for bit the autograd numbers, ``tests/test_fused_steps.py``);
- ``floor``: a bare eager loop in this process, the same net, loss and optimiser and the online error kept per
  point (Backprop: MLP 20 -> 40 -> 1, Adam; QOA: scorer [x_j, x_t] 40 -> 20 -> 1 over the 100 previous points,
  softmax, fused Adam; CBP: Backprop's net with AdamGnT and generate-and-test after each step, replacement rate
  1e-3, maturity 10);
- ``hand floor``: the fused step's own loop (``nn.fused_steps``) called bare in this process on the same data,
  no Lightning, no learner, no monitors: what the fused variant would cost with no framework around it;
- ``native``: this tree as configured with ``--model.init_args.step_kernel=native``: the same steps as one C loop
  per chunk (``nn.native``; equal to float32 rounding, not bit for bit; CBP: the C loop runs from one replacement to
  the next, the replacements in Python);
- ``native floor``: that C loop called bare in this process on the same data (one call for all the points).

All variants of a round run back to back, the order reversed every other round (:func:`harness.interleave`).
``--pmnist`` adds the Permuted-MNIST demo configs (``configs/quick_demo.yaml``, Backprop and QOA, 3 tasks),
before vs this tree, so a change for one-point streams shows if it slows chunks of 100.

``--learners`` picks whose child fits run (default all three; ``--small``: Backprop's); the floors run for each.

    python -m benchmarks.scr_step [--before REV] [--pmnist] [--no-scr] [--one-point] [--learners bp qoa cbp]
        [--tasks 2] [--train-size 9000] [--repeats 3] [--out docs/results/scr_speed]
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.harness import ROOT, Bench, interleave, parser
from cl_lightning.nn import MLP, AdamGnT, GenerateAndTest, PairScorer, native
from cl_lightning.nn.fused_steps import attention_mse_steps, mlp_steps
from cl_lightning.nn.optim import FlatAdam, FlatAdamGnT, drop_unloadable_nvml_check

# The child: one fit, timed per task from the first training batch to the last; prints one JSON line.
_CHILD = """
import json, sys, time
import torch
from lightning.pytorch import Callback
from cl_lightning.run.cli import main

torch.set_num_threads(1)

class Timer(Callback):
    cpu, points, start, end = 0.0, 0, None, 0.0

    def on_train_epoch_start(self, trainer, module):
        self.start = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.start is None:
            self.start = time.process_time()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.end = time.process_time()
        self.points += batch[0].numel() // batch[0].shape[-1]  # flat inputs: (B, D) or (K, B, D)

    def on_train_epoch_end(self, trainer, module):
        self.cpu += self.end - self.start

cli = main(sys.argv[1:], run=False)
timer = Timer()
cli.trainer.callbacks.append(timer)
cli.trainer.fit(cli.model, cli.datamodule)
print(json.dumps({"us_per_step": timer.cpu / timer.points * 1e6, "points": timer.points}))
"""

SCR = {"bp": "bp_scr", "qoa": "qoa_scr", "cbp": "cbp_scr"}
# Every configured monitor stays (the same per-batch hook dispatch); their once-per-task probes, which the per-step
# time leaves out, are made small so a fit ends sooner on a loaded machine.
LIGHT = ["--callbacks.hessian.init_args.num_queries=10", "--callbacks.plasticity.init_args.probe_size=100"]
PMNIST = {"bp": ["bp_pmnist", "quick_demo"], "qoa": ["qoa_pmnist", "quick_demo", "quick_qoa"]}


def _fit_us(root: Path, configs: list[str], overrides: list[str], work: Path) -> float:
    """µs per training step of one child fit of ``configs`` (from ``root``'s tree and ``configs/``)."""
    args = [a for c in configs for a in ("--config", str(root / "configs" / f"{c}.yaml"))]
    args += [
        *overrides,
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--callbacks.checkpoint=null",
        f"--trainer.default_root_dir={work}",
    ]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"child fit failed ({root}, {configs}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["us_per_step"]


def _floor(
    opt: torch.optim.Optimizer,
    points: int,
    loss_of: Callable[[int], Tensor],
    after_step: Callable[[int], object] | None = None,
) -> Callable[[], float]:
    """A bare eager loop over ``points`` steps: the loss of point ``i`` (its prediction made first), its online error
    kept, one optimiser step, then ``after_step(i)`` if given; returns a function timing one pass (µs per step,
    process CPU time)."""
    errors = torch.empty(points)

    def run() -> float:
        start = time.process_time()
        for i in range(points):  # sequential: one point per step
            loss = loss_of(i)
            errors[i] = loss.detach()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step(i)
        return (time.process_time() - start) / points * 1e6

    return run


def _bp_floor(points: int) -> Callable[[], float]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 40), nn.ReLU(), nn.Linear(40, 1))
    x, y = torch.randint(0, 2, (points, 1, 20)).float(), torch.randn(points, 1, 1)
    return _floor(torch.optim.Adam(net.parameters(), lr=1e-4), points, lambda i: (net(x[i]) - y[i]).pow(2).mean())


def _qoa_floor(points: int, supports: int = 100) -> Callable[[], float]:
    torch.manual_seed(0)
    scorer = nn.Sequential(nn.Linear(40, 20), nn.ReLU(), nn.Linear(20, 1))
    x, y = torch.randint(0, 2, (points + supports, 20)).float(), torch.randn(points + supports, 1)

    def loss_of(i: int) -> Tensor:  # the point against the `supports` points just before it
        sx, sy, q = x[i : i + supports], y[i : i + supports], x[i + supports]
        scores = scorer(torch.cat([sx, q.expand(supports, -1)], 1)).squeeze(1)  # (S,)
        return (scores.softmax(0) @ sy - y[i + supports]).pow(2).mean()

    return _floor(torch.optim.Adam(scorer.parameters(), lr=1e-4, fused=True), points, loss_of)


def _gnt() -> GenerateAndTest:
    """cbp_scr's generate-and-test on its 40 hidden units (``configs/cbp_scr.yaml``)."""
    return GenerateAndTest([40], replacement_rate=1e-3, maturity_threshold=10)


def _cbp_floor(points: int) -> Callable[[], float]:
    torch.manual_seed(0)
    net, gnt, features = MLP(20, 1, [40]), _gnt(), []
    layers = list(net.layers)
    x, y = torch.randint(0, 2, (points, 1, 20)).float(), torch.randn(points, 1, 1)
    opt = AdamGnT(net.parameters(), lr=1e-4)

    def loss_of(i: int) -> Tensor:
        h = layers[0](x[i]).relu()  # (1, 40): the features generate-and-test reads after the step
        features[:] = [h.detach()]
        return (layers[1](h) - y[i]).pow(2).mean()

    return _floor(opt, points, loss_of, lambda i: gnt.step(layers, features, opt, torch.Generator().manual_seed(i)))


def _timed(run: Callable[[], Any], points: int) -> Callable[[], float]:
    def timed() -> float:
        start = time.process_time()
        run()
        return (time.process_time() - start) / points * 1e6

    return timed


def _bp_hand_floor(points: int, run: Callable[..., Tensor] = mlp_steps) -> Callable[[], float]:
    """The fused step's loop, bare: :func:`~cl_lightning.nn.fused_steps.mlp_steps` (or ``run``) over ``points``
    points."""
    torch.manual_seed(0)
    net = MLP(20, 1, [40])
    x, y = torch.randint(0, 2, (points, 1, 20)).float(), torch.randn(points, 1, 1)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    adam = FlatAdam().bind(opt, list(net.parameters()))
    return _timed(lambda: run(list(net.layers), adam, x, y), points)


def _qoa_hand_floor(
    points: int, supports: int = 100, run: Callable[..., Tensor] = attention_mse_steps
) -> Callable[[], float]:
    """The fused step's loop, bare: :func:`~cl_lightning.nn.fused_steps.attention_mse_steps` (or ``run``) along
    ``points`` steps."""
    torch.manual_seed(0)
    scorer = PairScorer(20, 0, 20, 0)
    x, y = torch.randint(0, 2, (points + supports, 20)).float(), torch.randn(points + supports, 1)
    opt = torch.optim.Adam(scorer.parameters(), lr=1e-4, fused=True)
    adam = FlatAdam().bind(opt, list(scorer.parameters()))
    layers = [*scorer.hidden, scorer.out]
    return _timed(lambda: run(scorer.first, layers, adam, x, y, supports), points)


def _cbp_hand_floor(points: int, kernel: str = "torch") -> Callable[[], float]:
    """The fused step's loop, bare: :func:`~cl_lightning.nn.fused_steps.mlp_steps` with AdamGnT on a flat tensor
    and generate-and-test after each update (``kernel="native"``: :func:`~cl_lightning.nn.native.cbp_mse_steps`, the
    same steps and replacements, one call for all the points)."""
    torch.manual_seed(0)
    net, gnt, draws = MLP(20, 1, [40]), _gnt(), itertools.count()
    layers = list(net.layers)
    x, y = torch.randint(0, 2, (points, 1, 20)).float(), torch.randn(points, 1, 1)
    opt = AdamGnT(net.parameters(), lr=1e-4)
    adam = FlatAdamGnT().bind(opt, list(net.parameters()))

    def generate_and_test(features: list[Tensor]) -> None:
        gnt.step(layers, features, opt, torch.Generator().manual_seed(next(draws)))

    if kernel == "native":  # a generator at each replacement only (the torch loop makes one a step)
        return _timed(lambda: native.cbp_mse_steps(layers, adam, gnt, x, y, opt, torch.Generator().manual_seed), points)
    return _timed(lambda: mlp_steps(layers, adam, x, y, generate_and_test), points)


NATIVE = {  # the native kernel, bare: the hand floors' loops with nn.native's functions, one call for all the points
    "bp": lambda points: _bp_hand_floor(points, native.mlp_mse_steps),
    "qoa": lambda points: _qoa_hand_floor(points, run=native.attention_mse_steps),
    "cbp": lambda points: _cbp_hand_floor(points, "native"),
}
NATIVE_ARG = "--model.init_args.step_kernel=native"
AUTOGRAD_ARG = "--model.init_args.step_kernel=autograd"


def _checkout(rev: str, into: Path) -> Path:
    """The tree at ``rev`` (``git archive`` of this repository), extracted under ``into``."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _row(name: str, variant: str, runs: list[float], before: float | None, floors: list[float | None]) -> list[Any]:
    mid = median(runs)
    return [
        name,
        variant,
        f"{min(runs):.0f}–{max(runs):.0f}",
        round(mid, 1),
        f"{before / mid:.2f}" if before else "",
        *(f"{mid / floor:.2f}" if floor else "" for floor in floors),
    ]


_FLOORS = {
    "bp": (_bp_floor, _bp_hand_floor),
    "qoa": (_qoa_floor, _qoa_hand_floor),
    "cbp": (_cbp_floor, _cbp_hand_floor),
}


def _scr_variants(
    scr: list[str],
    size: int,
    before: Path | None,
    work: Path,
    one_point: bool,
    fits: tuple[str, ...] = tuple(SCR),
    floors: tuple[str, ...] = tuple(SCR),
) -> dict[str, Callable[[], float]]:
    """Every SCR variant by name (the module docstring), each a function timing one run; child fits of the learners
    in ``fits`` only, the floors (in this process) of those in ``floors``."""
    variants: dict[str, Callable[[], float]] = {}
    for name, config in SCR.items():
        if name not in fits:
            continue
        if before is not None:
            variants[f"scr {name} before"] = lambda c=config: _fit_us(before, [c], scr, work)
        if one_point:
            variants[f"scr {name} one point"] = lambda c=config: _fit_us(
                ROOT, [c], [*scr, "--data.steps_per_batch=1"], work
            )
        variants[f"scr {name} autograd"] = lambda c=config: _fit_us(ROOT, [c], [*scr, AUTOGRAD_ARG], work)
        variants[f"scr {name} fused"] = lambda c=config: _fit_us(ROOT, [c], scr, work)
        if name in NATIVE and native.available():
            variants[f"scr {name} native"] = lambda c=config: _fit_us(ROOT, [c], [*scr, NATIVE_ARG], work)
    for name in floors:
        floor, hand_floor = _FLOORS[name]
        variants[f"scr {name} floor"] = floor(size)
        variants[f"scr {name} hand floor"] = hand_floor(size)
        if name in NATIVE and native.available():
            variants[f"scr {name} native floor"] = NATIVE[name](size)
    return variants


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time every variant of Backprop, QOA and CBP on slowly changing regression (and Permuted MNIST with ``--pmnist``),
    interleaved; return µs per training step by learner and variant."""
    p = parser(__doc__, repeats=3)
    p.add_argument("--before", default=None, help="git revision of the pre-change code (default: not timed)")
    p.add_argument("--tasks", type=int, default=2, help="SCR tasks per fit")
    p.add_argument("--train-size", type=int, default=9000, help="SCR points per task (paper: 9,000)")
    p.add_argument("--pmnist", action="store_true", help="also time the Permuted-MNIST demo configs (3 tasks)")
    p.add_argument("--one-point", action="store_true", help="also time one point per Lightning batch")
    p.add_argument("--no-scr", action="store_true", help="time no SCR variant (with --pmnist: Permuted MNIST only)")
    p.add_argument("--learners", nargs="+", choices=list(SCR), default=list(SCR), help="SCR learners to time")
    bench = Bench.start("scr_step", p, argv)
    args = bench.args
    tasks, size, repeats = (1, 200, 1) if args.small else (args.tasks, args.train_size, args.repeats)
    drop_unloadable_nvml_check()  # the floor as this package now runs (the harness imported Lightning)
    scr = [f"--data.stream.init_args.num_tasks={tasks}", f"--data.stream.init_args.train_size={size}", *LIGHT]
    pmnist = ["--data.stream.init_args.num_tasks=3"] + (["--data.stream.init_args.train_size=1000"] * args.small)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        before = _checkout(args.before, work / "before") if args.before else None
        learners = tuple(args.learners)
        fits = ("bp",) if args.small else learners  # --small: Backprop's two child fits (the tests' budget)
        variants = {} if args.no_scr else _scr_variants(scr, size, before, work, args.one_point, fits, learners)
        for name, configs in PMNIST.items() if args.pmnist else ():
            if before is not None:
                variants[f"pmnist {name} before"] = lambda c=configs: _fit_us(before, c, pmnist, work)
            variants[f"pmnist {name} after"] = lambda c=configs: _fit_us(ROOT, c, pmnist, work)
        runs = interleave(variants, repeats)
    rows = []
    for key, values in runs.items():
        stream, name, variant = key.split(" ", 2)
        timed_fit = variant not in ("before", "floor", "hand floor", "native floor")  # ratios read a fit of this tree
        ref = runs.get(f"{stream} {name} before")
        floors = [runs.get(f"{stream} {name} {f}") for f in ("floor", "hand floor")]
        floors = [median(f) if f and variant not in ("floor", "hand floor", "native floor") else None for f in floors]
        rows.append(_row(f"{stream} {name}", variant, values, median(ref) if ref and timed_fit else None, floors))
    columns = [
        "stream, learner",
        "variant",
        "µs/step range",
        "median",
        "before / this",
        "this / floor",
        "this / hand floor",
    ]
    notes = [f"{repeats} interleaved rounds, process CPU time."]
    if not args.no_scr:
        notes = [f"{tasks} SCR tasks of {size:,} points per fit, " + notes[0]]
    return bench.finish({"us_per_step": runs, "tasks": tasks, "train_size": size}, columns, rows, notes)


if __name__ == "__main__":
    main()
