"""The one error path of every command: a mistake is one ``error:`` line, exit code 2, no traceback (``--debug`` or
``CL_LIGHTNING_DEBUG=1``: the traceback instead). Nothing here imports Lightning or torch.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

DEBUG_HINT = "traceback: --debug"
USAGE_EXIT = 2


class UsageError(ValueError):
    """A mistake in the config or on the command line, already worded for the user."""


def debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` among the arguments, or ``CL_LIGHTNING_DEBUG`` set to anything but ``0``."""
    return "--debug" in argv or os.environ.get("CL_LIGHTNING_DEBUG", "0") not in ("", "0")


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest option, else the empty string."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a file that is missing or does not parse is a :class:`UsageError` naming file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not a YAML text file ({type(error).__name__})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UsageError(f"{where}: not valid YAML: {problem}") from None


def key_lines(path: str | Path) -> dict[tuple[str, ...], int]:
    """The 1-based line of every mapping key of a YAML file, by its key path (``("experiments", "bp", "configs")``).

    Only for naming a line in a message: a file that does not parse gives an empty map (:func:`load_yaml` reports it).
    """
    try:
        root = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = (*prefix, str(key.value))
                lines[here] = key.start_mark.line + 1
                walk(value, here)

    walk(root, ())
    return lines


def fail(message: str, code: int = USAGE_EXIT, hint: bool = True) -> NoReturn:
    """Write ``error: <message>`` (and the ``--debug`` hint) to stderr and exit with ``code``."""
    text = " ".join(message.split())
    sys.stderr.write(f"error: {text}{f' ({DEBUG_HINT})' if hint else ''}\n")
    raise SystemExit(code)


def guarded(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run ``command(argv)``; a :class:`ValueError`, a missing file or a permission error is one line and exit 2."""
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        return command(argv)
    except (ValueError, OSError) as error:
        if debug:
            raise
        message = str(error) if isinstance(error, ValueError) else f"{error.filename}: {error.strerror}"
        fail(message or type(error).__name__)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one ``error:`` line and exit code 2, like every command's (no usage block)."""

    def error(self, message: str) -> NoReturn:
        """Report ``message`` in one line."""
        fail(f"{message} ({self.prog} --help lists the options)", hint=False)
