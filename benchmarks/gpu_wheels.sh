#!/usr/bin/env bash
# Fetches, into ./.whl (git-ignored through .git/info/exclude), the wheels of the packages a GPU
# machine's image may lack: distrax and what it needs beyond JAX (tfp-nightly, dm-tree, gast,
# decorator), at the versions installed here, for CPython 3.12 on x86-64 Linux. A command on that
# machine installs them with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
# (benchmarks/gpu_session.sh and benchmarks/device_check.sh do so when ./.whl holds wheels).
# Usage (repository root, on a machine that reaches a package index):
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION (default 3.12)]
set -euo pipefail
py="${1:-3.12}"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")" .whl
grep -qx "/.whl/" "$exclude" 2> /dev/null || echo "/.whl/" >> "$exclude"
for name in distrax tfp-nightly dm-tree gast decorator; do
  version="$(python3 -m pip show "$name" 2> /dev/null | sed -n 's/^Version: //p')"
  [ -n "$version" ] || { echo "error: $name is not installed here" >&2; exit 1; }
  log="$(mktemp)"
  rc=0
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$name==$version" > "$log" 2>&1 || rc=$?
  grep -v "is ignored" "$log" || true
  rm -f "$log"
  # a failed download must stop here, not on the GPU machine (bchg_jax imports distrax)
  [ "$rc" = 0 ] || { echo "error: pip download $name==$version failed (exit $rc)" >&2; exit 1; }
done
ls .whl
du -sh .whl
