"""Composed configs: every experiment resolves as its complete, hand-written version did.

``tests/fixtures/complete_configs/`` holds the experiment files as they were before composition, each complete
(trainer, monitors, learner, stream): the 27 of ``configs/`` at 49df3f6 and ``lifelong/recall_delta_rule.yaml`` at
6d11e60. Both the old file and the new composed one are resolved by today's parser, so a signature change elsewhere
moves both sides; what is compared is what ``--print_config`` prints. The one difference by design: the monitors and
the checkpoint moved from the ``trainer.callbacks`` list to the named slots ``callbacks.<name>``;
:func:`as_callback_list` maps them back before comparing. When a later change renames or removes an argument the
configs set, make the same edit in the fixtures: they pin the values, not the schema.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from helpers import CONFIGS, ROOT
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.run.cli import main
from cl_lightning.run.compose import CALLBACK_SLOTS, config_chain, expand_includes

OLD = ROOT / "tests" / "fixtures" / "complete_configs"
EXPERIMENTS = sorted(str(p.relative_to(OLD)) for p in OLD.rglob("*.yaml"))
FRAGMENTS = ("trainer", "data", "learner")
OVERLAYS = {  # the README's overlay combinations, applied on top of the old and the new experiment alike
    "bp_pmnist.yaml": ["quick.yaml"],
    "qoa_pmnist.yaml": ["quick.yaml", "quick_qoa.yaml"],
    "maml_replay_pmnist.yaml": ["quick.yaml", "quick_maml.yaml"],
    "qoa_scr.yaml": ["quick_scr.yaml"],
    "qoa_split_mnist.yaml": ["quick.yaml"],
    "lifelong/recall_delta_rule.yaml": ["lifelong/omega.yaml"],
    "delta_rule_pmnist.yaml": ["lifelong/frozen_encoder.yaml"],
}


def resolved(*configs: Path, extra: tuple[str, ...] = ()) -> dict:
    """The config ``--print_config`` prints for ``--config`` of each file in turn (no class is instantiated)."""
    out = io.StringIO()
    args = [a for c in configs for a in ("--config", str(c))]
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*args, *extra, "--print_config"], run=False)
    return yaml.safe_load(out.getvalue())


def as_callback_list(config: dict) -> dict:
    """``config`` with its named callback slots appended, in slot order, to ``trainer.callbacks``."""
    named = config.pop("callbacks", None) or {}
    listed = config["trainer"].get("callbacks") or []
    slots = [named[name] for name in CALLBACK_SLOTS if named.get(name) is not None]
    config["trainer"]["callbacks"] = [*slots, *listed] or None
    return config


@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=lambda n: n.removesuffix(".yaml"))
def test_experiment_resolves_as_before(experiment: str) -> None:
    old = as_callback_list(resolved(OLD / experiment))
    new = as_callback_list(resolved(CONFIGS / experiment))
    assert new == old


@pytest.mark.parametrize("experiment", sorted(OVERLAYS), ids=lambda n: n.removesuffix(".yaml"))
def test_overlays_apply_as_before(experiment: str) -> None:
    overlays = [CONFIGS / o for o in OVERLAYS[experiment]]
    old = as_callback_list(resolved(OLD / experiment, *overlays))
    new = as_callback_list(resolved(CONFIGS / experiment, *overlays))
    assert new == old


def test_experiments_are_composed_and_shorter() -> None:
    """Every experiment includes fragments; experiments and fragments together are at least 40 % shorter."""
    experiments = [CONFIGS / n for n in EXPERIMENTS]
    assert all(len(config_chain(p)) > 1 for p in experiments)
    fragments = [p for d in FRAGMENTS for p in (CONFIGS / d).glob("*.yaml")]
    before = sum(len((OLD / n).read_text().splitlines()) for n in EXPERIMENTS)
    after = sum(len(p.read_text().splitlines()) for p in [*experiments, *fragments])
    assert after <= 0.6 * before, (before, after)


def test_one_monitor_setting_changes_in_one_place() -> None:
    """An overlay or flag reaches one named monitor and leaves the others; null turns one off."""
    base = resolved(CONFIGS / "qoa_pmnist.yaml")
    flags = ("--callbacks.hessian.every_n_tasks=7", "--callbacks.cost=null")
    changed = resolved(CONFIGS / "qoa_pmnist.yaml", extra=flags)
    assert changed["callbacks"]["hessian"]["init_args"]["every_n_tasks"] == 7
    assert changed["callbacks"]["hessian"]["init_args"]["num_queries"] == 100  # the learner fragment's, kept
    assert changed["callbacks"]["cost"] is None
    assert changed["callbacks"]["plasticity"] == base["callbacks"]["plasticity"]
    assert changed["callbacks"]["checkpoint"] == base["callbacks"]["checkpoint"]


def test_named_callbacks_reach_the_trainer(tmp_path: Path) -> None:
    """The slots become Trainer callbacks; setting ``trainer.callbacks`` adds to them, a null slot adds nothing."""
    args = ["--config", str(CONFIGS / "knn_pmnist.yaml"), "--config", str(CONFIGS / "quick.yaml")]
    flags = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--callbacks.cost=null"]
    extra = "--trainer.callbacks=lightning.pytorch.callbacks.LearningRateMonitor"  # used to replace the monitors
    cli = main([*args, *flags, extra, "--callbacks.hessian.every_n_tasks=3"], run=False)
    kinds = [type(c) for c in cli.trainer.callbacks]
    for kind in (ModelCheckpoint, ForgettingMonitor, PlasticityMonitor, HessianMonitor, LearningRateMonitor):
        assert kinds.count(kind) == 1
    assert CostMonitor not in kinds
    hessian = next(c for c in cli.trainer.callbacks if isinstance(c, HessianMonitor))
    assert (hessian.every_n_tasks, hessian.num_queries) == (3, 100)
    assert cli.trainer.reload_dataloaders_every_n_epochs == 1  # set by the CLI, in no config file


SAVED_BEFORE_TYPED_SLOTS = {  # a saved config.yaml's slots as the CLI wrote them while each was typed `Callback`
    "checkpoint": {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"every_n_epochs": 1, "save_last": True, "save_top_k": 1, "mode": "min", "filename": None},
    },
    "forgetting": {"class_path": "cl_lightning.callbacks.ForgettingMonitor", "init_args": {"plot_budget": 0.02}},
    "plasticity": {"class_path": "cl_lightning.callbacks.PlasticityMonitor", "init_args": {"every_n_tasks": 10}},
    "hessian": {"class_path": "cl_lightning.callbacks.HessianMonitor", "init_args": {"every_n_tasks": 100}},
    "cost": {"class_path": "cl_lightning.callbacks.CostMonitor"},
}


def test_slots_take_class_path_or_only_arguments(tmp_path: Path) -> None:
    """A config saved before the slots were typed by their callback reloads; a slot's ``class_path`` may be left out."""
    saved, bare = tmp_path / "saved.yaml", tmp_path / "bare.yaml"
    saved.write_text(yaml.safe_dump({"callbacks": SAVED_BEFORE_TYPED_SLOTS}))
    bare.write_text(yaml.safe_dump({"callbacks": {"hessian": {"every_n_tasks": 5}, "plasticity": None}}))
    config = resolved(CONFIGS / "qoa_pmnist.yaml", saved)["callbacks"]
    assert config["hessian"]["class_path"] == "cl_lightning.callbacks.HessianMonitor"
    assert config["hessian"]["init_args"]["every_n_tasks"] == 100
    assert config["checkpoint"]["init_args"]["save_last"] is True
    config = resolved(CONFIGS / "qoa_pmnist.yaml", saved, bare)["callbacks"]
    assert config["hessian"]["init_args"]["every_n_tasks"] == 5
    assert config["plasticity"] is None


