"""Host-side checks shared by every problem family and trainer (clear ``ValueError`` before
anything compiles): the follower's entropy weight, discounts and horizons, LQ cost matrices,
positive numbers and integer ranges of hyperparameters.

The public pure functions check their concrete arguments with :func:`check_if_concrete` /
:func:`check_beta_if_concrete` / :func:`check_problem_settings`: a traced value (inside ``jit``,
``vmap``, ``grad``) has no value to check and is skipped silently.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.precision import jaxpr_eqns

Array = jax.Array


def _show(value) -> str:
    """A value for an error message: numbers as numbers, arrays as lists."""
    arr = np.asarray(value)
    return repr(arr.item()) if arr.size == 1 else repr(arr.tolist())


def is_concrete(*values) -> bool:
    """True unless some leaf of ``values`` (any pytrees) is a ``jax.core.Tracer``.

    Args:
      values: the values to inspect (scalars, arrays, pytrees, None).
    Returns:
      False inside a transformation (``jit``, ``vmap``, ``grad``) that traces one of them.
    """
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(values))


def validate_if_concrete(problem, *args) -> None:
    """``problem.validate(*args)`` where its tables can be evaluated, also under a trace.

    Runs under ``jax.ensure_compile_time_eval`` (a problem built inside a user's ``jit`` has
    concrete tables, but its checks would otherwise be staged); a problem whose tables depend
    on traced values is skipped, as traced arguments are.

    Raises:
      ValueError: whatever ``problem.validate`` raises.
    """
    if not hasattr(problem, "validate"):
        return
    try:
        with jax.ensure_compile_time_eval():
            problem.validate(*args)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerIntegerConversionError,
    ):
        pass  # a problem made of traced values (built inside a trace): nothing to check


# problems whose theta-independent arrays passed ``check_constants`` (keyed by the object: the
# problem types are frozen dataclasses hashed by identity; ``dataclasses.replace`` makes a new one)
_CONSTANTS_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def check_constants_once(problem) -> None:
    """``problem.check_constants()`` the first time a pure function sees this problem object.

    The exact references and best responses of the linear-Gaussian families take a problem
    that nobody may have validated; its theta-independent arrays (costs, noise factors,
    initial covariances) are checked here, once per object, so an indefinite cost or a
    covariance that is no covariance is named instead of giving a finite, meaningless number.
    The theta-dependent checks stay in ``validate(theta)`` (at a diverging theta the exact
    functions answer NaN by design). Skipped for an object without ``check_constants`` and
    while any of its fields is traced.

    Raises:
      ValueError: whatever ``problem.check_constants`` raises (not cached).
    """
    check = getattr(problem, "check_constants", None)
    if check is None:
        return
    try:
        if problem in _CONSTANTS_CHECKED:
            return
    except TypeError:  # not weak-referenceable: check every time
        pass
    if not is_concrete(list(vars(problem).values())):
        return
    with jax.ensure_compile_time_eval():
        check()
    try:
        _CONSTANTS_CHECKED[problem] = True
    except TypeError:
        pass


# problems whose functions of theta were traced once for out-of-range indices (by object)
_INDEXING_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# the out-of-range modes of a gather or scatter that say what to do there (clip, fill / drop):
# chosen on purpose, not checked (a scatter's default is drop)
_CHOSEN_MODES = (jax.lax.GatherScatterMode.CLIP, jax.lax.GatherScatterMode.FILL_OR_DROP)
# the primitives that index at a computed position (jax.lax's names)
_INDEXING_PRIMITIVES = (
    "dynamic_slice",
    "dynamic_update_slice",
    "gather",
    *(f"scatter{op}" for op in ("", "-add", "-sub", "-mul", "-min", "-max")),
)


def _indexes(jaxpr) -> bool:
    """Whether a jaxpr (or a sub-jaxpr of a loop, a branch, a call) indexes where
    :func:`check_indexing_once` checks: a dynamic slice or update (clamped), or a gather or
    scatter whose mode is not one of :data:`_CHOSEN_MODES` (plain indexing promises in-range
    indices). Thermal's ``A(theta)``, built by ``.at[i, j].add`` (scatters that drop), has none:
    no instrumented compile for it."""
    for eqn in jaxpr_eqns(jaxpr, _INDEXING_PRIMITIVES):
        if eqn.primitive.name.startswith("dynamic") or eqn.params.get("mode") not in _CHOSEN_MODES:
            return True
    return False


@contextlib.contextmanager
def _explicit_modes_unchecked():
    """While active, checkify's index checks pass a gather or scatter whose out-of-range mode was
    chosen (``clip``, ``fill`` / ``drop``: ``jnp.take(x, i, mode="clip")`` and a scatter's
    default ``drop``); plain indexing (promised in bounds, or a clamped dynamic slice) stays
    checked. checkify has no option for it, so its rules (a private registry) are wrapped for
    the duration; without that registry every gather and scatter is checked."""
    try:
        from jax._src import checkify as impl  # noqa: PLC0415 - private: checkify's rules

        rules = impl.error_checks
    except (ImportError, AttributeError):
        yield
        return
    saved = {p: r for p, r in rules.items() if p.name == "gather" or p.name.startswith("scatter")}

    def passing(prim, rule):
        def check(error, enabled, *args, **params):
            if params.get("mode") in _CHOSEN_MODES:
                return error, prim.bind(*args, **params)
            return rule(error, enabled, *args, **params)

        return check

    rules.update({p: passing(p, r) for p, r in saved.items()})
    try:
        yield
    finally:
        rules.update(saved)


def check_indexing_once(problem, functions: dict, theta, pname: Optional[str] = None) -> None:
    """The problem's functions of theta never index past the end of an array, checked once per
    problem object (``jax.experimental.checkify``'s index checks, on one trace of each).

    JAX clamps an out-of-range gather index and drops an out-of-range scatter without a word, so
    a ``transition(theta)`` that reads ``theta[3]`` of a ``theta0`` of length 3 runs on
    ``theta[2]`` twice: finite tables, a gradient that is not the model's. A mode chosen on
    purpose (``jnp.take(x, i, mode="clip")`` or ``"fill"``, a scatter's default ``drop``:
    :func:`_explicit_modes_unchecked`) or an index passed through ``jnp.clip`` is not flagged;
    ``x.at[i].get(mode="clip")`` with a computed scalar ``i`` is (JAX lowers it to the clamped
    slice of ``x[i]``).
    A function that cannot be traced is skipped here (it ran eagerly; a trainer's ``jit``
    names it).

    Args:
      problem: the problem (its ``name`` is shown; the cache is keyed by the object), or the
        one function checked (a game leader's ``policy_fn``).
      functions: label -> function of theta (e.g. ``{"transition(theta)": problem.transition}``).
      theta: concrete parameters to trace at (an array or a pytree of them).
      pname: the name shown first in the error (None: ``problem.name``).
    Returns:
      None.
    Raises:
      ValueError: the first function that indexes out of range, with checkify's account of
        the array and the index (not cached).
    """
    try:
        if problem in _INDEXING_CHECKED:
            return
    except TypeError:  # not weak-referenceable: check every time
        pass
    from jax.experimental import checkify  # noqa: PLC0415 - only needed here

    if pname is None:
        pname = getattr(problem, "name", type(problem).__name__)
    shapes = [tuple(np.shape(x)) for x in jax.tree_util.tree_leaves(theta)]
    shown = shapes[0] if len(shapes) == 1 else shapes
    for label, fn in functions.items():
        if fn is None:
            continue
        try:
            if not _indexes(jax.make_jaxpr(fn)(theta).jaxpr):
                continue  # nothing to check (the instrumented compile costs ~0.1 s a function)
            # jit: under ensure_compile_time_eval (validate_if_concrete) a plain checkify
            # call evaluates eagerly and checks nothing
            with _explicit_modes_unchecked():
                err, _ = jax.jit(checkify.checkify(fn, errors=checkify.index_checks))(theta)
            message = err.get()
        except Exception:  # noqa: BLE001 - untraceable: the eager call ran, jit will name it
            continue
        if message:
            raise ValueError(
                f"{pname}: {label} indexes out of range at theta of shape {shown}: "
                f"{message.strip()} JAX clamps (reads) or drops (writes) such an index silently, "
                "so the tables would not be the model's: a theta0 shorter than the functions "
                "read? (to clamp on purpose, say so: jnp.take(x, i, mode='clip') or "
                "jnp.clip of the index)"
            )
    try:
        _INDEXING_CHECKED[problem] = True
    except TypeError:
        pass


def check_if_concrete(check: Callable[..., None], *args) -> None:
    """``check(*args)`` when every argument is concrete; nothing when one is traced.

    Args:
      check: a host-side check raising ``ValueError`` (e.g. :func:`check_discount`).
      args: its arguments.
    Returns:
      None.
    Raises:
      ValueError: whatever ``check`` raises on concrete arguments.
    """
    if is_concrete(*args):
        check(*args)


def check_beta_if_concrete(beta) -> None:
    """The follower's entropy weight given to a pure function: a scalar (checked on traced
    values too: a vector would broadcast against the tables, e.g. across the columns of an
    LQR covariance, and give a number that is neither beta's answer), and :func:`check_beta`
    unless traced. Several betas are a ``vmap`` (or a trainer's grid), never one array.

    Raises:
      ValueError: a ``beta`` with axes, or a concrete ``beta`` not finite and > 0.
    """
    if np.ndim(beta) != 0:
        raise ValueError(
            "beta (follower entropy coefficient) must be a scalar, got shape "
            f"{tuple(np.shape(beta))} (for several betas, jax.vmap over them)"
        )
    check_if_concrete(check_beta, beta)


def check_mix_if_concrete(mix) -> None:
    """The ``lag`` follower's mix (the weight of the new best response) given to an exact
    reference: a scalar (checked on traced values too: an array broadcast across the policy's
    columns, so that its rows no longer summed to 1, and gave the gradient of no policy), not a
    bool, and in (0, 1] unless traced (as ``FollowerModel``).

    Raises:
      ValueError: a ``mix`` with axes or a bool, or a concrete ``mix`` outside (0, 1].
    """
    if np.ndim(mix) != 0 or isinstance(mix, (bool, np.bool_)):
        shown = f"shape {tuple(np.shape(mix))}" if np.ndim(mix) else repr(mix)
        raise ValueError(
            f"mix (the weight of the new best response) must be a real scalar, got {shown} "
            "(for several mixes, jax.vmap over them)"
        )
    check_if_concrete(check_unit_interval, "mix", mix)


def check_discount(name: str, value, closed: bool = False) -> None:
    """A discount: a real scalar in [0, 1) (``closed``: [0, 1], for finite-horizon sums).

    Args:
      name: the name shown in the error (e.g. ``"fourrooms: gamma_L"``).
      value: the concrete discount (Python or numpy number, or a 0-d array).
      closed: allow 1 (an undiscounted finite sum).
    Returns:
      None.
    Raises:
      ValueError: a non-scalar, a non-number, NaN, or a value outside the interval.
    """
    try:
        v = np.asarray(value, np.float64)
        ok = v.ndim == 0 and 0.0 <= float(v) and (float(v) <= 1.0 if closed else float(v) < 1.0)
    except (TypeError, ValueError):
        ok = False
    # numpy reads '0.5' and True as numbers; a discount kept as a string fails later, far away
    ok = ok and not isinstance(value, (str, bytes, bool, np.bool_))
    if not ok:
        raise ValueError(
            f"{name} must be a number in [0, {'1]' if closed else '1)'}, got {_show_any(value)}"
        )


def env_count(var: str) -> Optional[int]:
    """The positive integer in the environment variable ``var``, or None when it is unset (a
    knob read when a program is traced, e.g. ``BCHG_STEPS_PER_TEST``).

    Raises:
      ValueError: ``var`` set to anything but a positive integer (``"4"``, not ``"4.0"``).
    """
    given = os.environ.get(var)
    if given is None:
        return None
    try:
        value = int(given)
    except ValueError:
        value = 0
    if value < 1 or str(value) != given.strip():
        raise ValueError(f"{var} must be a positive integer, got {given!r}")
    return value


def check_count(name: str, value, allow_none: bool = False) -> None:
    """A positive integer (a horizon, an episode time limit), or None when ``allow_none``.

    Args:
      name: the name shown in the error.
      value: the concrete value.
      allow_none: accept None (no limit).
    Returns:
      None.
    Raises:
      ValueError: anything but an integer >= 1 (or None when allowed).
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer{' or None' if allow_none else ''}, "
            f"got {_show_any(value)}"
        )


_NO_TOL = object()


def check_solver_settings(where: str, tol=_NO_TOL, **counts) -> None:
    """An iterative solver's settings, where concrete (a traced one is the caller's grid).

    A NaN or negative tolerance is never met and an infinite one is met by the first sweep, so
    either returned a solve flagged (or called converged) for the wrong reason; a cap below its
    floor, or a non-integer one, ran no sweep or failed inside ``jax.lax`` with a type error.

    Args:
      where: the function, for the message.
      tol: the stopping tolerance (a real scalar, finite and > 0); ``None`` where the caller
        allows it (a fixed schedule); left out: none to check.
      counts: ``name=(value, low)``: an iteration count that must be an integer >= ``low``.
    Returns:
      None.
    Raises:
      ValueError: a concrete tolerance that is not a finite real scalar > 0, or a concrete count
        that is not an integer >= its ``low``.
    """
    if tol is not None and tol is not _NO_TOL and is_concrete(tol):
        if np.ndim(tol) != 0:
            raise ValueError(f"{where}: tol must be a scalar, got shape {np.shape(tol)}")
        check_positive(f"{where}: tol (the stopping tolerance)", tol)
    for name, (value, low) in counts.items():
        if not is_concrete(value):
            continue
        integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if not integer and hasattr(value, "dtype") and np.ndim(value) == 0:
            integer = jnp.issubdtype(value.dtype, jnp.integer)
        if not integer or int(value) < low:
            raise ValueError(f"{where}: {name} must be an integer >= {low}, got {_show_any(value)}")


def probability_tolerance(gamma, dtype, cap: float = 1e-4) -> float:
    """How far a probability row's sum may be from 1: ``max(min(cap, 1e-3 (1 - gamma)),
    32 eps(dtype))``.

    A transition row summing to 1 - d loses mass d per step. The samplers draw from the rows
    normalised while the solvers use them as given, so the sampled problem and the one the exact
    references solve differ by ~ gamma d / (1 - gamma) of the values; ``1e-3 (1 - gamma)`` keeps
    that below ~0.1%, and ``32 eps`` leaves room for rows normalised in the tables' own dtype
    (float32: 3.8e-6).

    Args:
      gamma: the largest discount of the problem.
      dtype: the tables' float dtype.
      cap: the largest tolerance at any discount.
    Returns:
      the tolerance (float).
    """
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return float(max(min(cap, 1e-3 * (1.0 - float(gamma))), 32 * eps))


def check_problem_settings(problem) -> None:
    """Cheap scalar checks of a problem or game, without evaluating any table.

    The discounts ``gamma_F``, ``gamma_L`` in [0, 1), and ``horizon`` (a positive integer) /
    ``time_limit`` (a positive integer or None) where the problem has them; traced settings are
    skipped. The full check is the problem's own ``validate()``.

    Args:
      problem: a :class:`~bchg_jax.tabular.cmdp.TabularCMDP`, ``LQConfigurableMDP``,
        ``TabularGame``, ``LQRGame`` or any object with these attributes.
    Returns:
      None.
    Raises:
      ValueError: the first bad setting, named as ``<problem name>: <attribute>``.
    """
    name = getattr(problem, "name", type(problem).__name__)
    for label in ("gamma_F", "gamma_L"):
        if hasattr(problem, label):
            check_if_concrete(check_discount, f"{name}: {label}", getattr(problem, label))
    if hasattr(problem, "horizon"):
        check_if_concrete(check_count, f"{name}: horizon", problem.horizon)
    if hasattr(problem, "time_limit"):
        check_if_concrete(check_count, f"{name}: time_limit", problem.time_limit, True)


# how far a concrete policy row may be from a distribution (float32 softmax rows are within ~1e-6)
POLICY_ROW_TOL = 1e-4


def check_probability_rows_if_concrete(label: str, table) -> None:
    """A concrete policy table's last axis holds distributions (every entry >= 0, each row
    summing to 1 within :data:`POLICY_ROW_TOL`); a traced table is skipped. A number computed
    from other rows (a log-policy, unnormalised weights) would be no policy's.

    Args:
      label: the table's name in the error (``"g (follower policy)"``).
      table: the policy, rows on its last axis.
    Returns:
      None.
    Raises:
      ValueError: a non-finite entry, an entry below ``-POLICY_ROW_TOL`` or a row sum off 1 by
        more than ``POLICY_ROW_TOL``, with the largest offence.
    """
    if not is_concrete(table):
        return
    x = np.asarray(table, np.float64)
    off = np.abs(x.sum(-1) - 1.0)
    finite = np.isfinite(x)
    if not np.all(finite):
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"{label} must hold probability rows, got {int(np.sum(~finite))} non-finite "
            f"entr{'y' if np.sum(~finite) == 1 else 'ies'} (the first {x[first]} at {first})"
        )
    if np.any(x < -POLICY_ROW_TOL) or np.any(off > POLICY_ROW_TOL):
        raise ValueError(
            f"{label} must hold probability rows (entries >= 0, summing to 1 within "
            f"{POLICY_ROW_TOL:g}); largest |row sum - 1| {np.max(off):.3g}, "
            f"smallest entry {np.min(x):.3g}"
        )


def check_not_half(where: str, dtype) -> None:
    """Refuses a 16-bit float (float16, bfloat16) for a leader's parameters or a run's dtype.

    Args:
      where: what has the dtype, shown first in the error.
      dtype: the dtype (anything ``np.dtype`` takes).
    Returns:
      None.
    Raises:
      ValueError: a floating dtype narrower than 32 bits.
    """
    if jnp.issubdtype(dtype, jnp.floating) and np.dtype(dtype).itemsize < 4:
        raise ValueError(
            f"{where} is {np.dtype(dtype).name}: the solvers' tolerances, the probability "
            "checks and the linear solves need at least float32 (a 16-bit float keeps ~3 "
            "significant digits, and XLA's linear solves refuse it); pass float32 or float64"
        )


def check_dtype_available(where: str, dtype) -> None:
    """A run's float dtype must be one JAX computes in at the solvers' accuracy: float32, or
    float64 with ``jax_enable_x64``.
    Without it JAX truncates every float64 array to float32 (a warning at most), so a user who
    asked for float64 (for the accurate linear solves at small beta) would get a float32 run.

    Args:
      where: what sets the dtype, shown first in the error (``"fourrooms: theta0"``).
      dtype: the requested dtype (anything ``np.dtype`` takes).
    Returns:
      None.
    Raises:
      ValueError: float64 while ``jax_enable_x64`` is off, naming both ways out; a 16-bit float
        (float16, bfloat16).
    """
    check_not_half(where, dtype)
    if np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError(
            f"{where} is float64 but jax_enable_x64 is off, so the run would silently compute "
            "in float32: call jax.config.update('jax_enable_x64', True) at start-up for a "
            "float64 run, or pass float32 (e.g. jnp.asarray(x, jnp.float32))"
        )


def check_float_dtype(where: str, dtype) -> None:
    """A problem constructor's ``dtype`` argument: float32, or float64 with ``jax_enable_x64``.

    The presets build their tables with ``jnp.asarray(table, dtype)``, which truncates an
    integer dtype's rewards (the toy game's R = 2.5 read 2), rounds a 16-bit one and turns
    float64 into float32 without x64, none of which a later check of the tables can see.

    Args:
      where: what has the dtype, shown first in the error (``"toy_game: dtype"``).
      dtype: the requested dtype (anything ``np.dtype`` takes).
    Returns:
      None.
    Raises:
      ValueError: not a dtype, a non-floating dtype, a 16-bit float, or float64 while
        ``jax_enable_x64`` is off.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"{where} must be a float dtype, got {_show_any(dtype)}") from err
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(
            f"{where} must be a float dtype (float32, or float64 with jax_enable_x64), got "
            f"{dt.name}: the tables would be cast to it"
        )
    check_dtype_available(where, dt)


# float32 runs of the tabular families warn above this discount: the soft fixed points and the
# exact hypergradient's implicit derivative lose accuracy as 1 / (1 - gamma) grows. Measured
# (float32 against float64 exact hypergradients, beta 0.5-1e-3, 2026-12-03): the tabular game
# (toy game and random 1- and 4-state games) at most 6e-4 at 0.99 and 0.995, 3e-3 at 0.999,
# 6e-4-4% at 0.9999; the tabular CMDP family (random CMDPs; Four-Rooms 1e-5 at 0.99, beta
# 1e-3) 4e-4 at 0.99, 5e-3 at 0.999. Before the tabular game's follower policy got a centred
# softmax derivative (core.softmax.follower_softmax) the toy game was 1.6% off at 0.99
# and beta 0.05, 27% at 1e-3, and random games up to 300% at 0.999: a leak of the softmax
# derivative at tied follower actions, which eps max|Q| / (beta (1 - gamma)) did not predict
# (Four-Rooms 0.012 gave 5e-6, the toy game 0.015 gave 1.6%); see docs/architecture.md
FLOAT32_GAMMA_WARN = 0.99


def warn_float32_long_horizon(where: str, dtype, *gammas) -> None:
    """Warns when a float32 computation of a tabular family has a discount above
    :data:`FLOAT32_GAMMA_WARN` (traced discounts are skipped).

    Args:
      where: what computes (shown first, e.g. ``"games.tabular.exact_hypergradient"``).
      dtype: the computation's float dtype.
      gammas: the discounts (scalars).
    """
    if np.dtype(dtype) != np.float32:
        return
    concrete = [float(g) for g in gammas if g is not None and is_concrete(g)]
    if concrete and max(concrete) > FLOAT32_GAMMA_WARN:
        warnings.warn(
            f"{where}: float32 with a discount of {max(concrete):g} (> {FLOAT32_GAMMA_WARN:g}): "
            "the soft fixed points and the exact hypergradient lose accuracy as 1 / (1 - gamma) "
            "grows (exact hypergradients against float64: errors up to 0.3% at 0.999 in the "
            "tabular game, 0.5% in the tabular CMDP family, 4% at 0.9999); compute in float64 "
            "(jax.config.update('jax_enable_x64', True) and float64 arrays or config dtype)",
            stacklevel=3,
        )


# warn when float32 rounds the follower's logits Q / beta by more than this (absolute)
FLOAT32_LOGIT_WARN = 1e-2


def float32_logit_rounding(Q, beta) -> float:
    """``eps(float32) * max |Q| / beta``: the rounding of the logits Q / beta of a soft policy
    softmax(Q / beta) computed in float32 (0 for other dtypes or traced values)."""
    if isinstance(beta, int):  # a Python int beyond int32 would overflow as an array
        beta = float(beta)
    Q, beta = jax.lax.stop_gradient((Q, beta))  # concrete under an eager grad
    if not is_concrete(Q, beta) or jnp.asarray(Q).dtype != jnp.float32:
        return 0.0
    return float(_logit_rounding(Q, beta))


def _logit_rounding(Q: Array, beta) -> Array:
    """``eps(float32) * max |Q| / beta`` as an array (traced or not)."""
    return jnp.finfo(jnp.float32).eps * jnp.max(jnp.abs(Q)) / beta


def logits_rounded(Q: Array, beta) -> Array:
    """In-graph (traced) form of the check of :func:`warn_float32_logit_rounding`: [] int32, 1
    when ``Q`` is float32 and ``eps * max |Q| / beta`` exceeds :data:`FLOAT32_LOGIT_WARN` (the
    trainers' ``logits_rounded`` flag, :mod:`bchg_jax.core.health`); 0 for other dtypes."""
    if Q.dtype != jnp.float32:
        return jnp.zeros((), jnp.int32)
    return (_logit_rounding(Q, beta) > FLOAT32_LOGIT_WARN).astype(jnp.int32)


def warn_float32_logit_rounding(where: str, Q, beta, stacklevel: int = 3) -> float:
    """Warns when a float32 soft policy softmax(Q / beta) has logits rounded by more than
    :data:`FLOAT32_LOGIT_WARN` (:func:`float32_logit_rounding`: beta small next to the
    follower's values). The policy, the objective and the hypergradient then carry errors
    that no tolerance shows: measured with two nearly tied actions, a rounding of 0.0058 gave a
    0.02% error of the hypergradient (quiet), 0.058 gave 0.4%, 0.58 gave 2.3% and 5.8 gave 24%;
    Four-Rooms at beta 1e-3 has 1.2e-4.
    Skipped for traced values and other dtypes.

    Returns:
      the rounding (0.0 where skipped).
    """
    rounding = float32_logit_rounding(Q, beta)
    if rounding > FLOAT32_LOGIT_WARN:
        beta = float(jax.lax.stop_gradient(beta))
        scale = rounding * beta / float(np.finfo(np.float32).eps)
        warnings.warn(
            f"{where}: float32 with beta {beta:g} next to follower values up to {scale:.3g}: "
            f"the soft policy's logits Q / beta are rounded by ~{rounding:.2g} (> "
            f"{FLOAT32_LOGIT_WARN:g}), so the policy, the objective and the hypergradient can "
            "be off by percent where actions are nearly tied, with every solve converged; "
            "compute in float64 (jax.config.update('jax_enable_x64', True) and float64 arrays "
            "or config dtype)",
            stacklevel=stacklevel,
        )
    return rounding


def check_not_wider(where: str, label: str, value, theta_dtype) -> None:
    """A problem function's output must not have a wider dtype than theta's: the solvers' loops
    carry theta's dtype, and a wider table (a float64 numpy constant under ``jax_enable_x64``
    with a float32 theta) changes the carry's dtype and fails deep inside a ``while_loop``
    ("carry input and carry output must have equal types"). Narrower outputs are promoted.

    Raises:
      ValueError: ``value``'s dtype promotes ``theta_dtype``, naming ``label`` and the fix.
    """
    dtype = jnp.asarray(value).dtype
    if jnp.promote_types(dtype, theta_dtype) != theta_dtype:
        raise ValueError(
            f"{where}: {label} has dtype {dtype}, wider than theta's {theta_dtype}; return it in "
            f"theta's dtype (e.g. jnp.asarray(x, theta.dtype)) or use a {dtype} theta"
        )


def check_floating(where: str, label: str, value) -> None:
    """A problem function's output the solvers compute in (their loops carry its dtype, or
    differentiate it) must be floating: an integer or bool table fails deep inside JAX
    (``jacfwd requires real-valued inputs``, ``data type int32 not inexact``).

    Raises:
      ValueError: a non-floating ``value`` (concrete or traced), naming ``label`` and the fix.
    """
    dtype = jnp.asarray(value).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{where}: {label} has dtype {dtype}; return a floating array (e.g. "
            "jnp.asarray(x, theta.dtype), or write its constants as floats: 1.0, not 1)"
        )


def check_bool_mask_if_concrete(where: str, mask) -> None:
    """:func:`check_bool_mask` unless ``mask`` is traced (or None)."""
    if mask is not None:
        check_if_concrete(check_bool_mask, where, mask)


def check_bool_mask(where: str, mask) -> None:
    """A mask documented as bool must hold booleans or 0 / 1 only: the exact solvers and the
    sampler would otherwise read a 2 or a 0.5 differently (``1 - mask`` against ``mask != 0``).

    Args:
      where: what the mask is, shown first in the error (``"chain: terminal"``).
      mask: the mask (array-like).
    Returns:
      None.
    Raises:
      ValueError: an entry that is not False / True / 0 / 1 (NaN included).
    """
    m = np.asarray(mask)
    if m.dtype == bool:
        return
    if not (np.issubdtype(m.dtype, np.number) and np.all((m == 0) | (m == 1))):
        flat = m.ravel()
        if np.issubdtype(m.dtype, np.number):
            flat = flat[~((flat == 0) | (flat == 1))]
        raise ValueError(
            f"{where} must be a bool mask (True / False or 1 / 0), got {m.dtype} entries such "
            f"as {flat[0].item()!r}"
        )


def check_theta_array(pname: str, theta, name: str = "theta0", ndim: Optional[int] = None) -> None:
    """The leader's parameters of a family that takes one array (tabular CMDPs: any shape; LQ:
    [d]): a single floating array, not a pytree (dict, list, tuple) of arrays, and finite.

    Args:
      pname: the problem's name, shown first in the error.
      theta: the parameters (concrete).
      name: the argument named in the error.
      ndim: the required number of axes, or None for any.
    Returns:
      None.
    Raises:
      ValueError: None, a pytree of several leaves or a container, a non-floating dtype, the
        wrong number of axes, or a NaN / inf entry.
    """
    if theta is None:
        raise ValueError(f"{pname}: {name} is required (an example of the leader's parameters)")
    if not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(theta)):
        raise ValueError(
            f"{pname}: {name} must be one floating array, got a {type(theta).__name__} "
            "(a pytree of parameters is not supported here: flatten it with "
            "jax.flatten_util.ravel_pytree and unflatten inside the problem's functions)"
        )
    arr = np.asarray(theta)
    if not jnp.issubdtype(arr.dtype, jnp.floating):  # numpy's test is False for bfloat16
        raise ValueError(f"{pname}: {name} must be a floating array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(
            f"{pname}: {name} must have {ndim} axis(es) ([d] for one vector), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{pname}: {name} must be finite, got {_show(arr)}")


def check_theta(problem, theta, name: str = "theta", last_axis: Optional[int] = None) -> None:
    """The leader's parameters: shaped like ``problem.theta0`` (static shapes, so this holds for
    traced values too) and, when concrete, finite.

    Args:
      problem: a problem with a ``theta0`` (pytree of arrays), or None when ``last_axis`` is given.
      theta: the parameters given (array or pytree).
      name: the argument named in the error.
      last_axis: instead of ``theta0``: theta must be the vector [last_axis] (the LQR game's
        flattened gain; a matrix gain [k, n] is refused by name, not read as a batch).
    Returns:
      None.
    Raises:
      ValueError: another tree structure or shape, a dtype that is not float32 / float64, or
        a NaN / inf entry.
    """
    pname = getattr(problem, "name", type(problem).__name__)
    ndim = getattr(problem, "theta_ndim", None)  # a family whose theta is one array of ndim axes
    if ndim is not None and (
        not isinstance(theta, (jax.Array, np.ndarray)) or np.ndim(theta) != ndim
    ):
        raise ValueError(
            f"{pname}: {name} must be one array of {ndim} axis (the vector [d]), got a "
            f"{type(theta).__name__} of shape {np.shape(theta)}: pass jnp.asarray({name}, "
            "theta0.dtype)"
        )
    if last_axis is not None:
        got = tuple(np.shape(theta))
        if got != (last_axis,):
            raise ValueError(
                f"{pname}: {name} must be the vector [{last_axis}] (a matrix gain flattened: "
                f"theta = K.reshape(-1); vmap for several), got shape {got}"
            )
    elif getattr(problem, "theta0", None) is not None:
        ref = problem.theta0
        want = [tuple(np.shape(x)) for x in jax.tree_util.tree_leaves(ref)]
        got = [tuple(np.shape(x)) for x in jax.tree_util.tree_leaves(theta)]
        same_tree = jax.tree_util.tree_structure(ref) == jax.tree_util.tree_structure(theta)
        single = jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(ref))
        if not same_tree and single and isinstance(theta, (list, tuple)):
            raise ValueError(
                f"{pname}: {name} must be one array shaped like theta0 {want[0]}, got a "
                f"{type(theta).__name__} of {len(theta)}; pass jnp.asarray({name}, "
                f"theta0.dtype)"
            )
        if not same_tree or want != got:
            shown = lambda s: s[0] if len(s) == 1 else s  # noqa: E731
            raise ValueError(
                f"{pname}: {name} must be shaped like theta0 {shown(want)}, got {shown(got)}"
            )
    for leaf in jax.tree_util.tree_leaves(theta):  # dtypes are static: traced leaves too
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):  # an int theta: no gradient, int tables
            raise ValueError(f"{pname}: {name} must be a floating array, got dtype {dtype}")
        check_not_half(f"{pname}: {name}", dtype)
    if is_concrete(theta):
        for leaf in jax.tree_util.tree_leaves(theta):
            arr = np.asarray(leaf)
            if jnp.issubdtype(arr.dtype, jnp.inexact) and not np.all(np.isfinite(arr)):
                raise ValueError(f"{pname}: {name} must be finite, got {_show(arr)}")


