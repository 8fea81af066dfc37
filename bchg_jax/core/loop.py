"""The outer loop shared by every family: ``Trainer``, ``scan_loop`` and the small pure steps
that each family's ``make_train`` composes (ascent with clipping, Polyak averaging, a traced
number of inner steps).

A family's ``make_train(problem, method, config)`` builds ``init(key, hp) -> state`` and
``step(state, hp) -> (state, metrics)``; :func:`scan_loop` turns them into ``run(state, hp, n)``
(n outer iterations as one ``lax.scan``, no host sync inside) and ``train(key, hp)``. ``hp`` is
the family's typed ``HParams``: its leaves are traced, so ``vmap`` over a grid of them never
retraces.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.core.validate import is_concrete


class Trainer(NamedTuple):
    """Pure functions of one run and what built them (returned by every family's ``make_train``).

    The outer loop of Algorithm 1 (``for i = 0 .. N-1``) as pure functions.

    Attributes:
      problem, method, config: the problem instance, method name and frozen config.
      init: ``init(key, hp) -> state``.
      run: ``run(state, hp, n) -> (state, metrics)``: n outer iterations, metrics [n, ...].
      train: ``train(key, hp)``: ``run(init(key, hp), hp, config.iterations)``.
      hparams: ``hparams(grid) -> HParams`` with leading axis G: a grid dict (name -> values,
        one per grid point) validated and cast to the trainer's dtype.
      steps: a dict of the named pure steps that ``step`` composes (each family its own, e.g.
        the tabular CMDP's ``follower``, ``collect``, ``leader_critic``, ``estimate``), for
        inspection, tests and reuse in user code.
      unread: the hyperparameters this method never reads (the tabular CMDP's ``sarsa_alpha``
        without a SARSA critic, a game's ``critic_steps`` without a critic): ``run_grid``
        refuses a grid that varies one of them (its points would be the same runs).
    """

    problem: Any
    method: str
    config: Any
    init: Callable
    run: Callable
    train: Callable
    hparams: Callable
    steps: Any = None
    unread: Tuple[str, ...] = ()


def scan_loop(init: Callable, step: Callable, iterations: int):
    """(run, train) from ``init(key, hp)`` and ``step(state, hp) -> (state, metrics)``.

    ``run(state, hp, n)`` is n outer iterations as one ``lax.scan`` (metrics stacked on a
    leading [n] axis); ``train(key, hp)`` runs ``iterations`` from ``init``.

    Args:
      init: ``init(key, hp) -> state``.
      step: ``step(state, hp) -> (state, metrics)``, one outer iteration.
      iterations: outer iterations of ``train``.
    Returns:
      (run, train): ``run(state, hp, n) -> (state, metrics [n, ...])`` (``n`` static) and
      ``train(key, hp) -> (state, metrics [iterations, ...])``.
    """

    def run(state, hp, num_iterations: int):
        return jax.lax.scan(lambda s, _: step(s, hp), state, None, length=num_iterations)

    def train(key, hp):
        return run(init(key, hp), hp, iterations)

    return run, train


def build_trainer(
    problem,
    method: str,
    config,
    init: Callable,
    step: Callable,
    hparams: type,
    dtype,
    steps=None,
    unread: Tuple[str, ...] = (),
    **validate_kw,
) -> Trainer:
    """The :class:`Trainer` of ``init`` and ``step`` (via :func:`scan_loop`) whose ``init``,
    ``run`` and ``train`` check concrete hyperparameters on the host first.

    ``hparams.validate(hp, **validate_kw)`` runs when every leaf of ``hp`` is concrete, so
    ``trainer.train(key, HParams(beta=0.0))`` raises a clear ``ValueError`` instead of training
    on NaN; traced hyperparameters (a grid under ``vmap``, a user's ``jit``) are checked where
    they were made (``run_grid`` / ``HParams.from_grid``). ``train`` and ``run`` are jitted
    (``run``'s ``n`` static): a Python loop of ``run(state, hp, 1)`` compiles once, where the
    un-jitted scan was traced and compiled on every call (2.2 s and ~8 MB each, until the
    process ran out of memory maps).

    Args:
      problem, method, config: recorded on the trainer.
      init: ``init(key, hp) -> state``.
      step: ``step(state, hp) -> (state, metrics)``.
      hparams: the family's ``HParams`` class (``from_grid`` and ``validate``, e.g. a
        :class:`~bchg_jax.core.hparams.HParamsMixin` subclass).
      dtype: the float dtype of the trainer: ``trainer.hparams(grid)`` is
        ``hparams.from_grid(grid, dtype, **validate_kw)`` (validated, cast).
      steps: the named pure steps, or None.
      unread: the names of ``hparams`` fields this method never reads (:class:`Trainer`).
      **validate_kw: passed to ``hparams.validate`` (e.g. ``max_steps`` of the game trainers).
    Returns:
      the :class:`Trainer`.
    """
    run, train = scan_loop(init, step, config.iterations)
    run, train = jax.jit(run, static_argnums=2), jax.jit(train)

    def from_grid(grid):
        return hparams.from_grid(grid, dtype, **validate_kw)

    def checked(fn, takes_key):
        def not_one_run(shaped) -> None:
            if shaped:  # a vector would be applied per coordinate or fail on shapes
                raise ValueError(
                    f"{fn.__name__}: hyperparameters of one run are scalars, got shapes "
                    f"{shaped}; {fn.__name__} runs one setting: for a grid use "
                    "bchg_jax.core.sweep.run_grid (or vmap over trainer.hparams(grid), the grid "
                    "checked against this trainer's settings)"
                )

        def wrapped(x, hp, *rest):
            if isinstance(hp, Mapping):  # {"lr": 0.1, ...}: one point, as HParams
                # the shapes as given (wrapped into a one-point grid below, a list would read
                # as [1, G])
                not_one_run({k: np.shape(v) for k, v in hp.items() if np.ndim(v) > 0})
                hp = jax.tree.map(lambda v: v[0], from_grid({k: [v] for k, v in hp.items()}))
            if takes_key:
                check_key(x)
            if is_concrete(hp):
                not_one_run(
                    {k: np.shape(v) for k, v in hp._asdict().items() if np.ndim(v) > 0}
                    if hasattr(hp, "_asdict")
                    else {}
                )
                hparams.validate(hp, **validate_kw)
                if hasattr(hp, "check_representable"):  # 1e-46 > 0 in float64, 0 in float32
                    hp.check_representable(dtype)
            return fn(x, hp, *rest)

        wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
        return wrapped

    return Trainer(
        problem,
        method,
        config,
        checked(init, True),
        checked(run, False),
        checked(train, True),
        from_grid,
        steps,
        tuple(unread),
    )


def check_key(key) -> None:
    """A PRNG key: a typed key (``jax.random.key(0)``) or a raw ``uint32[..., 2]`` key
    (``jax.random.PRNGKey(0)``); traced keys are not checked.

    Raises:
      ValueError: anything else (e.g. the int 0), with the fix.
    """
    if isinstance(key, jax.core.Tracer):
        return
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return
    if dtype == jnp.uint32 and np.shape(key)[-1:] == (2,):
        return
    shown = repr(key) if np.size(key) < 5 else f"an array of shape {np.shape(key)}"
    raise ValueError(f"key must be a PRNG key such as jax.random.key(0), got {shown}")


def global_norm(tree) -> jax.Array:
    """sqrt(sum of squares) over every leaf of ``tree``, also where the sum of squares
    overflows (or underflows) the dtype.

    The plain norm (``optax.tree.norm``) where it is finite and positive, so ordinary values
    are bitwise optax's; otherwise the norm of the leaves divided by their largest ``|entry|``
    m, times m: a float32 gradient with entries ~1e19 has a finite norm (the plain sum of
    squares is inf). NaN when an entry is NaN, inf when one is inf or the norm itself exceeds
    the dtype.

    Args:
      tree: a pytree of arrays.
    Returns:
      [] the global norm.
    """
    leaves = jax.tree.leaves(tree)
    plain = optax.tree.norm(leaves)
    m, s = _scaled_sum_sq(leaves)
    scaled = jnp.where(jnp.isinf(m), m, m * jnp.sqrt(s))  # inf / inf would be NaN
    return jnp.where(jnp.isfinite(plain) & (plain > 0), plain, scaled).astype(plain.dtype)


def _scaled_sum_sq(leaves):
    """(m, s): the largest ``|entry|`` m of the leaves (NaN / inf when one is; 1 for all-zero
    leaves) and ``s = sum (x / m)^2`` (>= 1 unless all zero; finite when m is)."""
    m = functools.reduce(
        jnp.maximum, [jnp.max(jnp.abs(x)) if x.size else jnp.zeros((), x.dtype) for x in leaves]
    )
    m = jax.lax.stop_gradient(jnp.where(m > 0, m, jnp.ones_like(m)))  # NaN / inf stay
    s = functools.reduce(jnp.add, [jnp.sum((x / m.astype(x.dtype)) ** 2) for x in leaves])
    return m, s


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` (scale the updates to global norm ``max_norm`` when above
    it) that also clips a finite gradient whose sum of squares overflows: optax's norm is then
    inf and its factor ``max_norm / inf`` zeroes the step (a float32 leader with entries
    ~1e19 froze, its updates counted as taken). Here such a gradient is scaled through its
    largest entry m, ``(x / m) * (max_norm / |x / m|)``, and keeps its direction. Where optax's
    norm is finite and positive the result is bitwise optax's. With a NaN / inf entry the step
    stays non-finite, as optax's (the trainers skip such a step).

    Args:
      max_norm: the largest global norm (> 0).
    Returns:
      the optax transformation (no state).
    """

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        leaves, tree = jax.tree.flatten(updates)
        plain = optax.tree.norm(leaves)
        m, s = _scaled_sum_sq(leaves)
        usual = jnp.isfinite(plain) & (plain > 0)
        r = jnp.sqrt(s)  # |x / m| >= 1 where some entry is non-zero

        def one(x):
            by_optax = jax.lax.select(plain < max_norm, x, (x / plain.astype(x.dtype)) * max_norm)
            big = r > max_norm / m  # the scaled norm above max_norm
            scaled = jnp.where(big, (x / m.astype(x.dtype)) * (max_norm / r).astype(x.dtype), x)
            return jnp.where(usual, by_optax, scaled)

        return jax.tree.unflatten(tree, [one(x) for x in leaves]), state

    return optax.GradientTransformation(init, update)


def sgd_ascent(theta, grad, lr, clip_norm: float):
    """One stateless ascent step ``theta + lr * clip(grad)``: the gradient is clipped to global
    norm ``clip_norm`` (:func:`clip_by_global_norm`: optax's, also for a finite gradient whose
    sum of squares overflows), then plain SGD with the traced step size ``lr``.

    The leader update theta^{i+1} = theta^i + alpha grad J_L of Algorithm 1 line 17 (with
    clipping).

    Args:
      theta: leader parameters (any pytree of arrays).
      grad: the hypergradient estimate, same structure and shapes as ``theta``.
      lr: step size alpha (scalar, may be traced).
      clip_norm: global-norm clip threshold (> 0).
    Returns:
      the new parameters, same structure and shapes as ``theta``.
    """
    opt = optax.chain(clip_by_global_norm(clip_norm), optax.sgd(lr))
    updates, _ = opt.update(jax.tree.map(jnp.negative, grad), opt.init(theta), theta)
    return optax.apply_updates(theta, updates)


def adam_step(opt: optax.GradientTransformation, params, opt_state, grads):
    """One optimiser step on a loss gradient -> (params, opt_state).

    Args:
      opt: an optax transformation (e.g. ``optax.adam``).
      params: parameters (pytree).
      opt_state: ``opt``'s state for ``params``.
      grads: gradient of a loss to *minimise*, same structure as ``params``.
    Returns:
      (params, opt_state) after the update.
    """
    upd, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, upd), opt_state


def polyak(new, old, tau: float):
    """Soft target update ``tau * new + (1 - tau) * old`` on every leaf.

    Args:
      new: online parameters (pytree).
      old: target parameters, same structure and shapes.
      tau: smoothing factor in [0, 1] (scalar, may be traced).
    Returns:
      the new target parameters, same structure and shapes.
    """
    return jax.tree.map(lambda x, y: tau * x + (1 - tau) * y, new, old)


def masked_steps(body: Callable, max_steps: int, num_steps, carry, active=True):
    """``num_steps`` (traced, <= ``max_steps``) applications of ``body(i, carry) -> carry``.

    A loop with a traced trip count (``lax.fori_loop`` lowered to a while loop), so one compiled
    program serves every grid value of ``num_steps`` and only the steps asked for are computed.
    Under ``vmap`` (seeds, grid points) the loop runs the batch's largest count and every
    element keeps its carry once its own count is reached. The loop is not reverse-mode
    differentiable (no trainer differentiates through its update loops).

    Args:
      body: ``body(i, carry) -> carry`` with an unchanged structure.
      max_steps: static upper bound of ``num_steps`` (larger counts are cut to it).
      num_steps: scalar (traced) number of effective iterations.
      carry: initial carry (pytree).
      active: scalar bool; False leaves ``carry`` unchanged.
    Returns:
      the final carry.
    """
    n = jnp.where(active, jnp.minimum(jnp.asarray(num_steps, jnp.int32), max_steps), 0)
    return jax.lax.fori_loop(jnp.zeros((), jnp.int32), n, body, carry)


def check_setup(problem, method: str, config, methods, problem_type=None) -> None:
    """Host-side checks of ``make_train``'s arguments before anything is traced: the method name,
    the problem's type and ``validate()``, the config's ``validate()``.

    Args:
      problem: the problem instance (must have ``validate()``).
      method: the requested method name.
      config: the frozen config (must have ``validate()``).
      methods: the family's allowed method names.
      problem_type: the expected problem class, or None to skip the type check.
    Returns:
      None.
    Raises:
      ValueError: an unknown method, a wrong problem type, or a failed ``validate()``.
    """
    if method not in methods:
        raise ValueError(f"method must be one of {tuple(methods)}, got {method!r}")
    if problem_type is not None and not isinstance(problem, problem_type):
        raise ValueError(f"problem must be a {problem_type.__name__}, got {type(problem).__name__}")
    problem.validate()
    config.validate()
