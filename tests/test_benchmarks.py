"""Every script in benchmarks/ runs in its tiny mode (``--small``) and prints its table with sane numbers.

The full sizes run by hand (minutes to hours); these keep a refactor of the package from breaking a benchmark
unnoticed. Each runs in this process on one thread, in seconds; the numbers are checked for their fields and their
range (times and rates positive, accuracies in [0, 1], byte counts that follow from the sizes), not for their speed.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import ROOT

NUMBER = r"(nan|[\d,]+(?:\.\d+)?)"


def _float(text: str) -> float:
    return float(text.replace(",", ""))


def _load(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The scripts set their own thread count and read sys.argv (Lightning's CLI): both restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    yield
    torch.set_num_threads(threads)


def _run(capsys: pytest.CaptureFixture[str], name: str, entry: str, argv: list[str]) -> str:
    getattr(_load(name), entry)(argv)
    return capsys.readouterr().out


def test_checkpoint_write(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "checkpoint_write", "main", ["--small"])
    line = r"checkpoint ([\d.]+) MB; median write: atomic ([\d.]+) ms, Lightning ([\d.]+) ms"
    size, atomic, lightning = map(float, re.search(line, out).groups())
    # 1,000 stored rows of 49 floats, the scorer's ~92,000 weights and Adam's two moments: ~1.3 MB
    assert 0.5 < size < 3.0
    assert min(atomic, lightning) > 0


def test_constant_memory(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "constant_memory", "main", ["--small"])
    rows: dict[str, dict[int, tuple[float, int]]] = {}
    for name, seen, ms, nbytes in re.findall(r"^(\w+)\s+(\d+)\s+([\d.]+)\s+([\d,]+)$", out, re.MULTILINE):
        rows.setdefault(name, {})[int(seen)] = (float(ms), int(nbytes.replace(",", "")))
    assert set(rows) == {"qoa", "full_attention", "qoa_read_all", "delta_rule", "gated_delta_rule"}
    assert all(set(r) == {800, 1_600} for r in rows.values())
    assert all(ms > 0 for r in rows.values() for ms, _ in r.values())
    row = 49 * 4 + 8 + 8  # x float32, y and task id int64
    assert [rows["qoa_read_all"][n][1] for n in (800, 1_600)] == [800 * row, 1_600 * row]
    assert rows["qoa"][1_600][1] == 1_200 * row  # its FIFO's cap
    for rule in ("delta_rule", "gated_delta_rule"):  # a fast state of fixed size
        assert rows[rule][800][1] == rows[rule][1_600][1] > 0
        assert re.search(rf"{rule}\s+time x\s*{NUMBER}\s+bytes x\s*1\.00\s+(flat|NOT flat)", out)


def test_lifelong_icl(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _run(capsys, "lifelong_icl", "main", ["--small", "--out", str(tmp_path)])
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
    assert [len(result[part]) for part in ("ops", "ablation", "encoder")] == [9, 21, 6]
    assert all(0 <= r["mean5"] <= 1 and r["std5"] == 0 for r in result["ablation"])  # one seed
    assert [r["items"] for r in result["capacity"]] == [2, 4, 8, 16, 32]
    tables = (tmp_path / "tables.md").read_text()
    for head in ("| stream | learner |", "| op |", "| question | lever |", "| associations per task |"):
        assert head in tables
    assert "| Permuted MNIST, delta rule |" in tables
    assert len(list(tmp_path.glob("*.png"))) == 5


def test_loop_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "loop_overhead", "main_benchmark", ["--small"])
    assert "configs/bp_pmnist.yaml, 2 tasks, 4 steps" in out  # 2 tasks of 800 in chunks of 400
    for name in ("plain", "lightning", "lightning, no bar"):
        assert _float(re.search(rf"{name}: {NUMBER} ms/step", out).group(1)) > 0
    ratio, no_bar = re.search(rf"lightning / plain ratio: {NUMBER} \(no bar: {NUMBER}; target <= 1.10\)", out).groups()
    assert min(_float(ratio), _float(no_bar)) > 0


def test_metric_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "metric_overhead", "main_benchmark", ["--small"])
    without, with_ = re.search(rf"2 tasks: without monitors {NUMBER} s, with {NUMBER} s", out).groups()
    assert min(_float(without), _float(with_)) > 0
    assert _float(re.search(rf"metric overhead ratio: {NUMBER} \(target <= 1.10\)", out).group(1)) > 0


def test_paper_size(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As is, at ``--small``; its matmul yardstick (48 products of 2048²) at 256² so it takes seconds."""
    module = _load("paper_size")
    monkeypatch.setattr(module, "matmul_gflops", partial(module.matmul_gflops, n=256))
    m = module.benchmark(["--small", "--tasks", "2", "--threads", "1"])
    out = capsys.readouterr().out
    for field in ("steady tasks (1..1)", "flop floor", "peak RSS", "projected 20-task time"):
        assert field in out
    (steady,) = [v for t, v in m["tasks"].items() if t > 0]
    assert min(steady["wall"], steady["updates"], steady["flops_training"], m["init_row"]["init_row"]) > 0
    assert m["tasks"][0]["episodes_probe_n"] == 10
    assert all(rate > 0 for pair in m["matmul_gflops"] for rate in pair)
    projected = _float(re.search(rf"projected 20-task time: {NUMBER} h \({NUMBER} s per task\)", out).group(2))
    assert projected > 0


