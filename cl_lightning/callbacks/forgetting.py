"""The accuracy matrix on the probe set and the transfer / forgetting metrics that follow from it, with pictures."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from cl_lightning.callbacks.probing import evaluation_mode, probe_episode, require_contract
from cl_lightning.contract import EpisodeSource, EvalSlot, ObservedLearner, metric_key
from cl_lightning.metrics import average_accuracy, backward_transfer, forgetting, forward_transfer, intransigence
from cl_lightning.metrics.figures import accuracy_matrix_figure, transfer_curves_figure

_STATE = ("matrix", "baseline", "forward", "backward")
"""The tensors a checkpoint keeps (besides the probe tasks)."""


class ForgettingMonitor(Callback):
    """Fills the probe-set accuracy matrix ``R`` and logs ACC, BWT, FWT, forgetting and intransigence, with figures
    (docs/metrics.md §2: the definitions, their sources and how other libraries differ).

    ``R[i, j]`` is the score on probe task ``j`` after training probe task ``i`` (``K × K``; rows and columns are both
    the probe tasks, the metric functions' ``row_tasks`` / ``col_tasks``). The learner logs it under
    ``metric_key(EvalSlot("matrix", j), m)``; this callback only reads it from ``trainer.callback_metrics`` after each
    probe task (nothing is evaluated twice), keeps it in its state (a resumed run restores it) and logs the metrics
    of :mod:`cl_lightning.metrics.forgetting` on the rows filled so far (``forgetting/*``; ``lower_is_better`` on
    MSE). ``b`` of FWT is the learner's score at initialisation, measured once at fit start. It also keeps the
    per-task forward and backward scores for the curves. Tasks are evaluated tasks: warm-up tasks have none.

    Cost: ``measure_baseline`` (one pass over the K probe episodes at fit start, the only evaluation this callback
    runs), ``plot`` and ``plot_budget`` (two figures take ~0.5 s of matplotlib, more than everything else here).

    Args:
        measure_baseline: Score the freshly initialised learner on every probe task at fit start (b of FWT). When a
            run resumes from a checkpoint without this callback's state, b stays unknown and FWT is not logged.
        reference: Intransigence reference a* on every probe task (one number for all); None: the ideal score.
        plot: Log the heatmap and curve figures to the loggers that take figures (TensorBoard).
        plot_budget: Largest fraction of the run's wall time spent drawing: a new row's figures are drawn when the
            drawing so far took at most this fraction of the time since fit start; the first and the last probe
            row are always drawn (so every run ends with its final figures).
    """

    def __init__(
        self,
        measure_baseline: bool = True,
        reference: float | None = None,
        plot: bool = True,
        plot_budget: float = 0.02,
    ) -> None:
        if plot_budget < 0:
            raise ValueError(f"plot_budget must be >= 0, got {plot_budget}")
        self.measure_baseline, self.reference = measure_baseline, reference
        self.plot, self.plot_budget = plot, plot_budget
        self._fit_start, self._plot_seconds = time.monotonic(), 0.0
        self.probe_tasks: list[int] = []
        self._allocate(0, 0)

    def _allocate(self, k: int, t: int) -> None:
        """``R`` and the curves at their final shapes for ``k`` probe tasks and ``t`` evaluated tasks, NaN-filled."""
        self.matrix = torch.full((k, k), math.nan, dtype=torch.float64)  # (K, K) R, NaN where not measured
        self.baseline = torch.full((k,), math.nan, dtype=torch.float64)  # (K,) b: score at initialisation
        self.forward = torch.full((t,), math.nan, dtype=torch.float64)  # (T,) eval/forward_{m} after each task
        self.backward = torch.full((t,), math.nan, dtype=torch.float64)  # (T,) eval/backward_{m} after each task

    def setup(self, trainer: Trainer, pl_module: ObservedLearner, stage: str) -> None:
        """Allocate ``R`` (K × K) and the per-task curves at their final shapes, NaN-filled."""
        if stage != "fit":
            return
        require_contract(trainer, pl_module, type(self).__name__)
        dm: EpisodeSource = trainer.datamodule
        self.probe_tasks = list(dm.probe_tasks)
        self._allocate(len(self.probe_tasks), dm.num_evaluated_tasks)  # warm-up tasks: no row, column or point

    def state_dict(self) -> dict[str, Any]:
        """``R``, b, the forward/backward curves and the probe tasks they belong to."""
        return {"probe_tasks": list(self.probe_tasks)} | {name: getattr(self, name).clone() for name in _STATE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (the probe set must be the same)."""
        if self.probe_tasks and list(state_dict["probe_tasks"]) != self.probe_tasks:
            raise ValueError(
                f"checkpoint's probe tasks {state_dict['probe_tasks']} differ from this run's {self.probe_tasks}"
            )
        self.probe_tasks = list(state_dict["probe_tasks"])
        for name in _STATE:
            setattr(self, name, state_dict[name].clone().to(torch.float64))

    def recent_means(self, n: int = 10) -> dict[str, tuple[float, int]]:
        """``{"forward" | "backward": (mean, count)}`` over the last ``n`` evaluated tasks that have the score."""
        out = {}
        for role, curve in (("forward", self.forward), ("backward", self.backward)):
            seen = curve[~curve.isnan()][-n:]
            if seen.numel():
                out[role] = (float(seen.mean()), seen.numel())
        return out

    def last_average(self, lower_is_better: bool) -> float | None:
        """ACC of the last row of ``R`` measured so far (``None`` before the first probe row)."""
        rows = int((~self.matrix.isnan()).any(1).sum())
        return self.metrics(rows, lower_is_better)["forgetting/avg"] if rows else None

    def on_fit_start(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Score the learner at initialisation on every probe task (once; not on resume)."""
        self._fit_start, self._plot_seconds = time.monotonic(), 0.0
        if not self.measure_baseline or trainer.ckpt_path is not None or not self.probe_tasks:
            return
        if not bool(self.baseline.isnan().all()):
            return
        dm: EpisodeSource = trainer.datamodule
        with evaluation_mode(pl_module):
            for j, task in enumerate(self.probe_tasks):
                cx, cy, qx, qy = probe_episode(trainer, pl_module, task, dm.eval_queries)
                self.baseline[j] = float(pl_module.score(pl_module.predict_episode(cx, cy, qx), qy))

    def metrics(self, rows: int, lower_is_better: bool) -> dict[str, float]:
        """The transfer and forgetting metrics on the first ``rows`` rows of ``R``."""
        r, tasks = self.matrix[:rows].numpy(), self.probe_tasks
        row_tasks, ideal = tasks[:rows], 0.0 if lower_is_better else 1.0
        ref = np.full(len(tasks), ideal if self.reference is None else self.reference)
        out = {
            "forgetting/avg": average_accuracy(r, row_tasks, tasks),
            "forgetting/bwt": backward_transfer(r, row_tasks, tasks, lower_is_better),
            "forgetting/forgetting": forgetting(r, row_tasks, tasks, lower_is_better),
            "forgetting/intransigence": intransigence(r, ref, row_tasks, tasks, lower_is_better),
        }
        if not bool(self.baseline.isnan().any()):
            out["forgetting/fwt"] = forward_transfer(r, self.baseline.numpy(), row_tasks, tasks, lower_is_better)
        return out

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """Collect this task's forward/backward scores and, after a probe task, its row of ``R``; log (in a fit only:
        the ``validate`` command scores the final row, which the learner logs as ``validate/...`` itself)."""
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or not self.forward.numel():
            return
        dm: EpisodeSource = trainer.datamodule
        task, m, logged = dm.evaluated_task(trainer.current_epoch), pl_module.metric_name, trainer.callback_metrics
        if task is None:  # a warm-up task: nothing was evaluated
            return
        for curve, role in ((self.forward, "forward"), (self.backward, "backward")):
            name = metric_key(EvalSlot(role), m)
            if name in logged and task < curve.numel():
                curve[task] = float(logged[name])
        if task not in self.probe_tasks:
            return
        row = self.probe_tasks.index(task)
        for j, probe in enumerate(self.probe_tasks):
            value = logged.get(metric_key(EvalSlot("matrix", probe), m))
            self.matrix[row, j] = math.nan if value is None else float(value)
        for name, value in self.metrics(row + 1, pl_module.task_type == "regression").items():
            if not math.isnan(value):
                pl_module.log(name, torch.tensor(value, dtype=torch.float32), batch_size=1)
        if self.plot and trainer.is_global_zero and self._within_budget(row):
            start = time.monotonic()
            self._plot(trainer, m)
            self._plot_seconds += time.monotonic() - start

    def _within_budget(self, row: int) -> bool:
        """Whether to draw this row's figures: always the first and the last row, others within ``plot_budget``."""
        if row in (0, len(self.probe_tasks) - 1):
            return True
        return self._plot_seconds <= self.plot_budget * (time.monotonic() - self._fit_start)

    def _plot(self, trainer: Trainer, metric: str) -> None:
        loggers = [lg for lg in trainer.loggers if hasattr(lg.experiment, "add_figure")]
        if not loggers:
            return
        matrix, tasks = self.matrix.numpy(), self.probe_tasks
        heatmap = accuracy_matrix_figure(matrix, tasks, self.baseline.numpy(), metric)
        curves = transfer_curves_figure(self.forward.numpy(), self.backward.numpy(), matrix, tasks, metric)
        figures = {f"forgetting/{metric}_matrix": heatmap, "forgetting/curves": curves}
        for logger in loggers:
            for tag, fig in figures.items():
                logger.experiment.add_figure(tag, fig, global_step=trainer.global_step, close=False)
