"""What the command line tells the user: one-line errors (the option, what is wrong, what it accepts, the config
file and line that set it) and no library noise."""

from __future__ import annotations

import errno
import importlib
import inspect
import logging
import re
import sys
import traceback
import warnings
from typing import Any, ClassVar

from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from cl_lightning import data, learners
from cl_lightning.errors import UsageError, did_you_mean, key_lines
from cl_lightning.run.cli_help import HelpFormatter, package_first
from cl_lightning.run.compose import scan_option

LINKED = ("input_shape", "num_outputs", "task_type")  # the learner's, filled in from the data module's: never typed

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _import(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _options(class_path: str) -> list[str]:
    """The ``init_args`` a class accepts: its ``__init__`` keywords and, through ``**kwargs``, its parents' (as
    jsonargparse follows them), less the linked ones and a learner's ``fixed_arguments``."""
    cls = _import(class_path)
    if cls is None:
        return []
    names: list[str] = []
    for owner in cls.__mro__:
        if "__init__" not in vars(owner):
            continue
        params = inspect.signature(owner.__init__).parameters.values()
        names += [p.name for p in params if p.kind not in _VARIADIC and p.name not in {"self", *names}]
        if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params):
            break
    skipped = {*LINKED, *getattr(cls, "fixed_arguments", ())}
    return [name for name in names if name not in skipped]


def _choices(key: str) -> list[str]:
    """Short class names a ``class_path`` option accepts: learners for ``model``, streams for ``data.stream``."""
    if key != "model" and not key.endswith("stream"):
        return []
    package, base = (learners, learners.ContinualLearner) if key == "model" else (data, data.TaskStream)
    found = [getattr(package, name) for name in package.__all__]
    return [c.__name__ for c in found if inspect.isclass(c) and issubclass(c, base) and not inspect.isabstract(c)]


def _key_path(message: str) -> tuple[str, str | None]:
    """The dotted option a nested jsonargparse message is about, and the innermost ``class_path`` on that path."""
    path, class_path = "", None
    for match in re.finditer(r"Parser key \"([^\"]+)\"|Problem with given class_path '([^']+)'", message):
        if match.group(1):
            path = f"{path}.{match.group(1)}" if path else match.group(1)
        else:
            class_path = match.group(2)
            path += ".init_args"
    return path, class_path


