"""CBP on slowly changing regression, torch path against native kernel: where do the two runs part, and why?

``scr_paper``'s CBP ran on the native step kernel; the torch path's run of seed 20 ends 3.5 seed-σ below the native
mean (issue 34, point 5). Both paths compute the same steps to float32 rounding and hand the rare replacements to
the same Python code (:meth:`~cl_lightning.nn.gnt.GenerateAndTest.replace`, the same ``(seed, step)`` draws), so
the question is whether they ever choose different units. This runs ``cbp_scr`` + the authors' warm-up on both
paths for ``--tasks`` tasks (warm-up included), logs every replacement as (step, layer, units) with the *margin* of
the choice (the gap between the highest chosen and the lowest unchosen eligible unit's bias-corrected utility,
relative to the latter), and reports the first replacement at which the sequences differ, the margins there, and
each task's forward MSE on both paths.

Chaos: the sequences agree until a near-tie (a margin at float32-rounding size) picks different units, and the
runs part after that. An algorithmic difference: they part at a step whose margin is large, or at the first
replacement.

    OMP_NUM_THREADS=1 python -m benchmarks.cbp_kernel_paths [--seed 20] [--tasks 20] [--small] [--out DIR]
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from benchmarks.harness import Bench, parser
from cl_lightning.nn.gnt import GenerateAndTest
from cl_lightning.run.compose import CALLBACK_SLOTS

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["what", "torch", "native"]


class _TaskMetrics(Callback):
    """Each task's evaluation metrics (``eval/*``), read at the end of its epoch."""

    def __init__(self) -> None:
        self.tasks: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("eval/")}
        self.tasks.append(metrics)


class _PartedError(Exception):
    """Raised by the recorder at the first replacement that differs from the reference run's."""


def _key(event: dict[str, Any]) -> tuple:
    return event["step"], event["layer"], event["units"]


def _recorder(seed: int, events: list[dict[str, Any]], reference: list[dict[str, Any]] | None):
    """A ``GenerateAndTest.replace`` that logs each layer's choice (step, units, margin) before replacing; with a
    ``reference`` run's events it stops the run at the first event that differs from it."""
    original = GenerateAndTest.replace

    def replace(self, layers, counts, optimizer, generator, h_hats=None):
        step = generator.initial_seed() - seed * 1_000_003  # generator_at(step): seed * 1,000,003 + step
        for i, count in enumerate(counts):
            if count == 0:
                continue
            eligible = self.buffer("age", i) > self.maturity_threshold
            util = self.buffer("bias_corrected_util", i)[eligible].double().sort().values
            chosen, rest = util[:count], util[count:]
            margin = float((rest[0] - chosen[-1]) / rest[0].abs().clamp_min(1e-30)) if rest.numel() else float("inf")
            events.append({"step": step, "layer": i, "count": count, "margin": margin})
        replaced = original(self, layers, counts, optimizer, generator, h_hats)
        units = iter(idx.tolist() for idx, c in zip(replaced, counts, strict=True) if c)
        for k in range(len(events) - sum(1 for c in counts if c), len(events)):
            events[k]["units"] = next(units)
            if reference is not None and (k >= len(reference) or _key(events[k]) != _key(reference[k])):
                raise _PartedError
        return replaced

    return replace


