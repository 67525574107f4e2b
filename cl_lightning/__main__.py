"""``python -m cl_lightning`` runs the command line."""

from cl_lightning.cli import main

if __name__ == "__main__":
    main()
