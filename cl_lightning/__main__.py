"""``python -m cl_lightning`` (and the ``cl-lightning`` script) runs the command line: ``fit``/``validate``/``test``
(LightningCLI, :mod:`cl_lightning.cli`), ``sweep`` (a suite of experiments × seeds, :mod:`cl_lightning.sweep`) and
``report`` (its figures and table, :mod:`cl_lightning.report`)."""

import sys


def main() -> None:
    """Dispatch ``sweep`` and ``report`` to their modules and everything else to the LightningCLI."""
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command == "sweep":
        from cl_lightning.sweep import main as sweep

        sys.exit(sweep(sys.argv[2:]))
    elif command == "report":
        from cl_lightning.report import main as report

        sys.exit(report(sys.argv[2:]))
    else:
        from cl_lightning.cli import main as cli

        cli()


if __name__ == "__main__":
    main()
