"""The contract between the parts: the log keys, the episode slots the data module hands out, the protocols the
callbacks rely on, and the import rules between the subpackages."""

from __future__ import annotations

import ast
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
    assert metric_key(EvalSlot("forward"), "acc", "live") == "eval/forward_live_acc"
    assert metric_key(EvalSlot("matrix", 0), "acc", "live") == "eval/live_acc_matrix/task_0"


@pytest.mark.parametrize("reading", [None, "live"])
def test_parse_metric_key_inverts_metric_key(reading: str | None) -> None:
    slots = [EvalSlot("forward"), EvalSlot("backward"), EvalSlot("matrix", 0), EvalSlot("matrix", 7_499)]
    for slot in [*slots, EvalSlot("final", 42)]:
        for m in ("acc", "mse"):
            assert parse_metric_key(metric_key(slot, m, reading), m, reading) == slot
    assert parse_metric_key("eval/acc_matrix/task_3", "mse") is None
    assert parse_metric_key("train/online_acc", "acc") is None


def test_split_metric_key_finds_any_reading_and_online_key_is_apart() -> None:
    slots = [EvalSlot("forward"), EvalSlot("backward"), EvalSlot("matrix", 7), EvalSlot("final", 42)]
    for slot in slots:
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


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("cl_lightning")}


# what each subpackage may import from the package (DESIGN's arrows; the contract module is below them all)
ALLOWED = {
    "contract.py": set(),
    "ops": {"ops"},
    "nn": {"ops", "nn"},
    "memory": {"ops", "nn", "memory"},
    "learners": {"ops", "nn", "memory", "learners", "contract"},
    "metrics": {"metrics"},
    "callbacks": {"metrics", "callbacks", "contract"},
    "data": {"data", "contract"},
}


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_flow_one_way(part: str) -> None:
    files = [PACKAGE / part] if part.endswith(".py") else sorted((PACKAGE / part).rglob("*.py"))
    for path in files:
        for module in _imports(path):
            top = module.split(".")[1] if "." in module else ""
            assert top in ALLOWED[part], f"{path.relative_to(ROOT)} imports {module}"