def run(kernel: str, seed: int, tasks: int, small: bool, root: Path, reference: list | None = None) -> dict[str, Any]:
    """One fit of ``cbp_scr`` + the warm-up on ``kernel``; its replacement events and task metrics (stopped at the
    first replacement that differs from ``reference``'s, if given)."""
    from cl_lightning.run.cli import main

    size = ["--data.stream.init_args.train_size=300", "--data.stream.init_args.query_size=100"] if small else []
    args = [
        "--config", str(ROOT / "configs/cbp_scr.yaml"), "--config", str(ROOT / "configs/paper/scr_warmup.yaml"),
        f"--seed_everything={seed}", f"--data.stream.init_args.seed={seed}", f"--model.init_args.seed={seed}",
        f"--data.stream.init_args.num_tasks={tasks}", f"--model.init_args.step_kernel={kernel}", *size,
        "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.enable_model_summary=false",
        *[f"--callbacks.{name}=null" for name in CALLBACK_SLOTS], f"--trainer.default_root_dir={root / kernel}",
    ]  # fmt: skip
    events: list[dict[str, Any]] = []
    original = GenerateAndTest.replace
    GenerateAndTest.replace = _recorder(seed, events, reference)  # type: ignore[method-assign]
    metrics, parted = _TaskMetrics(), False
    try:
        cli = main(args, run=False)
        cli.trainer.callbacks.append(metrics)
        cli.trainer.fit(cli.model, cli.datamodule)
    except _PartedError:
        parted = True
    finally:
        GenerateAndTest.replace = original  # type: ignore[method-assign]
    return {"events": events, "tasks": metrics.tasks, "parted": parted}


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int | None:
    """Index of the first replacement event whose (step, layer, units) differ between the runs (None: none)."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if (x["step"], x["layer"], x["units"]) != (y["step"], y["layer"], y["units"]):
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def stream_task(step: int, warmup: int = 5, warmup_steps: int = 10_000, task_steps: int = 9_000) -> int:
    """The stream task a (0-based) step belongs to: warm-up tasks train on all 10,000 points, the others on 9,000."""
    if step < warmup * warmup_steps:
        return step // warmup_steps
    return warmup + (step - warmup * warmup_steps) // task_steps


def margin_gaps(a: list[dict[str, Any]], b: list[dict[str, Any]], until: int) -> dict[int, dict[str, float]]:
    """Per stream task, over the replacements both paths made alike (the first ``until``), how far apart the two
    paths' margins of the same choice are: median and max of |margin_torch - margin_native| (choices with a finite
    margin strictly between 0 and 1: a real runner-up, not an exact tie)."""
    gaps: dict[int, list[float]] = {}
    for x, y in zip(a[:until], b[:until], strict=True):
        if 0 < x["margin"] < 1 and 0 < y["margin"] < 1:
            gaps.setdefault(stream_task(x["step"]), []).append(abs(x["margin"] - y["margin"]))
    return {t: {"n": len(v), "median": statistics.median(v), "max": max(v)} for t, v in sorted(gaps.items())}


def summarise(result: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """The table rows and notes of a measured (or saved) result."""
    a, b = result["events"]["torch"], result["events"]["native"]
    k = result["first_difference"]
    at = result["at"]
    same = len(a) if k is None else k
    rows: list[list[Any]] = [
        ["replacement events (torch stops at the first difference)", len(a), result["replacements"]["native"]],
        ["replacements made alike before it", same, same],
        ["first differing event: step", *(at[x]["step"] if at[x] else "-" for x in ("torch", "native"))],
        ["  units chosen (layer 0)", *(at[x]["units"] if at[x] else "-" for x in ("torch", "native"))],
        ["  margin of that choice", *(f"{at[x]['margin']:.3g}" if at[x] else "-" for x in ("torch", "native"))],
    ]
    for t, g in margin_gaps(a, b, same).items():
        rows.append(
            [f"task {t}: paths' margin gap ({g['n']} choices)", f"median {g['median']:.2g}", f"max {g['max']:.2g}"]
        )
    nan = float("nan")
    metrics = result["task_metrics"]
    for t, (m, n) in enumerate(zip(metrics["torch"], metrics["native"], strict=False)):
        if "eval/forward_mse" in m:
            rows.append(
                [
                    f"task {t} forward MSE",
                    f"{m.get('eval/forward_mse', nan):.5f}",
                    f"{n.get('eval/forward_mse', nan):.5f}",
                ]
            )
    ties = sum(1 for e in a[:same] if e["margin"] == 0)
    notes = [f"exact ties (margin 0) among the replacements made alike: {ties}, broken alike (towards the lower index)"]
    return rows, notes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Both paths (or ``--from-events``, a saved run), the first difference of their replacement sequences, the
    margin gaps per task and the task metrics; ``cbp_kernel_paths_events.json.gz`` and the harness's files."""
    p = parser(__doc__, out=Path("benchmarks/results/cbp_kernel_paths"))
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--tasks", type=int, default=20, help="tasks in all, the 5 warm-up tasks included")
    p.add_argument("--from-events", type=Path, help="summarise a saved cbp_kernel_paths_events.json[.gz] instead")
    bench = Bench.start("cbp_kernel_paths", p, argv)
    args = bench.args
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_events:
        raw = args.from_events.read_bytes()
        result = json.loads(gzip.decompress(raw) if args.from_events.suffix == ".gz" else raw)
        torch_events = result["events"]["torch"]
        result["events"]["native"] = result["events"]["native"][: len(torch_events) + 10]  # as a measured run saves
    else:
        tasks = 7 if args.small else args.tasks  # the warm-up is 5 tasks
        # the native run first (fast), then the torch path until its first replacement that differs from it
        runs = {"native": run("native", args.seed, tasks, args.small, args.out / "fit")}
        runs["torch"] = run("torch", args.seed, tasks, args.small, args.out / "fit", runs["native"]["events"])
        a, b = runs["torch"]["events"], runs["native"]["events"]
        k = first_difference(a, b)
        result = {
            "seed": args.seed,
            "tasks": tasks,
            "replacements": {"torch": len(a), "native": len(b)},
            "torch_stopped_at_difference": runs["torch"]["parted"],
            "first_difference": k,
            "at": {
                "torch": a[k] if k is not None and k < len(a) else None,
                "native": b[k] if k is not None and k < len(b) else None,
            },
            "task_metrics": {kernel: r["tasks"] for kernel, r in runs.items()},
            # the native run's events past the torch run's end add nothing to the comparison
            "events": {"torch": a, "native": b[: len(a) + 10]},
        }
    (args.out / "cbp_kernel_paths_events.json.gz").write_bytes(gzip.compress(json.dumps(result).encode(), mtime=0))
    rows, notes = summarise(result)
    summary = {k: v for k, v in result.items() if k != "events"}
    summary["margin_gaps"] = margin_gaps(result["events"]["torch"], result["events"]["native"],
                                         len(result["events"]["torch"]) if result["first_difference"] is None
                                         else result["first_difference"])  # fmt: skip
    return bench.finish({**summary, "events": result["events"]}, COLUMNS, rows, notes)


if __name__ == "__main__":
    main()
