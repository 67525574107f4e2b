"""Adam steps on a CPU fit no longer try to load NVML: ``drop_unloadable_nvml_check`` (called in ``on_fit_start``)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
import torch
from helpers import BACKPROP, tiny_args
from lightning.pytorch import Callback, LightningModule, Trainer

from cl_lightning.nn.optim.adam_kernel import NVML_CHECK, drop_unloadable_nvml_check


def _nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


class _CountDuringTraining(Callback):
    """Reads a call counter when training starts (after every ``on_fit_start``) and when it ends."""

    def __init__(self, calls: list[int]) -> None:
        self.calls, self.at_start, self.at_end = calls, -1, -1

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.at_start = len(self.calls)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.at_end = len(self.calls)


def test_a_cpu_fit_asks_nvml_at_most_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NVML_CHECK, "1")  # as importing Lightning left it
    available = torch.cuda.is_available()
    calls: list[int] = []
    real = torch.cuda._device_count_nvml

    def counted() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(torch.cuda, "_device_count_nvml", counted)
    from cl_lightning.run.cli import main

    cli = main(tiny_args(tmp_path, BACKPROP), run=False)
    counter = _CountDuringTraining(calls)
    cli.trainer.callbacks.append(counter)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step > 10  # Adam stepped on every chunk
    assert torch.cuda.is_available() == available  # the same answer either way
    if _nvml_loads():  # a GPU machine: the fork-safe check is kept
        assert counter.at_end - counter.at_start > 0
        assert NVML_CHECK in os.environ
    else:
        assert counter.at_end - counter.at_start == 0
        assert NVML_CHECK not in os.environ


def test_the_check_is_dropped_once_and_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NVML_CHECK, raising=False)
    assert drop_unloadable_nvml_check() is False
    monkeypatch.setenv(NVML_CHECK, "1")
    dropped = drop_unloadable_nvml_check()
    assert dropped is (torch.cuda._is_compiled() and not _nvml_loads())
    assert drop_unloadable_nvml_check() is False