def check_finite_if_concrete(name: str, value) -> None:
    """A concrete ``value`` (array) has only finite entries; a traced one is not checked.

    Raises:
      ValueError: a NaN or infinite entry, naming ``name`` (a NaN start value gave an all-NaN
        gradient and no error).
    """
    if is_concrete(value):
        arr = np.asarray(value)
        if jnp.issubdtype(arr.dtype, jnp.inexact) and not np.all(np.isfinite(arr)):
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            raise ValueError(f"{name} must be finite, got {bad} of {arr.size} entries not finite")


def check_shape(name: str, value, shape: tuple, source: str = "") -> None:
    """``value`` has exactly ``shape`` (static, so this also holds for traced arrays).

    Args:
      name: the argument named in the error.
      value: an array (or tracer).
      shape: the expected shape.
      source: where the sizes come from, shown in the error (e.g. ``"S=3, B=2 from transition"``).
    Returns:
      None.
    Raises:
      ValueError: another shape, naming ``name``.
    """
    got = tuple(np.shape(value))
    if got != tuple(shape):
        src = f" ({source})" if source else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{src}, got {got}")


def transition_sizes(name: str, P, layout: str = "[S, B, S]") -> tuple:
    """The sizes of a transition table laid out as ``layout`` (first and last axis: states).

    Args:
      name: the table named in the error.
      P: the table (array or tracer; only its static shape is read).
      layout: its layout, e.g. ``"[S, B, S]"`` or ``"[S, A, B, S]"``.
    Returns:
      its shape without the last axis, e.g. (S, B).
    Raises:
      ValueError: a rank other than the layout's, an empty axis, or first axis != last axis.
    """
    shape = tuple(np.shape(P))
    if len(shape) != layout.count(",") + 1 or shape[0] != shape[-1] or 0 in shape:
        raise ValueError(f"{name} must have shape {layout}, got {shape}")
    return shape[:-1]


