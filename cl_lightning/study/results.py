"""A suite's results in memory and the aggregations over seeds that the report's table and figures share.

An :class:`Experiment` holds one experiment's per-task curves (``(seeds, tasks)`` arrays, NaN where a seed logged
nothing) and its trials' records; the functions reduce such arrays over seeds the paper's way. Pure numpy.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cl_lightning.contract import EvalSlot, SlotRole, metric_key, parse_metric_key
from cl_lightning.metrics import window_means

HESSIAN_RANK = "hessian/eff_rank"
"""The Hessian effective rank :class:`cl_lightning.callbacks.HessianMonitor` logs (exact method, on its block: by
default the last layer), as the report's rank figure and block table read it."""
FIGURE4_RANK = "hessian/eff_rank/figure4"
""":data:`HESSIAN_RANK` as the authors' plotting scripts turn it into Figure 4 (:func:`figure4_rank`): a curve the
report derives, never logged."""


@dataclass
class Experiment:
    """One experiment's trials: per-task curves stacked over seeds, and each trial's record."""

    name: str
    label: str
    num_evaluated_tasks: int
    metric: str
    seeds: list[int] = field(default_factory=list)
    curves: dict[str, list[np.ndarray]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    stream: str | None = None
    published: str | None = None
    warmup_tasks: int = 0
    backward_lag: int | list[int] | None = None

    def rows(self, tag: str) -> np.ndarray:
        """``(seeds, tasks)`` array of a tag (NaN rows for seeds that never logged it)."""
        empty = np.full(self.num_evaluated_tasks, np.nan)
        return np.stack([c if c is not None else empty for c in self.curves.get(tag, [None] * len(self.seeds))])

    def score(self, role: SlotRole, task: int = -1) -> np.ndarray:
        """:meth:`rows` of the score of an evaluation slot (its :func:`~cl_lightning.contract.metric_key`)."""
        return self.rows(metric_key(EvalSlot(role, task), self.metric))

    def slots(self, role: SlotRole) -> list[int]:
        """The tasks of the ``role`` slots this experiment logged (probe tasks, lags, visits), in order."""
        found = (parse_metric_key(tag, self.metric) for tag in self.curves)
        return sorted(slot.task for slot in found if slot is not None and slot.role == role)

    def add(self, seed: int, curves: dict[str, np.ndarray], record: dict[str, Any]) -> None:
        """Add one seed's curves (tags missing from earlier seeds or from this one are NaN-padded)."""
        for tag in set(self.curves) | set(curves):
            self.curves.setdefault(tag, [None] * len(self.seeds)).append(curves.get(tag))
        self.seeds.append(seed)
        self.records.append(record)

    @property
    def window(self) -> int:
        """The plots' window: ``T // 80`` tasks (about the paper's 75–100 points), at least one."""
        return max(1, self.num_evaluated_tasks // 80)


@dataclass(frozen=True)
class PaperWindows:
    """The paper's curve of one experiment as points: its score per ``window``-task window where it was read.

    Args:
        window: Tasks per window (window ``w`` holds evaluated tasks ``w * window .. (w + 1) * window - 1``).
        at: The windows read.
        scores: ``{"forward" | "backward" | "effective_rank": one value per window}``; a ``[low, high]`` pair is a
            range read.
        figure: The paper's figure, for the legend.
        figures: A score's own figure where it is another (the effective rank: Figure 4).
        rank_zero_fill: Evaluated tasks the authors' scripts leave at rank 0 before their first measurement
            (:func:`figure4_rank`).
    """

    window: int
    at: list[int]
    scores: dict[str, list[float | list[float]]]
    figure: str
    figures: dict[str, str] = field(default_factory=dict)
    rank_zero_fill: int = 0

    def points(self, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(window centres in tasks, midpoints, half ranges) of ``role``'s values; empty when the paper has none."""
        values = self.scores.get(role) or []
        lo = np.array([v[0] if isinstance(v, list) else v for v in values], dtype=float)
        hi = np.array([v[1] if isinstance(v, list) else v for v in values], dtype=float)
        centres = np.asarray(self.at[: len(values)], dtype=float) * self.window + (self.window - 1) / 2
        return centres, (lo + hi) / 2, (hi - lo) / 2


def seed_band(rows: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The paper's curve of a ``(seeds, tasks)`` array: per task the mean and population std over seeds (NaN
    seeds skipped), each then averaged over non-overlapping ``window``-task windows. Returns (window centres,
    mean, std), only for windows holding a value.

    >>> c, m, s = seed_band(np.array([[1.0, 3.0, 5.0, 7.0], [3.0, 3.0, 7.0, 7.0]]), 2)
    >>> c.tolist(), m.tolist(), s.tolist()
    ([0.5, 2.5], [2.5, 6.5], [0.5, 0.5])
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN tasks stay NaN
        mean, std = np.nanmean(rows, axis=0), np.nanstd(rows, axis=0)
    return (*window_means(mean, window), window_means(std, window)[1])


def _over_seeds(values: np.ndarray) -> tuple[float, float, int]:
    """Mean and population std of one value per seed, and how many seeds have one (NaN: none)."""
    values = values[~np.isnan(values)]
    if not values.size:
        return math.nan, math.nan, 0
    return float(values.mean()), float(values.std()), int(values.size)


def final_window(rows: np.ndarray, window: int) -> tuple[float, float, int]:
    """Mean and population std over seeds of each seed's mean over the last ``window`` tasks, and the number of
    seeds that have a value there.

    >>> final_window(np.array([[0.0, 0.25, 0.5], [0.0, 0.75, 1.0]]), 2)
    (0.625, 0.25, 2)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_seed = np.nanmean(rows[:, -window:], axis=1)
    return _over_seeds(per_seed)


def block_stats(exp: Experiment, tag: str, size: int, blocks: Iterable[int]) -> dict[int, tuple[float, float, int]]:
    """Per block ``b`` of ``blocks`` (evaluated tasks ``b * size .. (b + 1) * size - 1``), up to the first block no
    seed reached: :func:`final_window` of ``tag`` over the block and the seeds whose run reached its last task (an
    ``epoch`` or ``tag`` value there).

    >>> exp = Experiment("e", "E", 4, "acc")
    >>> exp.add(0, {"s": np.array([1.0, 2.0, 3.0, 4.0])}, {})
    >>> exp.add(1, {"s": np.array([3.0, 4.0, 9.0, np.nan])}, {})  # stopped after task 2
    >>> block_stats(exp, "s", 2, range(3))  # block 1: seed 0 only; block 2 ends past the run
    {0: (2.5, 1.0, 2), 1: (3.5, 0.0, 1)}
    """
    rows, epochs, out = exp.rows(tag), exp.rows("epoch"), {}
    for b in blocks:
        stop = (b + 1) * size
        if stop > exp.num_evaluated_tasks:
            break
        reached = ~np.isnan(epochs[:, stop - 1]) | ~np.isnan(rows[:, stop - 1])
        if not reached.any():
            break
        out[b] = final_window(rows[reached, b * size : stop], size)
    return out


def spread_of(std: float, seeds: int) -> float:
    """The std over ``seeds`` seeds as a table shows it: a spread needs two seeds, so NaN (no ``±``) below that."""
    return std if seeds > 1 else math.nan


def last_logged(rows: np.ndarray) -> np.ndarray:
    """Each seed's last logged value ``(S, 1)`` (NaN: none logged).

    >>> last_logged(np.array([[0.5, 0.25, np.nan], [np.nan, np.nan, np.nan]])).tolist()
    [[0.25], [nan]]
    """
    out = np.full((len(rows), 1), np.nan)
    for i, row in enumerate(rows):
        seen = row[~np.isnan(row)]
        if seen.size:
            out[i, 0] = seen[-1]
    return out


def last_value(rows: np.ndarray) -> tuple[float, float, int]:
    """Mean and population std over seeds of each seed's last logged value (e.g. the final ACC of R)."""
    return _over_seeds(last_logged(rows)[:, 0])


def figure4_rank(rows: np.ndarray, zero_fill: int) -> np.ndarray:
    """Hessian effective ranks ``(seeds, tasks)`` (NaN between measurements) as the authors' scripts draw Figure 4.

    Their experiment scripts store one rank per evaluated task, carried forward from the last measurement, in an
    array of zeros, and first measure at stream task 100: on Permuted MNIST (5 warm-up tasks) the first 95 evaluated
    tasks keep rank 0 (``zero_fill``). The plotting script then min–max scales each seed's whole series, zeros
    included, so its minimum is 0 and Figure 4 shows each seed's rank divided by its largest.

    >>> figure4_rank(np.array([[4.0, np.nan, 8.0, np.nan]]), 1).tolist()
    [[0.0, 0.5, 1.0, 1.0]]
    """
    carried = rows.copy()
    for seed in carried:
        for t in range(1, seed.size):
            if np.isnan(seed[t]):
                seed[t] = seed[t - 1]
    carried[:, :zero_fill] = 0.0
    return minmax_per_seed(carried)


def minmax_per_seed(rows: np.ndarray) -> np.ndarray:
    """Each seed's series scaled to [0, 1] over its measured tasks, as the authors normalise effective ranks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanmin(rows, axis=1, keepdims=True), np.nanmax(rows, axis=1, keepdims=True)
    return (rows - lo) / np.where(hi > lo, hi - lo, np.nan)  # a constant series: NaN
