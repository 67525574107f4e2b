"""The P1 probe's two references: what a task's own examples give on its unseen keys, without any learner.

On ``AssociativeRecall(rule=True)`` a task writes n keys whose values follow a linear rule, value = argmax(A_t key);
its unseen keys are fresh keys of the same rule. Two references bound what a memory read on the unseen keys can be
asked for (docs/results/lifelong_icl.md §4):

- *least squares*: the one-hot targets of the task's training examples regressed linearly on their inputs (no
  bias), read on the unseen keys: what capturing a linear rule from these examples gives;
- *nearest written pair*: each unseen key answered with the value of its nearest written key (1-NN over the task's
  n clean keys, unbounded): what storing the pairs gives.
"""

import torch
from torch import Tensor


def least_squares_accuracy(x: Tensor, y: Tensor, query_x: Tensor, query_y: Tensor, num_classes: int) -> Tensor:
    """Accuracy on ``query_x`` of the least-squares linear map from ``x`` (N, D) to one-hot ``y`` (N,).

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    >>> least_squares_accuracy(x, torch.tensor([0, 1, 0]), torch.tensor([[3.0, 0.5]]), torch.tensor([0]), 2).item()
    1.0
    """
    weights = torch.linalg.lstsq(x, torch.nn.functional.one_hot(y, num_classes).to(x.dtype)).solution  # (D, C)
    return ((query_x @ weights).argmax(-1) == query_y).float().mean()


def nearest_pair_accuracy(keys: Tensor, values: Tensor, query_x: Tensor, query_y: Tensor) -> Tensor:
    """Accuracy on ``query_x`` of the value of the nearest of ``keys`` (K, D) (Euclidean; ``values`` (K,)).

    >>> keys, values = torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([3, 5])
    >>> nearest_pair_accuracy(keys, values, torch.tensor([[0.9, 0.8], [0.1, 0.0]]), torch.tensor([5, 5])).item()
    0.5
    """
    return (values[torch.cdist(query_x, keys).argmin(-1)] == query_y).float().mean()
