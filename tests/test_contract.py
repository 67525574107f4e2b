"""The contract between the parts: the log keys, the episode slots the data module hands out, the protocols the
callbacks rely on, and the import rules between the subpackages."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from lightning.pytorch import LightningModule, Trainer

from cl_lightning.callbacks import PlasticityMonitor
from cl_lightning.contract import (
    EpisodeSource,
    EvalSlot,
    ObservedLearner,
    metric_key,
    online_key,
    parse_metric_key,
    split_metric_key,
)
from cl_lightning.data import StreamDataModule, SyntheticClasses

PACKAGE = ROOT / "cl_lightning"


def test_metric_keys_are_the_logged_names() -> None:
    assert metric_key(EvalSlot("forward"), "acc") == "eval/forward_acc"
    assert metric_key(EvalSlot("backward"), "mse") == "eval/backward_mse"
    assert metric_key(EvalSlot("matrix", 12), "acc") == "eval/acc_matrix/task_12"
    assert metric_key(EvalSlot("final", 3), "mse") == "test/mse/task_3"
    assert metric_key(EvalSlot("validated", 3), "acc") == "validate/acc/task_3"
    assert metric_key(EvalSlot("forward"), "acc", "live") == "eval/forward_live_acc"
    assert metric_key(EvalSlot("matrix", 0), "acc", "live") == "eval/live_acc_matrix/task_0"


@pytest.mark.parametrize("reading", [None, "live"])
def test_parse_metric_key_inverts_metric_key(reading: str | None) -> None:
    slots = [EvalSlot("forward"), EvalSlot("backward"), EvalSlot("matrix", 0), EvalSlot("matrix", 7_499)]
    for slot in [*slots, EvalSlot("final", 42), EvalSlot("validated", 5)]:
        for m in ("acc", "mse"):
            assert parse_metric_key(metric_key(slot, m, reading), m, reading) == slot
    assert parse_metric_key("eval/acc_matrix/task_3", "mse") is None
    assert parse_metric_key("train/online_acc", "acc") is None


def test_split_metric_key_finds_any_reading_and_online_key_is_apart() -> None:
    slots = [EvalSlot("forward"), EvalSlot("backward"), EvalSlot("matrix", 7), EvalSlot("final", 42)]
    for slot in [*slots, EvalSlot("validated", 1)]:
        for m in ("acc", "mse"):
            for reading in (None, "live", "two_words"):
                assert split_metric_key(metric_key(slot, m, reading), m) == (slot, reading)
    assert online_key("acc") == "train/online_acc"
    for key in (online_key("acc"), "eval/forward_mse", "eval/forward_", "forgetting/avg", "eval/acc_matrix/task_x"):
        assert split_metric_key(key, "acc") is None


def test_the_data_module_hands_out_slots_for_forward_backward_and_the_matrix() -> None:
    dm = StreamDataModule(SyntheticClasses(num_tasks=10), backward_lag=[1, 3], num_probe_tasks=4)
    assert dm.probe_tasks == [0, 3, 6, 9]
    items = dict(dm.eval_items(3))
    assert items[3] == [EvalSlot("forward"), EvalSlot("matrix", 3)]
    assert items[2] == [EvalSlot("backward")]
    assert items[0] == [EvalSlot("backward"), EvalSlot("matrix", 0)]
    assert items[9] == [EvalSlot("matrix", 9)]
    assert dict(dm.eval_items(4)) == {4: [EvalSlot("forward")], 3: [EvalSlot("backward")], 1: [EvalSlot("backward")]}


def test_task_batches_are_the_whole_task_in_arrival_order_cut_at_the_budget() -> None:
    stream = SyntheticClasses(num_tasks=2, train_size=50, chunk_size=16)
    dm = StreamDataModule(stream)
    whole = torch.cat([b.x for b in dm.task_batches(1)])
    assert torch.equal(whole, stream.task(1).train_x)
    cut = list(dm.task_batches(1, 20))
    assert [b.x.shape[0] for b in cut] == [16, 4]
    assert torch.equal(torch.cat([b.x for b in cut]), stream.task(1).train_x[:20])


def test_the_data_module_is_an_episode_source() -> None:
    assert isinstance(StreamDataModule(SyntheticClasses(num_tasks=2)), EpisodeSource)


class _Plain(LightningModule):
    def training_step(self, batch, batch_idx):
        return None


def test_a_monitor_on_a_module_without_the_contract_names_what_is_missing(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, default_root_dir=tmp_path)
    trainer.datamodule = StreamDataModule(SyntheticClasses(num_tasks=1))
    assert not isinstance(_Plain(), ObservedLearner)
    message = r"PlasticityMonitor needs the ObservedLearner interface; _Plain lacks .*output_layer"
    with pytest.raises(TypeError, match=message):
        PlasticityMonitor().setup(trainer, _Plain(), "fit")


def _module_name(path: Path) -> str:
    """``cl_lightning/callbacks/forgetting.py`` -> ``cl_lightning.callbacks.forgetting`` (a package: its folder)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
