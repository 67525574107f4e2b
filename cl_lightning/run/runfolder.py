"""One writer per run folder (an advisory lock a second ``fit`` of the same run cannot take), and undoing a failed
attempt's writes.

:func:`hold` takes ``fcntl.flock`` on ``<run>/.lock`` (and writes this process's id into it) for as long as the
process runs or until :func:`release` / :func:`release_all`, which remove the file. The operating system drops the
lock when the process ends, however it ends, so a file left by a ``kill -9``'d run never blocks the next one. A
process that locked a file its owner removed meanwhile notices (the path no longer names the locked file) and locks
the new one, so two processes never both hold a run. Where ``fcntl`` does not exist (Windows) nothing is locked.
"""

from __future__ import annotations

import os
from pathlib import Path

from cl_lightning.errors import UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}  # lock file -> open file descriptor holding its lock


class RunInUse(UsageError):  # noqa: N818 - reads as the condition it reports
    """Another live process holds the run folder's lock."""


def hold(run: Path, name: str = LOCK_NAME) -> None:
    """Take the lock ``name`` of run folder ``run`` (created if missing) for this process, or raise :class:`RunInUse`.

    The descriptor is not inherited by child processes (Python opens files non-inheritable).
    """
    run = run.resolve()
    path = run / name
    if fcntl is None or path in _held:
        return
    run.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunInUse(
                f"{run} is being written by another process (pid {owner}); two writers would corrupt the run. "
                f"Wait for it to end, or stop it first (kill -TERM {owner})"
            ) from None
        if _names(path, fd):
            break
        os.close(fd)  # its owner removed the file between our open and flock: lock the file there now
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[path] = fd


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def release(run: Path, name: str = LOCK_NAME) -> None:
    """Release the lock ``name`` of ``run`` if this process holds it, and remove its file."""
    path = run.resolve() / name
    fd = _held.pop(path, None)
    if fd is not None:
        if _names(path, fd):
            path.unlink()  # while still locked: a process that opened it meanwhile sees the file is gone
        os.close(fd)  # closing the descriptor releases its flock


def release_all() -> None:
    """Release every lock this process holds (the OS does it anyway when the process ends)."""
    for path in list(_held):
        release(path.parent, path.name)


class Snapshot:
    """What a run folder holds before an attempt, to undo that attempt's writes when it fails before its first step.

    Files the attempt created are removed; the small records it rewrites (``config.yaml``, ``hparams.yaml``) get
    their old contents back; a folder that did not exist is removed whole (and its parent, if that was new too).
    """

    RECORDS = ("config.yaml", "hparams.yaml")

    def __init__(self, run: Path) -> None:
        self.run = run
        self.new_folders = [p for p in (run, *run.parents) if not p.exists()]  # the run, then new ancestors
        self.paths = set(run.rglob("*")) if run.is_dir() else set()
        self.records = {n: (run / n).read_bytes() for n in self.RECORDS if (run / n).is_file()}

    def undo(self) -> None:
        """Put the folder back as it was (the lock file stays: the lock is still held)."""
        import shutil

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
