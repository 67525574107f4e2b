"""How many queries per chunk QOA's online metric needs: its cost per step against the noise of the task mean.

The online metric (``train/online_acc``, ours, not the authors') predicts the first ``online_queries`` examples of
each incoming chunk from the newest ``support_size`` stored examples before the chunk is stored. Two measurements:

1. Cost: at the V1 size (1,000 supports, scorer 9 × 100), the no-gradient prediction of k queries against one
   training step (query loss, backward, fused Adam), interleaved in one process.
2. Noise: a short Permuted-MNIST run (paper-size chunks: 145 of 400 per task) with ``online_queries`` = 16 whose
   per-query hits are kept; per task, the 16 queries of each chunk are cut into 16/k disjoint groups of k, and the
   spread (standard deviation) of the groups' task means is the standard error of a task's logged online accuracy
   with k queries per chunk, beside the binomial figure sqrt(p(1 − p) / (145 k)).

    python -m benchmarks.online_metric                      # both, 2 threads (~3 min on 2 busy cores)
    python -m benchmarks.online_metric --small              # tiny sizes (the smoke test)
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

import torch

from benchmarks.harness import Bench, clock, interleave, parser
from cl_lightning.learners import QueryOnlyAttention
from cl_lightning.learners.engines import StepRun
from cl_lightning.nn.optim import prefer_fused
from cl_lightning.run import cli

K_MAX = 16


def cost(rounds: int, reps: int, small: bool = False) -> dict[int, float]:
    """Median ms of the online prediction of k queries (k = 0 is one training step), V1 sizes, interleaved."""
    torch.manual_seed(0)
    model = QueryOnlyAttention(support_size=1000, **({"hidden": 16, "num_hidden_layers": 2} if small else {}))
    opt = prefer_fused(torch.optim.Adam(model.parameters(), lr=1e-4))
    gen = torch.Generator().manual_seed(0)
    sx, sy = torch.rand(1000, 49, generator=gen), torch.randint(0, 10, (1000,), generator=gen)
    x, y = torch.rand(K_MAX, 49, generator=gen), torch.randint(0, 10, (K_MAX,), generator=gen)

    def train() -> None:
        opt.zero_grad()
        model.query_loss(x[:1], y[:1], sx[:990], sy[:990]).backward()
        opt.step()

    def online(k: int) -> None:
        with torch.no_grad():
            model.predict_support(x[:k], sx, sy)

    jobs = {0: train, **{k: (lambda k=k: online(k)) for k in (1, 2, 4, 8)}}
    for job in jobs.values():
        job()

    def timed(job: Any) -> float:
        with clock() as t:
            for _ in range(reps):
                job()
        return t.wall / reps * 1e3

    ms = interleave({str(k): lambda job=job: timed(job) for k, job in jobs.items()}, rounds)
    return {int(k): statistics.median(v) for k, v in ms.items()}


def noise(tasks: int, small: bool = False) -> list[torch.Tensor]:
    """Per task, the ``(chunks, K_MAX)`` hits of a QOA V1 run on Permuted MNIST (buffer of 5,000 so it trains from
    the first task; evaluation shrunk, monitors off; ``small``: tasks of 1,200 images in chunks of 50)."""
    tiny = ["--data.stream.init_args.train_size=1200", "--data.stream.init_args.chunk_size=50"] if small else []
    hits: list[list[torch.Tensor]] = [[] for _ in range(tasks)]
    with tempfile.TemporaryDirectory() as root:
        run = cli.main(
            [
                "--config=configs/qoa_pmnist.yaml",
                f"--data.stream.init_args.num_tasks={tasks}",
                "--data.eval_queries=100",
                "--data.num_probe_tasks=1",
                "--model.init_args.memory_size=5000",
                f"--model.init_args.online_queries={K_MAX}",
                "--callbacks.plasticity=null",
                "--callbacks.hessian=null",
                "--callbacks.checkpoint=null",
                "--trainer.accelerator=cpu",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
                *tiny,
                f"--trainer.logger.init_args.save_dir={root}",
                f"--trainer.default_root_dir={root}",
            ],
            run=False,
        )
        model = run.model
        log_online = StepRun.log_online  # where a learner's step logs its online predictions

        def keep(step: StepRun, pred: torch.Tensor, y: torch.Tensor, loss: torch.Tensor | None = None) -> None:
            if pred.shape[0] == K_MAX:
                hits[model.trainer.current_epoch].append((pred.argmax(-1) == y).float())
            log_online(step, pred, y, loss)

        StepRun.log_online = keep  # type: ignore[method-assign]
        try:
            run.trainer.fit(model, run.datamodule)
        finally:
            StepRun.log_online = log_online  # type: ignore[method-assign]
    return [torch.stack(h) for h in hits if h]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both measurements; the result holds the cost per k and each task's standard errors."""
    p = parser(__doc__, threads=2, repeats=5)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--reps", type=int, default=20, help="calls per timing")
    bench = Bench.start("online_metric", p, argv)
    args = bench.args
    if args.small:  # a 16-wide scorer, 2 tasks of 1,200 images
        args.tasks, args.repeats, args.reps = 2, 1, 2
    ms = cost(args.repeats, args.reps, args.small)
    rows: list[list[Any]] = [["training step (1 query x 990 supports)", ms[0], 1.0]]
    rows += [[f"online metric, {k} queries x 1,000 supports", ms[k], ms[k] / ms[0]] for k in (1, 2, 4, 8)]
    tasks = []
    for h in noise(args.tasks, args.small):
        chunks, p_hat = h.shape[0], float(h.mean())
        se = {}
        for k in (1, 2, 4, 8):
            groups = h.view(chunks, K_MAX // k, k).mean((0, 2))  # (16 / k,) task means of disjoint groups
            se[k] = (float(groups.std()), (p_hat * (1 - p_hat) / (chunks * k)) ** 0.5)
        tasks.append({"chunks": chunks, "online_acc": p_hat, "se": se})
    notes = [
        "\n".join(
            f"task {t}: {r['chunks']} chunks, online acc {r['online_acc']:.3f}; "
            + "; ".join(f"k={k}: SE {m:.4f} (binomial {b:.4f})" for k, (m, b) in r["se"].items())
            for t, r in enumerate(tasks)
        )
    ]
    result = {"ms": ms, "tasks": tasks}
    return bench.finish(result, ["what", "ms", "share of a step"], rows, notes)


if __name__ == "__main__":
    main()