def test_scorer_rate(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "scorer_rate", "main", ["--small"])
    assert int(re.search(r"measured block: (\d+) pairs", out).group(1)) > 0
    rates = re.search(rf"GFLOP per CPU second: matmul 512² {NUMBER}, before {NUMBER}, blocked {NUMBER}", out).groups()
    assert all(_float(rate) > 0 for rate in rates)


def test_transfer_curves(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = _run(capsys, "transfer_curves", "main_benchmark", ["--small", "--out", str(tmp_path / "curve.csv")])
    probes = re.findall(rf"task\s+(\d+) steps\s+(\d+)\s+forward {NUMBER}\s+backward {NUMBER}\s+unseen {NUMBER}", out)
    assert [(int(t), int(s)) for t, s, *_ in probes] == [(0, 4), (1, 8)]  # 400 images in chunks of 100
    assert all(0 <= float(a) <= 1 for _, _, forward, _, unseen in probes for a in (forward, unseen))
    assert math.isnan(float(probes[0][3]))  # backward (lag 1) from task 1 on
    assert 0 <= float(probes[1][3]) <= 1
    assert re.search(rf"last 10 tasks: forward {NUMBER} backward {NUMBER} \(gap [+-]{NUMBER}\); unseen", out)
    with open(tmp_path / "curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["task"] for r in rows] == ["0", "1"]
    assert set(rows[0]) == {"task", "steps", "forward", "backward", "unseen", "seconds"}
    assert (tmp_path / "curve.tasks.csv").read_text().splitlines()[0] == "task,forward,backward"


def test_lifelong_budget(tmp_path: Path) -> None:
    argv = ["--small", "--streams", "AssociativeRecall", "--out", str(tmp_path)]
    result = _load("lifelong_budget").main(argv)["AssociativeRecall"]
    cells = result["cells"]
    assert set(cells) == {"knn_fifo", "knn_reservoir", "qoa_fifo", "qoa_reservoir", "delta_rule",
                          "gated_delta_rule", "ttt_linear"}  # fmt: skip
    for name, by_budget in cells.items():
        assert set(by_budget) == {1024, 8192}
        for budget, c in by_budget.items():
            assert c["bytes"] <= budget or name.endswith(("fifo", "reservoir"))  # a buffer holds >= 2 rows
            assert 0 <= c["mean1"] <= 1
            assert 0 <= c["mean5"] <= 1
            assert math.isnan(c["mean20"])  # 7 tasks: no task 20 back
    assert cells["knn_fifo"][8192]["bytes"] == 8192 // (32 * 4 + 16) * (32 * 4 + 16)  # 56 rows of 144 B
    assert cells["delta_rule"][8192]["bytes"] == 8192 // 40 * 40  # d_k 204 x 10 floats
    assert (tmp_path / "budget_AssociativeRecall.png").exists()


def test_lifelong_reuse_and_goals(tmp_path: Path) -> None:
    rows = _load("lifelong_reuse").main(["--small", "--out", str(tmp_path)])["rows"]
    assert len(rows) == 3 * 6  # three reuse streams x six levers
    for r in rows:
        assert 0 <= r["forward"] <= 1
        assert math.isnan(r["revised"]) == r["stream"].startswith("recur")
        assert math.isnan(r["return_first"]) == r["stream"].startswith("revise")
    goals = _load("lifelong_goals").main(["--small", "--streams", "AssociativeRecall", "--out", str(tmp_path)])
    assert [r["bytes"] for r in goals["rows"]] == [1000 * 40 + 32 * 4 + 8, 8 * 112 * 40 + 8 * 32 * 4 + 8]
    assert all(r["bytes"] <= goals["budget"] for r in goals["rows"])


def test_lifelong_budget_tables_rebuild_from_progress_lines_and_find_the_crossover(tmp_path: Path) -> None:
    bench = _load("lifelong_budget")
    log = tmp_path / "run.log"
    log.write_text(
        "S knn_reservoir 1,024 B (  1,000) L1 0.100±0.010 L5 0.100±0.010 L20 0.100±0.010  (1 s)\n"
        "S knn_reservoir 4,096 B (  4,000) L1 0.900±0.010 L5 0.700±0.010 L20 0.500±0.010  (1 s)\n"
        "S delta_rule    1,024 B (  1,000) L1 0.800±0.050 L5 0.300±0.050 L20 0.100±0.050  (1 s)\n"
        "S delta_rule    4,096 B (  4,080) L1 0.950±0.050 L5 0.600±0.050 L20 0.100±0.050  (1 s)\n"
        "T delta_rule    1,024 B (  1,000) L1 0.000±0.000 L5 0.000±0.000 L20 0.000±0.000  (1 s)\n"
    )
    result = bench.from_logs("S", [log])
    assert list(result["cells"]) == ["knn_reservoir", "delta_rule"]  # the other stream's line is not read
    cell = result["cells"]["delta_rule"][4096]
    assert (cell["bytes"], cell["mean5"], cell["std5"]) == (4080, 0.6, 0.05)
    assert math.isnan(cell["forward"])
    assert result["crossover"] == {1: None, 5: 4096, 20: 1024}  # lag 20: tied at 1 KB, buffer ahead after
