"""``core.precision``: the jaxpr walk that the full-precision tests rely on finds products in
every kind of sub-jaxpr (a ``cond``'s branches included), ``is_highest`` needs both operands at
HIGHEST, and the decorator keeps the wrapped function's name and docstring and is applied once
by ``full_precision_fields``.

Without these the structural precision tests could pass while a product runs at TF32."""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import (
    HIGHEST,
    full_precision,
    full_precision_fields,
    is_highest,
    low_precision_dots,
)


def test_a_product_in_a_cond_branch_is_found():
    """A ``cond``'s branches are a tuple of jaxprs: a default-precision product in one is found
    (and not once the function is decorated)."""
    x = jnp.ones((3, 3))

    def f(a, p):
        return jax.lax.cond(p, lambda m: m @ m, lambda m: m + 1.0, a)

    assert len(low_precision_dots(f, x, True)) == 1
    assert low_precision_dots(full_precision(f), x, True) == []

    # a switch with three branches, two of them with a product
    def g(a, i):
        return jax.lax.switch(i, [lambda m: m @ m, lambda m: m.T @ m, lambda m: m], a)

    assert len(low_precision_dots(g, x, 0)) == 2


def test_is_highest_needs_both_operands():
    """A (lhs, rhs) pair is HIGHEST only when both are; None (the backend default) never is."""
    D = jax.lax.Precision.DEFAULT
    assert is_highest(HIGHEST) and is_highest((HIGHEST, HIGHEST))
    assert not is_highest((HIGHEST, D)) and not is_highest((D, HIGHEST))
    assert not is_highest(None) and not is_highest(D) and not is_highest((None, HIGHEST))


def test_full_precision_keeps_name_and_docstring():
    """The docstring promises ``functools.wraps``: name, docstring and __wrapped__ kept."""

    def solver(a):
        """My solver."""
        return a @ a

    w = full_precision(solver)
    assert w.__name__ == "solver" and w.__doc__ == "My solver." and w.__wrapped__ is solver
    assert w.full_precision is True


@dataclasses.dataclass(frozen=True)
class _Problem:
    transition: Callable
    reward: Any = None
    label: Any = "x"


def test_full_precision_fields_wraps_callables_once_and_leaves_the_rest():
    """Each callable field is wrapped once (a second call keeps the same wrapper); ``None`` and
    non-callable values are left for ``validate`` to judge."""
    prob = _Problem(lambda th: th @ th)
    full_precision_fields(prob, ("transition", "reward", "label"))
    first = prob.transition
    assert first.full_precision is True
    assert low_precision_dots(first, jnp.ones((2, 2))) == []
    full_precision_fields(prob, ("transition", "reward", "label"))
    assert prob.transition is first
    assert prob.reward is None and prob.label == "x"
