"""What a learner's fused inner step (``ContinualLearner.learn_fused``) shares: the configured Adam bound to one flat
tensor, and the bookkeeping of the steps it took.

A fused step (:mod:`cl_lightning.nn.fused_steps`: hand-written gradients, one fused Adam on a flat tensor) takes the
place of ``learn_chunk`` on the remaining chunks of a ``StreamSteps`` batch. It applies only where it computes what
``learn_chunk`` would: a regression task on the CPU, the configured optimiser one :class:`FlatAdam` or
:class:`FlatAdamGnT` reproduces, no forward hook on any of the learner's modules (a monitor's hook would not fire),
full precision (``learn_steps`` runs only there). None of these changes inside a batch, so a refusal holds for the
rest of it (``ChunkedRun.fused_refused``, :mod:`cl_lightning.learners.chunked`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from cl_lightning.nn import fused_steps, native
from cl_lightning.nn.adam_gnt import AdamGnT
from cl_lightning.nn.flat_adam import FlatAdam, FlatAdamGnT, FlatOptimizer, adam_refusal
from cl_lightning.nn.hooks import has_forward_hooks

StepKernel = Literal["torch", "native"]

if TYPE_CHECKING:
    from cl_lightning.learners.base import ContinualLearner
    from cl_lightning.nn.scorers import PairScorer


def fused_adam(learner: ContinualLearner) -> FlatOptimizer | None:
    """The optimiser of the running ``learn_steps`` as one flat Adam (or AdamGnT) over the learner's parameters,
    bound for this batch; ``None`` where a fused step must not run (see the module docstring), which also stops
    ``learn_steps`` asking again in this batch. A refused optimiser is warned of once per learner."""
    optimizer = learner._chunked.optimizer
    learner._chunked.fused_refused = True  # until every check below has passed
    if learner.task_type != "regression" or optimizer is None or learner.device.type != "cpu":
        return None  # bit-exactness is tested on the CPU only (no accelerator was at hand to test it on)
    if has_forward_hooks(learner.modules()):
        return None
    params = list(learner.parameters())
    reason = adam_refusal(optimizer, params)
    if reason is not None:
        _warn_once(learner, "_fused_warned", f"no fused step ({reason}); learning chunk by chunk")
        return None
    learner._chunked.fused_refused = False
    flat_type = FlatAdamGnT if isinstance(optimizer, AdamGnT) else FlatAdam
    adam = learner.__dict__.get("_flat_adam")  # not module state: rebuilt from the optimiser
    if type(adam) is not flat_type:
        adam = learner.__dict__["_flat_adam"] = flat_type()
    return adam.bind(optimizer, params)


def check_step_kernel(step_kernel: StepKernel) -> StepKernel:
    """``step_kernel``, checked at construction, not mid-run: ``"native"`` needs the C kernels
    (:mod:`cl_lightning.nn.native`), which are built here on first use;
    :class:`~cl_lightning.nn.native.NativeUnavailableError` says why they cannot be."""
    if step_kernel not in ("torch", "native"):
        raise ValueError(f"step_kernel must be 'torch' or 'native', not {step_kernel!r}")
    if step_kernel == "native":
        native.library()
    return step_kernel


def uses_native(learner: ContinualLearner, adam: FlatOptimizer, kind: type[FlatOptimizer] = FlatAdam) -> bool:
    """Whether this batch's fused steps run in the C kernels: the learner asks for them (``step_kernel``) and they
    implement its optimiser as ``kind`` (:func:`cl_lightning.nn.native.refusal`; a refusal is warned of once per
    learner, and the torch fused step runs instead)."""
    if getattr(learner, "step_kernel", "torch") != "native":
        return False
    reason = native.refusal(adam, kind)
    if reason is not None:
        _warn_once(learner, "_native_warned", f"no native step kernel ({reason}); torch fused steps")
    return reason is None


def attention_steps(
    learner: ContinualLearner,
    adam: FlatOptimizer,
    scorer: PairScorer,
    support: tuple[Tensor, Tensor],
    x: Tensor,
    y: Tensor,
) -> Tensor:
    """Label-free query-only attention steps along the stream: point ``t`` of ``x (T, D)``, ``y (T, k)`` is the query
    of step ``t`` over the ``S`` points before it, the first step's being ``support`` (``(S, D)``, ``(S, k)``; each
    later point joins them). The window ``support + x`` goes through
    :func:`~cl_lightning.nn.fused_steps.attention_mse_steps`, or its C form where :func:`uses_native`; the
    predictions ``(T, 1, k)``, each made before its step."""
    sx, sy = support
    window_x, window_y = torch.cat([sx, x.to(sx.dtype)]), torch.cat([sy, y.to(sy.dtype)])
    steps = native.attention_mse_steps if uses_native(learner, adam) else fused_steps.attention_mse_steps
    return steps(scorer.first, [*scorer.hidden, scorer.out], adam, window_x, window_y, sx.shape[0])


def _warn_once(learner: ContinualLearner, flag: str, message: str) -> None:
    """Warn ``message`` (prefixed with the learner's class) the first time per learner and ``flag``; the flag lives in
    the instance's ``__dict__``, not module state."""
    if not learner.__dict__.get(flag):
        learner.__dict__[flag] = True
        warnings.warn(f"{type(learner).__name__}: {message}", stacklevel=4)


def refuse(learner: ContinualLearner) -> None:
    """No fused step in the running batch (the learner's own reason, fixed for the batch): ``learn_steps`` stops
    asking; ``None``, for ``learn_fused`` to return."""
    learner._chunked.fused_refused = True


def finish_fused(learner: ContinualLearner, adam: FlatOptimizer, preds: Tensor, y: Tensor, weight: int) -> Tensor:
    """Book ``T`` fused steps as ``learn_chunk`` would have: the optimiser's step counts, the online predictions
    ``preds (T, B, k)`` of targets ``y (T, B, k)``, each step's MSE as a ``train/loss`` term of ``weight`` examples,
    ``T`` optimiser steps; returns the summed losses."""
    adam.release()
    steps, run = preds.shape[0], learner._chunked
    run.online.append((preds.flatten(0, 1), y.flatten(0, 1)))
    losses = (preds - y.to(preds.dtype)).pow(2).mean((1, 2))  # (T,): each step's loss
    values, weights = run.terms.setdefault("train/loss", ([], []))
    values.append(losses)  # one 1-d entry for the run of steps (ContinualLearner._add_deferred)
    weights.extend([weight] * steps)
    run.steps += steps
    return losses.sum()
