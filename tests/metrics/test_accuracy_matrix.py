"""ACC / BWT / FWT / forgetting / intransigence on hand-worked accuracy matrices, and the curves' window means
(cl_lightning.metrics.forgetting)."""

import math

import numpy as np
import pytest

from cl_lightning import metrics

# R[i, j] = accuracy on task j after training through task i.
R = np.array(
    [
        [0.90, 0.20, 0.10],  # after task 0
        [0.95, 0.85, 0.30],  # after task 1 (task 0 improved: backward transfer)
        [0.60, 0.80, 0.95],  # after task 2
    ]
)
B = np.array([0.10, 0.15, 0.05])  # random-init accuracy
A_STAR = np.array([0.95, 0.90, 0.97])  # reference (joint-training) accuracy


def test_average_accuracy_hand() -> None:
    # ACC = (0.60 + 0.80 + 0.95) / 3 = 2.35 / 3
    assert metrics.average_accuracy(R) == pytest.approx(2.35 / 3)


def test_backward_transfer_hand() -> None:
    # BWT = ((R20 - R00) + (R21 - R11)) / 2 = ((0.60 - 0.90) + (0.80 - 0.85)) / 2 = -0.175
    assert metrics.backward_transfer(R) == pytest.approx(-0.175)


def test_forward_transfer_hand() -> None:
    # FWT = ((R01 - b1) + (R12 - b2)) / 2 = ((0.20 - 0.15) + (0.30 - 0.05)) / 2 = 0.15
    assert metrics.forward_transfer(R, B) == pytest.approx(0.15)


def test_forgetting_hand_uses_max_not_first() -> None:
    # task 0: max(R00, R10) - R20 = 0.95 - 0.60 = 0.35; task 1: R11 - R21 = 0.85 - 0.80 = 0.05 -> 0.20
    # (Avalanche's "first minus current" would give 0.175 = -BWT here)
    assert metrics.forgetting(R) == pytest.approx(0.20)


def test_forgetting_ignores_rows_before_the_task_was_trained() -> None:
    # R01 = 0.99 was measured before task 1 was trained: it is not "knowledge gained", so f_1 stays 0.85 - 0.80
    high = R.copy()
    high[0, 1] = 0.99
    assert metrics.forgetting(high) == pytest.approx(0.20)


def test_intransigence_hand() -> None:
    # I_k = a*_k - R_kk = (0.95 - 0.90, 0.90 - 0.85, 0.97 - 0.95) = (0.05, 0.05, 0.02); mean 0.04
    assert metrics.intransigence(R, A_STAR) == pytest.approx(0.04)
    assert metrics.intransigence(R, A_STAR, task=2) == pytest.approx(0.02)


# E[i, j] = MSE on task j after training through task i (lower is better).
E = np.array(
    [
        [0.10, 0.80, 0.90],
        [0.30, 0.12, 0.70],
        [0.40, 0.20, 0.05],
    ]
)


def test_regression_matrix_hand() -> None:
    # mean final error = (0.40 + 0.20 + 0.05) / 3
    assert metrics.average_accuracy(E) == pytest.approx(0.65 / 3)
    # BWT = -((0.40 - 0.10) + (0.20 - 0.12)) / 2 = -0.19 (errors grew: negative transfer)
    assert metrics.backward_transfer(E, lower_is_better=True) == pytest.approx(-0.19)
    # FWT, b = 1: -((0.80 - 1) + (0.70 - 1)) / 2 = 0.25 (better than a random net)
    assert metrics.forward_transfer(E, np.ones(3), lower_is_better=True) == pytest.approx(0.25)
    # forgetting: (0.40 - min(0.10, 0.30)) and (0.20 - 0.12) -> (0.30 + 0.08) / 2 = 0.19
    assert metrics.forgetting(E, lower_is_better=True) == pytest.approx(0.19)
    # intransigence, ref 0.05: (0.10 - 0.05, 0.12 - 0.05, 0.05 - 0.05) -> 0.04
    assert metrics.intransigence(E, np.full(3, 0.05), lower_is_better=True) == pytest.approx(0.04)


def test_lower_is_better_equals_negated_matrix() -> None:
    rng = np.random.default_rng(0)
    m, b = rng.random((5, 5)), rng.random(5)
    assert metrics.backward_transfer(m, lower_is_better=True) == pytest.approx(metrics.backward_transfer(-m))
    assert metrics.forward_transfer(m, b, lower_is_better=True) == pytest.approx(metrics.forward_transfer(-m, -b))
    assert metrics.forgetting(m, lower_is_better=True) == pytest.approx(metrics.forgetting(-m))
    assert metrics.intransigence(m, b, lower_is_better=True) == pytest.approx(metrics.intransigence(-m, -b))


