"""The command line's thread policy: every core the process may use, and OpenMP threads that wait briefly.

With no thread variable set, ``python -m cl_lightning`` runs one intra-op thread per usable core (its CPU affinity,
capped by a cgroup CPU quota: :func:`usable_cores`), and with no waiting variable set, OpenMP's waiting threads spin
for :data:`SPIN_COUNT` rounds before they sleep. torch's CPU build uses GNU OpenMP, whose idle threads spin for
300,000 rounds by default: on an idle machine that keeps the next parallel region cheap, on a busy one a spinning
thread burns the time slice its partner needs (two spinning threads on two busy cores ran 5-10x slower than one). A
short spin keeps the first and avoids the second (docs/results/threads.md measures the four cases).

Both are environment variables read when OpenMP starts, i.e. when torch is imported, so the entry point
(:mod:`cl_lightning.__main__`) applies the policy before anything imports torch. A program that imports the package
keeps its own settings, and any ``OMP_*`` / ``MKL_*`` / ``GOMP_*`` setting of the user's wins over the policy.
The thread count changes the order in which products sum, so a run's numbers depend on it (and on it only):
``OMP_NUM_THREADS=N`` pins it. A sweep records each trial's count and resumes it with the same one.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = 100_000  # GNU OpenMP's spin rounds before a waiting thread sleeps (its default: 300,000)
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def _is_set(environ: MutableMapping[str, str], names: tuple[str, ...]) -> bool:
    return any(environ.get(name, "").strip() for name in names)


def cgroup_cores(path: Path = CGROUP_CPU_MAX) -> int | None:
    """Whole cores a cgroup v2 CPU quota grants (``cpu.max``: quota and period in µs); None without a quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, int(quota) // int(period))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by the cgroup's CPU quota."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cores()
    return max(1, min(affinity, quota) if quota else affinity)


def policy_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The variables the policy would add to ``environ`` (default: this process's): none the user has set.

    The thread count when neither ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` is set; the spin count when neither
    ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` is.
    """
    environ = os.environ if environ is None else environ
    added: dict[str, str] = {}
    if not _is_set(environ, THREAD_VARIABLES):
        added["OMP_NUM_THREADS"] = str(usable_cores())
    if not _is_set(environ, WAIT_VARIABLES):
        added["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return added


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
    """The intra-op threads a ``python -m cl_lightning`` child started with ``environ`` runs."""
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return usable_cores()
