#!/usr/bin/env bash
# Paper-size throughput on one GPU: QOA V1 and Backprop on full Permuted MNIST (7,500 tasks of 58,000 images),
# bf16-mixed, each for a fixed wall-clock budget; prints seconds per task and the projected full-run time.
# Usage: bash benchmarks/gpu_paper_size.sh [seconds per learner] [output folder]
set -uo pipefail
budget=${1:-150}
out=${2:-logs/gpu_check}
mkdir -p "$out"
for cfg in qoa_pmnist bp_pmnist; do
  start=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$budget" python3 -m cl_lightning fit --config "configs/$cfg.yaml" \
    --trainer.accelerator=gpu --trainer.precision=bf16-mixed --trainer.enable_progress_bar=true \
    --trainer.logger.init_args.save_dir="$out" > "$out/$cfg.log" 2>&1
  echo "== $cfg: exit $? after $(( $(date +%s) - start )) s"
  python3 - "$out/$cfg" <<'PY'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
runs = sorted(glob.glob(sys.argv[1] + "/version_*"))
ea = EventAccumulator(runs[-1]); ea.Reload()
tags = ea.Tags()["scalars"]
fwd = ea.Scalars("eval/forward_acc") if "eval/forward_acc" in tags else []
if len(fwd) >= 2:
    per_task = (fwd[-1].wall_time - fwd[0].wall_time) / (len(fwd) - 1)
    print(f"tasks finished: {len(fwd)}  seconds per task (steady): {per_task:.2f}  projected 7,500 tasks: {per_task * 7500 / 3600:.1f} h")
for tag in ("eval/forward_acc", "eval/backward_acc", "train/online_acc"):
    if tag in tags:
        print(tag, [round(e.value, 3) for e in ea.Scalars(tag)][-8:])
PY
done
