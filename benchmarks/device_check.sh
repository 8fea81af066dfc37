#!/usr/bin/env bash
# One short GPU check (about 5 minutes): Four-Rooms paper-grid throughput (240 vmapped runs)
# and the scaling table of every experiment's trainer at 1 / 100 / 1000 / 10,000 runs.
# Usage (repository root, on a machine with a GPU and jax[cuda] installed):
#   bash benchmarks/device_check.sh [OUTDIR]
# Each step has its own time limit so that one slow step cannot take the others with it.
# If ./.whl holds wheels (packages the GPU machine lacks, e.g. distrax), they are installed into
# /tmp/site first.
set -uo pipefail
out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$out/header.txt"
timeout 120 python3 -m benchmarks.fourrooms_throughput --iterations 200 --single-iterations 2000 \
  2>&1 | tee "$out/fourrooms_throughput.txt"
for e in fourrooms thermal toy_game lqr_game; do
  timeout 90 python3 -m benchmarks.scaling --experiments "$e" --runs 1 100 1000 10000 \
    --iterations 3 2>&1 | grep -v Warning | tee "$out/scaling_$e.txt"
done
