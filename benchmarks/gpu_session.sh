#!/usr/bin/env bash
# A whole GPU session as one script of at most 9 minutes (GPU_SESSION_BUDGET), for a remote job
# of 10 minutes:
#   1. benchmarks/device_check.sh: throughput of all four experiments, failing on any capped
#      solve or skipped update (about 7.5 minutes on an H200, 2026-12-04; its steps' limits add
#      up to 9.2), with a profile of each experiment's 1- and 10,000-run chunk;
#   2. one complete Four-Rooms panel (batch 100, beta 1e-3: every method + exact, 10 seeds x
#      10,000 iterations), its methods trained one after another in one process
#      (GPU_SESSION_METHOD_WORKERS, default 1), in the time left of the budget; then
#      `fourrooms_figure compare` against the committed CPU tables (each panel from the newest).
#      Not side by side: on one GPU, processes take turns on the card, and a Four-Rooms
#      iteration is a chain of ~1,200 small kernels with host tests among them (solver loop
#      tests, lax.cond: benchmarks/loop_trips.py), so each waits out the others' turns. Seven processes side by
#      side (H200, 2026-12-04) ran bchg's 240 runs at over 0.1 s per iteration (no chunk of
#      1,000 iterations in a sitting of 121 s), against 4.5 ms alone in the device check.
#      After the check (~7.5 min) a 9-minute call leaves too little for the panel: give each a
#      call of its own (--check-only, --panel-only);
#   3. if time is left (all of it with --ab-only): Four-Rooms' chain of fixed-length steps
#      (its rollout and SARSA pass, 200 dependent steps per iteration) shortened two ways,
#      each timed by `benchmarks.fourrooms_throughput` (one run and the 240-run grid, sparse
#      solver, the grid's mean J beside each row): TrainConfig.parallel_steps (the rollout in
#      log depth, the SARSA pass one triangular solve: 235 -> 35 fixed steps per iteration,
#      benchmarks.loop_trips) against the scans; `benchmarks.fourrooms_parts` with parallel
#      steps (where such an iteration goes, and whether its batch and critic are the scans' on
#      the device), then the same with the sparse follower's rounds of expectation sweeps as the
#      CPU's loop (BCHG_SPARSE_ROUND=loop) instead of unrolled (67 -> 132 kernels a trip,
#      benchmarks.gpu_kernels); the fused fit of the MLP critic (lq.fused_td: two Pallas
#      kernels per Adam step instead of XLA's 27) checked against XLA's on the card
#      (benchmarks.fused_td_check, exit 3 when they differ) and timed, then the faithful
#      thermal run with each fit (the 0.1 s/it target); the kernels per iteration of
#      Four-Rooms (scans and parallel steps) and of the faithful thermal run as XLA:GPU
#      compiles them for the card (benchmarks.gpu_kernels --attached: the autotuned GEMMs,
#      against the counts of its compile without a GPU); Four-Rooms at 25 steps per scan trip
#      (BCHG_SCAN_UNROLL) instead of 4; with parallel steps, at 8 steps per solver loop test
#      (BCHG_STEPS_PER_TEST) instead of 4 (the grid's metric solve makes most of its host
#      tests). In the order the parts run: parallel steps, the fused fit, the faithful run,
#      the parts in both round forms, the card's kernel counts, then the two tunings.
#      Into ab.txt.
# It writes at most seven files to OUTDIR, few and shallow, so that a remote job copies little
# back: RESULT.txt (one line per part: passed / failed / not finished), header.txt, ab.txt,
# device_check.txt,
# panel.txt, compact.tgz (the panel's compact copies and wall.json: `fourrooms_figure figure` and
# `compare` read them) and gpu_session.tgz (the check's tables, per-method logs and chunk
# timings, the GPU utilisation log). A machine whose JAX has no GPU backend stops at once.
#
# Usage (repository root):
#   bash benchmarks/gpu_session.sh [--smoke] [--panel-only | --check-only | --ab-only] [OUTDIR]
# Without --panel-only or --ab-only the work folder results/gpu_session/ (git-ignored) starts
# empty.
# --panel-only skips the device check and starts the panel, or continues it in that folder: a
#   call of its own for the panel (the check leaves it too little time), and further calls on
#   the same machine finish a panel that ran out of time (the work folder must still be there),
#   e.g. `bash benchmarks/gpu_session.sh --panel-only $OUT`.
# --check-only runs the device check (and step 3 if time is left), not the panel: with
#   a 10-minute call, one call --check-only and one --panel-only (about 7.5 + 5-8 minutes).
# --ab-only runs step 3 alone (8-10 minutes on an H200, estimated; a part that does not fit the
#   budget is "not started", the call then fails, and what ran is kept): what is left to
#   measure once the check and the panel have been (both were, 2026-12-04).
# --smoke tries the plumbing on a CPU in a few minutes: every device-check step shrunk,
#   a panel of 2 seeds x 30 iterations (its comparison is printed, not judged), in
#   results/gpu_session_smoke/. Exit status: 0 when every part passed, 1 otherwise.
# GPU_SESSION_BUDGET (seconds, default 540) is the wall-clock budget of the whole script; the
# panel gets what the device check leaves, minus 30 s kept for the bundle. GPU_SESSION_WORK
# overrides the work folder; GPU_SESSION_METHOD_WORKERS the panel's --method-workers (1; 7 with
# --smoke); a panel started with one number of workers continues in its layout.
# GPU_SESSION_PARALLEL_STEPS=1 trains the panel with --parallel-steps (a panel started without
# them is refused: give it another GPU_SESSION_WORK). Fetch the
# wheels beforehand, on a machine that reaches a package index (bash benchmarks/gpu_wheels.sh),
# copy ./.whl with the checkout, and give the job 600 s.
set -uo pipefail
smoke=0 panel_only=0 check_only=0 ab_only=0 out=""
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    --panel-only) panel_only=1 ;;
    --check-only) check_only=1 ;;
    --ab-only) ab_only=1 ;;
    -*) echo "unknown option $arg" >&2; exit 2 ;;
    *) out="$arg" ;;
  esac
