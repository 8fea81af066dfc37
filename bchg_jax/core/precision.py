"""Full-precision matrix products for the solvers and exact references, on every backend.

On Hopper / Ampere GPUs and on TPUs, JAX's default float32 matmul precision lets XLA use
reduced-precision passes (TF32 or bf16: about 1e-3 relative error per product). Fixed-point
solvers that stop at a sup-norm change of 1e-6 (soft value iteration, policy evaluation, the
Riccati iteration) can then never meet their tolerance once their products go to the tensor
cores: every loop runs to its cap, and an update that waits for a converged follower is never
taken. On the CPU the setting changes nothing, so the problem shows only on accelerators.

The mechanism is a *trace-time scope*: :func:`full_precision` wraps a function so that it is
traced under ``jax.default_matmul_precision("highest")``. JAX resolves a ``dot_general``'s
``precision=None`` from that setting when the operation is traced, so every product inside the
function (``@``, ``einsum``, ``jnp.linalg.solve``'s matvecs, the problem's own table functions
when the solver calls them, the JVP rules of ``custom_root`` / ``custom_linear_solve`` and the
transposes derived from them) carries ``Precision.HIGHEST`` in the jaxpr, whatever the global
``jax_default_matmul_precision``. Why a scope rather than ``precision=`` on each operation: it
also covers products the library does not write itself (inside ``jnp.linalg``, inside the
user's ``transition(theta)``), and a new solver needs one decorator instead of an argument on
every product.
The scope covers what is traced while the decorated function runs, and no more: a function that
a custom rule traces *later* is outside it. A ``custom_vmap`` rule runs when ``vmap`` reaches the
primitive, which for a solver inside a ``scan`` or ``while_loop`` body is after the body was
traced, outside the caller's scope (the sparse solvers' bodies once missed it, and under TF32
the Four-Rooms follower hit its cap in most iterations). A custom JVP rule is traced late too:
``grad`` of a jitted function (or a ``scan``, or a ``checkpoint``) holding it traces the rule
when it differentiates, so such a rule carries the decorator itself.
:func:`~bchg_jax.core.run_last.run_last` and :func:`~bchg_jax.tabular.sparse.cond_on_any_lane`
therefore record the precision in force at the call and re-enter it in their rules
(:func:`~bchg_jax.core.run_last.in_callers_precision`); the sparse solvers' bodies carry the
decorator as well. Why not
a global setting: neural critics and actors keep the user's choice
(TF32 is what makes them fast on a GPU, and SGD does not need 1e-7 products).

:func:`low_precision_dots` walks a jaxpr (and every sub-jaxpr: loops, conditionals, custom
rules, linear solves) and lists the ``dot_general`` operations that are not at full precision;
the tests use it on every solver and exact reference, and on the whole vmapped trainers as the
command lines compose them. A CPU run shows the difference numerically only under
:func:`~bchg_jax.core.reduced_precision.emulate_reduced_precision`. Users can run it on their
own functions too::

    from bchg_jax.core.precision import low_precision_dots
    assert not low_precision_dots(my_solver, *args)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List

import jax

HIGHEST = jax.lax.Precision.HIGHEST


def full_precision(fn: Callable) -> Callable:
    """Decorator: ``fn`` is traced (and, called eagerly, run) with every float matmul at
    ``Precision.HIGHEST``. Docstring, name and signature are kept (``functools.wraps``).

    Args:
      fn: any function of JAX arrays (jitted or not; ``jax.jit`` caches the full-precision
        trace separately from a default-precision one).
    Returns:
      the wrapped function.
    """

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    wrapped.full_precision = True
    return wrapped


def full_precision_fields(obj, names) -> None:
    """Replaces each callable attribute ``names`` of the (frozen) dataclass ``obj`` by its
    :func:`full_precision` version, once (a field already wrapped is kept). A problem's table
    functions (``transition(theta)``, ``A_fn(theta)``, ...) are called by solvers, samplers and
    estimators alike, inside and outside any solver's scope; a user's table built with a product
    (``P0 + theta @ D``, ``softmax(W @ theta)``) would otherwise be rounded to TF32 on a GPU
    where the sampler or an estimator calls it, and the rows of a linear one would no longer sum
    to 1 (a row sum off by d moves the values by about gamma d / (1 - gamma)). Called by the
    problem classes' ``__post_init__``; ``None`` and non-callable values are left for their
    ``validate`` to judge."""
    for name in names:
        fn = getattr(obj, name)
        if callable(fn) and not getattr(fn, "full_precision", False):
            object.__setattr__(obj, name, full_precision(fn))


def is_highest(precision: Any) -> bool:
    """True when a ``dot_general``'s ``precision`` parameter (one value or a pair) is
    ``Precision.HIGHEST`` for both operands (``None``, the backend's default, is not)."""
    if precision is None:
        return False
    if isinstance(precision, (tuple, list)):
        return all(is_highest(p) for p in precision)
    return precision == HIGHEST or str(precision).endswith("HIGHEST")


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):  # core.Jaxpr
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # ClosedJaxpr
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):  # branches, _LinearSolveTuple, ...
        for v in value:
            yield from _sub_jaxprs(v)


