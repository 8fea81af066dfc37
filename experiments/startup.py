"""Ctrl-C while a training command starts (``python -m experiments.<name>``).

The command's imports (NumPy, JAX, the library: one to a few seconds) run before any of the
run folder's interrupt handling exists. A ``KeyboardInterrupt`` raised inside a C extension's
import printed a traceback and sometimes crashed the interpreter (SIGSEGV, no message; 2 of 16
interrupts between 1.0 and 1.7 s after the start, and 1 in 3 to 6 at 0.3 s, two audits). So the
package installs :func:`hold` when it is imported by such a command and imports the library
under it (:func:`import_the_library`: JAX, orbax; the commands otherwise import them lazily,
after the hold): the first Ctrl-C is held, the imports finish, and the run stops before it
writes anything (``run_folder.interrupt_flag`` reads the
held interrupt: exit 130, "interrupted before any training started"); a second Ctrl-C exits at
once with status 130. Imported by any other program (tests, notebooks, ``experiments.plot``)
it changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

TRAINING_COMMANDS = ("fourrooms", "thermal", "toy_game", "lqr_game")
_HELD = threading.Event()


def _on_sigint(signum, frame) -> None:
    if _HELD.is_set():
        sys.stderr.write("\nCtrl-C again: stopped during start-up; nothing was written\n")
        sys.stderr.flush()
        os._exit(130)
    _HELD.set()
    sys.stderr.write("\nCtrl-C: stopping once start-up is done (Ctrl-C again stops at once)\n")
    sys.stderr.flush()


def started_as_training_command() -> bool:
    """True while ``python -m experiments.<training command>`` is locating its module (Python sets
    ``sys.argv[0]`` to ``"-m"`` until the module's own code runs)."""
    argv = list(getattr(sys, "orig_argv", ()))
    if sys.argv[:1] != ["-m"] or "-m" not in argv[:-1]:
        return False
    target = argv[argv.index("-m") + 1]
    return target in {f"experiments.{name}" for name in TRAINING_COMMANDS}


def hold() -> None:
    """Installs the start-up handler, in the main thread and where SIGINT has Python's default
    handler (not where it is ignored, as in a shell's background job)."""
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _on_sigint)


def import_the_library() -> None:
    """Imports the library (JAX, optax, flax, distrax) and orbax (its checkpoints): the C
    extensions a training command loads, while :func:`hold` holds Ctrl-C."""
    import orbax.checkpoint  # noqa: F401

    import bchg_jax  # noqa: F401


def is_holding(handler) -> bool:
    """Whether ``handler`` (a ``signal.getsignal`` result) is the start-up handler."""
    return handler is _on_sigint


def held() -> bool:
    """Whether a Ctrl-C came during start-up."""
    return _HELD.is_set()
