#!/usr/bin/env bash
# The GPU path's figures (docs/performance.md, "GPU: unmeasured"), as one prepared script for a
# lent GPU machine, where each command may run 10 minutes and the whole loan is 15: run part
# "paths" first (the two paths through the simulation at 10 and 30 clients a round, the
# cohort's training alone, and a cohort node's round around its training: host vs device sums
# on the GPU, bench/cohort_node.py), then part "paper" (10 rounds of every row of the FedSOL
# CIFAR-10 table). Everything it prints goes to $OUT (default /tmp/gpu-figures); the data are generated
# (bench/fake_data.py: MNIST's and CIFAR-10's schema and shapes), never downloaded.
#
#   bash scripts/gpu_figures.sh paths    # about 6 minutes on an H200
#   bash scripts/gpu_figures.sh paper    # about 8 minutes on an H200 at the cohort path's speed of 2026-11-27
set -euo pipefail
part="${1:?usage: scripts/gpu_figures.sh paths|paper}"
out="${OUT:-/tmp/gpu-figures}"
data="${GPU_FIGURES_DATA:-/tmp/gpu-figures-data}"
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; git rev-parse --short HEAD
  python -c "import torch, flwr; print('torch', torch.__version__, 'flwr', flwr.__version__)"; } > "$out/machine.txt" 2>&1
case "$part" in
  paths)
    [ -d "$data/mnist" ] || python bench/fake_data.py --out "$data" --datasets mnist
    for k in 30 10; do
      fraction=$(python -c "print($k / 100)")
      gpus=$(python -c "print(0.0625 if $k > 16 else 1 / $k)")
      FL_DATA_DIR="$data" timeout 280 python bench/overhead.py --mode sim --execution cohort,per-client \
        --clients 100 --model cnn --batch-size 32 --fraction "$fraction" --rounds 6 --gpus-per-client "$gpus" \
        --json "$out/overhead-k$k.json" > "$out/overhead-k$k.txt" 2>&1 || echo "overhead k=$k: rc $?" >> "$out/failed.txt"
    done
    timeout 120 python bench/cohort.py --models cnn --clients 10 30 --samples 600 --batch-size 32 \
      > "$out/cohort.txt" 2>&1 || echo "cohort: rc $?" >> "$out/failed.txt"
    FL_DATA_DIR="$data" timeout 90 python bench/cohort_node.py --model cnn --per-round 30 --rounds 4 \
      > "$out/cohort-node.txt" 2>&1 || echo "cohort-node: rc $?" >> "$out/failed.txt"
    ;;
  paper)
    [ -d "$data/cifar10" ] || python bench/fake_data.py --out "$data" --datasets cifar10
    FL_DATA_DIR="$data" timeout 560 python run_simulation.py --config experiments/paper/fedsol-cifar10-lda01.toml \
      --seeds 0 --rounds 10 --out "$out/paper" --quiet > "$out/paper.txt" 2>&1 || echo "paper: rc $?" >> "$out/failed.txt"
    ;;
  *) echo "unknown part $part: paths or paper" >&2; exit 2 ;;
esac
ls -la "$out"
