"""The life of one run: the ``fit`` / ``validate`` / ``test`` command line and everything that keeps a run safe
(config composition, one-line errors, signals and clean stops, atomic checkpoints, resume, the run-folder lock, the
closing summary). Nothing is imported here, so ``process_signals`` loads before torch and Lightning do."""
