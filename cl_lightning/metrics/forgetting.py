"""Continual-learning metrics on an accuracy matrix.

In the accuracy matrix ``R`` (argument ``matrix``), ``R[i, j]`` is the accuracy (or, with ``lower_is_better=True``,
the error, e.g. MSE) on task ``j`` measured after training through row ``i``; NaN marks a cell that was not measured
and is skipped.

By default ``R`` is square-ish: row ``i`` is measured after task ``i`` and column ``j`` is task ``j``
(``row_tasks = range(T_rows)``, ``col_tasks = range(T_cols)``). A *probe matrix* passes ``row_tasks`` (the tasks
after which each row was measured) and ``col_tasks`` (the probed tasks), both strictly increasing ints, for example
rows after tasks ``[0, 100, 200]`` and columns ``[0, 100, 200]``. Then "just after training task j" is the row whose
task equals ``j`` and "before training task j" is the last row whose task is smaller than ``j``; a column without such
a row is skipped. "Final" is always the last row.

With ``lower_is_better=True`` every difference flips sign, so positive BWT / FWT always mean improvement and positive
forgetting / intransigence always mean harm; ``average_accuracy`` is then the mean error.
"""

import math

import numpy as np
import numpy.typing as npt


def _prepare(
    matrix: npt.ArrayLike, row_tasks: list[int] | None, col_tasks: list[int] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns the matrix as float64 and the row / column task ids, validated."""
    acc = np.asarray(matrix, dtype=np.float64)
    if acc.ndim != 2:
        raise ValueError(f"matrix must be 2-D (T_rows, T_cols), got shape {acc.shape}")
    rows = np.arange(acc.shape[0]) if row_tasks is None else np.asarray(row_tasks, dtype=np.int64)
    cols = np.arange(acc.shape[1]) if col_tasks is None else np.asarray(col_tasks, dtype=np.int64)
    if rows.shape != (acc.shape[0],) or cols.shape != (acc.shape[1],):
        raise ValueError(f"row_tasks/col_tasks lengths must match the matrix shape {acc.shape}")
    if np.any(np.diff(rows) <= 0) or np.any(np.diff(cols) <= 0):
        raise ValueError("row_tasks and col_tasks must be strictly increasing")
    return acc, rows, cols


def _per_column(values: npt.ArrayLike, cols: np.ndarray, name: str) -> np.ndarray:
    """``values`` (one per column task) as float64, checked against the columns."""
    out = np.asarray(values, dtype=np.float64)
    if out.shape != cols.shape:
        raise ValueError(f"{name} must have shape ({cols.size},), got {out.shape}")
    return out


def _nanmean(x: np.ndarray) -> float:
    """Mean over the non-NaN entries; NaN (without a warning) when there are none."""
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else float("nan")


def _after(acc: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(T_cols,) accuracy on each task just after training it (``R[row(j), j]``); NaN where no such row."""
    out = np.full(cols.shape, np.nan)
    idx = np.searchsorted(rows, cols)  # row whose task equals cols[j], if any
    has = (idx < rows.size) & (rows[np.minimum(idx, rows.size - 1)] == cols)
    out[has] = acc[idx[has], np.flatnonzero(has)]
    return out


def average_accuracy(
    matrix: npt.ArrayLike, row_tasks: list[int] | None = None, col_tasks: list[int] | None = None
) -> float:
    """Average accuracy at the end of the stream (Lopez-Paz & Ranzato 2017, GEM).

    ACC = (1/T) Σ_{j ≤ final task} R[final, j]: the mean of the last row over the tasks already trained
    (columns whose task is ≤ the last row's task), NaN cells skipped. Chaudhry et al. (2018) call the same quantity at
    every row A_k. With an error matrix this is the mean error.

    Args:
        matrix, row_tasks, col_tasks: The accuracy matrix R and its layout (module docstring).

    >>> average_accuracy([[0.9, 0.1], [0.7, 0.8]])
    0.75
    """
    acc, rows, cols = _prepare(matrix, row_tasks, col_tasks)
    return _nanmean(acc[-1, cols <= rows[-1]])


def backward_transfer(
    matrix: npt.ArrayLike,
    row_tasks: list[int] | None = None,
    col_tasks: list[int] | None = None,
    lower_is_better: bool = False,
) -> float:
    """Backward transfer (Lopez-Paz & Ranzato 2017, GEM).

    BWT = 1/(T−1) Σ_{j < final task} (R[final, j] − R[row(j), j]), where ``row(j)`` is the row measured just after
    training task ``j``. Negative means forgetting (other libraries: docs/metrics.md §2). With ``lower_is_better``
    the difference is negated. NaN when no earlier task has both cells.

    Args:
        matrix, row_tasks, col_tasks, lower_is_better: The accuracy matrix R and its layout (module docstring).

    >>> round(backward_transfer([[0.9, 0.1], [0.7, 0.8]]), 6)
    -0.2
    """
    acc, rows, cols = _prepare(matrix, row_tasks, col_tasks)
    diff = acc[-1] - _after(acc, rows, cols)
    sign = -1.0 if lower_is_better else 1.0
    return _nanmean(sign * diff[cols < rows[-1]])


def forward_transfer(
    matrix: npt.ArrayLike,
    b: npt.ArrayLike,
    row_tasks: list[int] | None = None,
    col_tasks: list[int] | None = None,
    lower_is_better: bool = False,
) -> float:
    """Forward transfer (Lopez-Paz & Ranzato 2017, GEM).

    FWT = 1/(T−1) Σ_{j=2}^{T} (R[before(j), j] − b_j), with ``before(j)`` the last row measured before training task
    ``j`` (``j−1`` for a full matrix) and ``b_j`` the accuracy on task ``j`` of the randomly initialised model. Only
    tasks trained by the final row count; NaN when no task has a row before it. Other libraries choose b differently
    (docs/metrics.md §2; Continuum's FWT: pass zeros).

    Args:
        matrix, row_tasks, col_tasks, lower_is_better: The accuracy matrix R and its layout (module docstring).
        b: (T_cols,) accuracy of the random-init model on each column's task (errors with ``lower_is_better``).

    >>> round(forward_transfer([[0.9, 0.3], [0.7, 0.8]], b=[0.1, 0.1]), 6)
    0.2
    """
    acc, rows, cols = _prepare(matrix, row_tasks, col_tasks)
    base = _per_column(b, cols, "b")
    before = np.searchsorted(rows, cols) - 1  # last row whose task < cols[j]
    keep = (before >= 0) & (cols <= rows[-1])
    diff = acc[before[keep], np.flatnonzero(keep)] - base[keep]
    return _nanmean(-diff if lower_is_better else diff)


def forgetting(
    matrix: npt.ArrayLike,
    row_tasks: list[int] | None = None,
    col_tasks: list[int] | None = None,
    lower_is_better: bool = False,
) -> float:
    """Average forgetting at the end of the stream (Chaudhry et al. 2018, RWalk, Eq. 3).

    f_j = max_{l} R[l, j] − R[final, j] for tasks j trained before the final row, the max running over the rows
    measured after training task j and before the final row; F = mean_j f_j. Rows before task j is trained are not
    "knowledge gained" and are excluded (Avalanche and Mammoth differ: docs/metrics.md §2). With
    ``lower_is_better``: f_j = R[final, j] − min_l R[l, j]. NaN when no task qualifies.

    Args:
        matrix, row_tasks, col_tasks, lower_is_better: The accuracy matrix R and its layout (module docstring).

    >>> round(forgetting([[0.9, 0.1, 0.1], [0.6, 0.8, 0.1], [0.7, 0.5, 0.9]]), 6)
    0.25
    """
    acc, rows, cols = _prepare(matrix, row_tasks, col_tasks)
    sign = -1.0 if lower_is_better else 1.0
    # (T_rows - 1, T_cols): cell (l, j) counts when row l is at or after task j, before the final row
    window = rows[:-1, None] >= cols[None, :]
    past = np.where(window, sign * acc[:-1], np.nan)
    keep = (cols < rows[-1]) & ~np.all(np.isnan(past), axis=0)
    best = np.nanmax(past[:, keep], axis=0) if keep.any() else np.empty(0)
    return _nanmean(best - sign * acc[-1, keep])


def intransigence(
    matrix: npt.ArrayLike,
    reference: npt.ArrayLike,
    row_tasks: list[int] | None = None,
    col_tasks: list[int] | None = None,
    lower_is_better: bool = False,
    task: int | None = None,
) -> float:
    """Intransigence (Chaudhry et al. 2018, RWalk).

    I_k = a*_k − R[row(k), k]: the accuracy of a reference model (trained with access to all data) minus the accuracy
    just after training task k. With ``task=k`` this is Chaudhry's I_k; by default it is averaged over all tasks that
    have a just-after row. Positive means the learner could not learn the new task as well as the reference. With
    ``lower_is_better``: I_k = R[row(k), k] − a*_k.

    Args:
        matrix, row_tasks, col_tasks, lower_is_better: The accuracy matrix R and its layout (module docstring).
        reference: (T_cols,) reference accuracy a* on each column's task (errors with ``lower_is_better``).
        task: return I_k for this task id only.

    >>> round(intransigence([[0.9, 0.1], [0.7, 0.8]], reference=[0.95, 0.95]), 6)
    0.1
    """
    acc, rows, cols = _prepare(matrix, row_tasks, col_tasks)
    ref = _per_column(reference, cols, "reference")
    diff = ref - _after(acc, rows, cols)
    diff = -diff if lower_is_better else diff
    if task is None:
        return _nanmean(diff)
    if task not in cols:
        raise ValueError(f"task {task} is not a column task")
    return float(diff[np.searchsorted(cols, task)])


def window_means(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of non-overlapping ``window``-task windows, NaN (unfinished) tasks skipped, as the paper smooths its
    curves (100-task windows on Permuted MNIST, 10 on regression). Returns (window centres, means), only for the
    windows holding at least one value.
    """
    padded = np.full(math.ceil(values.size / window) * window, np.nan)
    padded[: values.size] = values
    blocks = padded.reshape(-1, window)
    seen = ~np.isnan(blocks).all(axis=1)
    centres = np.arange(blocks.shape[0])[seen] * window + (window - 1) / 2
    return centres, np.nanmean(blocks[seen], axis=1)
