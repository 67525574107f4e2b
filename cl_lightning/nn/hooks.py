"""Whether modules carry forward hooks: a fast path that computes a module's output without calling it would skip
them (a monitor's probe would see nothing), so it runs only where none is registered."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def has_forward_hooks(modules: Iterable[nn.Module]) -> bool:
    """Whether any of ``modules`` has a forward or forward-pre hook of its own (global hooks are not counted)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)
