"""The command line's thread policy (#35, #46): one thread unless the user sets a thread variable, set before torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cl_lightning.__main__ as entry
import cl_lightning.run.cli
from benchmarks import threads
from benchmarks.threads import cgroup_cores
from cl_lightning.run.threads import apply_thread_policy, policy_environment, thread_count


def test_policy_adds_only_what_the_user_left_unset() -> None:
    assert policy_environment({}) == {"OMP_NUM_THREADS": "1"}
    assert policy_environment({"OMP_NUM_THREADS": ""}) == {"OMP_NUM_THREADS": "1"}
    assert policy_environment({"OMP_NUM_THREADS": "2"}) == {}
    assert policy_environment({"MKL_NUM_THREADS": "3"}) == {}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert apply_thread_policy(environ) == {"OMP_NUM_THREADS": "1"}
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "1"}
    assert thread_count({"OMP_NUM_THREADS": "3"}) == 3
    assert thread_count({"MKL_NUM_THREADS": "4"}) == 4
    assert thread_count({}) == 1


def test_usable_cores_follow_affinity_and_the_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert cgroup_cores(cpu_max) is None
    cpu_max.write_text("150000 100000\n")
    assert cgroup_cores(cpu_max) == 1
    cpu_max.write_text("400000 100000\n")
    assert cgroup_cores(cpu_max) == 4
    assert cgroup_cores(tmp_path / "missing") is None
    monkeypatch.setattr(threads, "cgroup_cores", lambda: None)
    assert threads.usable_cores() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "cgroup_cores", lambda: 1)
    assert threads.usable_cores() == 1


def test_the_entry_point_sets_the_policy_before_torch_starts() -> None:
    """A fresh `python -m cl_lightning` process: the policy is in the environment before torch is imported."""
    probe = (  # the CLI replaced by a module that imports torch only when called
        "import sys, types; sys.argv = ['cl_lightning', 'validate', '--help'];"
        "cli = types.ModuleType('cl_lightning.run.cli'); sys.modules['cl_lightning.run.cli'] = cli;"
        "exec('def main(args=None):\\n import torch\\n print(torch.get_num_threads())', cli.__dict__);"
        "import cl_lightning.__main__ as m; m.main()"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split()[-1] == "1"
    pinned = subprocess.run(
        [sys.executable, "-c", probe], env=env | {"OMP_NUM_THREADS": "2"}, capture_output=True, text=True, check=True
    )
    assert pinned.stdout.split()[-1] == "2"


def test_a_program_that_imports_the_package_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(cl_lightning.run.cli, "main", lambda args=None: seen.append(os.environ.get("OMP_NUM_THREADS")))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    entry.main(["validate", "--help"])
    assert seen == [None]


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


def test_a_trial_keeps_the_thread_count_it_started_with() -> None:
    from cl_lightning.study.trial_run import trial_threads

    assert trial_threads({"threads": 2, "attempts": [{}]}, 1, {"OMP_NUM_THREADS": "4"}) == 2  # recorded: kept
    assert trial_threads({"attempts": [{}]}, None, {}) == 1  # recorded before counts were: the one-thread default
    assert trial_threads({}, 3, {}) == 3  # new, a sweep's cores per trial
    assert trial_threads({}, None, {"OMP_NUM_THREADS": "5"}) == 5  # new: what the CLI would run
