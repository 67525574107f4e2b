"""The last lines of a ``fit``: how many tasks ran, the scores a report cites, where the logs and checkpoint are."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer
from torch import Tensor

from cl_lightning.contract import EvalSlot, metric_key
from cl_lightning.run.checkpointing import kept_checkpoint


def run_summary(
    trainer: Trainer,
    seconds: float,
    recent: dict[str, tuple[float, int]] | None = None,
    average: float | None = None,
    already_done: bool = False,
) -> str:
    """Three lines: tasks done; the scores a report cites; where the logs and the checkpoint are, how to continue.

    Args:
        trainer: The trainer after ``fit``.
        seconds: The run's wall time.
        recent: ``{"forward" | "backward": (mean, count)}`` over the last evaluated tasks (the forgetting monitor's
            ``recent_means``); without it the last task's scores are printed.
        average: ACC of ``R``'s last measured row (the forgetting monitor's ``last_average``): printed when this
            process logged none (a resumed run that had nothing left to do).
        already_done: The checkpoint the run resumed from had finished every task.
    """
    done, total = trainer.current_epoch, trainer.max_epochs
    minutes, secs = divmod(round(seconds), 60)
    if already_done and done == total:
        line = f"\nRun already finished: {done}/{total} tasks; nothing left to run.\n"
    else:
        status = "stopped early" if trainer.interrupted else "finished"
        line = f"\nRun {status}: {done}/{total} tasks in {minutes} min {secs} s.\n"
    scores = _scores(trainer, recent or {}, average)
    ckpt = kept_checkpoint(trainer)
    where = []
    if trainer.logger is not None and trainer.log_dir:
        where.append(f"Logs: {trainer.log_dir} (tensorboard --logdir {Path(trainer.log_dir).parent.parent})")
    where.append(f"checkpoint: {ckpt} (continue with --ckpt_path last)" if ckpt else "no checkpoint kept")
    return line + (scores + "\n" if scores else "") + "; ".join(where) + ".\n"


def _scores(trainer: Trainer, recent: dict[str, tuple[float, int]], average: float | None = None) -> str:
    """``Last 10 tasks (mean): forward acc 0.81, backward acc 0.80 (task t − 5); ACC 0.79 (R's last row).``"""
    metric = getattr(trainer.lightning_module, "metric_name", None)  # "acc" or "mse"
    lags = getattr(trainer.datamodule, "backward_lags", None)
    lag = "" if not lags else f"task t − {lags[0]}" if len(lags) == 1 else f"tasks t − {min(lags)} … t − {max(lags)}"
    logged = trainer.callback_metrics
    parts, head = [], "Last task"
    if recent:
        n = recent.get("forward", next(iter(recent.values())))[1]
        head = f"Last {n} task{'s' * (n > 1)} (mean)"
    for role in ("forward", "backward"):
        where = [lag] if role == "backward" and lag else []
        if role in recent:
            value, count = recent[role]
            where += [f"{count} task{'s' * (count > 1)}"] if count != n else []
        else:
            value = logged.get(metric_key(EvalSlot(role), metric)) if metric else None
            if value is None or value.numel() != 1:
                continue
        parts.append(f"{role} {metric} {float(value):.4g}" + (f" ({', '.join(where)})" if where else ""))
    text = f"{head}: {', '.join(parts)}" if parts else ""
    avg = logged.get("forgetting/avg", average)
    if avg is not None and (not isinstance(avg, Tensor) or avg.numel() == 1):
        name = "ACC" if metric == "acc" else f"average {metric}"
        text += f"{'; ' if text else ''}{name} {float(avg):.4g} (probe tasks, R's last row)"
    return text + "." if text else ""
