"""Composed configs: fragment includes and named callbacks for the command line.

An experiment file states only what differs from the fragments it builds on::

    # configs/qoa_v2_pmnist.yaml
    include: [trainer/pmnist.yaml, data/pmnist.yaml, learner/qoa.yaml]
    model:
      init_args:
        support_size: 200

``include`` lists files relative to the including file, each applied as an earlier ``--config`` (its own includes
first), so the including file and later overlays override them key by key; the key is read before jsonargparse
parses and is no part of the resolved config. Not jsonargparse's nested config files: one (``model:
learner/qoa.yaml``) fills its group whole, and a fragment spanning groups has no group to be nested under.

Callbacks a config tunes live in named slots, ``callbacks.<name>`` (:data:`CALLBACK_SLOTS`), each typed by its class
(``class_path`` optional), rather than in ``trainer.callbacks``, which a later config can only replace whole:
``--callbacks.hessian.every_n_tasks=5``, ``--callbacks.hessian=null``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from cl_lightning.callbacks import CostMonitor, ForgettingMonitor, HessianMonitor, PlasticityMonitor
from cl_lightning.errors import UsageError, key_lines, load_yaml

INCLUDE_KEY = "include"
CALLBACK_SLOTS: dict[str, type[Callback]] = {
    "checkpoint": ModelCheckpoint,
    "forgetting": ForgettingMonitor,
    "plasticity": PlasticityMonitor,
    "hessian": HessianMonitor,
    "cost": CostMonitor,
}
"""The named callback slots and the class each holds (a subclass of it too, given by ``class_path``)."""


def config_chain(path: Path, _stack: tuple[Path, ...] = ()) -> list[Path]:
    """The files that make up ``path``: its includes' chains in order, then ``path`` itself.

    Args:
        path: A YAML config file, possibly with an ``include`` list of paths relative to it.

    Raises:
        UsageError: A file does not parse (file and line named), an included file does not exist, the includes
            form a cycle, or ``include`` is not a path or a list of paths.
    """
    resolved = path.resolve()
    if resolved in _stack:
        raise UsageError(f"include cycle: {' -> '.join(str(p) for p in (*_stack, resolved))}")
    content = load_yaml(path)
    includes = content.get(INCLUDE_KEY) if isinstance(content, dict) else None
    if includes is None:
        return [path]
    if isinstance(includes, str):
        includes = [includes]
    where = f"{path}:{key_lines(path).get((INCLUDE_KEY,), 1)}"
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise UsageError(f"{where}: `{INCLUDE_KEY}` must be a path or a list of paths, got {includes!r}")
    chain: list[Path] = []
    for include in includes:
        fragment = path.parent / include
        if not fragment.is_file():
            raise UsageError(f"{where}: included {include!r} not found (relative to the including file)")
        chain.extend(config_chain(fragment, (*_stack, resolved)))
    return [*chain, path]


def scan_option(args: Sequence[str], option: str) -> Iterator[tuple[bool, str]]:
    """``args`` as ``(True, VALUE)`` for each ``option VALUE`` or ``option=VALUE`` and ``(False, arg)`` for any other
    argument (``option``: e.g. ``--config``)."""
    i = 0
    while i < len(args):
        if args[i] == option and i + 1 < len(args):
            yield True, args[i + 1]
            i += 2
        else:
            given = args[i].startswith(f"{option}=")
            yield given, (args[i].split("=", 1)[1] if given else args[i])
            i += 1


def expand_includes(args: Sequence[str]) -> list[str]:
    """Command-line arguments with each ``--config FILE`` replaced by ``--config`` of every file of its chain.

    A fragment reached twice within one ``--config`` (two fragments including the same base) is applied once, at its
    first place. ``--config`` values that are not files (jsonargparse also takes a YAML string) pass unchanged.
    """
    out: list[str] = []
    for given, value in scan_option(args, "--config"):
        if not given:
            out.append(value)
        elif not Path(value).is_file():
            out += ["--config", value]
        else:
            seen: set[Path] = set()
            for file in config_chain(Path(value)):
                if file.resolve() not in seen:
                    seen.add(file.resolve())
                    out += ["--config", str(file)]
    return out
