"""Eager calls of the exact references through one cached compiled program.

Called outside ``jit``, a function with ``lax.while_loop`` / ``lax.scan`` / ``custom_root`` inside
traces each loop body anew on every call (the bodies are closures over the call's tables), and
JAX compiles a new XLA program for each and keeps it: measured 2026-12-05 (jax 0.10.2, 2-core
CPU), ``lq.exact_hypergradient`` compiled 5 programs per call (~1 s) and added ~270 memory
mappings; a few hundred calls in a user's exact-ascent loop reached Linux's default
``vm.max_map_count`` (65,530) and LLVM failed with "Cannot allocate memory".

:func:`cached_when_eager` runs such a call as one ``jax.jit`` program, compiled once per problem
object and argument shapes: the arrays of one axis or more (theta, a warm start, a solved
response) are traced, everything else is a static argument (the problem, by identity: the
problem classes hash by identity; a Python or 0-d scalar such as ``beta``, by value, so its
checks still run on the concrete value while the program is traced). The errors of an eager
call are kept:

* the checks of static arguments run while the program is traced, as eagerly;
* ``precheck(*args, **kwargs)`` (e.g. a tabular problem's ``validate(theta)``) runs eagerly
  before every call: the checks of a traced argument's values are skipped inside ``jit``;
* a result with a non-finite entry, or a solution whose ``info.converged`` is False, is
  recomputed by the plain eager call, which raises the error it stands for (a solve that
  missed its tolerance, a diverging closed loop) or returns the same value;
* ``postcheck(result, *args, **kwargs)`` gives the warnings the plain call gives on concrete
  values (a float32 soft policy's rounded logits);
* the program bakes in the problem's arrays and tables, so the cache key also holds a digest of
  them (every array field, and each table function's output at ``theta0`` and at a fixed
  random point beside it): a NumPy array the user changes in place between calls compiles a
  new program instead of reusing stale tables. The table functions must be functions of theta
  alone (``jax.jit``'s own rule); state they read that shows at neither point is not seen;
* a key is compiled on its second call: the first runs the plain call, so a problem object
  used once (a loop over ``dataclasses.replace`` variants) costs what it did and is not kept
  alive by the cache; problem objects called twice are (with their compiled programs);
* a problem whose functions cannot be traced (they read a traced value on the host) is called
  plainly from then on (other problems are not affected).

Under a trace (the trainers, a user's ``jit`` / ``vmap`` / ``grad``) the function runs as
written; so it does under ``jax.disable_jit()``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import weakref
from typing import Callable, Optional

import jax
import numpy as np

from bchg_jax.core.validate import is_concrete

# the errors of host code that reads a traced value (the function is then called eagerly)
_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


class _ByValue:
    """A static argument hashed by a key of its value (a 0-d array or NumPy scalar: dtype and
    bytes; a Python number: type and value), passed to the function as the original object."""

    __slots__ = ("value", "key")

    def __init__(self, value, key):
        self.value, self.key = value, key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _ByValue) and self.key == other.key


def _traced(x) -> bool:
    """Whether an argument is traced: an array of one axis or more, or a tuple / list / dict /
    NamedTuple whose leaves are all such arrays (a solved response)."""
    if isinstance(x, (jax.Array, np.ndarray)):
        return np.ndim(x) >= 1
    if isinstance(x, (tuple, list, dict)):
        leaves = jax.tree.leaves(x)
        return bool(leaves) and all(isinstance(v, (jax.Array, np.ndarray)) for v in leaves)
    return False


def _array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _static(x):
    """A static argument: arrays and NumPy scalars by dtype and value, Python numbers by type
    and value (``True``, ``1.0`` and ``1`` are equal keys in Python, and a check may refuse
    one and take the other), anything else as it is (the problem: by identity)."""
    if _array(x):
        v = np.asarray(x)
        return _ByValue(x, (v.dtype.str, v.tobytes()))
    if isinstance(x, (bool, int, float, complex)):
        return _ByValue(x, (type(x), x))
    return x


def _unwrap(x):
    return x.value if isinstance(x, _ByValue) else x


def cached_when_eager(
    precheck: Optional[Callable] = None,
    postcheck: Optional[Callable] = None,
    traced_names: tuple = ("theta",),
) -> Callable:
    """Decorator: an eager call of the function runs as one cached ``jax.jit`` program (module
    docstring); a traced call runs the function as written.

    Args:
      precheck: called eagerly with the call's arguments before the program runs (the checks
        of traced arguments' values), or None.
      postcheck: called eagerly as ``postcheck(result, *args, **kwargs)`` after a finite,
        converged result (the warnings the plain call gives on concrete values), or None.
      traced_names: the parameters traced whatever their number of axes (a 0-d theta).
    Returns:
      the decorator.
    """

    def decorate(fn: Callable) -> Callable:
        untraceable = weakref.WeakSet()  # problems whose functions read a traced value
        seen = weakref.WeakKeyDictionary()  # problem -> the keys called once (plain)
        positional = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        @functools.partial(jax.jit, static_argnums=(0, 1, 2))
        def program(names, static, fingerprint, traced):
            values = iter(traced)
            flat = [next(values) if s is _TRACED else _unwrap(s) for s in static]
            npos = len(flat) - len(names)
            return fn(*flat[:npos], **dict(zip(names, flat[npos:], strict=True)))

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            problem = next((x for x in args if dataclasses.is_dataclass(x)), None)
            if (
                problem is None
                or problem in untraceable
                or not is_concrete(args, kwargs)
                or _jit_disabled()
                or _inside_trace()  # concrete arguments closed over by the caller's jit
            ):
                return fn(*args, **kwargs)
            names = positional[: len(args)] + list(kwargs)
            flat = list(args) + list(kwargs.values())
            static = tuple(
                _TRACED if _traced(x) or (name in traced_names and _array(x)) else _static(x)
                for name, x in zip(names, flat, strict=False)
            )
            try:
                hash(static)
            except TypeError:  # an unhashable static argument: the plain call
                return fn(*args, **kwargs)
            if precheck is not None:
                precheck(*args, **kwargs)
            fingerprint = _fingerprint(flat)
            if fingerprint is None:  # a problem function failed: the plain call says where
                return fn(*args, **kwargs)
            key = (tuple(kwargs), static, fingerprint)
            keys = seen.setdefault(problem, set())
            if key not in keys:  # a problem called once compiles nothing it keeps
                keys.add(key)
                return fn(*args, **kwargs)
            traced = [x for x, s in zip(flat, static, strict=True) if s is _TRACED]
            try:
                out = program(tuple(kwargs), static, fingerprint, traced)
            except _TRACE_ERRORS:
                untraceable.add(problem)
                return fn(*args, **kwargs)
            if _all_finite(out) and _converged(out):
                if postcheck is not None:
                    postcheck(out, *args, **kwargs)
                return out
            # names what went wrong, or returns the same value
            return fn(*args, **kwargs)

        wrapped.cached_when_eager = True
        return wrapped

    return decorate


class _TracedMarker:
    """The place of a traced argument in the static signature."""

    def __repr__(self):
        return "<traced>"


_TRACED = _TracedMarker()


def _all_finite(out) -> bool:
    for leaf in jax.tree.leaves(out):
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            return False
    return True


def _fingerprint(flat) -> Optional[str]:
    """A digest of every problem argument's arrays and of its table functions' outputs at its
    ``theta0``: the program bakes them in when it is traced, so a NumPy array that the user
    changed in place between two calls (a field, or one a table function closes over) must
    compile a new program, not reuse the old tables. None when a table function fails."""
    digest = hashlib.blake2b(digest_size=16)
    for x in flat:
        if not dataclasses.is_dataclass(x) or isinstance(x, type):
            continue
        theta0 = getattr(x, "theta0", None)
        probes = [] if theta0 is None else _probes(theta0)
        for field in dataclasses.fields(x):
            value = getattr(x, field.name)
            try:
                if callable(value):
                    value = [value(theta) for theta in probes]
                leaves = jax.tree.leaves(value)
                for leaf in leaves:
                    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int, bool)):
                        a = np.asarray(leaf)
                        digest.update(f"{field.name}{a.dtype.str}{a.shape}".encode())
                        digest.update(a.tobytes())
            except Exception:  # noqa: BLE001 - the plain call reports it
                return None
    return digest.hexdigest()


def _probes(theta0):
    """The points the digest evaluates the table functions at: ``theta0`` and a fixed random
    point beside it (a table ``A0 + theta[0] D`` does not show ``D`` at ``theta0 = 0``)."""
    t0 = jax.numpy.asarray(theta0)
    noise = np.random.default_rng(20261205).standard_normal(t0.shape)
    return [t0, t0 + jax.numpy.asarray(noise, t0.dtype)]


def _converged(out) -> bool:
    """False for a solution whose ``info.converged`` has a False entry (a best response
    returned under a trace flags its failed solve there; the plain call raises)."""
    flag = getattr(getattr(out, "info", None), "converged", None)
    return flag is None or bool(np.all(np.asarray(flag)))


def theta_precheck(problem, theta, *_, **__) -> None:
    """The eager check of ``theta`` (shape, finite) that a traced theta skips."""
    from bchg_jax.core.validate import check_theta

    check_theta(problem, theta)


def _inside_trace() -> bool:
    """Whether a transformation is tracing now (an array made here would be its tracer)."""
    return isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def _jit_disabled() -> bool:
    return bool(jax.config.jax_disable_jit)