def _show_any(value) -> str:
    """:func:`_show` for numbers and arrays, ``repr`` for anything else."""
    try:
        return _show(value)
    except (TypeError, ValueError):
        return repr(value)


def check_beta(beta) -> None:
    """Raises ``ValueError`` unless every entry of ``beta``, the follower's entropy weight of
    Eq. (lower) (a concrete scalar or array), is finite and > 0."""
    check_positive("beta (follower entropy coefficient)", beta)


def check_positive(name: str, value) -> None:
    """Raises ``ValueError`` (naming ``name``) unless every entry of ``value`` (a concrete scalar
    or array) is finite and > 0."""
    if not _real_number(value):  # NumPy reads "0.5" as 0.5; the computation would not
        raise ValueError(f"{name} must be a real number, got {_show_any(value)}")
    v = np.asarray(value, np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {_show(value)}")


def _real_number(value) -> bool:
    """Whether ``value`` is a real number or an array of them (bool and int included)."""
    if isinstance(value, (bool, int, float)):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError):
            return False
    # jnp.issubdtype knows bfloat16 and the float8 types, which NumPy's does not
    real = jnp.issubdtype(dtype, jnp.number) and not jnp.issubdtype(dtype, jnp.complexfloating)
    return bool(real or jnp.issubdtype(dtype, jnp.bool_))


