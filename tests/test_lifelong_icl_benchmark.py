"""The scorecard's pieces on a tiny stream: live recall, matched bytes, evictions and the op throughput rows."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
from helpers import ROOT

from cl_lightning.data import AssociativeRecall
from cl_lightning.nn.fast_weights import DeltaRule


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("lifelong_icl", ROOT / "benchmarks" / "lifelong_icl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lifelong_icl"] = module
    spec.loader.exec_module(module)
    return module


def _stream() -> AssociativeRecall:
    return AssociativeRecall(num_tasks=7, num_items=4, input_dim=64, train_size=128, query_size=64, chunk_size=32)


def test_delta_rule_recalls_the_last_task_from_a_constant_state(bench) -> None:
    spec = bench.parametric("delta_rule", [64], rule=DeltaRule(), key_dim=128)
    r = bench.run_stream(spec, _stream(), eval_last=2, queries=64)
    assert r["recall"][1] > 0.5  # chance 0.1
    assert r["recall"][5] > 0.2
    assert math.isnan(r["recall"][20])  # no task 20 back in a 7-task stream
    assert {b for _, b in r["bytes_trace"]} == {128 * 10 * 4}
    assert r["evicted"] == 0
    assert 0.0 <= r["key_coherence"] <= 1.0


def test_matched_buffers_hold_the_state_bytes_and_evict(bench) -> None:
    stream = _stream()
    n = bench.matched_buffer(stream)
    assert n * bench.row_bytes(stream) <= bench.STATE_FLOATS * 4 < (n + 1) * bench.row_bytes(stream)
    knn = next(s for s in bench.nonparametric_specs([16]) if s.name == "knn")
    r = bench.run_stream(knn, stream, eval_last=1, queries=64)
    assert r["bytes_trace"][-1][1] == n * bench.row_bytes(stream)
    assert r["evicted"] == 7 * 128 - n


def test_every_op_has_a_throughput_row(bench) -> None:
    ops = bench.op_throughput(tokens=24, chunk_sizes=[8], repeats=1)
    assert set(ops) == {
        "linear_attn",
        "decay",
        "delta_rule",
        "gated_delta_rule",
        "longhorn",
        "omega_c4",
        "titans",
        "ttt_linear",
        "ttt_mlp",
    }
    for row in ops.values():
        assert row["recurrent"] > 0
        assert row["chunked"][8] > 0
