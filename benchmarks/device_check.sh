#!/usr/bin/env bash
# One short GPU check (about 7.5 minutes on an H200) that fails (exit 1) when any run's solver
# hits its cap.
#   1. Four-Rooms throughput: one run and the paper's 240-run grid, dense and sparse solvers.
#   2. Thermal with the paper's faithful MLP critics, 1 run (their matmuls keep JAX's default),
#      profiled.
#   3. The scaling table of every experiment's trainer at 1 / 100 / 1000 / 10,000 vmapped runs,
#      the 1- and 10,000-run chunks also profiled (kernels, device busy time, costliest kernels
#      per iteration: what bounds them).
# Every table has the share of run-iterations whose follower (or metric) solve hit its cap and
# the skipped updates beside the speed, and the scaling table compares each row's per-run J
# with the CPU's (benchmarks/scaling_cpu_reference.json: the same J as the CPU, or the row
# fails); each step runs with --fail-on-cap, and a step that fails, or runs past its own time
# limit, makes the whole script exit 1 after the others ran.
# Usage (repository root, on a machine with a GPU and jax[cuda] installed):
#   bash benchmarks/device_check.sh [OUTDIR] [EXPERIMENTS]
# EXPERIMENTS: the scaling table's experiments, comma-separated (default:
# fourrooms,thermal,toy_game,lqr_game; "none" skips steps 2 and 3).
# On an NVIDIA H200 (2026-12-04, jax 0.11.2) the check takes about 7.5 minutes, most of it
# compiling (12-21 s per scaling row: each number of runs is its own program); the steps' limits
# (fourrooms_throughput 75 s, thermal_faithful 45 s, scaling 95 / 120 / 100 / 115 s for
# fourrooms / thermal / toy_game / lqr_game) add up to 9.2 minutes, and steps.txt records how
# long each step took. If ./.whl holds wheels (packages the GPU machine
# lacks, e.g. distrax), they are installed into /tmp/site first (unless BCHG_WHEELS_DONE=1:
# benchmarks/gpu_session.sh installed them). DEVICE_CHECK_SMOKE=1 shrinks every step (a few
# iterations, 1 and 10 runs, limits x8; the faithful thermal step runs 1 MLP iteration of 50
# Adam steps instead of 5000: the paper's took 66 s on one core on 2026-12-03) to try the
# script's plumbing on a CPU.
set -uo pipefail
out="${1:-${OUT:-/tmp/device_check}}"
experiments="${2:-fourrooms,thermal,toy_game,lqr_game}"
mkdir -p "$out"
if [ "${BCHG_WHEELS_DONE:-0}" != 1 ] && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
if [ "${DEVICE_CHECK_SMOKE:-0}" = 1 ]; then
  scale=8 grid_its=3 single_its=5 runs="1 10" profile="1 10" mlp_its=1 mlp_steps=(--mlp-steps 50)
else
  scale=1 grid_its=100 single_its=500 runs="1 100 1000 10000" profile="1 10000" mlp_its=2
  mlp_steps=()
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
failed=()
step() {   # step NAME LIMIT_S COMMAND...: run with a time limit, tee to OUT/NAME.txt
  local name="$1" limit="$2" t0
  shift 2
  t0=$(date +%s)
  timeout "$((limit * scale))" "$@" 2>&1 | grep -v Warning | tee "$out/$name.txt"
  local rc="${PIPESTATUS[0]}"
  echo "$name: $(($(date +%s) - t0)) s of its $((limit * scale)) s limit, exit $rc" >> "$out/steps.txt"
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && why="ran past its $((limit * scale)) s limit" || why="exit $rc"
    failed+=("$name ($why)")
  fi
}
scaling_limit() {  # seconds for one experiment's scaling step: 4 rows, each compiled anew
  case "$1" in
    thermal) echo 120 ;;
    lqr_game) echo 115 ;;
    toy_game) echo 100 ;;
    *) echo 95 ;;
  esac
}
: > "$out/steps.txt"
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$out/header.txt"
step fourrooms_throughput 75 python3 -m benchmarks.fourrooms_throughput --iterations "$grid_its" \
  --single-iterations "$single_its" --solvers dense sparse --fail-on-cap
if [ "$experiments" != none ]; then
  step thermal_faithful 45 python3 -m benchmarks.thermal_throughput --methods bchg --seeds 1 \
    --only-mlp --mlp-iterations "$mlp_its" "${mlp_steps[@]}" --profile --fail-on-cap
  for e in ${experiments//,/ }; do
    step "scaling_$e" "$(scaling_limit "$e")" python3 -m benchmarks.scaling --experiments "$e" \
      --runs $runs --iterations 2 --profile-runs $profile --reference --fail-on-cap
  done
fi
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'DEVICE CHECK FAILED: %s\n' "${failed[@]}" | tee "$out/FAILED.txt"
  exit 1
fi
echo "device check passed: no solve hit its cap, no update skipped" | tee "$out/PASSED.txt"
