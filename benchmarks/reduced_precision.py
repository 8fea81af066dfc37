"""Run any experiment or benchmark on the CPU as a GPU / TPU would compute its products.

``python -m benchmarks.reduced_precision [--bits 10] MODULE [ARGS ...]`` runs ``python -m MODULE
ARGS`` inside :func:`bchg_jax.core.reduced_precision.emulate_reduced_precision`: every float32
product not at ``Precision.HIGHEST`` has its operands rounded to ``--bits`` mantissa bits (10:
TF32, an NVIDIA GPU's default; 7: bfloat16, a TPU's). Examples::

    python -m benchmarks.reduced_precision experiments.fourrooms --seeds 2 --iterations 200
    python -m benchmarks.reduced_precision --bits 7 experiments.thermal --seeds 10 --iterations 50

Compare the run's ``capped`` / ``skipped`` shares and its curve with the same command without
the wrapper. At the end it prints how many products it compiled rounded and how many at full
precision (on stderr). A worst case of the device: XLA:GPU may keep some small products at full
float32, here every default product is rounded.
"""

from __future__ import annotations

import argparse
import runpy
import sys

from bchg_jax.core.reduced_precision import TF32_BITS, emulate_reduced_precision


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reduced_precision",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after MODULE is passed to it unchanged.",
    )
    parser.add_argument(
        "--bits",
        type=int,
        default=TF32_BITS,
        help="mantissa bits the rounded products keep: 10 = TF32 (GPU), 7 = bfloat16 (TPU)",
    )
    parser.add_argument("module", help="the module to run as python -m MODULE")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = parser.parse_args(argv)
    if not 1 <= a.bits <= 22:
        parser.error(f"--bits must be in 1..22, got {a.bits}")
    sys.argv = [a.module] + list(a.args)
    code = 0
    with emulate_reduced_precision(a.bits) as counts:
        try:
            runpy.run_module(a.module, run_name="__main__", alter_sys=True)
        except SystemExit as e:  # the module's own exit status
            code = e.code
        finally:
            print(
                f"[reduced_precision] {a.bits} mantissa bits: {counts['rounded']} products "
                f"compiled rounded, {counts['full']} at full precision",
                file=sys.stderr,
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
