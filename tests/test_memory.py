from __future__ import annotations

import pytest
import torch

from cl_lightning.memory import ReplayBuffer, uniform_sample, window_sample


def _chunk(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.arange(start, start + n)
    return ids.float()[:, None].repeat(1, 3), ids % 10, torch.zeros(n, dtype=torch.long)


def test_fifo_keeps_the_newest_in_order() -> None:
    buf = ReplayBuffer(10, (3,))
    for start in range(0, 37, 7):  # 6 chunks of 7: 42 examples, ids 0..41
        buf.add(*_chunk(start, 7))
    assert len(buf) == 10
    assert int(buf.n_seen) == 42
    x, _y = buf.get(torch.arange(10))
    assert x[:, 0].tolist() == list(range(32, 42))  # logical 0 = oldest kept
    assert torch.equal(buf.labels(), torch.arange(32, 42) % 10)
    assert buf.newest(3).tolist() == [7, 8, 9]


def test_fifo_chunk_larger_than_capacity() -> None:
    buf = ReplayBuffer(4, (3,))
    buf.add(*_chunk(0, 3))
    buf.add(*_chunk(3, 9))
    assert buf.get(torch.arange(4))[0][:, 0].tolist() == [8, 9, 10, 11]
    buf.add(*_chunk(12, 2))
    assert buf.get(torch.arange(4))[0][:, 0].tolist() == [10, 11, 12, 13]


def test_reservoir_is_uniform_over_the_stream() -> None:
    capacity, n, runs = 20, 200, 2000
    counts = torch.zeros(n)
    for r in range(runs):
        buf = ReplayBuffer(capacity, (3,), mode="reservoir")
        gen = torch.Generator().manual_seed(r)
        for start in range(0, n, 25):
            buf.add(*_chunk(start, 25), generator=gen)
        assert len(buf) == capacity
        kept = buf.x[:, 0].long()
        assert kept.unique().numel() == capacity  # no example stored twice
        counts[kept] += 1
    freq = counts / runs  # each example kept with probability capacity / n = 0.1
    assert abs(freq.mean().item() - 0.1) < 1e-6
    assert (freq - 0.1).abs().max() < 0.035  # ~5 binomial standard deviations (sd = 0.0067)
    assert abs(freq[:100].mean().item() - freq[100:].mean().item()) < 0.01  # early and late alike


def test_buffer_state_round_trips() -> None:
    buf = ReplayBuffer(8, (3,))
    buf.add(*_chunk(0, 11))
    other = ReplayBuffer(8, (3,))
    other.load_state_dict(buf.state_dict())
    assert torch.equal(other.get(torch.arange(8))[0], buf.get(torch.arange(8))[0])
    assert len(other) == 8
    assert other.to(torch.float64).y.dtype == torch.long


def test_window_sampler_follows_the_authors_rule() -> None:
    labels = torch.tensor([3, 1, 3, 2, 1, 2, 2, 0, 3, 1, 0, 0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        q, s = window_sample(labels, 12, window=12, num_queries=2, generator=gen)
        assert not set(q.tolist()) & set(s.tolist())
        assert set(q.tolist()) <= {0, 1, 3, 7}  # first example of each class in the window
        assert s.tolist() == [2, 4, 5, 6, 8, 9, 10, 11]  # window minus each class's first example
        assert labels[q].unique().numel() == 2


def test_window_sampler_inside_a_longer_buffer() -> None:
    labels = torch.arange(100) % 10  # every class's first example in any window sits in its first 10 slots
    starts = set()
    for seed in range(20):
        q, s = window_sample(labels, 100, window=30, num_queries=1, generator=torch.Generator().manual_seed(seed))
        start = int(s.min()) - 10  # the window is [start, start + 30): supports are its last 20 examples
        assert 0 <= start <= 70
        assert s.tolist() == list(range(start + 10, start + 30))
        assert q.numel() == 1
        assert start <= int(q) < start + 10
        starts.add(start)
    assert len(starts) > 5  # the window moves


def test_uniform_sampler_is_disjoint_and_sized() -> None:
    q, s = uniform_sample(50, 30, 5, torch.Generator().manual_seed(0))
    assert q.numel() == 5
    assert s.numel() == 30
    assert torch.cat([q, s]).unique().numel() == 35
    with pytest.raises(ValueError, match="exceed"):
        uniform_sample(10, 10, 1, torch.Generator())