def check_unit_interval(name: str, value) -> None:
    """Raises ``ValueError`` (naming ``name``) unless every entry of ``value`` (a concrete scalar
    or array) is in (0, 1]."""
    v = np.asarray(value, np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0) or np.any(v > 1):
        raise ValueError(f"{name} must be in (0, 1], got {_show(value)}")


def check_closed_unit_interval(name: str, value) -> None:
    """Raises ``ValueError`` (naming ``name``) unless every entry of ``value`` (a concrete scalar
    or array) is in [0, 1] (a continuation factor, a probability)."""
    v = np.asarray(value, np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v > 1):
        bad = v.ravel()[~((v.ravel() >= 0) & (v.ravel() <= 1))] if v.size else v.ravel()
        shown = bad[0].item() if bad.size else _show(value)
        raise ValueError(f"{name} must have every entry in [0, 1], got e.g. {shown!r}")


def check_int_range(name: str, value, low: int, high) -> None:
    """Every entry of ``value`` an integer in [low, high].

    Args:
      name: the name shown in the error.
      value: scalar or array of any shape (concrete; integral floats are accepted).
      low: smallest allowed value.
      high: largest allowed value.
    Returns:
      None.
    Raises:
      ValueError: an empty ``value``, a boolean (``True`` is not a count; :func:`check_count`
        refuses it too), a non-integer, or an entry outside [low, high].
    """
    if np.asarray(value).dtype == np.bool_:  # a list of them too
        raise ValueError(f"{name} must be integers in [{low}, {high}], got {_show_any(value)}")
    v = np.asarray(value, np.float64)
    if v.size == 0 or np.any(v < low) or np.any(v > high) or np.any(v != np.round(v)):
        whole = v.size and np.all(np.isfinite(v)) and np.all(v == np.round(v))
        shown = _show(v.astype(np.int64)) if whole else _show(value)  # 25, not 25.0
        raise ValueError(f"{name} must be integers in [{low}, {high}], got {shown}")


