"""SIGTERM / SIGINT outside a ``fit``'s steps: while ``python -m cl_lightning fit`` starts, and after the run finished.

:class:`~cl_lightning.run.stopping.GracefulStop` handles the signals while the CLI's ``main`` runs. Around it the
process would die by the signal (Python's defaults apply before and after, and while the interpreter shuts down
Python resets every handler it set), so the entry point (:mod:`cl_lightning.__main__`) calls :func:`watch` before it
imports the CLI. From then until the process is gone a signal has a defined outcome: while starting it is recorded
and ``GracefulStop`` takes it over (:func:`take`: the run stops before its first step, exit 128 + signal); after a
``fit`` that ran to its end (:func:`finished`) it gets one line (:func:`finished_message`) and the exit code stays 0,
so a sweep records the trial finished; after a ``fit`` that ended with an exit code of its own (a stop, an error) it
is recorded and changes nothing; in the last ``atexit`` callback both signals are ignored (``SIG_IGN`` is the one
setting Python's shutdown keeps). Nothing here imports torch or Lightning.
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
    """From now until the process exits: record SIGTERM / SIGINT, and ignore them once the interpreter shuts down.

    For the entry point of a process only (it replaces the handlers for good); callbacks registered with ``atexit``
    later (Lightning's, TensorBoard's) run before the one registered here.
    """
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
    """The command finished and its files are complete: a signal from now on gets the line of
    :func:`finished_message` (once) and leaves the exit code 0. ``signum``: one the command received and did not act
    on (it came after a ``fit``'s last step), answered now; so is one recorded here since the command's handlers
    were put back."""
    pending = signum or _state.signum
    _state.reset(finished=True)
    if pending is not None:
        _say_finished(pending)
