"""Every benchmark runs through the harness in its tiny mode (``--small``) and returns sane numbers; the harness itself.

The full sizes run by hand (minutes to hours); these keep a refactor of the package from breaking a benchmark
unnoticed. Each runs ``main(["--small", ...])`` in this process on one thread, in seconds; the returned numbers are
checked for their fields and their range (times and rates positive, accuracies in [0, 1], byte counts that follow
from the sizes), not for their speed. Only ``main`` of a benchmark is called: its internals are its own.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT

from benchmarks import harness
from cl_lightning.nn import native as nn_native

BENCHMARKS = sorted(
    p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in {"__init__", "harness", "sync_check"}
)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The harness sets the thread count and trims sys.argv (for Lightning's CLI): both restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    yield
    torch.set_num_threads(threads)


def _main(name: str, *argv: str, out: Path | None = None) -> dict[str, Any]:
    args = ["--small", "--threads", "1", *argv, *(["--out", str(out)] if out else [])]
    return importlib.import_module(f"benchmarks.{name}").main(args)


def _module(name: str) -> Any:
    return importlib.import_module(f"benchmarks.{name}")


def test_every_benchmark_uses_the_harness_and_no_test_code() -> None:
    """Each benchmark imports the harness, runs as a module (no ``sys.path`` patching) and never imports ``tests``."""
    for name in BENCHMARKS:
        source = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert "from tests" not in source, name
        assert "import tests" not in source, name
        assert "from benchmarks.harness import" in source, name
        assert "sys.path" not in source, name


def test_interleave_alternates_the_order_each_round() -> None:
    calls: list[str] = []
    runs = harness.interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert runs == {"a": [1, 1, 1], "b": [2, 2, 2]}


def test_markdown_table_and_environment_stamp() -> None:
    assert harness.markdown(["x", "n"], [["a", 1234], ["b", 0.123456]]).splitlines() == [
        "| x | n |",
        "|---|---|",
        "| a | 1,234 |",
        "| b | 0.1235 |",
    ]
    env = harness.environment()
    assert {"commit", "cpu", "cores", "threads", "load_before", "torch", "lightning", "python", "date"} <= set(env)
    assert env["torch"] == torch.__version__
    assert len(env["load_before"]) == 3
    assert f"torch {torch.__version__}" in harness.stamp_line(env)


def test_clock_reads_wall_and_cpu_seconds() -> None:
    with harness.clock() as t:
        sum(i * i for i in range(200_000))
    assert t.wall > 0
    assert t.cpu > 0


def test_checkpoint_write_writes_json_and_markdown(tmp_path: Path) -> None:
    result = _main("checkpoint_write", out=tmp_path)
    # 1,000 stored rows of 49 floats, the scorer's ~92,000 weights and Adam's two moments: ~1.5 MB
    assert 0.5 < result["size_mb"] < 3.0
    assert [len(v) for v in result["ms"].values()] == [3, 3]
    assert min(result["median_ms"].values()) > 0
    saved = json.loads((tmp_path / "checkpoint_write.json").read_text())
    assert saved["median_ms"] == result["median_ms"]
    assert saved["environment"]["threads"] == 1
    assert "load_after" in saved["environment"]
    text = (tmp_path / "checkpoint_write.md").read_text()
    assert text.startswith("`python -m benchmarks.checkpoint_write --small --threads 1 --out ")
    assert "| writer | checkpoint MB | median ms | writes |" in text
    assert "Environment: commit" in text


def test_constant_memory() -> None:
    learners = _main("constant_memory")["learners"]
    assert set(learners) == {"qoa", "full_attention", "qoa_read_all", "delta_rule", "gated_delta_rule"}
    assert all([seen for seen, _, _ in v["rows"]] == [800, 1_600] for v in learners.values())
    assert all(s > 0 for v in learners.values() for _, s, _ in v["rows"])
    row = 49 * 4 + 8 + 8  # x float32, y and task id int64
    assert [b for _, _, b in learners["qoa_read_all"]["rows"]] == [800 * row, 1_600 * row]
    assert learners["qoa"]["rows"][-1][2] == 1_200 * row  # its FIFO's cap
    for rule in ("delta_rule", "gated_delta_rule"):  # a fast state of fixed size
        assert learners[rule]["rows"][0][2] == learners[rule]["rows"][1][2] > 0
        assert learners[rule]["bytes"] == 1.0
        assert learners[rule]["flat"] in (True, False)
    assert learners["qoa"]["flat"] is None  # a verdict only for the parametric rules


def test_lifelong_icl(tmp_path: Path) -> None:
    importlib.import_module("benchmarks.lifelong_icl").main(["--small", "--out", str(tmp_path)])  # no --threads
    result = json.loads((tmp_path / "scorecard.json").read_text())
    card = result["scorecard"]
    assert set(card) == {"AssociativeRecall", "PermutedMNIST"}
    assert [len(card["AssociativeRecall"]), len(card["PermutedMNIST"])] == [13, 12]  # longhorn: recall stream only
    for rows in card.values():
        for r in rows.values():
            assert all(0 <= a <= 1 for a in (r["recall"]["1"], r["recall"]["5"], r["forward"]))
            assert math.isnan(r["recall"]["20"])  # 6 tasks: no task 20 back
            assert min(r["ms_per_token_early"], r["ms_per_token_late"], r["bytes_trace"][-1][1]) > 0
            assert r["evicted"] >= 0
    assert card["AssociativeRecall"]["knn_unbounded"]["evicted"] == 0
    assert card["AssociativeRecall"]["delta_rule"]["state_bytes"] == 128 * 10 * 4
    assert all(row["recurrent"] > 0 and min(row["chunked"].values()) > 0 for row in result["ops"].values())
    assert len(result["ops"]) == 9
    assert "ablation" not in result  # the levers, the capacity sweep and the encoder study are suites
    assert "encoder" not in result
    assert 0 <= card["PermutedMNIST"]["delta_rule"]["key_coherence"] <= 1
    tables = (tmp_path / "tables.md").read_text()
    for head in ("| stream | learner |", "| op |"):
        assert head in tables
    assert len(list(tmp_path.glob("*.png"))) == 4  # one per property


def test_loop_overhead() -> None:
    result = _main("loop_overhead")
    assert result["steps"] == 4  # 2 tasks of 800 in chunks of 400
    assert set(result["ms_per_step"]) == {"plain", "lightning", "lightning, no bar"}
    assert min(result["ms_per_step"].values()) > 0
    assert result["ratio"]["plain"] == 1.0


def test_metric_overhead() -> None:
    result = _main("metric_overhead", "--each")  # 6 fits of 2 tiny tasks
    assert set(result["best_s"]) == {
        "none",
        "all",
        "CostMonitor",
        "ForgettingMonitor",
        "HessianMonitor",
        "PlasticityMonitor",
    }
    assert min(result["best_s"].values()) > 0
    assert result["ratio"]["none"] == 1.0


@pytest.mark.parametrize("gpu_flag", [False, True])
def test_paper_size(gpu_flag: bool) -> None:
    """As is, at ``--small`` (its yardstick at 256²); with ``--gpu --device cpu``, the GPU code path (bf16-mixed)."""
    m = _main("paper_size", "--tasks", "2", *(["--gpu", "--device", "cpu"] if gpu_flag else []))
    (steady,) = [v for t, v in m["tasks"].items() if t > 0]
    assert min(steady["wall"], steady["updates"], steady["flops_training"], m["init_row"]["init_row"]) > 0
    assert m["tasks"][0]["episodes_probe_n"] == 10
    assert m["matmul_n"] == 256
    assert all(rate > 0 for pair in m["matmul_gflops"] for rate in pair)
    assert m["num_tasks"] == 20
    assert m["threads"] == 1


def test_pmnist_task_cost() -> None:
    """Backprop, kNN and QOA V1 at ``--small``: task 0 and one steady task timed by phase, flops counted in the next
    task (training and evaluation), the floor and the ratio at the configured cadence, in CPU and wall seconds."""
    m = _main("pmnist_task_cost", "--learners", "bp", "knn", "qoa_v1")
    assert set(m) >= {"bp", "knn", "qoa_v1", "table"}
    for name in ("bp", "knn", "qoa_v1"):
        (fit,) = m[name]["fits"]
        assert sorted(fit["tasks"]) == [0, 1]
        assert fit["flops"]["training"] > 0
        assert fit["flops"]["episodes"] > 0
        assert fit["probes"] == 10
        for summary in (*m[name]["cpu"], *m[name]["wall"]):
            assert summary["cost_s"] > 0
            assert summary["floor_s"] > 0
            assert summary["ratio"] > 0
            assert summary["amortised"]["training"] > 0
        for summary in m[name]["cpu"]:  # the products alone: a part of the task
            assert 0 < summary["products_s"] < summary["cost_s"]
    assert m["bp"]["fits"][0]["every_n"]["HessianMonitor"] == 100  # the Permuted-MNIST cadence


def test_products_are_logged_by_layout_and_timed_alone() -> None:
    """Each product call counted by its operands' layout (a transposed operand stays transposed when rebuilt);
    non-products not logged; the CPU SDPA counted as torch counts its GPU kernels: full attention's floor."""
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.pmnist_task_cost import Products, _operand, time_products
    from cl_lightning.nn.transformer import TinyTransformer

    a, b = torch.randn(4, 3), torch.randn(4, 5)
    with Products() as log:
        for _ in range(3):
            torch.mm(a.t(), b).relu()
    ((func, args, kwargs), count), *rest = log.calls.items()
    assert (func, count, rest) == (torch.ops.aten.mm.default, 3, [])
    assert args == (("tensor", (3, 4), (1, 3), torch.float32), ("tensor", (4, 5), (5, 1), torch.float32))
    assert _operand(args)[0].stride() == (1, 3)
    assert kwargs == ("kwargs", ())
    assert time_products(log.calls) > 0
    with FlopCounterMode(display=False) as flops:
        TinyTransformer(59, 1)(torch.randn(1, 100, 59))
    assert flops.get_total_flops() == 3 * 2 * 100 * 59 * 59 + 2 * 2 * 100 * 100 * 59  # q, k, v; Q Kᵀ and P V


