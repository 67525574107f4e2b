"""SIGTERM / SIGINT outside a ``fit``'s steps: while ``python -m cl_lightning fit`` starts, and after the run finished.

:class:`~cl_lightning.run.stopping.GracefulStop` handles them while the CLI's ``main`` runs; around it
(:func:`watch`, called by :mod:`cl_lightning.__main__` before it imports the CLI) a signal while starting is recorded
and taken over by ``GracefulStop`` (:func:`take`); after a ``fit`` that ran to its end (:func:`finished`) it gets one
line and the exit code stays 0; after one that ended otherwise it changes nothing; in the last ``atexit`` callback
both are ignored (Python's shutdown resets the handlers it set, but keeps ``SIG_IGN``). No torch, no Lightning.
"""

from __future__ import annotations

import atexit
import os
import signal
from dataclasses import dataclass
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class FirstSignal:
    """Keeps the first signal :meth:`record` is given (a later one changes nothing): this module's while the process
    starts, :class:`~cl_lightning.run.stopping.GracefulStop`'s while the command runs."""

    signum: int | None = None

    def record(self, signum: int | None, frame: FrameType | None = None) -> None:
        """A signal handler; ``None`` (no signal) keeps nothing."""
        if self.signum is None:
            self.signum = signum


@dataclass
class _State(FirstSignal):
    signum: int | None = None
    finished: bool = False  # the command finished: a signal gets the line
    said: bool = False  # the line was written

    def reset(self, finished: bool = False) -> None:
        self.signum, self.finished, self.said = None, finished, False


_state = _State()


def finished_message(signum: int) -> str:
    """The line for a signal that came after the run had finished."""
    name = signal.Signals(signum).name
    return f"{name} arrived after the run had finished: nothing was lost (its files are complete); exit code 0\n"


def _say_finished(signum: int) -> None:
    if not _state.said:
        _state.said = True
        os.write(2, finished_message(signum).encode())  # not sys.stderr: this may run inside a signal handler


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.finished:
        _say_finished(signum)
    else:
        _state.record(signum)


def watch() -> None:
    """From now until the process exits (an entry point's call): record SIGTERM / SIGINT, and ignore them once the
    interpreter shuts down (``atexit`` callbacks registered later, Lightning's, run before this one)."""
    _state.reset()
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    atexit.register(_ignore)


def _ignore() -> None:
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def take() -> int | None:
    """The signal recorded since :func:`watch` (the first), handed over to the caller: forgotten here."""
    signum = _state.signum
    _state.reset()
    return signum


def finished(signum: int | None = None) -> None:
    """The command finished and its files are complete: a signal from now on gets :func:`finished_message` (once)
    and leaves the exit code 0; so does ``signum``, one the command received after its last step, or one recorded
    here since its handlers were put back."""
    pending = signum or _state.signum
    _state.reset(finished=True)
    if pending is not None:
        _say_finished(pending)
