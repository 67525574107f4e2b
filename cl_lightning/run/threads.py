"""The command line's thread policy: one intra-op thread unless ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` is set.

torch's one thread per core mostly waits on the small networks of the CPU streams, the more so on a busy machine
(docs/results/threads.md). Applied by the process's entry point only (:mod:`cl_lightning.__main__`): a program that
calls :func:`cl_lightning.run.cli.main` keeps its own.
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