def test_scorer_rate() -> None:
    result = _main("scorer_rate")
    assert result["block_pairs"] > 0
    rates = result["gflop_per_cpu_s"]
    assert set(rates) == {"matmul", "before", "blocked"}
    assert all(v[0] > 0 for v in rates.values())


def test_nvml_check() -> None:
    result = _main("nvml_check")
    timings = result["us_per_call"]
    assert set(timings) == {"is_available()", "adam step", "fused adam step"}
    assert all(len(r["set"]) == len(r["unset"]) == 2 and min(r["set"] + r["unset"]) > 0 for r in timings.values())


def test_transfer_curves(tmp_path: Path) -> None:
    result = _main("transfer_curves", out=tmp_path)
    probes = result["probes"]
    assert [(r["task"], r["steps"]) for r in probes] == [(0, 4), (1, 8)]  # 400 images in chunks of 100
    assert all(0 <= r[k] <= 1 for r in probes for k in ("forward", "unseen"))
    assert math.isnan(probes[0]["backward"])
    assert 0 <= probes[1]["backward"] <= 1
    assert result["last10"]["forward"] == pytest.approx(sum(result["forward"]) / 2)
    lines = (tmp_path / "transfer_curves.tasks.csv").read_text().splitlines()
    assert lines[0] == "task,forward,backward"
    assert len(lines) == 3


