"""The processes a sweep starts: they die with it, and a SIGTERM / SIGINT to the sweep reaches them.

Where a signal cannot reach the process waiting for a fit (a Ray worker), the sweep writes a stop request file
instead (:func:`cl_lightning.study.trial_run.request_stop`), which :func:`wait_passing_signals` answers with SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # resolved before forking
_state: dict[str, int | None] = {"signum": None, "child": None}  # the signal received, the child waited for


def package_pythonpath() -> str:
    """``PYTHONPATH`` with this package's root first: a child or a Ray worker imports this package, installed or not."""
    return os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p)


def die_with_parent() -> None:
    """In the child (Linux): receive SIGTERM when the parent dies. Runs between fork and exec: one C call."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def received() -> int | None:
    """The SIGTERM / SIGINT received inside :func:`passing_signals` (its number), if any."""
    return _state["signum"]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _state["signum"] = _state["signum"] or signum
    if _state["child"] is not None:
        os.kill(_state["child"], signum)


@contextmanager
def passing_signals() -> Iterator[None]:
    """While inside: SIGTERM / SIGINT are recorded and passed to the waited-for child instead of ending this process."""
    _state["signum"] = None
    handlers = catch_signals()
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def catch_signals() -> dict[int, object]:
    """Record SIGTERM / SIGINT (and pass them on) from now on; returns the handlers replaced. Call it again after
    something installed its own (``ray.init`` does, for SIGTERM)."""
    return {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}


def catching() -> bool:
    """Whether SIGTERM is being recorded and passed on (inside :func:`passing_signals`)."""
    return signal.getsignal(signal.SIGTERM) is _on_signal


def _kill(pid: int, signum: int) -> None:
    """``os.kill`` that ignores a child already gone (``Popen.send_signal`` would reap it, failing the wait)."""
    with suppress(ProcessLookupError):
        os.kill(pid, signum)


def wait_passing_signals(proc: subprocess.Popen, stop_file: Path) -> tuple[int, resource.struct_rusage]:
    """Wait for ``proc`` (its ``os.wait4`` status and resource usage), passing it a signal received meanwhile, and
    SIGTERM once ``stop_file`` exists (polled every 0.2 s)."""
    _state["child"] = proc.pid
    try:
        if _state["signum"] is not None:  # the signal came while the child was starting
            _kill(proc.pid, _state["signum"])
        asked = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                return status, usage
            if not asked and stop_file.exists():
                asked = True
                _kill(proc.pid, signal.SIGTERM)
            time.sleep(0.2)
    finally:
        _state["child"] = None
