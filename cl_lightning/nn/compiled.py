"""An opt-in ``torch.compile`` of one function: compiled at its first call, never pickled.

A module's ``compile`` switch wraps the function its training step runs (query-only attention: the forward and the
loss) in :class:`LazyCompile`: a module built only to evaluate or to load a checkpoint pays no compilation, the
parameters and checkpoint keys stay the module's own (a bound method, no ``_orig_mod``), and the compiled function is
left out of pickles and deep copies (inductor's functions do not pickle). Cost and gain: docs/results/paper_size.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

__all__ = ["LazyCompile"]

T = TypeVar("T")


class LazyCompile(Generic[T]):
    """``fn`` through ``torch.compile(fn, mode=mode)``, compiled at the first call (see the module docstring).

    Args:
        fn: The function to compile (a bound method of the module whose parameters it reads).
        mode: ``torch.compile``'s mode (``"reduce-overhead"`` adds CUDA graphs on CUDA).
    """

    def __init__(self, fn: Callable[..., T], mode: str = "default") -> None:
        self.fn, self.mode = fn, mode
        self.compiled: Callable[..., T] | None = None  # built at the first call

    def __call__(self, *args: Any) -> T:
        """``fn(*args)``, through the compiled function (compiled first, at the first call)."""
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, mode=self.mode)
        return self.compiled(*args)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle and deep-copy without the compiled function (compiled again at the next call)."""
        return {**self.__dict__, "compiled": None}
