"""The one harness every benchmark runs through.

A benchmark is ``python -m benchmarks.<name> [flags]`` and a ``main(argv) -> dict``. The harness gives it:

- the shared flags (:func:`parser`): ``--threads`` (torch threads, set before anything runs), ``--small`` (tiny
  sizes: the same code path in seconds, what the tests run), ``--out`` (a folder for ``<name>.json`` and
  ``<name>.md``) and ``--repeats`` (interleaved rounds);
- clocks that read wall and process-CPU seconds together (:func:`clock`): on a shared machine CPU seconds of a
  one-thread process are what descheduling distorts least;
- interleaved A/B runs (:func:`interleave`): each variant once per round, the order reversed every other round,
  so the machine's load falls on every variant alike;
- the matmul yardstick (:func:`matmul_gflops`): what this machine does at its best, to read rates against;
- the environment stamp (:func:`environment`): commit, CPU model, cores, threads, load average before and after,
  torch / Lightning / Python versions, date;
- the output (:meth:`Bench.finish`): the result as JSON and a Markdown table with the stamp under it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import lightning
import torch

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def parser(
    doc: str | None,
    *,
    threads: int = 1,
    repeats: int = 1,
    repeats_help: str = "interleaved rounds of each variant",
    out: Path | None = None,
) -> argparse.ArgumentParser:
    """An argument parser with the shared flags; a benchmark adds its own.

    Args:
        doc: The benchmark's module docstring (the help text).
        threads: Default of ``--threads`` (0: leave torch's setting).
        repeats: Default of ``--repeats``.
        repeats_help: What ``--repeats`` repeats in this benchmark (seeds, for one that averages over seeds).
        out: Default of ``--out`` (None: write nothing), for a benchmark that always writes its own files there.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=threads, help="torch threads (0: leave as is)")
    p.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    p.add_argument("--small", action="store_true", help="tiny sizes: the same code path in seconds (the tests)")
    where = "folder for <name>.json and <name>.md" + ("" if out is None else " (default: %(default)s)")
    p.add_argument("--out", type=Path, default=out, help=where)
    return p


@dataclass
class Timing:
    """Seconds of one timed block: wall clock and this process's CPU time (all its threads)."""

    wall: float = 0.0
    cpu: float = 0.0


def sync(device: torch.device | str | None) -> None:
    """Wait for a CUDA device's queued work (nothing on the CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def clock(device: torch.device | str | None = None) -> Iterator[Timing]:
    """Time the block in wall and process-CPU seconds, synchronising ``device`` on entry and exit."""
    timing = Timing()
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        sync(device)
        timing.wall, timing.cpu = time.perf_counter() - wall, time.process_time() - cpu


def interleave(variants: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Run each variant once per round, ``repeats`` rounds, the order reversed every other round.

    Returns:
        Each variant's results in round order.
    """
    results: dict[str, list[T]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name].append(variants[name]())
    return results


def matmul_gflops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 4
) -> tuple[float, float]:
    """The yardstick: best of three rounds of ``reps`` products of two ``n × n`` matrices.

    Returns:
        GFLOP per wall second and per CPU second of this process (all threads together).
    """
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
    c = a @ b
    best, best_cpu = 0.0, 0.0
    for _ in range(3):
        with clock(device) as t:
            for _ in range(reps):
                torch.mm(a, b, out=c)
        best = max(best, 2 * n**3 * reps / max(t.wall, 1e-9) / 1e9)
        best_cpu = max(best_cpu, 2 * n**3 * reps / max(t.cpu, 1e-9) / 1e9)
    return best, best_cpu


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def environment() -> dict[str, Any]:
    """Where and on what the benchmark runs (``load_after`` is added by :meth:`Bench.finish`)."""
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "commit": commit,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "load_before": list(os.getloadavg()),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def stamp_line(env: Mapping[str, Any]) -> str:
    """The environment as one Markdown line."""
    load = f"{env['load_before'][0]:.1f}"
    if "load_after" in env:
        load += f" → {env['load_after'][0]:.1f}"
    gpu = f", GPU {env['gpu']}" if env.get("gpu") else ""
    return (
        f"commit `{env['commit']}`, {env['cpu'] or 'CPU unknown'} ({env['cores']} cores){gpu}, {env['threads']} "
        f"torch threads, load average {load}, torch {env['torch']}, Lightning {env['lightning']}, Python "
        f"{env['python']}, {env['date']}"
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats to 4 significant digits, integers with thousands separators."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Bench:
    """One benchmark run: parses the flags, sets the threads, stamps the environment, writes the result.

    Args:
        name: The benchmark's module name (the output files' stem).
        args: The parsed flags (from :func:`parser`).
    """

    name: str
    args: argparse.Namespace
    env: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, p: argparse.ArgumentParser, argv: Sequence[str] | None) -> Bench:
        """Parse ``argv`` (default: the command line), set torch's threads, stamp the environment."""
        argv = list(sys.argv[1:] if argv is None else argv)
        args = p.parse_args(argv)
        if args.threads:
            torch.set_num_threads(args.threads)
        sys.argv = sys.argv[:1]  # the LightningCLI gets its arguments from the benchmark, not this command line
        return cls(name, args, environment(), argv)

    def finish(
        self, result: dict[str, Any], columns: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Print the table, the notes and the stamp; write ``<out>/<name>.json`` and ``.md``; return the result.

        The returned dict is ``result`` plus ``benchmark``, ``args``, ``environment`` and ``table`` (the Markdown).
        """
        self.env["load_after"] = list(os.getloadavg())
        table = markdown(columns, rows)
        text = "\n\n".join([table, *notes, f"Environment: {stamp_line(self.env)}"])
        print(text, flush=True)
        args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        out = {"benchmark": self.name, "args": args, "environment": self.env, **result, "table": table}
        if self.args.out is not None:
            self.args.out.mkdir(parents=True, exist_ok=True)
            command = " ".join(["python -m", f"benchmarks.{self.name}", *self.argv])
            (self.args.out / f"{self.name}.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
            (self.args.out / f"{self.name}.md").write_text(f"`{command}`\n\n{text}\n")
        return out
