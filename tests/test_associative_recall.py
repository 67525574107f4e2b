import pytest
import torch

from cl_lightning.data import AssociativeRecall


def test_tasks_are_pure_functions_of_seed_and_task():
    a, b = AssociativeRecall(num_tasks=30, seed=3), AssociativeRecall(num_tasks=30, seed=3)
    for t in (0, 17, 29):
        torch.testing.assert_close(a.generate(t).train_x, b.generate(t).train_x)
    b.generate(5)  # order does not matter
    torch.testing.assert_close(a.generate(29).query_y, b.generate(29).query_y)
    assert not torch.equal(a.generate(1).train_x, AssociativeRecall(num_tasks=30, seed=4).generate(1).train_x)


@pytest.mark.parametrize(("fraction", "renewed"), [(1.0, 16), (0.25, 4), (0.5, 8)])
def test_a_fraction_of_the_map_is_renewed_at_each_task(fraction, renewed):
    stream = AssociativeRecall(num_tasks=20, num_items=16, change_fraction=fraction)
    for t in range(1, 12):
        (k0, v0), (k1, v1) = stream.items(t - 1), stream.items(t)
        changed = (k0 != k1).any(-1)
        assert changed.sum() == renewed
        assert torch.equal(v0[~changed], v1[~changed])  # kept items keep their value
    # an item lives `period` tasks: after 4 tasks at fraction 1/4 every slot is new
    if fraction == 0.25:
        assert ((stream.items(3)[0] != stream.items(7)[0]).any(-1)).all()


def test_examples_are_noisy_copies_of_the_items_with_their_values():
    stream = AssociativeRecall(num_tasks=3, num_items=8, noise=0.1)
    keys, values = stream.items(2)
    data = stream.generate(2)
    for x, y in ((data.train_x, data.train_y), (data.query_x, data.query_y)):
        nearest = torch.cdist(x, keys).argmin(-1)
        assert torch.equal(values[nearest], y)  # the nearest item's value is the label: recall is possible
    assert data.train_x.shape == (256, 32)
    assert data.query_x.shape == (128, 32)
    assert int(data.train_y.max()) < 10


def test_the_task_stream_contract_chunks_and_episodes():
    stream = AssociativeRecall(num_tasks=2, train_size=100, chunk_size=32)
    assert stream.num_chunks == 4
    batch = stream.chunk(1, 3)
    assert batch.x.shape == (4, 32)
    assert (batch.task_id == 1).all()
    episode = stream.episode(1, context_size=50, num_queries=10)
    assert episode.context_x.shape == (50, 32)
    assert episode.query_x.shape == (10, 32)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="change_fraction"):
        AssociativeRecall(change_fraction=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        AssociativeRecall(train_size=10, chunk_size=32)


@pytest.mark.parametrize(("fraction", "revised"), [(0.25, 4), (0.5, 8), (1.0, 16)])
def test_partial_revision_gives_exactly_the_stated_fraction_of_keys_a_new_value(fraction, revised):
    stream = AssociativeRecall(num_tasks=30, num_items=16, change_fraction=fraction, revise=True, seed=2)
    keys0 = stream.items(0)[0]
    for t in range(1, 25):
        v0, (k1, v1) = stream.items(t - 1)[1], stream.items(t)
        assert torch.equal(k1, keys0)  # keys never change
        assert int((v0 != v1).sum()) == revised  # exactly that many keys answer something new
        assert torch.equal(v1 != v0, stream.born(t) == t)  # and they are the slots renewed at task t
    # a revised key's examples carry its new value
    data, slots = stream.generate(7), stream.slots(7)
    torch.testing.assert_close(data.query_y, stream.items(7)[1][slots[256:]])


@pytest.mark.parametrize("change", [1.0, 0.5])
def test_a_recurring_map_returns_after_k_tasks_with_fresh_noise(change):
    stream = AssociativeRecall(num_tasks=30, num_items=8, change_fraction=change, recur_every=5, seed=1)
    plain = AssociativeRecall(num_tasks=30, num_items=8, change_fraction=change, seed=1)
    for t in range(5, 30):
        for a, b in zip(stream.items(t), stream.items(t - 5), strict=True):
            assert torch.equal(a, b)  # the same map, bit for bit
        for a, b in zip(stream.items(t), plain.items(t % 5), strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(stream.items(5)[0], stream.items(4)[0])  # the 5 maps differ
    assert not torch.equal(stream.generate(7).train_x, stream.generate(2).train_x)  # fresh noisy copies
    assert torch.equal(stream.generate(7).train_y, stream.items(7)[1][stream.slots(7)[:256]])
    with pytest.raises(ValueError, match="recur_every"):
        AssociativeRecall(recur_every=0)


def test_a_rule_task_queries_unseen_keys_that_a_learner_of_the_rule_answers():
    stream = AssociativeRecall(num_tasks=4, num_items=128, input_dim=16, train_size=256, rule=True, seed=2)
    data, (keys, values) = stream.generate(3), stream.items(3)
    assert torch.equal(values, stream.rule_values(3, keys))  # the written pairs follow the rule
    assert torch.equal(data.query_y, stream.rule_values(3, data.query_x))  # and so do the queries
    assert torch.cdist(data.query_x, keys).min() > 0.1  # fresh keys: none of them was written
    assert not torch.equal(stream.rule_values(2, keys), values)  # each task has its own rule
    # least squares on the written pairs generalises to the unseen keys (chance 0.1), better than the nearest pair
    targets = torch.nn.functional.one_hot(data.train_y, 10).float()
    weights = torch.linalg.lstsq(data.train_x, targets).solution  # (D, C)
    rule_acc = (data.query_x @ weights).argmax(-1).eq(data.query_y).float().mean()
    nearest_acc = values[torch.cdist(data.query_x, keys).argmin(-1)].eq(data.query_y).float().mean()
    assert rule_acc > max(0.4, nearest_acc)
    with pytest.raises(ValueError, match="rule and revise"):
        AssociativeRecall(rule=True, revise=True)
