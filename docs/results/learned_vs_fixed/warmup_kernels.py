"""The 24-kernel grid's warm-up scores on Permuted MNIST and Rescaled Permuted MNIST at 1,000 and 200 supports
(docs/results/learned_vs_fixed.md, "The stream"): the kernel each stream's selection picks, and the best kernel on raw
and on standardised inputs. Five warm-up tasks each (the paper's), then one evaluated task; about a minute.

    python docs/results/learned_vs_fixed/warmup_kernels.py
"""

from __future__ import annotations

from cl_lightning.run.cli import main


def scores(rescaled: bool, support: int) -> tuple[str, float, tuple[float, str], tuple[float, str]]:
    """(chosen kernel, its warm-up accuracy, best on raw inputs, best on standardised inputs)."""
    args = ["--config", "configs/knn_tuned_pmnist.yaml"]
    args += ["--config", "configs/data/pmnist_rescaled.yaml"] if rescaled else []
    args += [
        "--data.stream.init_args.num_tasks=6", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        f"--model.init_args.memory_size={support}", f"--model.init_args.support_size={support}",
        f"--data.context_size={support}", "--data.eval_queries=200", "--trainer.enable_checkpointing=false",
        "--callbacks.checkpoint=null", "--trainer.default_root_dir=/tmp/warmup_kernels",
    ]  # fmt: skip
    cli = main(args, run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    model = cli.model
    pairs = list(zip(model.selection_scores.tolist(), model.select.kernels(), strict=True))
    raw = max((s, str(k)) for s, k in pairs if not k.standardised)
    standardised = max((s, str(k)) for s, k in pairs if k.standardised)
    return str(model.kernel), max(s for s, _ in pairs), raw, standardised


if __name__ == "__main__":
    rows = [(r, s, *scores(r, s)) for r in (False, True) for s in (1000, 200)]
    print("| stream | supports | chosen | its warm-up accuracy | best on raw inputs | best on standardised inputs |")
    print("|---|---:|---|---:|---|---|")
    for rescaled, support, chosen, best, raw, std in rows:
        stream = "Rescaled Permuted MNIST" if rescaled else "Permuted MNIST"
        print(f"| {stream} | {support:,} | {chosen} | {best:.4f} | {raw[0]:.4f} ({raw[1]}) | {std[0]:.4f} ({std[1]}) |")