def check_indices_if_concrete(name: str, index, size: int) -> None:
    """A concrete integer index array within [0, size - 1] (JAX clamps an out-of-range gather
    index and drops an out-of-range scatter silently); nothing when ``index`` is traced.

    Args:
      name: the name shown in the error (e.g. ``"batch.s (states)"``).
      index: integer array of any shape.
      size: the length of the axis it indexes.
    Returns:
      None.
    Raises:
      ValueError: a concrete ``index`` that is not an integer array, or has an entry outside
        [0, size - 1].
    """
    if not is_concrete(index):
        return
    v = np.asarray(index)
    if not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {v.dtype}")
    if v.size and (v.min() < 0 or v.max() >= size):
        raise ValueError(
            f"{name} must be indices in [0, {size - 1}], got values in [{v.min()}, {v.max()}]"
        )


def check_discounts(name: str, gamma_F, gamma_L, horizon) -> None:
    """Both discounts in [0, 1) and a positive integer horizon.

    Args:
      name: the problem's name shown in the error.
      gamma_F: the follower's discount (scalar).
      gamma_L: the leader's discount (scalar).
      horizon: episode length (int).
    Returns:
      None.
    Raises:
      ValueError: a discount outside [0, 1) or a horizon that is not a positive integer.
    """
    check_discount(f"{name}: gamma_F", gamma_F)
    check_discount(f"{name}: gamma_L", gamma_L)
    check_count(f"{name}: horizon", horizon)


