"""The command line's thread policy: one intra-op thread unless the user chose a number.

torch starts one thread per core. The networks of the CPU streams are small (a step is a few matrix products of
hundreds of rows), so the threads mostly wait for each other, and on a machine that has other work they wait for
the cores too: a small-network step took 179 ms with torch's 2 threads and 13 ms with one on a loaded 2-core machine
(docs/results/threads.md). ``python -m cl_lightning fit|validate|test`` therefore runs with one thread, unless
``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) is set, which torch then follows: ``OMP_NUM_THREADS=4 python -m
cl_lightning fit …``. A program that calls :func:`cl_lightning.run.cli.main` itself keeps its own
``torch.set_num_threads``: the policy is applied by the process's entry point only (:mod:`cl_lightning.__main__`).
"""

from __future__ import annotations

import os

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = 1


def apply_thread_policy(environ: dict[str, str] | None = None) -> int:
    """Set torch's intra-op threads to :data:`DEFAULT_THREADS` unless a thread variable is set; returns the count."""
    import torch

    environ = os.environ if environ is None else environ
    if not any(environ.get(name, "").strip() for name in THREAD_VARIABLES):
        torch.set_num_threads(DEFAULT_THREADS)
    return torch.get_num_threads()