def _split_top(text: str) -> list[str]:
    """Split ``a, b[c, d], e`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "[("
        depth -= char in "])"
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _short_type(text: str) -> str:
    """``[<class 'int'>, typing.Literal['a', 'b'], <class 'NoneType'>]`` → ``int or one of 'a', 'b' or null``."""
    out = []
    for part in _split_top(text):
        part = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", part).replace("NoneType", "null")
        literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", part)
        out.append(f"one of {literal.group(1)}" if literal else part)
    return " or ".join(out)


def _unknown_class(path: str, given: str) -> str:
    """A class option given a name that is no class of its kind, or an abstract base (``ReplayLearner``)."""
    choices = _choices(path)
    listed = f"; choose one of: {', '.join(choices)}" if choices else ""
    base = _import(given) or _import(f"cl_lightning.learners.{given}") or _import(f"cl_lightning.data.{given}")
    if inspect.isclass(base) and inspect.isabstract(base):
        return f"{path}: {base.__name__} is an abstract base class, not something to run{listed}"
    name = given.rpartition(".")[2]
    return f"{path}: unknown class '{given}'{did_you_mean(name, choices)}{listed}"


def concise_parse_error(message: str, options: list[str] | None = None) -> str:
    """One line from a jsonargparse error report: the option, what is wrong, and what it accepts (``options``: the
    dotted options of the parser, for a suggestion when a key is misspelt)."""
    refused = re.search(r"Subcommand '\w+' does not accept option '([\w.]+)'", message)
    if refused:  # a key no section has, e.g. `trainr:` in a config file
        option, known = refused.group(1), options or []
        top = option.split(".")[0]
        tops = list(dict.fromkeys(o.split(".")[0] for o in known))
        if top not in tops:
            return f"{top}: unknown key{did_you_mean(top, tops)}; the top-level keys: {', '.join(tops)}"
        return f"{option}: unknown option{did_you_mean(option, known)}"
    path, class_path = _key_path(message)
    tail = message[message.rfind('Parser key "') :] if 'Parser key "' in message else message
    nested = re.search(r"Got value: Namespace\(class_path='([^']+)'", tail)  # a callable's class (optimizer)
    if nested:
        class_path, path = nested.group(1), f"{path}.init_args"
    unknown = re.search(r"Option '([^']+)' is not accepted|Key \"?'?([\w.]+)'?\"? is not expected", message)
    if unknown:
        option = unknown.group(1) or unknown.group(2)
        if class_path:
            options = _options(class_path)
            name = class_path.rpartition(".")[2]
            return (
                f"{path}.{option}: {name} has no option '{option}'{did_you_mean(option, options)}; "
                f"its options: {', '.join(options)}"
            )
        return f"unknown option '{option}'"
    bad_class = re.search(
        r"Expected a dot import path string: (\S+)|Expected a path but (\S+) either not accessible"
        r"|Import path (\S+) does not correspond|Problem with given class_path '([^']+)':\s*(?:module|No module)",
        message,
    )
    if bad_class and path:
        return _unknown_class(path.removesuffix(".init_args"), next(g for g in bad_class.groups() if g))
    given = re.search(r"Given value: (.*)|Got value: (.*)", tail)
    if given and path:
        subtypes = re.search(r"Subtypes: \[(.*)\]", tail)
        expected = re.search(r"Expected a (.*?)(?:\. Got value:|$)", tail, re.MULTILINE)
        wanted = _short_type(subtypes.group(1) if subtypes else expected.group(1) if expected else "another type")
        return f"{path}: expected {wanted}, got {(given.group(1) or given.group(2)).strip()!r}"
    missing = re.search(r'Parser key "config": File does not exist: (.*)', message)
    if missing:
        return f"--config {missing.group(1).strip()}: no such file"
    if message.startswith("unrecognized arguments"):
        first = re.match(r"unrecognized arguments: --([\w.]+)", message)
        hint = did_you_mean(first.group(1), options or []) if first else ""
        return f"{message.strip()}{hint} (python -m cl_lightning fit --help lists the options)"
    lines = [line.strip(" -") for line in message.strip().splitlines() if line.strip(" -")]
    return "; ".join(lines[:2])[:300]


class ConciseArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose errors are one ``error: …`` line and exit code 2 (``debug``: jsonargparse's)."""

    debug = False
    arguments: ClassVar[list[str]] = []  # the command line, includes expanded: where an option was set

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)  # also the parsers jsonargparse makes for --X.help
        kwargs["allow_abbrev"] = False  # `--trainer.max_epoch` is a mistake, not `--trainer.max_epochs`
        super().__init__(*args, **kwargs)

    def format_help(self, formatter: Any = None) -> str:
        """The help, the package's options before the Trainer's (:mod:`cl_lightning.run.cli_help`)."""
        with package_first(self):
            return super().format_help() if formatter is None else super().format_help(formatter)

    def error(self, message: str, ex: Exception | None = None) -> Any:
        """Write one line and exit with code 2 (jsonargparse's internal, non-exiting parsers are left alone)."""
        if not self.exit_on_error or type(self).debug:
            return ArgumentParser.error(self, message, ex)
        line = concise_parse_error(message, self.option_names())
        option = re.match(r"([\w.]+): ", line)
        where = locate(option.group(1), type(self).arguments) if option else None
        sys.stderr.write(f"error: {f'{where}: ' if where else ''}{line}\n")
        raise SystemExit(2)

    def option_names(self) -> list[str]:
        """The dotted options of the running subcommand's parser (of this parser when it has no subcommands)."""
        parser: Any = self
        subcommands = getattr(self, "_subcommands_action", None)
        if subcommands is not None:
            chosen = next((a for a in type(self).arguments if a in subcommands._name_parser_map), None)
            parser = subcommands._name_parser_map.get(chosen, self)
        names = [a.dest for a in parser._actions if a.dest not in ("help", "config", "include", "print_config")]
        return [n for n in names if not n.startswith("_") and n != "==SUPPRESS=="]


def locate(option: str, arguments: list[str]) -> str | None:
    """``file:line`` of the ``--config`` file that last sets the dotted ``option`` (``init_args`` may be left out
    there); ``None`` when the command line sets it after every such file, or nothing does."""
    short = ".".join(p for p in option.split(".") if p != "init_args")
    flag = re.compile(rf"--({re.escape(option)}|{re.escape(short)})(=|\.|$)")
    where = None
    for given, arg in scan_option(arguments, "--config"):
        if given:
            lines = key_lines(arg)
            for key in (tuple(option.split(".")), tuple(short.split("."))):
                if key in lines:
                    where = f"{arg}:{lines[key]}"
                    break
        elif flag.match(arg):
            where = None
    return where


