#!/usr/bin/env bash
# One short GPU check (under 8 minutes): Four-Rooms paper-grid throughput (240 vmapped runs) with
# the dense and the sparse follower solvers side by side, and the scaling table of every
# experiment's trainer at 1 / 100 / 1000 / 10,000 runs.
# Usage (repository root, on a machine with a GPU and jax[cuda] installed):
#   bash benchmarks/device_check.sh [OUTDIR] [EXPERIMENTS]
# EXPERIMENTS: the scaling table's experiments, comma-separated (default:
# fourrooms,thermal,toy_game,lqr_game; "none" skips the table).
# Each step has its own time limit so that one slow step cannot take the others with it (the
# steps' limits add up to 7.5 minutes). If ./.whl holds wheels (packages the GPU machine lacks,
# e.g. distrax), they are installed into /tmp/site first.
set -uo pipefail
out="${1:-${OUT:-/tmp/device_check}}"
experiments="${2:-fourrooms,thermal,toy_game,lqr_game}"
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
timeout 150 python3 -m benchmarks.fourrooms_throughput --iterations 100 --single-iterations 500 \
  --solvers dense sparse 2>&1 | tee "$out/fourrooms_throughput.txt"
[ "$experiments" = none ] && exit 0
for e in ${experiments//,/ }; do
  runs="1 100 1000 10000"
  [ "$e" = thermal ] && runs="1 100 1000"   # 10,000 thermal runs do not finish in the limit
  timeout 75 python3 -m benchmarks.scaling --experiments "$e" --runs $runs \
    --iterations 2 2>&1 | grep -v Warning | tee "$out/scaling_$e.txt"
done
