"""StableKeyMemory: fixed keys, routed states, constant context bytes (issue 24)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_checkpoint_round_trip, fit

from cl_lightning.data import AssociativeRecall, PermutedMNIST
from cl_lightning.learners import StableKeyMemory


def _train(learner: StableKeyMemory, stream, tasks: int) -> None:
    opt = torch.optim.Adam([p for p in learner.parameters() if p.requires_grad], lr=1e-3)
    learner.log_online = lambda *a, **k: None  # no trainer to log to
    for t in range(tasks):
        for i in range(stream.num_chunks):
            loss = learner.training_step(stream.chunk(t, i), i)
            opt.zero_grad()
            loss.backward()
            opt.step()


def _recall(tasks: int = 3) -> AssociativeRecall:
    return AssociativeRecall(num_tasks=tasks, num_items=8, input_dim=32, train_size=64, query_size=32, chunk_size=16)


@pytest.mark.parametrize(
    ("stream", "kwargs", "nbytes"),
    [
        # the two goal settings of the study: one state of d_k 1,000 (AssociativeRecall), 8 x 112 (Permuted MNIST)
        (AssociativeRecall(num_tasks=2, input_dim=128, train_size=64, chunk_size=32), {"routes": 1, "key_dim": 1000},
         1000 * 10 * 4 + 128 * 4 + 8),
        (PermutedMNIST(num_tasks=2, train_size=100, query_size=20, chunk_size=100), {"routes": 8, "key_dim": 112},
         8 * 112 * 10 * 4 + 8 * 49 * 4 + 8),
    ],
)  # fmt: skip
def test_context_bytes_are_constant_and_within_40_kb(stream, kwargs, nbytes):
    learner = StableKeyMemory(
        input_shape=stream.input_shape, num_outputs=stream.num_outputs, hidden_sizes=[16], **kwargs
    )
    assert learner.context_memory_bytes() == nbytes <= 40 * 1024
    _train(learner, stream, 2)
    assert learner.context_memory_bytes() == nbytes
    assert learner.fast_state.abs().sum() > 0  # it was written


def test_keys_are_a_fixed_function_of_the_input_bit_for_bit():
    stream = _recall()
    learner = StableKeyMemory(input_shape=(32,), num_outputs=10, hidden_sizes=[16], routes=2, key_dim=64)
    probe = stream.task(0).query_x
    keys, matrix = learner.features(probe).clone(), learner.key_matrix.clone()
    _train(learner, stream, 3)
    assert torch.equal(learner.features(probe), keys)
    assert torch.equal(learner.key_matrix, matrix)
    assert torch.allclose(keys.norm(dim=1), torch.ones(len(probe)))  # sign(.) / sqrt(K): unit keys
    assert set(keys.abs().unique().tolist()) == {1 / math.sqrt(64)}


def test_each_new_map_opens_the_next_state_and_writes_touch_only_its_state():
    stream = _recall(tasks=3)
    learner = StableKeyMemory(input_shape=(32,), num_outputs=10, hidden_sizes=[16], routes=4, key_dim=64)
    _train(learner, stream, 1)
    assert int(learner.next_route) == 1
    assert learner.fast_state[1:].abs().sum() == 0  # states 1..3 untouched by task 0
    before = learner.fast_state.clone()
    _train_task = StableKeyMemory.training_step
    for i in range(stream.num_chunks):  # task 1: a new map, so a new state
        _train_task(learner, stream.chunk(1, i), i)
    assert int(learner.next_route) == 2
    assert torch.equal(learner.fast_state[0], before[0])  # task 0's state bit-identical
    assert learner.fast_state[1].abs().sum() > 0
    # queries go to the state their task was written into
    for task in (0, 1):
        assert (learner.route(stream.task(task).query_x) == task).float().mean() > 0.9


def test_one_route_wraps_around_and_bad_arguments_raise():
    stream = _recall(tasks=3)
    learner = StableKeyMemory(input_shape=(32,), num_outputs=10, hidden_sizes=[16], routes=2, key_dim=16)
    _train(learner, stream, 3)
    assert int(learner.next_route) == 1  # tasks 0, 1, 2 -> states 0, 1, 0
    with pytest.raises(ValueError, match="routes"):
        StableKeyMemory(input_shape=(32,), num_outputs=10, routes=0)


SKM = ["--model=cl_lightning.learners.StableKeyMemory", "--model.routes=2", "--model.key_dim=64",
       "--model.hidden_sizes=[16]", "--model.optimizer=torch.optim.Adam", "--model.optimizer.lr=0.003"]  # fmt: skip


@pytest.mark.slow  # a real CLI fit and a checkpoint
def test_it_learns_through_the_cli_and_its_checkpoint_keeps_everything(tmp_path):
    m = fit(tmp_path / "fit", SKM).trainer.callback_metrics
    assert torch.isfinite(m["train/loss"])
    assert m["eval/forward_live_acc"] > 0.25 + 0.2  # 4 classes, read from the live state
    assert_checkpoint_round_trip(tmp_path / "ckpt", SKM, StableKeyMemory)
