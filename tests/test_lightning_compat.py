"""The Lightning internals cl_lightning relies on (all in cl_lightning/lightning_compat.py) are still there: a
Lightning upgrade that removes or changes one fails here, naming it, instead of deep inside a run."""

from __future__ import annotations

import ast
from pathlib import Path

import lightning
from helpers import BACKPROP, ROOT, fit
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_lightning.lightning_compat import (
    CompatCLI,
    checkpoint_logged_steps,
    logged_steps,
    missing_internals,
    set_purge_step,
    steps_run,
)

PRIVATE = {"_parse_ckpt_path", "_instantiate_trainer", "_get", "_dump_config", "_kwargs", "_batches_that_stepped"}


def test_every_internal_the_adapter_uses_is_still_there() -> None:
    assert missing_internals() == [], f"Lightning {lightning.__version__}: update cl_lightning/lightning_compat.py"


def test_the_public_names_reach_the_internals(tmp_path: Path) -> None:
    cli = fit(tmp_path, BACKPROP, tasks=1)
    assert isinstance(cli, CompatCLI)
    assert steps_run(cli.trainer) == 16  # one task of 16 chunks
    assert logged_steps(cli.trainer) == 16
    saved = {"loops": {"fit_loop": {"epoch_loop.state_dict": {"_batches_that_stepped": 16}}}, "global_step": 9}
    assert checkpoint_logged_steps(saved) == 16
    assert checkpoint_logged_steps({"global_step": 9}) == 9
    first = TensorBoardLogger(tmp_path, name="x", version=0)
    for step in range(8):
        first.log_metrics({"m": float(step)}, step)
    first.finalize("success")
    again = TensorBoardLogger(tmp_path, name="x", version=0)
    set_purge_step(again, 5)  # the SummaryWriter drops steps >= 5 of the earlier file
    again.log_metrics({"m": 50.0}, 5)
    again.finalize("success")
    events = EventAccumulator(str(tmp_path / "x" / "version_0"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("m")] == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 50)]


def test_no_other_module_touches_them() -> None:
    """Outside the adapter no package module names a private Lightning member the adapter covers."""
    for path in sorted((ROOT / "cl_lightning").rglob("*.py")):
        if path.name == "lightning_compat.py":
            continue
        names = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        names |= {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not names & PRIVATE, f"{path.relative_to(ROOT)} uses {sorted(names & PRIVATE)}"


def test_the_loop_counters_are_used_in_the_adapter_only() -> None:
    """``trainer.fit_loop`` is reached only in the adapter, whose counters :func:`missing_internals` checks (the step
    engines count through :func:`~cl_lightning.lightning_compat.count_optimizer_steps`)."""
    users = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "cl_lightning").rglob("*.py")
        if "fit_loop" in {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    )
    assert users == ["cl_lightning/lightning_compat.py"]