def test_saved_config_is_complete_and_reloads(tmp_path: Path) -> None:
    """The resolved config has no ``include`` key, so a printed config reloads on its own, anywhere."""
    frozen = tmp_path / "frozen.yaml"
    config = resolved(CONFIGS / "qoa_v2_pmnist.yaml")
    assert "include" not in config
    frozen.write_text(yaml.safe_dump(config))
    assert resolved(frozen) == config


def test_include_errors_are_clear(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    with pytest.raises(ValueError, match="include cycle"):
        config_chain(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("include: [missing.yaml]\n")
    with pytest.raises(ValueError, match="relative to the including file"):
        config_chain(tmp_path / "c.yaml")


def test_expand_includes_orders_fragments_first_and_once(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "base.yaml").write_text("seed_everything: 1\n")
    (tmp_path / "sub" / "x.yaml").write_text("include: ../base.yaml\n")
    (tmp_path / "exp.yaml").write_text("include: [base.yaml, sub/x.yaml]\n")
    args = expand_includes(["fit", f"--config={tmp_path / 'exp.yaml'}", "--trainer.devices=1"])
    chain = [tmp_path / "base.yaml", tmp_path / "sub" / "x.yaml", tmp_path / "exp.yaml"]  # base.yaml once
    assert args == ["fit", *(a for p in chain for a in ("--config", str(p))), "--trainer.devices=1"]


def test_the_rescaled_overlay_changes_the_stream_class_and_nothing_else() -> None:
    """configs/data/pmnist_rescaled.yaml on a paper config: the same sizes, seed and warm-up, tasks rescaled."""
    base = resolved(CONFIGS / "qoa_pmnist.yaml", CONFIGS / "paper/pmnist_warmup.yaml")
    rescaled = resolved(
        CONFIGS / "qoa_pmnist.yaml", CONFIGS / "paper/pmnist_warmup.yaml", CONFIGS / "data/pmnist_rescaled.yaml"
    )
    stream = rescaled["data"]["stream"]
    assert stream["class_path"] == "cl_lightning.data.RescaledPermutedMNIST"
    assert stream["init_args"].pop("gain_spread") == 1.0
    assert stream["init_args"] == base["data"]["stream"]["init_args"]
    rescaled["data"]["stream"] = base["data"]["stream"]
    assert rescaled == base


@pytest.mark.parametrize("config", ["knn_tuned_pmnist.yaml", "knn_tuned_scr.yaml"])
def test_tuned_knn_configs_pick_from_the_stated_grid_on_warm_up_tasks(config: str) -> None:
    model = resolved(CONFIGS / config)["model"]["init_args"]
    assert model["select"] == {
        "k": [1, 3, 5, 10, 20, 50],
        "weighting": ["inverse", "gaussian"],
        "standardised": [False, True],
        "queries_per_task": 2000,
    }
    assert resolved(CONFIGS / config)["data"]["stream"]["init_args"]["warmup_tasks"] == 5
