"""The command line's thread policy: one intra-op thread unless the user sets a thread variable.

Set before torch is imported (the entry point, :mod:`cl_lightning.__main__`, applies it first), so OpenMP starts
with it. Measured on a 2-core machine (docs/results/threads.md), one thread per usable core
runs the CPU demo 1.4x faster than one thread when the machine is idle and 1.3-6x slower beside two busy processes,
whatever OpenMP's waiting (spinning, passive, or 100,000 spins then sleep); one thread is never far from the best
on a busy machine, so it stays the default until a policy serves both (#46). A program that imports the package keeps
its own settings, and an ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` setting of the user's wins. The thread
count changes the order in which products sum, so a run's numbers depend on it (and on it only):
``OMP_NUM_THREADS=N`` pins it. A sweep records each trial's count and resumes it with the same one.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = 1


def _is_set(environ: MutableMapping[str, str], names: tuple[str, ...]) -> bool:
    return any(environ.get(name, "").strip() for name in names)


def policy_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The variables the policy would add to ``environ`` (default: this process's): ``OMP_NUM_THREADS`` of
    :data:`DEFAULT_THREADS` when neither ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` is set, else nothing."""
    environ = os.environ if environ is None else environ
    return {} if _is_set(environ, THREAD_VARIABLES) else {"OMP_NUM_THREADS": str(DEFAULT_THREADS)}


def apply_thread_policy(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Add :func:`policy_environment` to ``environ`` (default: this process's, before torch is imported).

    Returns:
        What was added.
    """
    environ = os.environ if environ is None else environ
    added = policy_environment(environ)
    environ.update(added)
    return added


def thread_count(environ: MutableMapping[str, str] | None = None) -> int:
    """The intra-op threads a ``python -m cl_lightning`` child started with ``environ`` runs: the first thread
    variable set, in ``environ`` or by the policy."""
    environ = os.environ if environ is None else environ
    merged = {**environ, **policy_environment(environ)}
    values = (merged.get(name, "").strip() for name in THREAD_VARIABLES)
    return next((int(v) for v in values if v.isdigit() and int(v) > 0), DEFAULT_THREADS)
