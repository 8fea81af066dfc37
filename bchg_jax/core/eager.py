"""Eager calls of the exact references through one cached compiled program.

Called outside ``jit``, a function with ``lax.while_loop`` / ``lax.scan`` / ``custom_root`` inside
traces each loop body anew on every call (the bodies are closures over the call's tables), and
JAX compiles a new XLA program for each and keeps it: measured 2026-12-05 (jax 0.10.2, 2-core
CPU), ``lq.exact_hypergradient`` compiled 5 programs per call (~1 s) and added ~270 memory
mappings; a few hundred calls in a user's exact-ascent loop reached Linux's default
``vm.max_map_count`` (65,530) and LLVM failed with "Cannot allocate memory".

:func:`cached_when_eager` runs such a call as one ``jax.jit`` program, compiled on the first
call for each problem object, argument shapes and static values: the arrays of one axis or more
(theta, a warm start, a solved response) and a scalar ``beta`` are traced (beta's checks run
eagerly first), everything else is a static argument (a Python or 0-d scalar such as
``gamma`` or ``horizon``, by value and type, so its checks still run on the concrete value
while the program is traced). Each problem object has its own program, which
holds the problem weakly: the program, and the executables JAX keeps for it, are freed with the
problem. The plain eager call is not such a fallback for a first call: the executables JAX
compiles for its loops stay in JAX's own caches after the problem is gone (measured 2026-12-05,
60 random 5-state tabular problems, one ``tabular.exact_hypergradient`` call each: the plain
calls left 5,950 new memory mappings and 923 MB resident, the cached program 476 and 418 MB; it
compiles one larger program, 0.66 s against the plain call's 0.42 s). The errors of an eager
call are kept:

* the checks of static arguments run while the program is traced, as eagerly;
* ``precheck(*args, **kwargs)`` (e.g. a tabular problem's ``validate(theta)``) runs eagerly
  before every call: the checks of a traced argument's values are skipped inside ``jit``;
* a result with a non-finite entry, or a solution whose ``converged`` flag (its own or its
  ``info``'s) is False, is recomputed by the plain eager call, which raises the error it stands
  for (a solve that missed its tolerance, a diverging closed loop) or returns the same value;
* the warnings given while the program was traced (those that depend on dtypes and static
  values alone, such as float32 with a long horizon) are given again on every call with its key
  and the same dtypes, shapes and weak types of the traced arguments;
  ``postcheck(result, *args, **kwargs)`` gives those the plain call gives on concrete values (a
  float32 soft policy's rounded logits);
* the program bakes in the problem's arrays and tables, so the cache key also holds a digest of
  them (every array field, and each table function's output at ``theta0`` and at a fixed
  random point beside it): a NumPy array the user changes in place between calls compiles a
  new program instead of reusing stale tables. The table functions must be functions of theta
  alone (``jax.jit``'s own rule); state they read that shows at neither point is not seen.
  Other callable arguments (a game's ``policy_fn``) are static, by identity, as under ``jit``,
  and held weakly (one that closes over the game would keep it alive): pass the same function
  object to reuse the program; a new function per call compiles per call, as the plain call
  does, and the game's program is rebuilt once :data:`DEAD_CALLABLES` of them have died;
* static values are keyed by type and value (a 0-d array also by dtype and weak type), a
  Python float theta or beta is traced as a 0-d array is (a weak type that leaves a float32
  computation in float32; a strong ``np.float64`` beta is cast to theta's dtype by the CMDP
  and LQR-game solvers and widens the tabular game's, as in the plain call),
  and a call that does not fit the function's signature is the plain call (its
  ``TypeError``);
* a problem whose functions cannot be traced (they read a traced value on the host) is called
  plainly from then on (other problems are not affected);
* at a beta so small that ``r / beta`` overflows op by op (1e-30 in float32, 1e-300 in
  float64), the compiled program (beta traced, the operations fused) can still give a finite
  answer where the plain call gives NaN or raises "non-finite values": the program's answer is
  returned (the greedy limit, to which such a beta is numerically equal).

A function of arrays alone (``problem_free=True``: ``riccati``, ``soft_value_iteration``, the
tabular ``k_step_response``) has no problem to hold: its calls share one program, traced once for
each shape, dtype and static value of the arguments.

Under a trace (the trainers, a user's ``jit`` / ``vmap`` / ``grad``) the function runs as
written; so it does under ``jax.disable_jit()``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import warnings
import weakref
from typing import Callable, Optional

import jax
import numpy as np

from bchg_jax.core.validate import check_beta_if_concrete, is_concrete

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


class _ByIdentity:
    """A callable static argument (a game's ``policy_fn``), held weakly: it may close over the
    problem, whose program (a weak dictionary's value) would then keep the problem alive. Equal
    to another only while both refer to the same live callable (a dead one equals nothing, so a
    new function at a reused address never gets its program)."""

    __slots__ = ("ref", "ident")

    def __init__(self, fn):
        if inspect.ismethod(fn):  # a bound method is made anew at each attribute access
            self.ref, self.ident = weakref.WeakMethod(fn), (id(fn.__self__), id(fn.__func__))
        else:
            self.ref, self.ident = weakref.ref(fn), id(fn)

    def __hash__(self):
        return hash(self.ident)

    def __eq__(self, other):
        if not isinstance(other, _ByIdentity):
            return False
        a, b = self.ref(), other.ref()
        return a is not None and (a is b or (inspect.ismethod(a) and a == b))

    def alive(self) -> bool:
        return self.ref() is not None


def _traced(x, theta: bool = False) -> bool:
    """Whether an argument is traced: an array of one axis or more, or a tuple / list / dict /
    NamedTuple whose leaves are all such arrays (a solved response); for a parameter named in
    ``traced_names`` (``theta``), also a 0-d array, a Python float or a pytree of them (each
    value would be a new static key: a compile per gradient step)."""
    if theta and (_array(x) or isinstance(x, float)):
        return True
    if isinstance(x, (jax.Array, np.ndarray)):
        return np.ndim(x) >= 1
    if isinstance(x, (tuple, list, dict)):
        leaves = jax.tree.leaves(x)
        kinds = (jax.Array, np.ndarray, np.generic, float) if theta else (jax.Array, np.ndarray)
        return bool(leaves) and all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in leaves
        )
    return False


def _traced_beta(name: str, x) -> bool:
    """A scalar ``beta`` (a Python float or int, or a 0-d array) is traced, checked eagerly
    first: as a static value each beta of a sweep compiled a program of its own (a 6-state
    ``tabular.exact_hypergradient``: ~1 s and ~340 memory mappings per value, 2026-12-06)."""
    return (
        name == "beta"
        and not isinstance(x, bool)
        and (isinstance(x, (int, float)) or (_array(x) and np.ndim(x) == 0))
    )


def _as_beta(x):
    """A traced beta as its plain call converts it: a NumPy float64 without asking for its dtype
    (no truncation warning with x64 off, on every call of a ``np.linspace`` sweep), a Python int
    as a (weak) float (one beyond int32 overflowed as a traced int)."""
    if isinstance(x, int):
        return float(x)
    return jax.numpy.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else x


def _is_problem(x) -> bool:
    """The problem (or game) argument: a dataclass instance that is not callable (a user's
    dataclass ``policy_fn`` or a flax module is a static callable, not the problem)."""
    return dataclasses.is_dataclass(x) and not isinstance(x, type) and not callable(x)


def _array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _static(x):
    """A static argument: arrays and NumPy scalars by dtype and value, Python numbers by type
    and value (``True``, ``1.0`` and ``1`` are equal keys in Python, and a check may refuse
    one and take the other), a list or tuple of scalars by its type and their keys (a list is
    not hashable), anything else as it is (a callable: by identity)."""
    if _array(x):
        v = np.asarray(x)
        # the type and weak type too: a weak 0-d beta does not widen the compute dtype, a
        # strong np.float64 one does
        weak = bool(getattr(x, "weak_type", False))
        return _ByValue(x, (type(x), weak, v.dtype.str, v.tobytes()))
    if isinstance(x, (bool, int, float, complex)):
        return _ByValue(x, (type(x), x))
    if isinstance(x, (tuple, list)) and all(_scalar(v) for v in x):  # ``gammas=[1.0, 0.99]``
        return _ByValue(x, (type(x), tuple(_static(v).key for v in x)))
    if callable(x) and not isinstance(x, type):
        try:
            return _ByIdentity(x)
        except TypeError:  # not weakly referenceable: held as it is
            return x
    return x


def _scalar(x) -> bool:
    return isinstance(x, (bool, int, float, complex)) or (_array(x) and np.ndim(x) == 0)


def _as_jax(x):
    """A traced argument's NumPy arrays as JAX arrays of their own dtype: with float64 off, a
    float64 array gives JAX's warning that it is truncated, as the plain call's operations
    give it (``jit`` truncates its arguments silently)."""
    return jax.tree.map(
        lambda v: jax.numpy.asarray(v, v.dtype) if isinstance(v, (np.ndarray, np.generic)) else v,
        x,
    )


def _unwrap(x):
    if isinstance(x, _ByIdentity):
        return x.ref()  # alive: the call that traces the program holds it
    return x.value if isinstance(x, _ByValue) else x


def cached_when_eager(
    precheck: Optional[Callable] = None,
    postcheck: Optional[Callable] = None,
    traced_names: tuple = ("theta",),
    recheck: bool = True,
    problem_free: bool = False,
) -> Callable:
    """Decorator: an eager call of the function runs as one cached ``jax.jit`` program (module
    docstring); a traced call runs the function as written.

    Args:
      precheck: called eagerly with the call's arguments before the program runs (the checks
        of traced arguments' values), or None.
      postcheck: called eagerly as ``postcheck(result, *args, **kwargs)`` after a finite,
        converged result (the warnings the plain call gives on concrete values), or None.
      traced_names: the parameters traced whatever their number of axes (a 0-d theta).
      recheck: recompute a non-finite or unconverged result by the plain call (which raises
        for it); False where the plain call returns such a result flagged (a best response
        whose ``converged`` the caller checks), to return the program's.
      problem_free: a function of arrays alone (a solver given the tables, ``riccati``): its
        calls share one program (no problem to hold, nothing to digest).
    Returns:
      the decorator.
    """

    def decorate(fn: Callable) -> Callable:
        untraceable = weakref.WeakSet()  # problems whose functions read a traced value
        programs = weakref.WeakKeyDictionary()  # problem -> its compiled program
        replay = weakref.WeakKeyDictionary()  # problem -> {key: the warnings of its trace}
        callables = weakref.WeakKeyDictionary()  # problem -> the callables of its keys
        anchor = _Anchor()  # the program key of a problem-free function (held by it)
        signature = inspect.signature(fn)
        positional = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        def program_of(problem):
            """The problem's own ``jax.jit`` program. It holds the problem weakly (a value of a
            weak dictionary that held its key would keep it alive), so the program, and the
            executables JAX keeps for it, go with the problem."""
            if problem not in programs:
                ref = weakref.ref(problem)

                @functools.partial(jax.jit, static_argnums=(0, 1, 2))
                def program(names, static, fingerprint, traced):
                    del fingerprint  # a new digest is a new program (the tables are baked in)
                    values = iter(traced)
                    flat = [
                        ref() if s is _SELF else next(values) if s is _TRACED else _unwrap(s)
                        for s in static
                    ]
                    npos = len(flat) - len(names)
                    return fn(*flat[:npos], **dict(zip(names, flat[npos:], strict=True)))

                programs[problem] = program
            return programs[problem]

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            problem = next((x for x in [*args, *kwargs.values()] if _is_problem(x)), None)
            if problem is None and problem_free:
                problem = anchor
            if (
                problem is None
                or problem in untraceable
                or not is_concrete(args, kwargs)
                or _jit_disabled()
                or _inside_trace()  # concrete arguments closed over by the caller's jit
            ):
                return fn(*args, **kwargs)
            try:
                signature.bind(*args, **kwargs)
            except TypeError:  # a call that does not fit the signature: the plain call says so
                return fn(*args, **kwargs)
            names = positional[: len(args)] + list(kwargs)
            flat = list(args) + list(kwargs.values())
            static = tuple(
                _SELF
                if x is problem
                else _TRACED
                if _traced(x, name in traced_names) or _traced_beta(name, x)
                else _static(x)
                for name, x in zip(names, flat, strict=True)
            )
            try:
                hash(static)
            except TypeError:  # an unhashable static argument: the plain call
                return fn(*args, **kwargs)
            if precheck is not None:
                precheck(*args, **kwargs)
            for name, x in zip(names, flat, strict=True):
                if _traced_beta(name, x):  # its checks (after the precheck's, as in the plain
                    check_beta_if_concrete(x)  # call), which the program's trace skips
            fingerprint = _fingerprint(flat)
            if fingerprint is None:  # a problem function failed: the plain call says where
                return fn(*args, **kwargs)
            key = (tuple(kwargs), static, fingerprint)
            _forget_dead_callables(problem, static, callables, programs, replay)
            # a problem-free function's arrays as they are: its plain call converts them without
            # asking for their dtype (no truncation warning), as jit does
            convert = (lambda x: x) if problem is anchor else _as_jax
            traced = [
                _as_beta(x) if _traced_beta(name, x) else convert(x)
                for name, x, s in zip(names, flat, static, strict=True)
                if s is _TRACED
            ]
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = program_of(problem)(*key, traced)
            except _TRACE_ERRORS:
                if problem is not anchor:  # a problem-free call's arrays are traced anyway
                    untraceable.add(problem)
                return fn(*args, **kwargs)
            # the program is traced anew for new dtypes, shapes or weak types of the traced
            # arguments (a float32 theta after a float64 one): their warnings are its own
            traced_key = (
                key,
                jax.tree.structure(traced),
                tuple(map(jax.typeof, jax.tree.leaves(traced))),
            )
            given = replay.setdefault(problem, {})
            if caught:  # the program was traced now: its warnings depend on the key alone
                given[traced_key] = [(w.message, w.category) for w in caught]
            if not recheck or (_all_finite(out) and _converged(out)):
                for message, category in given.get(traced_key, ()):
                    warnings.warn(message, category, stacklevel=2)
                if postcheck is not None:
                    postcheck(out, *args, **kwargs)
                return out
            # names what went wrong, or returns the same value
            return fn(*args, **kwargs)

        wrapped.cached_when_eager = True
        return wrapped

    return decorate


# a problem's program is rebuilt once this many of the callables it was compiled for have died
# (a loop that makes a new ``policy_fn`` per call compiles per call, as the plain call does,
# but keeps only this many of those programs)
DEAD_CALLABLES = 8


def _forget_dead_callables(problem, static, callables, programs, replay) -> None:
    """Records the callables of a call's key; drops the problem's program (and the executables
    JAX keeps for it) when more than :data:`DEAD_CALLABLES` of them have died."""
    held = callables.setdefault(problem, [])
    held.extend(s for s in static if isinstance(s, _ByIdentity) and s not in held)
    if sum(not s.alive() for s in held) > DEAD_CALLABLES:
        programs.pop(problem, None)
        replay.pop(problem, None)
        held[:] = [s for s in held if s.alive()]


class _Anchor:
    """The key of a problem-free function's one program (weakly referenceable)."""


class _TracedMarker:
    """The place of a traced argument in the static signature."""

    def __repr__(self):
        return "<traced>"


_TRACED = _TracedMarker()
_SELF = object()  # the problem's place in the static signature (its program holds it weakly)


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
    """False for a solution whose ``converged`` flag, its own or its ``info``'s, has a False
    entry (a best response returned under a trace flags its failed solve there; the plain call
    raises, or returns the same flag)."""
    for holder in (out, getattr(out, "info", None)):
        flag = getattr(holder, "converged", None)
        if flag is not None and not bool(np.all(np.asarray(flag))):
            return False
    return True


def theta_precheck(problem, theta, *_, **__) -> None:
    """The eager check of ``theta`` (shape, finite) that a traced theta skips."""
    from bchg_jax.core.validate import check_theta

    check_theta(problem, theta)


def running_eagerly(*args) -> bool:
    """Whether a call with these arguments runs eagerly: all concrete, no transformation tracing
    and ``jit`` not disabled (where a function may run a cached ``jax.jit`` program instead of
    tracing its loops anew)."""
    return is_concrete(args) and not _jit_disabled() and not _inside_trace()


def _inside_trace() -> bool:
    """Whether a transformation is tracing now (an array made here would be its tracer)."""
    return isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def _jit_disabled() -> bool:
    return bool(jax.config.jax_disable_jit)
