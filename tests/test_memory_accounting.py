"""cl_lightning.memory.accounting: what a budget study charges a learner (issue 34)."""

from __future__ import annotations

import torch

from cl_lightning.data import AssociativeRecall, PermutedMNIST
from cl_lightning.learners import KNN, ParametricAttention, StableKeyMemory
from cl_lightning.memory import memory_bytes, row_bytes, stream_row_bytes
from cl_lightning.nn.fast_weights import DeltaRule


def test_buffer_rows_as_stored_and_at_the_data_precision() -> None:
    pmnist = PermutedMNIST(num_tasks=2, train_size=100, query_size=20, chunk_size=100)
    assert stream_row_bytes(pmnist) == 49 * 4 + 8 + 8 == 212  # float32 pixels, int64 label and task id
    assert stream_row_bytes(pmnist, "data") == 49 + 1 == 50  # pixels are exact 8-bit values; no task id
    recall = AssociativeRecall(num_tasks=2, input_dim=128, train_size=64, chunk_size=32)
    assert stream_row_bytes(recall) == 128 * 4 + 16
    assert stream_row_bytes(recall, "data") == 128 * 4 + 1  # continuous keys stay float32
    assert row_bytes((3,), 2, classification=False, precision="data") == 3 * 4 + 2 * 4


def test_a_buffer_is_charged_its_rows_and_nothing_fixed() -> None:
    knn = KNN(input_shape=(49,), num_outputs=10, memory_size=10, support_size=10, k=1, online_queries=0)
    knn.buffer.add(torch.rand(4, 49), torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    assert memory_bytes(knn).budget == 4 * 212  # the rows it holds, as stored
    assert memory_bytes(knn, 50, held=False).budget == 10 * 50  # its capacity, at the data's precision
    assert memory_bytes(knn).fixed == memory_bytes(knn).slow == 0


def test_stable_key_memory_is_charged_its_fixed_projection() -> None:
    """The goal settings with R counted: 512,000 B of R on 128-dim keys, 21,952 B on 7x7 images."""
    one = StableKeyMemory(input_shape=(128,), hidden_sizes=[16], routes=1, key_dim=1000)
    assert memory_bytes(one).context == one.context_memory_bytes() == 40_520
    assert memory_bytes(one).fixed == 1000 * 128 * 4 == 512_000
    assert memory_bytes(one).budget == 552_520 > 40 * 1024
    routed = StableKeyMemory(input_shape=(49,), hidden_sizes=[16], routes=8, key_dim=112)
    assert (memory_bytes(routed).context, memory_bytes(routed).fixed) == (37_416, 21_952)
    fits = StableKeyMemory(input_shape=(49,), hidden_sizes=[16], routes=8, key_dim=76)  # the setting that fits 40 KB
    assert memory_bytes(fits).budget == 40_792 <= 40 * 1024


def test_a_fast_weight_rule_has_no_fixed_state() -> None:
    rule = ParametricAttention(input_shape=(49,), hidden_sizes=[16], rule=DeltaRule(), key_dim=128)
    assert memory_bytes(rule).budget == rule.context_memory_bytes() == 128 * 10 * 4
    assert memory_bytes(rule).slow == sum(p.numel() * 4 for p in rule.parameters() if p.requires_grad)
