"""``python -m cl_lightning`` runs the command line: ``fit``/``validate``/``test`` (LightningCLI), ``sweep`` (a
suite of experiments × seeds, :mod:`cl_lightning.sweep`) and ``report`` (its figures and table,
:mod:`cl_lightning.report`)."""

import sys

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command == "sweep":
        from cl_lightning.sweep import main

        sys.exit(main(sys.argv[2:]))
    elif command == "report":
        from cl_lightning.report import main

        sys.exit(main(sys.argv[2:]))
    else:
        from cl_lightning.cli import main

        main()
