#!/usr/bin/env bash
# The GPU check of paper-size QOA (at most 8 minutes on one H200): QOA V1 on Permuted MNIST at paper size, CUDA,
# bf16-mixed, every monitor on, eager and then with the training step compiled (model.init_args.compile), each for
# 3 tasks (task 0 fills the buffer; tasks 1-2 are steady): seconds per task split by phase and the projected
# 7,500-task time (python -m benchmarks.paper_size); then the synchronisations of steady training steps counted under
# torch.cuda.set_sync_debug_mode("warn") (python -m benchmarks.gpu_sync_check). Each part has a time limit, so the whole
# stays under 8 minutes whatever happens; a part that runs out prints what it had.
# Usage: bash benchmarks/gpu_paper_size.sh [output folder]          # on a machine with a CUDA GPU
#        bash benchmarks/gpu_paper_size.sh --cpu [output folder]    # the same code paths on the CPU, tiny sizes (tests)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mode=gpu
if [[ "${1:-}" == "--cpu" ]]; then mode=cpu; shift; fi
out=${1:-logs/gpu_check}
mkdir -p "$out"
if [[ $mode == gpu ]]; then
  bench=(--gpu --tasks 3)
  sync=()
  limits=(150 210 100)
else
  bench=(--gpu --device cpu --small --tasks 3 --threads 1)
  sync=(--device cpu --small --threads 1)
  limits=(600 600 300)
fi
python3 -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
start=$(date +%s)
timeout "${limits[0]}" python3 -m benchmarks.paper_size "${bench[@]}" --out "$out/eager" > "$out/eager.log" 2>&1
echo "== eager (exit $?, $(( $(date +%s) - start )) s so far)"
grep -E "^(steady tasks|  training|  flop floor|peak RSS|projected|Environment)" "$out/eager.log"
timeout "${limits[1]}" python3 -m benchmarks.paper_size "${bench[@]}" --set model.init_args.compile=true \
  --out "$out/compiled" > "$out/compiled.log" 2>&1
echo "== compiled training step (exit $?, $(( $(date +%s) - start )) s so far; compilation falls in task 0/1)"
grep -E "^(steady tasks|  training|  flop floor|peak RSS|projected)" "$out/compiled.log"
timeout "${limits[2]}" python3 -m benchmarks.gpu_sync_check "${sync[@]}" --out "$out/sync" > "$out/sync.log" 2>&1
echo "== sync check (exit $?, $(( $(date +%s) - start )) s in all)"
grep -E "^(sync check|synchronisations|\| [0-9]|not counted|Environment)" "$out/sync.log"
