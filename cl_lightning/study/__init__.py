"""Studies: suites of experiments × seeds (``sweep``), and what is read back from their runs (``report``: tables,
figures, departures from the paper configs, the paper's published values). The report reads saved configs and
TensorBoard event files; it imports neither the training command line nor a callback."""