"""Every module of the package by its dotted name."""


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports, at module level or inside a function (AST, not run):
    ``from cl_lightning.x import y`` is ``cl_lightning.x.y`` when ``y`` is a module, else ``cl_lightning.x``."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path.relative_to(ROOT)}: a relative import (the rules read absolute names)"
            names.update(
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            )
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] == "cl_lightning"}


# What each subpackage and top-level module may import from the package (docs/architecture.md's arrows, as the code
# has them; function-level imports included). Read downwards: __main__ -> study -> run -> callbacks / learners / data
# -> building blocks -> the contract and the adapters.
ALLOWED = {
    # adapters and the contract: below everything, importing nothing from the package
    "__init__.py": set(),
    "contract.py": set(),
    "errors.py": set(),
    "heap.py": set(),
    "lightning_compat.py": set(),
    # building blocks
    "ops": {"ops"},
    "nn": {"ops", "nn"},
    "memory": {"ops", "nn", "memory"},
    "metrics": {"metrics"},
    # the parts a run is made of, meeting through contract.py
    "data": {"data", "contract"},
    "learners": {"ops", "nn", "memory", "learners", "contract", "lightning_compat"},
    "callbacks": {"metrics", "memory", "callbacks", "contract", "heap", "lightning_compat"},
    # the life of one run, then studies of many
    "run": {"run", "data", "learners", "callbacks", "contract", "errors", "heap", "lightning_compat"},
    "study": {"study", "run", "metrics", "contract", "errors"},
    "__main__.py": {"run", "study", "errors"},
}


def test_every_module_has_import_rules() -> None:
    parts = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts == set(ALLOWED), "a module or subpackage without a line in ALLOWED (and docs/architecture.md)"


def test_every_file_is_named_in_the_architecture() -> None:
    """docs/architecture.md names every file of the package, so none appears unmapped to a part: by its path below
    ``cl_lightning/`` (`` `nn/gnt.py` ``) or by its bare name where no other file has it (`` `gnt.py` ``); a
    subpackage's ``__init__.py`` by its folder (`` `nn/native/` `` or `` `native/` ``)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    units = {}  # file -> what names it: itself, or its folder for a subpackage's __init__.py
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        units[rel] = rel.parent if rel.name == "__init__.py" and rel.parent != Path() else rel
    tails = Counter(unit.name for unit in units.values())
    unnamed = []
    for rel, unit in units.items():
        slash = "/" if unit != rel else ""
        names = [f"{unit.as_posix()}{slash}"] + ([f"{unit.name}{slash}"] if tails[unit.name] == 1 else [])
        if not any(f"`{name}`" in doc for name in names):
            unnamed.append(rel.as_posix())
    assert not unnamed, f"files docs/architecture.md does not name (add each to its part): {unnamed}"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_flow_one_way(part: str) -> None:
    files = [PACKAGE / part] if part.endswith(".py") else sorted((PACKAGE / part).rglob("*.py"))
    for path in files:
        for module in _imports(path):
            top = module.split(".")[1] if "." in module else ""
            assert top in ALLOWED[part], f"{path.relative_to(ROOT)} imports {module}"


def test_no_import_cycle_between_package_modules() -> None:
    """The module import graph (every file, function-level imports too) is acyclic: depth-first search, a module
    met again while still on the path closes a cycle. A package's ``__init__`` importing its own modules is an
    edge like any other."""
    graph = {name: sorted(_imports(path) & MODULES.keys()) for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for imported in graph[name]:
            visit(imported, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def _reached(name: str) -> set[str]:
    """Every package module ``name`` imports, directly or through others (function-level imports too)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for imported in _imports(MODULES[todo.pop()]) & MODULES.keys():
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


def test_the_report_reads_files_without_the_training_cli_or_a_callback() -> None:
    """``report`` reads saved configs and event files: neither the ``fit`` command line nor a callback (nor
    Lightning's learners behind them) is among what it imports."""
    reached = _reached("cl_lightning.study.report")
    assert not {
        m for m in reached if m.startswith(("cl_lightning.run", "cl_lightning.callbacks", "cl_lightning.learners"))
    }
