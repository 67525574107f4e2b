"""Key coherence: how much one task's memory writes reach the keys other tasks are read with.

A delta-rule write along a key k changes what the state returns along every key not orthogonal to k (its read
moves by the cosine), so the mean |cos| between keys of *different* tasks measures how much each write disturbs
older associations: 0 for mutually orthogonal keys, 1 when every task is read along the same direction
(docs/results/lifelong_scorecard.md, the encoder study).
"""

from torch import Tensor


def cross_task_coherence(keys: Tensor, task_ids: Tensor) -> Tensor:
    """Mean |cos| between rows of ``keys`` (N, K) whose ``task_ids`` (N,) differ; keys are taken as unit vectors.

    >>> import torch
    >>> keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    >>> round(cross_task_coherence(keys, torch.tensor([0, 0, 1])).item(), 6)  # pairs (0, 2) and (1, 2)
    0.7
    """
    other = task_ids[:, None] != task_ids[None, :]
    return (keys @ keys.T).abs()[other].mean()
