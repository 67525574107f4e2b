"""The fast paths give the reference numbers: blocked scorer evaluation, fused Adam, window-only label reads,
streamed plasticity rows, and evaluation split over DDP ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cl_lightning.callbacks.plasticity import StridedRows
from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.memory import ReplayBuffer, window_sample
from cl_lightning.nn import PairScorer
from cl_lightning.nn.optim import prefer_fused
from cl_lightning.nn.scorers import tuned_block_pairs


def _scorer(dtype: torch.dtype = torch.float64, **kwargs) -> PairScorer:
    torch.manual_seed(0)
    scorer = PairScorer(x_dim=49, num_labels=10, **kwargs).to(dtype)
    with torch.no_grad():  # non-zero biases, so the bias path of addmm is exercised
        for p in scorer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return scorer


@pytest.mark.parametrize("block", [1, 37, 13 * 5, 10_000])
def test_blocked_evaluation_equals_the_authors_concatenated_network(block: int) -> None:
    scorer = _scorer(block_pairs=block)
    qx, sx, sy = (
        torch.rand(11, 49, dtype=torch.float64),
        torch.rand(13, 49, dtype=torch.float64),
        torch.randint(0, 10, (13,)),
    )
    ref = scorer.forward_concat(qx, sx, sy)
    with torch.no_grad():
        fast = scorer(qx, sx, sy)
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scorer.score_blocked(qx, sx, sy), ref, rtol=1e-12, atol=1e-12)


def test_workspace_is_allocated_once_and_reused() -> None:
    scorer = _scorer(torch.float32, block_pairs=64)
    qx, sx, sy = torch.rand(20, 49), torch.rand(16, 49), torch.randint(0, 10, (16,))
    scorer.score_blocked(qx, sx, sy)
    ptrs = [t.data_ptr() for t in scorer._workspace]
    scorer.score_blocked(qx[:7], sx, sy)  # a smaller episode reuses the buffers
    scorer.score_blocked(qx, sx[:8], sy[:8])
    assert [t.data_ptr() for t in scorer._workspace] == ptrs


def test_fast_episode_accuracy_equals_reference_path_on_a_fixed_seed() -> None:
    """The learner's evaluation (blocked path) gives the same accuracies as the authors' concatenated network."""
    torch.manual_seed(3)
    model = QueryOnlyAttention(input_shape=(49,), num_outputs=10, memory_size=400, support_size=300)
    with torch.no_grad():
        for p in model.scorer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(0)
    centres = torch.rand(10, 49, generator=gen)
    cy, qy = torch.randint(0, 10, (300,), generator=gen), torch.randint(0, 10, (200,), generator=gen)
    cx = (centres[cy] + 0.3 * torch.rand(300, 49, generator=gen)).clamp(0, 1)
    qx = (centres[qy] + 0.3 * torch.rand(200, 49, generator=gen)).clamp(0, 1)
    model.eval()
    with torch.no_grad():
        fast = model.predict_episode(cx, cy, qx)
        ref_scores = model.scorer.forward_concat(qx, cx, cy)
    ref = ref_scores @ torch.nn.functional.one_hot(cy, 10).float()
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    acc_fast, acc_ref = model.score(fast, qy), model.score(ref, qy)
    assert acc_fast == acc_ref
    assert fast.argmax(1).unique().numel() >= 3  # not a degenerate all-equal answer


def test_hooked_evaluation_fires_every_layer_and_gives_the_same_scores() -> None:
    scorer = _scorer(block_pairs=26)
    qx, sx, sy = (
        torch.rand(9, 49, dtype=torch.float64),
        torch.rand(13, 49, dtype=torch.float64),
        torch.randint(0, 10, (13,)),
    )
    rows: list[int] = []
    handle = scorer.hidden[4].register_forward_hook(lambda m, a, out: rows.append(out.shape[0]))
    with torch.no_grad():
        hooked = scorer(qx, sx, sy)
    handle.remove()
    assert sum(rows) == 9 * 13
    assert max(rows) == 26
    torch.testing.assert_close(hooked, scorer.forward_concat(qx, sx, sy))


def test_bf16_evaluation_path_is_close_to_fp32() -> None:
    """The CUDA evaluation dtype (bf16), forced on CPU: scores within bf16 rounding, same argmax mostly."""
    scorer = _scorer(torch.float32, eval_dtype_cpu=True)
    qx, sx, sy = torch.rand(50, 49), torch.rand(40, 49), torch.randint(0, 10, (40,))
    with torch.no_grad():
        low = scorer(qx, sx, sy)
        ref = scorer.forward_concat(qx, sx, sy)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())
    assert (low.argmax(1) == ref.argmax(1)).float().mean() > 0.8


def test_tuned_block_size_is_a_candidate_and_cached() -> None:
    first = tuned_block_pairs(16, 2, torch.device("cpu"), torch.float32)
    assert first in (1024, 2048, 4096, 8192, 16384)
    assert tuned_block_pairs(16, 2, torch.device("cpu"), torch.float32) == first


def test_fused_adam_takes_the_same_steps_as_the_loop() -> None:
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    loop = torch.optim.Adam(nets[0].parameters(), lr=1e-2)
    fused = prefer_fused(torch.optim.Adam(nets[1].parameters(), lr=1e-2))
    assert fused.param_groups[0]["fused"]
    assert not loop.param_groups[0]["fused"]
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(20):
        for net, opt in zip(nets, (loop, fused), strict=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    explicit = prefer_fused(torch.optim.Adam(nets[0].parameters(), foreach=True))
    assert explicit.param_groups[0]["foreach"]
    assert not explicit.param_groups[0]["fused"]
    sgd = torch.optim.SGD(nets[0].parameters(), lr=0.1)
    assert prefer_fused(sgd) is sgd


def test_window_sampler_reads_only_its_window_and_draws_the_same() -> None:
    buf = ReplayBuffer(50, (2,))
    for start in range(0, 130, 13):
        ids = torch.arange(start, start + 13)
        buf.add(ids.float()[:, None].repeat(1, 2), ids % 7, torch.zeros(13, dtype=torch.long))
    ranges: list[tuple[int, int]] = []

    def labels(start: int, stop: int) -> torch.Tensor:
        ranges.append((start, stop))
        return buf.labels(start, stop)

    for seed in range(5):
        whole = window_sample(buf.labels(), len(buf), 20, 2, torch.Generator().manual_seed(seed))
        lazy = window_sample(labels, len(buf), 20, 2, torch.Generator().manual_seed(seed))
        assert all(torch.equal(a, b) for a, b in zip(whole, lazy, strict=True))
    assert all(stop - start == 20 for start, stop in ranges)
    assert torch.equal(buf.labels(10, 15), buf.labels()[10:15])


@pytest.mark.parametrize(("total", "max_rows"), [(50, 40), (80, 40), (1000, 40), (12345, 64)])
def test_strided_rows_are_evenly_spaced_and_bounded(total: int, max_rows: int) -> None:
    rows = torch.arange(total, dtype=torch.float64)[:, None].repeat(1, 3)
    sampler = StridedRows(max_rows)
    gen = torch.Generator().manual_seed(total)
    lo = 0
    while lo < total:
        n = int(torch.randint(1, 200, (1,), generator=gen))
        sampler.add(rows[lo : lo + n])
        lo += n
        assert sampler.count <= 2 * max_rows
    kept = sampler.rows()[:, 0].long()
    assert kept.numel() == min(total, max_rows)
    assert kept[0] == 0
    assert bool((kept.diff() > 0).all())
    gaps = kept.diff()
    assert int(gaps.max()) <= 2 * int(gaps.min()) + 2 * sampler.stride  # evenly spaced up to the stride
    if total <= 2 * max_rows:  # nothing dropped: exactly the old evenly strided rows of the whole stream
        expected = (
            torch.linspace(0, total - 1, min(total, max_rows)).long() if total > max_rows else torch.arange(total)
        )
        assert torch.equal(kept, expected)


def _episode() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (
        torch.rand(120, 49, generator=gen),
        torch.randint(0, 10, (120,), generator=gen),
        torch.rand(37, 49, generator=gen),
    )


def _learner() -> QueryOnlyAttention:
    torch.manual_seed(0)
    return QueryOnlyAttention(memory_size=200, support_size=100, eval_across_ranks=True)


def _split_worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model = _learner().eval()
        cx, cy, qx = _episode()
        with torch.no_grad():
            pred = model.predict_episode(cx, cy, qx)
        torch.save(pred, f"{out}.{rank}")
        try:  # a rank holding another episode: a clear error, not mixed answers
            model.predict_episode(cx, cy, qx + rank)
        except RuntimeError as err:
            torch.save(str(err), f"{out}.err{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_evaluation_split_over_two_gloo_ranks_equals_one_process(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = str(tmp_path / "pred")
    mp.spawn(_split_worker, args=(2, str(tmp_path / "init"), out), nprocs=2, join=True)
    model = _learner().eval()
    with torch.no_grad():
        single = model.predict_episode(*_episode())  # no process group: one process answers every query
    for rank in range(2):
        split = torch.load(f"{out}.{rank}")
        assert split.shape == (37, 10)
        # the same answers; blocks of other sizes round differently in the last bits of fp32
        torch.testing.assert_close(split, single, rtol=1e-5, atol=1e-5)
        assert torch.equal(split.argmax(1), single.argmax(1))
        assert "use_distributed_sampler=false" in torch.load(f"{out}.err{rank}")
