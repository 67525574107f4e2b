"""When the file system says no (#35): a read-only `logs/` (new run and resume), a full disk during a checkpoint,
damaged MNIST files under `data_root`. Each is one `error:` line, exit code 2, no traceback, nothing lost.

Tests run as root here, where `chmod` stops nothing: a refusal is made by patching the calls that write."""

from __future__ import annotations

import builtins
import errno
import gzip
import hashlib
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import BACKPROP, tiny_args

import cl_lightning.run.checkpointing
from cl_lightning.data.mnist import packaged_mnist_dir
from cl_lightning.run.cli import main

CHECKPOINTS = ["--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true"]


def _deny_writes(monkeypatch: pytest.MonkeyPatch, folder: Path, code: int = errno.EROFS) -> None:
    """Every write, folder creation, rename or delete under ``folder`` fails as on a read-only file system."""
    real_open, real_makedirs, real_mkdir = builtins.open, os.makedirs, os.mkdir
    real_replace, real_unlink, real_os_open = os.replace, os.unlink, os.open

    def under(path: object) -> bool:
        return isinstance(path, (str, os.PathLike)) and str(Path(os.fspath(path)).absolute()).startswith(str(folder))

    def refuse(path: object) -> None:
        raise OSError(code, os.strerror(code), os.fspath(path))  # type: ignore[arg-type]

    def guard(real: Callable, write: Callable[..., bool] = lambda *a, **k: True) -> Callable:
        def call(path: object, *args: object, **kwargs: object) -> object:
            if under(path) and write(*args, **kwargs):
                refuse(path)
            return real(path, *args, **kwargs)

        return call

    def writes(mode: str = "r", *_: object, **__: object) -> bool:
        return any(c in mode for c in "wax+")

    def os_writes(flags: int = 0, *_: object, **__: object) -> bool:
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))

    monkeypatch.setattr(builtins, "open", guard(real_open, writes))
    monkeypatch.setattr(io, "open", guard(real_open, writes))
    monkeypatch.setattr(os, "open", guard(real_os_open, os_writes))
    for name, real in (("makedirs", real_makedirs), ("mkdir", real_mkdir), ("replace", real_replace)):
        monkeypatch.setattr(os, name, guard(real))
    monkeypatch.setattr(os, "unlink", guard(real_unlink))
    monkeypatch.setattr(os, "remove", guard(real_unlink))


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _one_line(capsys: pytest.CaptureFixture, stop: pytest.ExceptionInfo) -> str:
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_read_only_logs_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "logs").mkdir()
    _deny_writes(monkeypatch, tmp_path / "logs")
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2)])
    line = _one_line(capsys, stop)
    assert "cannot write there (Read-only file system)" in line, line
    assert str(tmp_path / "logs") in line
    assert list((tmp_path / "logs").iterdir()) == []


def test_a_resume_into_a_read_only_logs_folder_is_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=1, extra=CHECKPOINTS)])
    before = _tree(tmp_path / "logs")
    capsys.readouterr()
    _deny_writes(monkeypatch, tmp_path / "logs")
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=2, extra=[*CHECKPOINTS, "--ckpt_path=last"])])
    assert "cannot write there (Read-only file system)" in _one_line(capsys, stop)
    monkeypatch.undo()
    assert _tree(tmp_path / "logs") == before


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_one(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second task's checkpoint hits ENOSPC half-way: no partial file, the first task's last.ckpt intact."""
    real_save, calls = torch.save, []

    def save(obj: object, f: io.BufferedWriter, *args: object, **kwargs: object) -> None:
        calls.append(f)
        if len(calls) > 2:  # task 0 writes its epoch checkpoint and last.ckpt
            f.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(cl_lightning.run.checkpointing.torch, "save", save)
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, BACKPROP, tasks=3, extra=CHECKPOINTS)])
    line = _one_line(capsys, stop)
    assert "no space left on device at task 2 of 3" in line, line
    assert "last.ckpt holds 1 finished task, no partial checkpoint; resume with" in line, line
    folder = tmp_path / "logs" / "tiny" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=16.ckpt", "last.ckpt"]
    monkeypatch.undo()
    assert torch.load(folder / "last.ckpt", weights_only=False)["epoch"] == 0


@pytest.mark.parametrize("damage", ["overwritten", "truncated", "not gzip"])
def test_damaged_mnist_files_are_one_line(damage: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "mnist"
    shutil.copytree(packaged_mnist_dir(), data)
    images = data / "train-images-idx3-ubyte.gz"
    raw = bytearray(images.read_bytes())
    if damage == "overwritten":
        raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(64)
    elif damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw = bytearray(b"<html>not found</html>")
    images.write_bytes(bytes(raw))
    stream = [
        "--data.stream=cl_lightning.data.PermutedMNIST",
        "--data.stream.num_tasks=2",
        f"--data.stream.data_root={data}",
    ]
    with pytest.raises(SystemExit) as stop:
        main(["fit", *tiny_args(tmp_path, BACKPROP, extra=stream)])
    line = _one_line(capsys, stop)
    assert f"{images}" in line, line
    assert "corrupt" in line, line
    assert not (tmp_path / "logs").exists()
    assert gzip  # the files are gzip-compressed IDX