def origin(error: BaseException) -> str | None:
    """The class whose ``__init__`` raised ``error`` (the innermost constructor on its traceback), if any."""
    found = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and not isinstance(owner, LightningCLI | None):
            found = type(owner).__name__
    return found


def describe(error: BaseException) -> str:
    """The one-line message of an error the CLI reports without a traceback."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, UsageError):
        return text
    if "Union subtypes" in text:  # jsonargparse wrapped a constructor's error: the first real one, and its class
        cause = error.__cause__ or error.__context__
        if cause is not None and "Union subtypes" not in str(cause):
            return describe(cause)
        reasons = [r for r in re.findall(r"- (.*?)(?= - |Given value|$)", text) if "NoneType" not in r]
        class_path = re.search(r"class_path='([^']+)'", text)
        if reasons:
            name = class_path.group(1).rpartition(".")[2] if class_path else None
            return f"{name}: {reasons[0].strip()}" if name else reasons[0].strip()
    where = origin(error)
    private = where is None or where.startswith("_")  # Lightning's internal helpers mean nothing to a user
    return f"{where}: {text}" if not private and not text.startswith(where) else text


def file_system_message(error: OSError) -> str:
    """A file system refusal (read-only or unwritable folder, full disk, …) in one line, naming the path."""
    path = error.filename or "a file"
    if error.errno == errno.ENOSPC:
        return f"{path}: no space left on device"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"{path}: cannot write there ({error.strerror or 'not writable'}); make it writable or log elsewhere "
            "(--trainer.logger.init_args.save_dir)"
        )
    return f"{path}: {error.strerror or describe(error)}"


class HeldLines(logging.Handler):
    """Holds Lightning's start-up lines (``Seed set to 0``, ``GPU available: …``) until :meth:`let_through`, so that a
    mistake found while the run is built is the one line on stderr."""

    LOGGERS = ("lightning.pytorch", "lightning.fabric")

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.held = True
        self.replaced = {name: list(logging.getLogger(name).handlers) for name in self.LOGGERS}
        for name, handlers in self.replaced.items():
            logger = logging.getLogger(name)
            for handler in handlers:
                logger.removeHandler(handler)
            logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        """Hold ``record`` until :meth:`let_through`, then pass it on to the logger's own handlers."""
        if self.held:
            self.records.append(record)
            return
        self._pass_on(record)

    def _pass_on(self, record: logging.LogRecord) -> None:
        for handlers in (h for name, h in self.replaced.items() if record.name.startswith(name)):
            for handler in handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)

    def let_through(self) -> None:
        """The run starts: print what was held, and from now on print as it comes."""
        self.held = False
        for record in self.records:
            self._pass_on(record)
        self.records = []

    def close(self) -> None:
        """Drop the held lines and restore the loggers' handlers."""
        for name, handlers in self.replaced.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            for handler in handlers:
                logger.addHandler(handler)
        self.records = []
        super().close()


def _no_advert(record: logging.LogRecord) -> bool:
    """Drops Lightning's "💡 Tip: … try installing …" advertisements (a logging filter)."""
    return "Tip: For seamless" not in record.getMessage()


def quiet() -> None:
    """Silence what is expected on a stream and the libraries' deprecation notices and advertisements."""
    # Expected on a stream: learners skip steps while their memory fills, a task's chunks are an IterableDataset
    # with a length, a task may have fewer chunks than the logging interval, replay learners keep a chunk's host
    # labels in their own on_before_batch_transfer, a warm-up task evaluates nothing. The LeafSpec and
    # torch.jit.script deprecations are Lightning's and torch.func's own calls. Under DDP, what a task's end logs
    # is the same on every rank (task means reduced over the ranks, every episode evaluated by every rank, monitors
    # of the parameters the ranks share; cost/* are rank 0's times), so Lightning's advice to sync_dist is moot.
    for message in (
        ".*overridden `on_before_batch_transfer` in `LightningModule` but have passed in a `LightningDataModule`.*",
        ".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*`training_step` returned `None`.*",
        ".*`IterableDataset` has `__len__` defined.*",
        ".*smaller than the logging interval.*",
        ".*`torch.jit.script` is deprecated.*",
        ".*Total length of `DataLoader` across ranks is zero.*",
        ".*when logging on epoch level in distributed setting.*",
    ):
        warnings.filterwarnings("ignore", message=message)
    # the CLI says itself that a run was stopped, and how to resume it (cl_lightning.run.stopping)
    logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector").setLevel(logging.WARNING)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_no_advert)  # once: a logger keeps one of each filter