def test_probe_matrix_square() -> None:
    # rows measured after tasks 0, 2, 4 on probe tasks 0, 2, 4
    p = np.array([[0.90, 0.30, 0.20], [0.80, 0.88, 0.25], [0.70, 0.85, 0.92]])
    tasks = [0, 2, 4]
    # ACC = (0.70 + 0.85 + 0.92) / 3
    assert metrics.average_accuracy(p, tasks, tasks) == pytest.approx(2.47 / 3)
    # BWT = ((0.70 - 0.90) + (0.85 - 0.88)) / 2 = -0.115
    assert metrics.backward_transfer(p, tasks, tasks) == pytest.approx(-0.115)
    # FWT: task 2 from the row after task 0: 0.30 - 0.1; task 4 from the row after task 2: 0.25 - 0.1 -> 0.175
    assert metrics.forward_transfer(p, np.full(3, 0.1), tasks, tasks) == pytest.approx(0.175)
    # forgetting: task 0: max(0.90, 0.80) - 0.70 = 0.20; task 2: 0.88 - 0.85 = 0.03 -> 0.115
    assert metrics.forgetting(p, tasks, tasks) == pytest.approx(0.115)
    # intransigence, ref 1: (0.10, 0.12, 0.08) -> 0.10; the task-4 term alone is 0.08
    assert metrics.intransigence(p, np.ones(3), tasks, tasks) == pytest.approx(0.10)
    assert metrics.intransigence(p, np.ones(3), tasks, tasks, task=4) == pytest.approx(0.08)


def test_probe_matrix_rows_not_columns() -> None:
    # rows after tasks 1 and 3; columns are tasks 0..3 (tasks 0 and 2 have no "just after" row)
    m = np.array([[0.8, 0.9, 0.3, 0.2], [0.6, 0.7, 0.85, 0.95]])
    rows, cols = [1, 3], [0, 1, 2, 3]
    assert metrics.average_accuracy(m, rows, cols) == pytest.approx(3.1 / 4)
    # BWT: only task 1 has a just-after row: 0.7 - 0.9
    assert metrics.backward_transfer(m, rows, cols) == pytest.approx(-0.2)
    # forgetting: task 0: 0.8 - 0.6; task 1: 0.9 - 0.7; task 2 has no row between training and the end
    assert metrics.forgetting(m, rows, cols) == pytest.approx(0.2)
    # FWT: tasks 2 and 3 from the row after task 1: ((0.3 - 0) + (0.2 - 0)) / 2; tasks 0, 1 have no earlier row
    assert metrics.forward_transfer(m, np.zeros(4), rows, cols) == pytest.approx(0.25)
    # intransigence: tasks 1 and 3 only: (1 - 0.9, 1 - 0.95) -> 0.075
    assert metrics.intransigence(m, np.ones(4), rows, cols) == pytest.approx(0.075)


def test_nan_cells_are_skipped() -> None:
    # the upper triangle is never needed by ACC, BWT, forgetting, intransigence
    lower = np.where(np.tril(np.ones((3, 3))) > 0, R, np.nan)
    assert metrics.average_accuracy(lower) == pytest.approx(metrics.average_accuracy(R))
    assert metrics.backward_transfer(lower) == pytest.approx(metrics.backward_transfer(R))
    assert metrics.forgetting(lower) == pytest.approx(metrics.forgetting(R))
    assert metrics.intransigence(lower, A_STAR) == pytest.approx(metrics.intransigence(R, A_STAR))
    assert math.isnan(metrics.forward_transfer(lower, B))


def _loop_reference(m: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float]:
    """Textbook loops (GEM ACC/BWT/FWT, Chaudhry forgetting over rows j..T-2) for a full T x T matrix."""
    t = m.shape[0]
    acc = sum(m[t - 1, i] for i in range(t)) / t
    bwt = sum(m[t - 1, i] - m[i, i] for i in range(t - 1)) / (t - 1)
    fwt = sum(m[i - 1, i] - b[i] for i in range(1, t)) / (t - 1)
    fgt = sum(max(m[row, j] for row in range(j, t - 1)) - m[t - 1, j] for j in range(t - 1)) / (t - 1)
    return acc, bwt, fwt, fgt


@pytest.mark.parametrize("t", [2, 4, 7])
def test_random_matrix_matches_loops(t: int) -> None:
    rng = np.random.default_rng(t)
    m, b = rng.random((t, t)), rng.random(t)
    got = (
        metrics.average_accuracy(m),
        metrics.backward_transfer(m),
        metrics.forward_transfer(m, b),
        metrics.forgetting(m),
    )
    np.testing.assert_allclose(got, _loop_reference(m, b), rtol=1e-12)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="increasing"):
        metrics.backward_transfer(R, row_tasks=[0, 2, 1])
    with pytest.raises(ValueError, match="lengths"):
        metrics.forgetting(R, col_tasks=[0, 1])
    with pytest.raises(ValueError, match="2-D"):
        metrics.average_accuracy(np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        metrics.forward_transfer(R, np.ones(2))
    with pytest.raises(ValueError, match="column task"):
        metrics.intransigence(R, A_STAR, task=5)


def test_window_means_skip_unfinished_tasks() -> None:
    values = np.array([1.0, 3.0, 5.0, np.nan, 7.0, np.nan, np.nan, np.nan])
    centres, means = metrics.window_means(values, 3)  # windows [1, 3, 5], [nan, 7, nan], [nan, nan] (all unfinished)
    np.testing.assert_allclose(centres, [1.0, 4.0])
    np.testing.assert_allclose(means, [3.0, 7.0])
    centres, means = metrics.window_means(values[:3], 1)
    np.testing.assert_allclose(means, [1.0, 3.0, 5.0])
