"""One writer per run folder (an advisory lock a second ``fit`` of the same run cannot take), and undoing a failed
attempt's writes.

:func:`hold` takes ``filelock``'s :class:`~filelock.FileLock` on ``<run>/.lock`` (``flock``; its soft fallback is
refused) with this process's id in it: the OS drops the lock when the process ends, so a ``kill -9``'d run never
blocks the next one. :func:`release` removes the file while still locked: a process that locked it meanwhile sees
it unlinked (filelock checks) and locks a new one, so two processes never both hold a run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from filelock import FileLock, Timeout

from cl_lightning.errors import UsageError

LOCK_NAME = ".lock"
_held: dict[Path, FileLock] = {}  # lock file -> the lock this process holds on it


class RunInUse(UsageError):  # noqa: N818 - reads as the condition it reports
    """Another live process holds the run folder's lock."""


def hold(run: Path, name: str = LOCK_NAME) -> None:
    """Take the lock ``name`` of run folder ``run`` (created if missing) for this process, or raise :class:`RunInUse`.

    The descriptor is not inherited by child processes (Python opens files non-inheritable).
    """
    run = run.resolve()
    path = run / name
    if path in _held:
        return
    run.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, thread_local=False, fallback_to_soft=False, on_acquired=_write_pid)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        owner = _owner(path)
        raise RunInUse(
            f"{run} is being written by another process (pid {owner}); two writers would corrupt the run. "
            f"Wait for it to end, or stop it first (kill -TERM {owner})"
        ) from None
    _held[path] = lock


def _write_pid(fd: int) -> None:
    """Name the holder in the lock file (called by filelock with the locked descriptor; ``lseek`` + ``write``, which
    every platform has, where ``pwrite`` is Unix's)."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode())


def _owner(path: Path) -> str:
    """The id of the process that holds ``path``, as it wrote it (``?`` before it has)."""
    try:
        return path.read_text(errors="replace").strip() or "?"
    except OSError:
        return "?"


def release(run: Path, name: str = LOCK_NAME) -> None:
    """Release the lock ``name`` of ``run`` if this process holds it, and remove its file."""
    path = run.resolve() / name
    lock = _held.pop(path, None)
    if lock is not None:
        with contextlib.suppress(PermissionError):  # Windows keeps an open file; filelock removes it on release there
            path.unlink(missing_ok=True)  # while still locked: a process that locked it meanwhile sees it is gone
        lock.release()


def release_all() -> None:
    """Release every lock this process holds (the OS does it anyway when the process ends)."""
    for path in list(_held):
        release(path.parent, path.name)


class Snapshot:
    """What a run folder holds before an attempt, to undo that attempt's writes (new files and folders removed,
    ``config.yaml`` and ``hparams.yaml`` as they were) when it fails before its first step."""

    RECORDS = ("config.yaml", "hparams.yaml")

    def __init__(self, run: Path) -> None:
        self.run = run
        self.new_folders = [p for p in (run, *run.parents) if not p.exists()]  # the run, then new ancestors
        self.paths = set(run.rglob("*")) if run.is_dir() else set()
        self.records = {n: (run / n).read_bytes() for n in self.RECORDS if (run / n).is_file()}

    def undo(self) -> None:
        """Put the folder back as it was (the lock file stays: the lock is still held)."""
        for folder in self.new_folders:
            shutil.rmtree(folder, ignore_errors=True)
        if not self.run.is_dir():
            return
        for path in sorted(self.run.rglob("*"), reverse=True):  # a folder's files before the folder
            if path in self.paths or path.suffix == ".lock":
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name, content in self.records.items():
            (self.run / name).write_bytes(content)
        for name in set(self.RECORDS) - set(self.records):
            (self.run / name).unlink(missing_ok=True)
