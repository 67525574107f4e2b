"""The command line's thread policy (#46): every usable core, training steps on one on a busy machine, set before
torch; a setting of the user's wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cl_lightning.__main__ as entry
import cl_lightning.run.cli
from cl_lightning.run import threads
from cl_lightning.run.threads import (
    ThreadPolicy,
    apply_thread_policy,
    busy_cores,
    cgroup_cores,
    choose_policy,
    sweep_threads,
    usable_cores,
)

STAT = """cpu  100 0 0 0 0 0 0 0 0 0
cpu0 {u0} {n0} 0 {i0} 0 0 0 0 0 0
cpu1 {u1} 0 0 {i1} 0 0 0 0 0 0
intr 0
"""


def test_busy_cores_count_other_processes_time_on_our_cpus_nice_aside() -> None:
    """Hand-worked: over the sample cpu0 ran 80 user + 40 nice jiffies of 200, cpu1 20 of 100 (0 when outside the
    affinity)."""
    texts = iter([STAT.format(u0=0, n0=0, i0=0, u1=0, i1=0), STAT.format(u0=80, n0=40, i0=80, u1=20, i1=80)])
    assert busy_cores(lambda: next(texts), 0.0, {0, 1}) == pytest.approx(2 * 100 / 300)
    texts = iter([STAT.format(u0=0, n0=0, i0=0, u1=0, i1=0), STAT.format(u0=80, n0=40, i0=80, u1=20, i1=80)])
    assert busy_cores(lambda: next(texts), 0.0, {0}) == pytest.approx(80 / 200)
    assert busy_cores(lambda: "", 0.0, {0}) == 0.0
    assert busy_cores(lambda: (_ for _ in ()).throw(OSError("no /proc")), 0.0, {0}) == 0.0


def test_the_policy_uses_every_core_and_splits_training_on_a_busy_machine() -> None:
    assert choose_policy(2, 0.1) == ThreadPolicy(2, 2, None, 0.1)
    assert choose_policy(2, 1.9) == ThreadPolicy(2, 1, "PASSIVE", 1.9)
    assert choose_policy(1, 1.9) == ThreadPolicy(1, 1, None, 1.9)
    assert ThreadPolicy(2, 1, "PASSIVE", 1.9).environment() == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    assert ThreadPolicy(4, 4, None, 0.0).environment() == {"OMP_NUM_THREADS": "4"}
    assert "training steps on 1" in ThreadPolicy(2, 1, "PASSIVE", 1.9).describe()


def test_a_setting_of_the_users_turns_the_policy_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "ACTIVE", None)  # restored: later fits in this process see no policy
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        environ = {name: "2"}
        assert apply_thread_policy(environ, measure=lambda: 0.0) is None
        assert environ == {name: "2"}
    environ = {"OMP_NUM_THREADS": ""}
    policy = apply_thread_policy(environ, measure=lambda: 2.0)
    assert policy is not None
    assert environ["OMP_NUM_THREADS"] == str(usable_cores())
    assert threads.ACTIVE is policy
    assert sweep_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert sweep_threads({"MKL_NUM_THREADS": "4"}) == 4
    assert sweep_threads({}) == 1


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
    env = {k: v for k, v in os.environ.items() if k not in (*threads.THREAD_VARIABLES, *threads.WAIT_VARIABLES)}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split()[-1] == str(usable_cores())
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
    assert "Threads: every usable core" in out
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
    assert trial_threads({}, None, {"OMP_NUM_THREADS": "5"}) == 5  # new: the user's pinned count
    assert trial_threads({}, None, {}) == 1  # new, nothing pinned: a sweep's one thread


def test_training_steps_run_on_the_policys_training_threads() -> None:
    from cl_lightning.run.thread_phases import TrainingThreads

    before = torch.get_num_threads()
    phases = TrainingThreads(ThreadPolicy(2, 1, "PASSIVE", 2.0))
    try:
        phases.on_train_batch_start(None, None, None, 0)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1
        phases.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 2
        phases.load_state_dict({"train_threads": 2})  # a checkpoint of a run that trained on 2: resumed on 2
        phases.on_train_batch_start(None, None, None, 0)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 2
        assert phases.state_dict() == {"train_threads": 2}
        phases.load_state_dict({"train_threads": 8})  # at most the threads this process has
        assert phases.policy is not None
        assert phases.policy.train_threads == 2
        pinned = TrainingThreads(None)  # the user's settings: nothing changes, nothing is checkpointed
        torch.set_num_threads(1)
        pinned.on_train_batch_start(None, None, None, 0)  # type: ignore[arg-type]
        pinned.load_state_dict({"train_threads": 2})
        pinned.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1
        assert pinned.state_dict() == {}
    finally:
        torch.set_num_threads(before)


def test_processes_sharing_the_cpu_share_its_cores() -> None:
    assert ThreadPolicy(4, 1, "PASSIVE", 3.0).per_process(2) == ThreadPolicy(2, 1, "PASSIVE", 3.0)
    assert ThreadPolicy(2, 2, None, 0.0).per_process(2) == ThreadPolicy(1, 1, None, 0.0)
    assert ThreadPolicy(2, 2, None, 0.0).per_process(8) == ThreadPolicy(1, 1, None, 0.0)