def jaxpr_eqns(jaxpr, names) -> List[Any]:
    """Every equation of ``jaxpr`` and its sub-jaxprs (loops, conditionals, custom rules,
    linear solves) whose primitive is named in ``names`` (e.g. ``{"triangular_solve", "lu"}``).

    Args:
      jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (e.g. from ``jax.make_jaxpr``).
      names: primitive names.
    Returns:
      the list of equations (``eqn.invars``: the operands, ``eqn.params``: the parameters).
    """
    names = set(names)
    out = []
    stack = list(_sub_jaxprs(jaxpr))
    while stack:
        jx = stack.pop()
        for eqn in jx.eqns:
            if eqn.primitive.name in names:
                out.append(eqn)
            for v in eqn.params.values():
                stack.extend(_sub_jaxprs(v))
    return out


def jaxpr_dots(jaxpr) -> List[Any]:
    """Every ``dot_general`` equation of ``jaxpr`` and its sub-jaxprs (:func:`jaxpr_eqns`):
    ``eqn.params["precision"]`` is its precision, ``eqn.invars`` its operands.

    Args:
      jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (e.g. from ``jax.make_jaxpr``).
    Returns:
      the list of equations.
    """
    return jaxpr_eqns(jaxpr, ("dot_general",))


def jaxpr_dot_precisions(jaxpr) -> List[Any]:
    """The ``precision`` parameter of every ``dot_general`` in ``jaxpr`` and its sub-jaxprs.

    Args:
      jaxpr: a ``Jaxpr`` or ``ClosedJaxpr`` (e.g. from ``jax.make_jaxpr``).
    Returns:
      a list with one entry per ``dot_general`` (``None`` means the backend's default).
    """
    return [eqn.params.get("precision") for eqn in jaxpr_dots(jaxpr)]


def low_precision_dots(fn: Callable, *args, **kwargs) -> List[Any]:
    """Traces ``fn(*args, **kwargs)`` and returns the precisions of its ``dot_general``
    operations that are not ``HIGHEST`` (an empty list: every product is at full precision).

    Traced under ``jax.default_matmul_precision("default")`` semantics of the caller: a product
    that is full precision only because of a global setting still counts as low here, since
    the test must hold on a GPU whose user keeps JAX's default.

    Args:
      fn: the function to trace; ``args`` / ``kwargs`` its example arguments (arrays or
        ``jax.ShapeDtypeStruct``).
    Returns:
      the non-HIGHEST precisions found (``None`` for the default), one per offending product.
    """
    with jax.default_matmul_precision(None):
        jaxpr = jax.make_jaxpr(functools.partial(fn, **kwargs))(*args)
    return [p for p in jaxpr_dot_precisions(jaxpr) if not is_highest(p)]