done
if [ $((panel_only + check_only + ab_only)) -gt 1 ]; then
  echo "--panel-only, --check-only and --ab-only exclude each other" >&2
  exit 2
fi
out="${out:-${OUT:-/tmp/gpu_session}}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
budget="${GPU_SESSION_BUDGET:-540}"
t_start=$(date +%s)
left() { echo $((budget - ($(date +%s) - t_start))); }
work="${GPU_SESSION_WORK:-results/gpu_session}"
[ "$smoke" = 1 ] && work="${GPU_SESSION_WORK:-results/gpu_session_smoke}"
# a new session starts afresh; --panel-only continues a panel there, --ab-only leaves it be
[ "$panel_only" = 1 ] || [ "$ab_only" = 1 ] || rm -rf "$work"
mkdir -p "$out" "$work"
wheels="no ./.whl"
if [ "$smoke" = 0 ] && compgen -G ".whl/*.whl" > /dev/null; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}" wheels="installed"
  else
    wheels="FAILED to install"
  fi
fi
export BCHG_WHEELS_DONE=1 PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
if [ "$smoke" = 1 ]; then  # on a CPU the methods' compiles overlap: seven processes
  export DEVICE_CHECK_SMOKE=1
  panel_args=(--seeds 2 --iterations 30 --chunk 10)
  method_workers="${GPU_SESSION_METHOD_WORKERS:-7}"
else
  panel_args=(--seeds 10 --iterations 10000 --chunk 1000)
  method_workers="${GPU_SESSION_METHOD_WORKERS:-1}"
fi
if [ "${GPU_SESSION_PARALLEL_STEPS:-0}" = 1 ]; then  # the panel with parallel steps
  panel_args+=(--parallel-steps)
fi
: > "$work/RESULT.txt"  # this call's parts only
result() { echo "$*" | tee -a "$work/RESULT.txt"; }
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
    || echo "no nvidia-smi"
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, \
jax.devices())"
  python3 -c "import sys; from importlib.metadata import version as v, PackageNotFoundError as E
names = 'flax optax chex distrax orbax-checkpoint numpy jax-cuda13-plugin jax-cuda12-plugin'
def ver(n):
    try:
        return v(n)
    except E:
        return '-'
print('python', sys.version.split()[0], *(n + ' ' + ver(n) for n in names.split()))"
  echo "budget ${budget} s, smoke ${smoke}, panel-only ${panel_only}, check-only ${check_only}, \
ab-only ${ab_only}, wheels ${wheels}"
} 2>&1 | tee "$work/header.txt"
[ "$wheels" = "FAILED to install" ] && result "wheels: FAILED to install (header.txt)"
backend="$(python3 -c 'import jax; print(jax.default_backend())' 2> /dev/null)"
if [ "$smoke" = 0 ] && [ "$backend" != gpu ]; then  # JAX fell back to the CPU: stop now
  result "no GPU: JAX's backend is '${backend}' (header.txt); nothing was run"
  cp "$work/RESULT.txt" "$work/header.txt" "$out/"
  exit 1
