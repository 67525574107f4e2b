"""The command line's thread policy (#35): one intra-op thread unless OMP_NUM_THREADS / MKL_NUM_THREADS say."""

from __future__ import annotations

import sys

import pytest
import torch

import cl_lightning.__main__ as entry
import cl_lightning.run.cli
from cl_lightning.run.threads import apply_thread_policy


@pytest.fixture
def two_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_unless_the_environment_says(two_threads: object) -> None:
    assert apply_thread_policy({"OMP_NUM_THREADS": "2"}) == 2  # torch read it at start-up: left as it is
    assert apply_thread_policy({"MKL_NUM_THREADS": "2"}) == 2
    assert apply_thread_policy({"OMP_NUM_THREADS": ""}) == 1
    assert apply_thread_policy({}) == 1


def test_the_command_line_runs_with_one_thread(two_threads: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m cl_lightning fit …` (argv from the process) gets the policy; `main([...])` from a program keeps its
    own `torch.set_num_threads`."""
    seen = []
    monkeypatch.setattr(cl_lightning.run.cli, "main", lambda args=None: seen.append(torch.get_num_threads()))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    entry.main(["validate", "--help"])
    monkeypatch.setattr(sys, "argv", ["cl_lightning", "validate", "--help"])
    entry.main()
    assert seen == [2, 1]


def test_fit_help_says_the_thread_default(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cl_lightning.run.cli.main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Threads: one" in out
    assert "OMP_NUM_THREADS=N" in out


def test_top_level_help_names_every_command_and_no_minute_demo(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cl_lightning.run.cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m cl_lightning {fit,validate,test,predict,sweep,report}")
    assert "about a minute" not in out