def test_online_metric() -> None:
    result = _main("online_metric")
    assert set(result["ms"]) == {0, 1, 2, 4, 8}
    assert min(result["ms"].values()) > 0
    assert len(result["tasks"]) == 2
    assert result["tasks"][1]["chunks"] == 24  # 1,200 images in chunks of 50 (task 0: from the first stored ones)
    for task in result["tasks"]:
        assert 0 <= task["online_acc"] <= 1
        assert all(se >= 0 and binomial >= 0 for se, binomial in task["se"].values())


def test_compile_step() -> None:
    ms = _main("compile_step")["ms"]
    assert [len(v) for v in ms.values()] == [2, 2]
    assert all(v > 0 for values in ms.values() for v in values)


def test_gpu_sync_check_finds_no_sync_on_cpu() -> None:
    """The GPU check's sync count, in its CPU mode (the taint recorder of benchmarks/sync_check.py): none per step."""
    result = _main("gpu_sync_check", "--device", "cpu")
    assert result["steps"] >= 10
    assert sum(result["events"].values()) == 0


def test_gpu_check_script_is_valid_bash() -> None:
    """The GPU check (``bash benchmarks/gpu_paper_size.sh``, run when a GPU is lent) at least parses."""
    script = ROOT / "benchmarks" / "gpu_paper_size.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_scr_step() -> None:
    runs = _main("scr_step")["us_per_step"]  # --small: Backprop's child fits, every learner's floors
    floors = {f"scr {learner} {v}" for learner in ("bp", "qoa", "cbp") for v in ("floor", "hand floor")}
    native = {"scr bp native", "scr bp native floor", "scr qoa native floor", "scr cbp native floor"}
    native = native if nn_native.available() else set()  # no C compiler: no native variant
    assert set(runs) == floors | native | {"scr bp autograd", "scr bp fused"}
    assert all(len(r) == 1 and 0 < r[0] < 1e6 for r in runs.values())


