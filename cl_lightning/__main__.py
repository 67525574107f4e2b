"""``python -m cl_lightning``: ``fit`` / ``validate`` / ``test`` (:mod:`cl_lightning.run.cli`), ``sweep``
(:mod:`cl_lightning.study.sweep`) and ``report`` (:mod:`cl_lightning.study.report`)."""

from __future__ import annotations

import importlib
import sys

from cl_lightning.errors import did_you_mean, fail, guarded
from cl_lightning.run import process_signals

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
COMMANDS = (*LIGHTNING_COMMANDS, "sweep", "report")


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``sweep`` and ``report`` to their modules and the Lightning commands to the LightningCLI."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args else None
    if command in ("sweep", "report"):
        sys.exit(guarded(importlib.import_module(f"cl_lightning.study.{command}").main, args[1:]))
    elif command is not None and not command.startswith("-") and command not in LIGHTNING_COMMANDS:
        hint = did_you_mean(command, COMMANDS)
        fail(f"no command '{command}'{hint}; choose one of: {', '.join(COMMANDS)}", hint=False)
    else:
        if argv is None and command == "fit":  # the process's entry point: a signal has a defined outcome until exit
            process_signals.watch()
        if argv is None:  # the process's entry point, before torch starts OpenMP: its thread count
            from cl_lightning.run.threads import apply_thread_policy

            apply_thread_policy()
        from cl_lightning.run.cli import main as cli

        cli(None if argv is None else args)


if __name__ == "__main__":
    main()
