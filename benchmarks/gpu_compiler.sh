#!/usr/bin/env bash
# Installs XLA:GPU's compiler (the jax-cuda13-plugin and jax-cuda13-pjrt wheels of the installed
# jaxlib's version, ~130 MB, from the package index) into folder DIR, for
# `PYTHONPATH=DIR python -m benchmarks.gpu_kernels` on a machine without a GPU. Not a dependency
# of the project: DIR stays out of the environment, and JAX still runs on the CPU beside it.
# Usage: bash benchmarks/gpu_compiler.sh DIR
set -euo pipefail
dir="${1:?usage: bash benchmarks/gpu_compiler.sh DIR}"
version="$(python3 -c 'import jaxlib; print(jaxlib.__version__)')"
python3 -m pip install -q --no-deps --target "$dir" \
  "jax-cuda13-plugin==$version" "jax-cuda13-pjrt==$version"
PYTHONPATH="$dir" JAX_PLATFORMS=cpu python3 -c '
from jax.experimental import topologies
with open("benchmarks/h200_target.txtpb") as f:
    topologies.get_topology_desc("check", "cuda", target_config=f.read(), topology="1x1x1")
print("XLA:GPU compiler ready")'