def test_cbp_kernel_paths_logs_both_replacement_sequences_until_they_part(tmp_path: Path) -> None:
    if not nn_native.available():
        pytest.skip("no C compiler: no native kernel")
    result = _main("cbp_kernel_paths", out=tmp_path)
    torch_events, native_events = result["events"]["torch"], result["events"]["native"]
    assert len(native_events) > 0
    k = result["first_difference"]
    same = len(torch_events) if k is None else k
    key = ("step", "layer", "units")
    assert [[e[x] for x in key] for e in torch_events[:same]] == [[e[x] for x in key] for e in native_events[:same]]
    assert all(e["margin"] >= 0 for e in native_events)
    assert (tmp_path / "cbp_kernel_paths_events.json.gz").exists()


def test_scr_output_init_runs_both_gains_on_the_same_draw(tmp_path: Path) -> None:
    if not nn_native.available():
        pytest.skip("no C compiler: no native kernel")
    result = _main("scr_output_init", out=tmp_path)
    assert len(result["runs"]) == 2  # one seed under --small, both inits
    assert all(len(r["forward"]) == 2 for r in result["runs"].values())  # 7 tasks, 5 of them warm-up


def test_threads_benchmark_times_each_variant_in_its_own_process() -> None:
    """Two tiny fits, the policy and one thread, each in a child process; seconds a task read from its events."""
    result = _main("threads", "--repeats", "1", "--workloads", "demo", "--loads", "idle", "--variants", "policy", "one")
    seconds = result["seconds_per_task"]["demo"]["idle"]
    assert set(seconds) == {"policy", "one"}
    assert all(len(s) == 1 and 0 < s[0] < 60 for s in seconds.values())
    assert "÷ best" in result["table"]
    (chosen,) = result["chosen"]["demo"]["idle"]  # the policy's fit said what it chose; the pinned one said nothing
    assert chosen.startswith("Threads: ")
