"""No host-device synchronisation per training step (issue: the GPU path), checked on the CPU by taint tracking
(:mod:`benchmarks.sync_check`): N steps of QOA V1's window sampler, Backprop, EWC and CBP after a warm-up (kNN, full
attention, parametric attention and MAML among the slow tests)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from benchmarks.sync_check import MAX_PER_TASK, PER_STEP_ON_CPU_ONLY, PER_TASK, SyncWatch
from cl_lightning.run.cli import main
from tests.helpers import BACKPROP, CBP, FULL_ATTENTION, KNN, MAML, PARAMETRIC, tiny_args

QOA_WINDOW = [  # the paper's sampler and start rule at tiny sizes
    "--model=cl_lightning.learners.QueryOnlyAttention",
    "--model.memory_size=128",
    "--model.support_size=48",
    "--model.sampler=window",
    "--model.queries_per_step=2",
    "--model.hidden=16",
    "--model.num_hidden_layers=2",
    "--model.online_queries=2",
]
EWC = ["--model=cl_lightning.learners.EWC", "--model.hidden_sizes=[16]"]

TASKS = 2


def _events(tmp_path: Path, learner: list[str], warmup: int) -> tuple[list[str], int]:
    """The reads of the watched steps not explained by the tables above, and the number of steps watched."""
    cli = main(tiny_args(tmp_path, learner, tasks=TASKS), run=False)
    watch = SyncWatch(warmup)
    cli.trainer.callbacks.insert(0, watch)
    cli.trainer.fit(cli.model, cli.datamodule)
    where = Counter(e.where for e in watch.rec.events)
    assert all(where[w] <= MAX_PER_TASK * TASKS for w in PER_TASK), where
    allowed = PER_STEP_ON_CPU_ONLY.keys() | PER_TASK.keys()
    return [f"{e.what} at {e.where}" for e in watch.rec.events if e.where not in allowed], watch.steps


@pytest.mark.parametrize(
    ("learner", "warmup"),
    [
        pytest.param(QOA_WINDOW, 10, id="qoa_window"),
        pytest.param(BACKPROP, 2, id="backprop"),
        pytest.param(EWC, 2, id="ewc"),
        pytest.param(CBP, 2, id="cbp"),
        pytest.param(KNN, 4, id="knn", marks=pytest.mark.slow),  # ~10 s each on 2 busy cores
        pytest.param(FULL_ATTENTION, 4, id="full_attention", marks=pytest.mark.slow),
        pytest.param(PARAMETRIC, 4, id="parametric", marks=pytest.mark.slow),
        pytest.param(MAML, 4, id="maml", marks=pytest.mark.slow),
    ],
)
def test_training_steps_never_wait_for_the_device(tmp_path: Path, learner: list[str], warmup: int) -> None:
    events, steps = _events(tmp_path, learner, warmup)
    assert steps >= 10  # the steps watched (2 tasks of 16 chunks, MAML 8, after the warm-up)
    assert events == []


def test_the_recorder_sees_the_synchronisations_this_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the buffer's length read from its device counter (as before) and the window's labels
    gathered on the device and copied to the host are caught, every step."""
    from cl_lightning.memory import ReplayBuffer

    monkeypatch.setattr(ReplayBuffer, "__len__", lambda self: min(int(self.n_seen), self.capacity))
    monkeypatch.setattr(ReplayBuffer, "keep_host_labels", lambda self: None)  # labels() then reads the device
    events, steps = _events(tmp_path, QOA_WINDOW, 10)
    kinds = Counter(e.split(" at ")[0] for e in events)
    assert kinds["_local_scalar_dense"] >= 3 * steps  # ready(), online_ready(), the sampler's size, newest()
    assert kinds["Tensor.cpu"] >= steps - 2  # the window's labels (every step once the buffer is full)


def test_host_shadows_are_reread_from_a_loaded_state() -> None:
    """The counters' host copies follow ``load_state_dict`` (a resumed run draws from the same state)."""
    import torch

    from cl_lightning.learners import QueryOnlyAttention

    def fed(steps: int) -> QueryOnlyAttention:
        torch.manual_seed(0)
        model = QueryOnlyAttention(memory_size=50, support_size=20, hidden=8, num_hidden_layers=1)
        for i in range(steps):
            x, y = torch.rand(13, 49), (torch.arange(13) + i) % 10
            model.buffer.add(x, y, torch.zeros(13, dtype=torch.long), model.step_generator(), host_y=y.clone())
        return model

    source, target = fed(7), fed(0)  # 91 examples through a FIFO of 50: the head has wrapped
    target.load_state_dict(source.state_dict())
    assert target._steps == source._steps == 7
    assert len(target.buffer) == len(source.buffer) == 50
    assert target.buffer._head == source.buffer._head == 91 % 50
    assert torch.equal(target.buffer.labels(), source.buffer.labels())
    assert torch.equal(target.buffer.labels(), target.buffer.y[target.buffer.physical(torch.arange(50))])
    assert target.step_generator().initial_seed() == source.step_generator().initial_seed()


@pytest.mark.parametrize("mode", ["fifo", "reservoir"])
def test_host_labels_follow_the_stored_labels(mode: str) -> None:
    """The host copy the window sampler reads equals the buffer's own labels after chunks larger and smaller than it."""
    import torch

    from cl_lightning.memory import ReplayBuffer

    buf = ReplayBuffer(40, (3,), mode=mode)
    buf.keep_host_labels()
    gen = torch.Generator().manual_seed(0)
    for n in (7, 30, 45, 13, 1, 60, 9):
        y = torch.randint(0, 10, (n,), generator=gen)
        buf.add(torch.rand(n, 3), y, torch.zeros(n, dtype=torch.long), gen, host_y=y.clone())
        assert torch.equal(buf.labels(), buf.y[buf.physical(torch.arange(len(buf)))])
        assert torch.equal(buf.labels(5, 25), buf.labels()[5:25])
    assert int(buf.n_seen) == len(buf) + 125