def check_costs(name: str, Q: np.ndarray, R: np.ndarray) -> None:
    """Qbar symmetric positive semi-definite and Rbar symmetric positive definite.

    The cost assumptions of Propositions 1 and 2.

    Args:
      name: the problem's name shown in the error.
      Q: [n, n] state cost Qbar.
      R: [m, m] action cost Rbar.
    Returns:
      None.
    Raises:
      ValueError: Qbar not symmetric PSD or Rbar not symmetric PD.
    """
    if not np.allclose(Q, Q.T) or np.linalg.eigvalsh(Q).min() < -1e-10:
        raise ValueError(f"{name}: Qbar must be symmetric positive semi-definite")
    if not np.allclose(R, R.T) or np.linalg.eigvalsh(R).min() <= 0:
        raise ValueError(f"{name}: Rbar must be symmetric positive definite")


def check_config(
    config,
    positive_ints=(),
    nonneg_ints=(),
    positive=(),
    nonneg=(),
    unit=(),
    choices=None,
    unbounded=(),
) -> None:
    """Field checks of a frozen training config: positive / non-negative integers, positive /
    non-negative finite numbers, numbers in (0, 1] (``unit``), and ``choices`` {field: allowed
    values}.

    Args:
      config: the config dataclass instance.
      positive_ints: names of fields that must be integers >= 1.
      nonneg_ints: names of fields that must be integers >= 0.
      positive: names of fields that must be finite and > 0.
      nonneg: names of fields that must be finite and >= 0.
      unit: names of fields that must be in (0, 1].
      unbounded: names among ``positive`` / ``nonneg`` that may also be +inf (e.g. a clipping
        norm, where inf means no clipping).
      choices: field name -> allowed values, or None.
    Returns:
      None.
    Raises:
      ValueError: the first field that fails, named as ``Class.field``.
    """
    cls = type(config).__name__

    def integer(v):  # bool is an int subclass: True would run as 1
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    for name in positive_ints:
        v = getattr(config, name)
        if not integer(v) or v < 1:
            raise ValueError(f"{cls}.{name} must be a positive integer, got {v!r}")
    for name in nonneg_ints:
        v = getattr(config, name)
        if not integer(v) or v < 0:
            raise ValueError(f"{cls}.{name} must be an integer >= 0, got {v!r}")
    for name in (*positive, *nonneg, *unit):
        v = getattr(config, name)
        if isinstance(v, (bool, np.bool_, str, bytes)) or np.ndim(v) != 0:
            raise ValueError(f"{cls}.{name} must be a real number, got {v!r}")
        try:
            float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{cls}.{name} must be a real number, got {v!r}") from None
    for names, low, word in ((positive, 0.0, "> 0"), (nonneg, 0.0, ">= 0")):
        for name in names:
            v = getattr(config, name)
            if not (v > low if word == "> 0" else v >= low):
                raise ValueError(f"{cls}.{name} must be {word}, got {v!r}")
            if name not in unbounded and not np.isfinite(v):
                raise ValueError(f"{cls}.{name} must be finite, got {v!r}")
    for name in unit:
        if not 0 < getattr(config, name) <= 1:
            raise ValueError(f"{cls}.{name} must be in (0, 1], got {getattr(config, name)!r}")
    for name, ok in (choices or {}).items():
        if getattr(config, name) not in ok:
            raise ValueError(
                f"{cls}.{name} must be one of {tuple(ok)}, got {getattr(config, name)!r}"
            )


def shape_property(field: str, axis: int, doc: str) -> property:
    """A read-only size of a problem dataclass: ``int(np.shape(self.<field>)[axis])``.

    Args:
      field: name of the array attribute.
      axis: the axis whose length is returned.
      doc: the property's docstring.
    Returns:
      a ``property`` returning an int.
    """
    return property(lambda self: int(np.shape(getattr(self, field))[axis]), doc=doc)
