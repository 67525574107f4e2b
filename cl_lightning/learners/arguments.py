"""Which ``__init__`` arguments a learner takes: its config keys and the hyperparameters it records
(docs/architecture.md, "Constructors are keyword-only").

Constructors are keyword-only, and a subclass passes its parents' arguments on through ``**kwargs`` (jsonargparse
follows them, so they stay config keys). A learner's arguments are therefore read off the ``__init__`` signatures
along its MRO: its own keyword-only ones and, for as long as each ``__init__`` passes ``**kwargs`` on, its parents'
(:func:`taken_arguments`). Lightning's ``save_hyperparameters`` reads the arguments of every running ``__init__`` off
the call frames (:func:`running_arguments`); ``ContinualLearner`` ignores those its class does not take.
"""

from __future__ import annotations

import inspect

__all__ = ["running_arguments", "taken_arguments"]


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls.__init__).parameters)


def taken_arguments(cls: type, base: type) -> set[str]:
    """The keyword-only arguments of ``cls.__init__`` and, through ``**kwargs``, of its parents' ``__init__`` down to
    ``base``'s (the walk stops at the first ``__init__`` without ``**kwargs``)."""
    names: set[str] = set()
    for owner in cls.__mro__:
        if "__init__" in vars(owner):
            params = _parameters(owner)
            names |= {name for name, p in params.items() if p.kind is p.KEYWORD_ONLY}
            if owner is base or all(p.kind is not p.VAR_KEYWORD for p in params.values()):
                break
    return names


def running_arguments(cls: type) -> set[str]:
    """Every argument of every ``__init__`` along ``cls``'s MRO: what ``save_hyperparameters`` finds on the frames."""
    return {name for owner in cls.__mro__ if "__init__" in vars(owner) for name in _parameters(owner)}