fi
if ! python3 -c "import bchg_jax" > "$work/import.txt" 2>&1; then  # e.g. distrax missing
  result "bchg_jax does not import (import.txt; its wheels: bash benchmarks/gpu_wheels.sh here, \
then copy .whl with the checkout); nothing was run"
  cp "$work/RESULT.txt" "$work/header.txt" "$work/import.txt" "$out/"
  exit 1
fi

# 1. the device check
if [ "$panel_only" = 0 ] && [ "$ab_only" = 0 ]; then
  t0=$(date +%s)
  bash benchmarks/device_check.sh "$work/check"
  rc=$?
  for f in header fourrooms_throughput thermal_faithful scaling_fourrooms scaling_thermal \
    scaling_toy_game scaling_lqr_game steps FAILED PASSED; do
    [ -f "$work/check/$f.txt" ] && { echo "### $f"; cat "$work/check/$f.txt"; }
  done > "$work/device_check.txt"
  if [ "$rc" = 0 ]; then
    result "device check: passed in $(($(date +%s) - t0)) s"
  else
    result "device check: FAILED (exit $rc) in $(($(date +%s) - t0)) s: $(cat "$work/check/FAILED.txt" 2> /dev/null)"
  fi
fi

# 2. the panel, in the time left (a panel stopped by the limit continues in the next call)
panel_limit=$(($(left) - 30))
dmon=""
if command -v nvidia-smi > /dev/null; then
  nvidia-smi dmon -s u -d 5 > "$work/dmon.txt" 2>&1 &
  dmon=$!
fi
if [ "$check_only" = 1 ] || [ "$ab_only" = 1 ]; then
  :  # the panel gets a call of its own (--panel-only)
elif [ "$panel_limit" -lt 60 ]; then
  result "panel: not started (${panel_limit} s left); continue with --panel-only"
else
  t0=$(date +%s)
  timeout "$panel_limit" python3 -m benchmarks.fourrooms_figure run --panels 100:1e-3 \
    --out "$work/fig" --compact "$work/compact" --method-workers "$method_workers" "${panel_args[@]}" \
    2>&1 | grep -v Warning | tee -a "$work/panel.txt"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then
    result "panel: complete, this call's part in $(($(date +%s) - t0)) s"
    python3 -m benchmarks.fourrooms_figure compare --compact "$work/compact" 2>&1 \
      | tee -a "$work/panel.txt"
    rc=${PIPESTATUS[0]}
    if [ "$smoke" = 1 ]; then
      result "compare: printed, not judged (--smoke: 30 iterations against 10,000)"
    elif [ "$rc" = 0 ]; then
      result "compare: every method within 2 SE of the CPU table"
    else
      result "compare: FAILED (exit $rc; 3: a method differs by more than 2 SE, 1: runs of another length; panel.txt)"
    fi
  elif [ "$rc" = 124 ]; then
    result "panel: NOT FINISHED, stopped at the ${panel_limit} s limit; continue with --panel-only"
  else
    result "panel: FAILED (exit $rc), see panel.txt and the logs in gpu_session.tgz"
  fi
fi

# 3. if time is left (all of it with --ab-only): Four-Rooms' chain of fixed-length steps shortened
# (parallel steps; 25 steps per scan trip), each row timed beside the grid's mean J; then where an
# iteration with parallel steps goes. Each part starts only with 65 s left (a limit of 45 s, 20
# kept for the bundle); with --ab-only a part that did not start is a failure.
ab() {  # ab NAME COMMAND...: one part of step 3 into ab.txt, in the time left
  local name=$1 limit=$(($(left) - 20)) rc
  shift
  if [ "$limit" -lt 45 ] && [ "$ab_only" = 1 ]; then
    result "${name}: not started (${limit} s left)"
    return
  elif [ "$limit" -lt 45 ]; then
    result "${name}: skipped (${limit} s left)"
    return
  fi
  echo "### ${name}" >> "$work/ab.txt"
  timeout "$limit" "$@" 2>&1 | grep -v Warning | tee -a "$work/ab.txt"
  rc=${PIPESTATUS[0]}
  case "$rc" in
    0) result "${name}: passed" ;;
    124) result "${name}: NOT FINISHED in ${limit} s" ;;
    *) result "${name}: FAILED (exit ${rc}; 3: a solve at its cap or an update skipped)" ;;
  esac
}
if [ "$smoke" = 1 ]; then  # the plumbing only, in seconds of a CPU's time each
  throughput=(python3 -m benchmarks.fourrooms_throughput --solvers sparse --iterations 2
    --single-iterations 2 --seeds 1 --fail-on-cap)
  parts=(--runs 1 --warmup 2 --iterations 2 --repeats 1)
  # the fused fit would run interpreted on a CPU; 50 Adam steps a fit instead of the paper's 5000
  mlp=(--mlp-iterations 1 --mlp-kernel xla --mlp-steps 50)
  fused=(--rows 300 --steps 5 --timing-steps 5 --interpret)
