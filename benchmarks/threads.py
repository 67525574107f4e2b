"""The thread policy against its alternatives, on an idle machine and beside busy processes.

Each variant runs ``python -m cl_lightning fit`` in a child process (the entry point applies the policy before torch
starts OpenMP, so the variants must be processes), with only its environment changed:

- ``policy``: nothing set (the CLI's default: :mod:`cl_lightning.run.threads`);
- ``one``: ``OMP_NUM_THREADS=1``;
- ``spin``: every usable core, ``OMP_WAIT_POLICY=ACTIVE`` (waiting threads spin);
- ``passive``: every usable core, ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep at once);
- ``spin<N>`` (``--spins N``): every usable core, ``GOMP_SPINCOUNT=N``, for choosing the policy's count.

Workloads: ``demo`` (the README's CPU demo command) and ``paper`` (the README's paper-size command, QOA V1 on
Permuted MNIST), each cut to ``--tasks`` tasks. Loads: ``idle`` and ``busy`` (``--busy`` processes that spin a core
each beside it, started before and stopped after every run of that load). The measure is seconds per task after the
first: the spread of the wall times at which consecutive tasks logged their forward score, in the run's event files
(so start-up, imports and the first task, which fills QOA's buffer, are not counted). Rounds interleave the
variants, the order reversed every other round.

    python -m benchmarks.threads --out docs/results/threads                  # the four cases, 2 rounds
    python -m benchmarks.threads --workloads demo --loads busy --spins 10000 100000 300000 --repeats 1
    python -m benchmarks.threads --small                                     # the test: tiny tasks, one round
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Bench, interleave, parser
from cl_lightning.run.threads import THREAD_VARIABLES, WAIT_VARIABLES, usable_cores

WORKLOADS = {  # the README's two commands
    "demo": ["configs/qoa_pmnist.yaml", "configs/quick_demo.yaml", "configs/quick_qoa.yaml"],
    "paper": ["configs/qoa_pmnist.yaml"],
}
SMALL = [  # --small: the demo's code path on tiny tasks
    "--data.stream.init_args.train_size=400",
    "--data.stream.init_args.query_size=100",
    "--data.eval_queries=20",
    "--callbacks.hessian=null",
    "--callbacks.plasticity=null",
]


def variant_environments(spins: Sequence[int] = ()) -> dict[str, dict[str, str]]:
    """Each variant's thread and waiting variables (``policy``: none, the CLI's defaults apply)."""
    cores = str(usable_cores())
    variants = {
        "policy": {},
        "one": {"OMP_NUM_THREADS": "1"},
        "spin": {"OMP_NUM_THREADS": cores, "OMP_WAIT_POLICY": "ACTIVE"},
        "passive": {"OMP_NUM_THREADS": cores, "OMP_WAIT_POLICY": "PASSIVE"},
    }
    return variants | {f"spin{n}": {"OMP_NUM_THREADS": cores, "GOMP_SPINCOUNT": str(n)} for n in spins}


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` processes that each keep a core busy, for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def seconds_per_task(log_dir: Path) -> float:
    """Mean wall seconds between consecutive tasks' forward scores, from the first task's to the last's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    times = sorted(e.wall_time for e in acc.Scalars("eval/forward_acc"))
    if len(times) < 2:
        raise RuntimeError(f"{log_dir}: fewer than two tasks logged")
    return (times[-1] - times[0]) / (len(times) - 1)


CHOSEN: list[str] = []
"""The policy's line (``Threads: …``) of each fit that printed one, in the order they ran."""


def run_fit(configs: Sequence[str], args: Sequence[str], environment: dict[str, str]) -> float:
    """One fit in a child process with ``environment`` over the caller's (thread and wait variables removed)."""
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARIABLES, *WAIT_VARIABLES)} | environment
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "cl_lightning", "fit"]
        command += [a for c in configs for a in ("--config", c)]
        command += [*args, f"--trainer.logger.init_args.save_dir={tmp}", "--trainer.logger.init_args.version=v"]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
        chosen = [line for line in done.stderr.splitlines() if line.startswith("Threads:")]
        CHOSEN.extend(chosen[:1])
        return seconds_per_task(next(Path(tmp).glob("*/v")))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, threads=0, repeats=2)
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--loads", nargs="+", choices=("idle", "busy"), default=["idle", "busy"])
    p.add_argument("--busy", type=int, default=2, help="busy processes beside the run under the 'busy' load")
    p.add_argument("--tasks", type=int, default=None, help="tasks a run (default: demo 8, paper 4; --small 3)")
    p.add_argument("--spins", type=int, nargs="*", default=[], help="extra variants at these GOMP_SPINCOUNT values")
    p.add_argument("--variants", nargs="+", default=None, help="run only these variants")
    bench = Bench.start("threads", p, argv)
    args = bench.args
    environments = variant_environments(args.spins)
    if args.variants:
        environments = {name: environments[name] for name in args.variants}
    default_tasks = {"demo": 8, "paper": 4}
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    chosen: dict[str, dict[str, list[str]]] = {}
    rows = []
    for workload in args.workloads:
        tasks = args.tasks or (3 if args.small else default_tasks[workload])
        fit_args = ["--trainer.enable_progress_bar=false", f"--data.stream.init_args.num_tasks={tasks}"]
        fit_args += SMALL if args.small else []
        for load in args.loads:
            CHOSEN.clear()
            with busy(args.busy if load == "busy" else 0):
                runs = {
                    name: (lambda e=env, c=WORKLOADS[workload], a=fit_args: run_fit(c, a, e))
                    for name, env in environments.items()
                }
                seconds = interleave(runs, args.repeats)
            results.setdefault(workload, {})[load] = seconds
            chosen.setdefault(workload, {})[load] = sorted(set(CHOSEN))
            best = min(statistics.median(s) for s in seconds.values())
            for name, s in seconds.items():
                median = statistics.median(s)
                rows.append([workload, load, name, median, f"{min(s):.3f}-{max(s):.3f}", median / best])
    notes = [
        f"Seconds per task after the first, median and range over {args.repeats} interleaved rounds; the last column "
        f"is the median over the best variant's median in that case. Usable cores: {usable_cores()}; busy: "
        f"{args.busy} processes spinning a core each.",
        *(f"{w} {load}, the policy chose: {'; '.join(lines)}" for w, d in chosen.items() for load, lines in d.items()),
    ]
    columns = ["workload", "load", "variant", "s / task", "range", "÷ best"]
    measured = {"seconds_per_task": results, "usable_cores": usable_cores(), "chosen": chosen}
    return bench.finish(measured, columns, rows, notes)


if __name__ == "__main__":
    main()
