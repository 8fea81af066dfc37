"""How many XLA programs a call compiles (JAX's compile log), for the tests of cached calls."""

import logging

import jax


class _Compiles(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += "Finished XLA compilation" in record.getMessage()


def compiles(call) -> int:
    """The number of XLA compilations while ``call()`` runs."""
    handler = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            call()
    finally:
        logger.removeHandler(handler)
    return handler.count
