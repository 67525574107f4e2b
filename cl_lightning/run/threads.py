"""The command line's thread policy: every usable core, with OpenMP's waiting and the training steps' thread count
chosen from the load the machine has when the command starts.

Set before torch is imported (the entry point, :mod:`cl_lightning.__main__`, applies it first), so OpenMP starts
with it. Measured on a 2-core machine (docs/results/threads.md): on an idle machine all cores with OpenMP's default
waiting (spin a while, then sleep) are fastest for the CPU demo and the paper-size run alike; beside busy processes
the demo's small training products want one thread (two threads wait for each other's time slices, 1.3-6x slower)
while the paper-size run's large evaluation products still gain from all cores. So on a busy machine the policy runs
the training steps on one thread and everything else (evaluation, probes) on every core, waiting passively (a thread
that waits sleeps at once and leaves its core to the others).

A program that imports the package keeps its own settings, and a thread or waiting variable of the user's
(``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) turns the policy off: the user's
settings run unchanged. The thread count changes the order in which products sum, so a run's numbers depend on the
training steps' count: ``OMP_NUM_THREADS=N`` pins it (every phase on N threads). A sweep's trial runs one thread
unless pinned, and keeps the count it started with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SWEEP_THREADS = 1
"""A sweep trial's thread count unless the user pins one: trials are long and share machines."""
BUSY_CORES = 0.5
"""Cores in use by other processes at start from which the machine counts as busy."""
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
PROC_STAT = Path("/proc/stat")
SAMPLE_SECONDS = 0.2


@dataclass(frozen=True)
class ThreadPolicy:
    """The threads one command runs: ``threads`` outside training steps, ``train_threads`` inside them, and
    OpenMP's waiting (``wait``: ``OMP_WAIT_POLICY``, None for OpenMP's default), chosen from ``busy_cores``."""

    threads: int
    train_threads: int
    wait: str | None
    busy_cores: float

    def environment(self) -> dict[str, str]:
        """The variables to set before torch (and so OpenMP) starts."""
        env = {"OMP_NUM_THREADS": str(self.threads)}
        return env | ({"OMP_WAIT_POLICY": self.wait} if self.wait else {})

    def per_process(self, processes: int) -> ThreadPolicy:
        """The policy for one of ``processes`` processes sharing these cores (several ranks on one CPU): the cores
        divided between them, at least one thread each."""
        threads = max(1, self.threads // processes)
        return ThreadPolicy(threads, min(self.train_threads, threads), self.wait, self.busy_cores)

    def describe(self) -> str:
        """One line for the fit's start: what it runs and why (the load is the machine's, whatever share of its cores
        this process takes)."""
        load = f"{self.busy_cores:.1f} cores busy at start"
        if self.train_threads == self.threads:
            return f"Threads: {self.threads} ({load}); OMP_NUM_THREADS=N pins them"
        return (
            f"Threads: {self.threads}, training steps on {self.train_threads}, waiting passively ({load}); "
            "OMP_NUM_THREADS=N pins them"
        )


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


def _cpu_times(stat: str, cpus: set[int]) -> tuple[int, int]:
    """Busy and total jiffies of ``cpus`` in a ``/proc/stat`` text. Busy: user, system, irq, softirq and steal time,
    and nice time too when this process is itself niced (a niced process competes with niced ones only)."""
    busy = total = 0
    niced = os.getpriority(os.PRIO_PROCESS, 0) > 0 if hasattr(os, "getpriority") else False
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
        busy += user + system + irq + softirq + steal + (nice if niced else 0)
        total += user + nice + system + idle + iowait + irq + softirq + steal
    return busy, total


def busy_cores(
    read: Callable[[], str] = PROC_STAT.read_text,
    seconds: float = SAMPLE_SECONDS,
    cpus: set[int] | None = None,
) -> float:
    """Cores of this process's affinity that other processes keep busy, sampled over ``seconds`` (0 where
    ``/proc/stat`` cannot be read)."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    try:
        busy0, total0 = _cpu_times(read(), cpus)
        time.sleep(seconds)
        busy1, total1 = _cpu_times(read(), cpus)
    except (OSError, ValueError):
        return 0.0
    elapsed = total1 - total0
    return len(cpus) * (busy1 - busy0) / elapsed if elapsed > 0 else 0.0


def choose_policy(cores: int, busy: float) -> ThreadPolicy:
    """The policy for ``cores`` usable cores of which ``busy`` are in use by others: all cores and OpenMP's default
    waiting on an idle machine; on a busy one, one thread in training steps and passive waiting."""
    if cores <= 1 or busy < BUSY_CORES:
        return ThreadPolicy(cores, cores, None, busy)
    return ThreadPolicy(cores, 1, "PASSIVE", busy)


def user_pinned(environ: MutableMapping[str, str]) -> bool:
    """Whether the user set a thread or waiting variable (the policy then changes nothing)."""
    return any(environ.get(name, "").strip() for name in (*THREAD_VARIABLES, *WAIT_VARIABLES))


ACTIVE: ThreadPolicy | None = None
"""The policy the entry point applied in this process (None: the user's settings, or a program's own)."""


def apply_thread_policy(
    environ: MutableMapping[str, str] | None = None, measure: Callable[[], float] = busy_cores
) -> ThreadPolicy | None:
    """Choose the policy and add its variables to ``environ`` (default: this process's, before torch is imported),
    unless the user pinned threads or waiting. Returns the policy applied (also :data:`ACTIVE`), or None."""
    global ACTIVE
    environ = os.environ if environ is None else environ
    if user_pinned(environ):
        return None
    policy = choose_policy(usable_cores(), measure())
    environ.update(policy.environment())
    ACTIVE = policy
    return policy


def sweep_threads(environ: MutableMapping[str, str]) -> int:
    """The intra-op threads of a sweep's new trial started from ``environ``: the user's thread variable if set, else
    :data:`SWEEP_THREADS`."""
    values = (environ.get(name, "").strip() for name in THREAD_VARIABLES)
    return next((int(v) for v in values if v.isdigit() and int(v) > 0), SWEEP_THREADS)
