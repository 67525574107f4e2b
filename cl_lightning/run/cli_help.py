"""What ``--help`` prints: plain text, the package's options first, Lightning's in brief.

:class:`HelpFormatter` prints jsonargparse's help (from docstrings written for Sphinx) as plain text, with a one-line
usage, a callback slot's own arguments under it, and of Lightning's options their first sentence.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, Union, get_args, get_origin

from jsonargparse import ActionConfigFile, ArgumentParser, DefaultHelpFormatter

LIGHTNING_KEYS = ("trainer.", "callbacks.checkpoint.", "ckpt_path", "weights_only", "seed_everything")
"""Options documented by Lightning: their help is cut to its first sentence, their type left out."""
OWN_HELP = {
    "ckpt_path": "Resume the run a checkpoint belongs to, from it; 'last': this config's newest run.",
    "weights_only": "torch.load's weights_only for the checkpoint (null: Lightning's choice).",
    "seed_everything": "Seed of every generator, set before the classes are built (true: a random one).",
    "trainer.max_epochs": "One epoch is one task: leave it unset, the CLI fills in data.stream.init_args.num_tasks.",
    "trainer.reload_dataloaders_every_n_epochs": "Must be 1 (each epoch serves a new task); the CLI sets it.",
}
"""Lightning's options whose first sentence says nothing, or not enough, of what they do here."""

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc|ref|doc|py:\w+):`(~?)([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>]+)>`_")
_LITERAL = re.compile(r"``([^`]+)``")
_INTERPRETED = re.compile(r"`([^`]+)`")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.\s+(?=[A-Z(`\"'])")


def plain(text: str) -> str:
    """``text`` without Sphinx markup: roles as their target (``~`` keeps its last name), literals as their text."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = _LINK.sub(r"\1 (\2)", text)
    return _LITERAL.sub(r"\1", text)


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (all of it when it is one)."""
    end = _SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


def _brief(action: argparse.Action) -> bool:
    return action.dest.startswith(LIGHTNING_KEYS)


def _is_help(action: argparse.Action) -> bool:
    return action.dest.endswith(".help") and action.default == argparse.SUPPRESS


def slot_class(action: argparse.Action) -> type | None:
    """The class of an option typed ``Optional[C]`` with ``C`` a concrete class (a callback slot), else ``None``."""
    hint = getattr(action, "_typehint", None)
    if hint is None or get_origin(hint) is not Union or _is_help(action):
        return None
    classes = [t for t in get_args(hint) if t is not type(None)]
    single = classes[0] if len(classes) == 1 else None
    return single if inspect.isclass(single) and not inspect.isabstract(single) else None


@cache
def class_arguments(cls: type, key: str) -> tuple[argparse.Action, ...]:
    """The options of ``cls``'s ``__init__`` as ``--<key>.<name>`` (what ``--<key>.help`` prints)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, key, fail_untyped=False, sub_configs=True)
    skip = (argparse._HelpAction, ActionConfigFile)
    return tuple(a for a in parser._actions if not isinstance(a, skip) and a.dest.startswith(f"{key}."))


def _short_names(match: re.Match) -> str:
    """``known subclasses: a.b.C, a.b.D`` → ``one of C, D`` (the CLI resolves a class by its name)."""
    return "one of " + ", ".join(path.rsplit(".", 1)[-1] for path in match.group(1).split(", "))


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's formatter, printing plain text in the ways of the module docstring."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 8, **kwargs: Any) -> None:
        """Option names are long (``--callbacks.hessian.every_n_tasks``): the help goes below them, indented little."""
        super().__init__(prog, indent_increment, max_help_position, **kwargs)

    def _format_usage(self, usage: str | None, actions: Iterable[argparse.Action], *args: Any, **kwargs: Any) -> str:
        actions = list(actions)
        if usage is None:  # the options are listed below; a usage of 60 lines hides them
            if all(not a.option_strings for a in actions):  # the prefix argparse gives a subcommand's usage
                return super()._format_usage(usage, actions, *args, **kwargs)
            given = {s for a in actions for s in a.option_strings}
            named = " ".join(f"[{flag}]" for flag in ("-h", "-c CONFIG", "--print_config") if flag.split()[0] in given)
            positionals = " ".join(self._format_args(a, a.dest) for a in actions if not a.option_strings)
            usage = " ".join(p for p in (self._prog, named, "[--KEY VALUE ...]", positionals) if p)
        return plain(super()._format_usage(usage, actions, *args, **kwargs))

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def start_section(self, heading: str | None) -> None:
        """A group's heading (the first line of its class's docstring): its first sentence, as plain text."""
        super().start_section(first_sentence(plain(heading)).rstrip(".:") if heading else heading)

    def add_argument(self, action: argparse.Action) -> None:
        """The option, and beneath a callback slot its class's own options."""
        if _is_help(action) and (_brief(action) or action.dest.removesuffix(".help").startswith("callbacks.")):
            return  # --trainer.<x>.help: Lightning's classes, documented by Lightning; a slot's options follow it
        super().add_argument(action)
        cls = slot_class(action)
        if cls is not None:
            for inner in class_arguments(cls, action.dest):
                super().add_argument(inner)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        if _brief(action) or slot_class(action) is not None:
            text = re.sub(r", known subclasses: [^)]*", "", text)
        if _brief(action) and action.help and action.help != argparse.SUPPRESS:
            tail = re.sub(r"type: .*?, (?=default: )", "", text[len(action.help) :])
            tail = re.sub(r"(, )?type: .*\)$", ")", tail).replace(" ()", "")
            text = (OWN_HELP.get(action.dest) or first_sentence(plain(action.help))) + tail
        return re.sub(r"known subclasses: ([^)]*)", _short_names, text)

    def _expand_help(self, action: argparse.Action) -> str:
        return _INTERPRETED.sub(r"\1", plain(super()._expand_help(action)))  # an option's `x`: RST, not a quote


def _trainer_last(group: argparse._ArgumentGroup) -> bool:
    dests = [a.dest for a in group._group_actions]
    return bool(dests) and all(d.startswith("trainer") for d in dests)


@contextmanager
def package_first(parser: argparse.ArgumentParser) -> Iterator[None]:
    """While it is open, ``parser`` lists the Trainer's options after every other group."""
    groups = parser._action_groups
    parser._action_groups = sorted(groups, key=_trainer_last)  # stable: the rest keep their order
    try:
        yield
    finally:
        parser._action_groups = groups
