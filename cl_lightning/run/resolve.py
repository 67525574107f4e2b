"""``python -m cl_lightning.run.resolve --config C1 --config C2 … ARGS`` prints, as JSON, the config that ``fit`` with
the same arguments resolves to (:func:`resolved_config`); given ``-`` instead, a JSON list of such argument lists on
standard input, a JSON list of configs. ``report`` runs it in a child process to compare a suite's trials with their
paper configs (:mod:`cl_lightning.study.departures`), so reading results never imports the training command line.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import yaml

from cl_lightning.errors import guarded
from cl_lightning.run.cli import CLI


def resolved_config(configs: Sequence[str], args: Sequence[str] = ()) -> dict[str, Any]:
    """The config that ``fit --config C1 --config C2 … ARGS`` resolves to, as plain values: its saved ``config.yaml``
    less ``ckpt_path`` and ``weights_only``. Nothing is built, seeded or written.

    Raises:
        SystemExit: The configs do not parse (the one-line ``error:`` of the command line).
    """

    class ConfigOnly(CLI):
        """The CLI up to its resolved config: nothing is seeded or built."""

        def seed(self) -> None:
            """Nothing: a resolved config needs no seed."""

        def instantiate_classes(self) -> None:
            """Nothing: only the parsed config is wanted."""

    argv = [a for c in configs for a in ("--config", str(c))] + list(args)
    with warnings.catch_warnings():
        # called from another command (`report`), whose own arguments are in sys.argv; the deprecations are
        # jsonargparse's, raised by Lightning's own calls (and `skip_none`, kept to dump as Lightning's run does)
        for message in ("not recommended to provide both args", "add_instantiator", "skip_none parameter"):
            warnings.filterwarnings("ignore", message=f".*{message}.*")
        cli = ConfigOnly(args=argv, run=False)
        return yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))


def main(argv: list[str]) -> int:
    """Print the resolved config of ``argv`` (``fit``'s arguments without the command) as JSON; with ``argv`` ``["-"]``
    the configs of every argument list in the JSON list on standard input."""
    out = [resolved_config([], args) for args in json.load(sys.stdin)] if argv == ["-"] else resolved_config([], argv)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main, sys.argv[1:]))