else
  throughput=(python3 -m benchmarks.fourrooms_throughput --solvers sparse --iterations 500
    --single-iterations 2000 --fail-on-cap)
  parts=(--runs 1 240 --warmup 50 --repeats 2)
  mlp=(--mlp-iterations 2 --mlp-kernel xla fused)
  fused=()
fi
rm -f "$work/ab.txt"  # this call's A/Bs only
if [ "$smoke" = 0 ] || [ "$ab_only" = 1 ]; then
  ab "Four-Rooms, scan and parallel steps" "${throughput[@]}" --steps scan parallel
  ab "fused TD fit against XLA's" python3 -m benchmarks.fused_td_check "${fused[@]}"
  ab "thermal faithful, XLA and fused critic fits" python3 -m benchmarks.thermal_throughput \
    --methods bchg --seeds 1 --only-mlp "${mlp[@]}" --fail-on-cap
  ab "fourrooms_parts, parallel steps" python3 -m benchmarks.fourrooms_parts "${parts[@]}" \
    --parallel-steps  # and, on the device, the same batch and critic as the scans
  BCHG_SPARSE_ROUND=loop ab "fourrooms_parts, parallel steps, the follower's rounds as a loop" \
    python3 -m benchmarks.fourrooms_parts "${parts[@]}" --parallel-steps
  if [ "$smoke" = 0 ]; then  # compiled for the card (its autotuned GEMMs); a CPU has none
    ab "kernels per iteration, compiled for the card" bash -c "python3 -m benchmarks.gpu_kernels \
      --attached --experiments fourrooms --runs 1 240 && python3 -m benchmarks.gpu_kernels \
      --attached --experiments fourrooms --runs 1 240 --parallel-steps && python3 -m \
      benchmarks.gpu_kernels --attached --experiments thermal_faithful --runs 1 \
      --mlp-kernel fused"
  fi
  BCHG_SCAN_UNROLL=25 ab "Four-Rooms, 25 steps per scan trip" "${throughput[@]}" --steps scan
  BCHG_STEPS_PER_TEST=8 ab "Four-Rooms, parallel steps, 8 steps per host test" \
    "${throughput[@]}" --steps parallel
fi

[ -n "$dmon" ] && kill "$dmon" 2> /dev/null

# 4. the bundle: at most seven files back
result "total: $(($(date +%s) - t_start)) s of the ${budget} s budget"
(
  cd "$work" || exit 1
  find fig -maxdepth 5 \( -name log.txt -o -name metrics.jsonl -o -name summary.csv \
    -o -name sittings.json -o -name panel.json \) 2> /dev/null > files.lst
  ls -d check dmon.txt 2> /dev/null >> files.lst
  tar czf "$out/gpu_session.tgz" --exclude='*/checkpoint' -T files.lst
  # the compact copies (about 2.5 MB a panel: the 12 of the CPU figure take 29 MB, RESULTS.md)
  # in a file of their own: each file that comes back must stay under 16 MiB
  [ -d compact ] && tar czf "$out/compact.tgz" compact
)
files=(RESULT.txt header.txt ab.txt)  # and the parts this call ran (the folder keeps earlier ones)
[ "$panel_only" = 1 ] || [ "$ab_only" = 1 ] || files+=(device_check.txt)
[ "$check_only" = 1 ] || [ "$ab_only" = 1 ] || files+=(panel.txt)
for f in "${files[@]}"; do
  [ -f "$work/$f" ] && cp "$work/$f" "$out/$f"
done
grep -q "FAILED\|NOT FINISHED\|not started\|no GPU" "$work/RESULT.txt" && exit 1
exit 0
