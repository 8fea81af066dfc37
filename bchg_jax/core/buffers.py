"""Episode buffers for actor-critic leaders, as pure functional state.

A buffer holds whole episodes (``s`` [N, T+1], ``a`` [N, T], ``b`` [N, T]; for discrete games
the smallest integer dtype that holds every index, :func:`index_dtype`; float with trailing
vector dimensions for continuous ones) so that the influence term can read the rest of a
sampled episode. ``"on"``-policy
buffers hold exactly the newest batch (N = episodes per iteration); ``"off"``-policy buffers
keep every episode (N = episodes x iterations, i.e. never full within a run); ``"ring"``
buffers keep the newest N episodes (a replay memory: the oldest batch is overwritten).
Sampling: ``sample_uniform`` (critic minibatches) draws (episode, step) uniformly over the
stored transitions; ``sample_discounted`` (actor minibatches) draws the step with probability
proportional to ``gamma^t`` (the discounted state distribution of the policy-gradient theorem).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class EpisodeBuffer(NamedTuple):
    """Whole episodes of a Markov game: N slots of horizon T (module docstring)."""

    s: Array  # [N, T+1]
    a: Array  # [N, T]
    b: Array  # [N, T]
    count: Array  # episodes added so far ("on" / "off": <= N; "ring": all, stored min(count, N))


def index_dtype(*sizes: int):
    """The smallest signed integer dtype (int8, int16, int32) that holds every index
    ``0 .. size - 1`` of the given sizes (e.g. a game's S, A, B): the dtype of a discrete
    game's buffer, which :func:`buffer_add` casts to without a check (a narrower one wraps).

    Raises:
      ValueError: a size that is not a positive integer, or one beyond int32.
    """
    for n in sizes:
        if int(n) != n or n < 1:
            raise ValueError(f"sizes must be positive integers, got {sizes}")
    for dtype in (jnp.int8, jnp.int16, jnp.int32):
        if max(sizes) - 1 <= jnp.iinfo(dtype).max:
            return jnp.dtype(dtype)
    raise ValueError(f"an index of size {max(sizes)} does not fit int32")


def buffer_init(capacity: int, horizon: int, dtype=jnp.int8, dims=None) -> EpisodeBuffer:
    """An empty buffer; ``dims=(n, k, m)`` adds trailing vector dimensions to s, a, b
    (continuous games, e.g. ``dtype=jnp.float32``).

    Args:
      capacity: N, the number of episode slots.
      horizon: T, steps per episode.
      dtype: dtype of the stored s, a, b; the default int8 holds indices up to 127 only: a
        discrete game passes ``index_dtype(S, A, B)`` (:func:`buffer_add` casts without a
        check, so larger indices would wrap).
      dims: None (scalar entries) or (n, k, m): state, leader-action and follower-action sizes.
    Returns:
      :class:`EpisodeBuffer` of zeros: ``s`` [N, T+1(, n)], ``a`` [N, T(, k)], ``b``
      [N, T(, m)], ``count`` [] int32 = 0.
    """
    ds, da, db = ((), (), ()) if dims is None else ((dims[0],), (dims[1],), (dims[2],))
    z = lambda *shape: jnp.zeros(shape, dtype)  # noqa: E731
    return EpisodeBuffer(
        z(capacity, horizon + 1, *ds),
        z(capacity, horizon, *da),
        z(capacity, horizon, *db),
        jnp.zeros((), jnp.int32),
    )


def buffer_add(buf: EpisodeBuffer, s: Array, a: Array, b: Array, mode: str) -> EpisodeBuffer:
    """Adds a batch of E episodes: ``mode="on"`` overwrites (N == E), ``"off"`` appends,
    ``"ring"`` overwrites the oldest E slots once full.

    In ``"off"`` mode a full buffer overwrites its last E slots (the buffers are sized never
    to fill within a run). ``"ring"`` needs N to be a multiple of E.

    Args:
      buf: the :class:`EpisodeBuffer` (N slots, horizon T).
      s: [E, T+1, ...] states (cast to the buffer's dtype).
      a: [E, T, ...] leader actions.
      b: [E, T, ...] follower actions.
      mode: ``"on"``, ``"off"`` or ``"ring"``.
    Returns:
      the updated :class:`EpisodeBuffer` (``count`` = min(count + E, N) off-policy, E on-policy,
      count + E for a ring).
    Raises:
      ValueError: an unknown ``mode``, or a ring whose N is not a multiple of E.
    """
    if mode not in ("on", "off", "ring"):
        raise ValueError(f"mode must be 'on', 'off' or 'ring', got {mode!r}")
    E, N = s.shape[0], buf.s.shape[0]
    if mode == "ring" and N % E:
        raise ValueError(
            f"a ring buffer's {N} slots must be a multiple of the {E} episodes added at a time"
        )
    if mode == "ring":
        start = buf.count % N
        count = buf.count + E
    else:
        start = 0 if mode == "on" else jnp.minimum(buf.count, N - E)
        count = jnp.minimum(buf.count + E if mode == "off" else E, N)
    # every index int32: with jax_enable_x64 the Python zeros would be int64 next to an int32
    # start, which dynamic_update_slice refuses
    start, zero = jnp.asarray(start, jnp.int32), jnp.zeros((), jnp.int32)
    put = lambda dst, x: jax.lax.dynamic_update_slice(  # noqa: E731
        dst, x.astype(dst.dtype), (start,) + (zero,) * (dst.ndim - 1)
    )
    return EpisodeBuffer(put(buf.s, s), put(buf.a, a), put(buf.b, b), count.astype(jnp.int32))


def stored(buf: EpisodeBuffer) -> Array:
    """The number of filled episode slots, at least 1 (an empty buffer samples slot 0)."""
    return jnp.clip(buf.count, 1, buf.s.shape[0])


def sample_uniform(key: Array, buf: EpisodeBuffer, num: int):
    """(episode, step) indices, uniform over the stored transitions.

    Args:
      key: PRNG key.
      buf: the :class:`EpisodeBuffer` (samples among the first ``clip(count, 1, N)`` episodes).
      num: number of indices.
    Returns:
      (e, t): [num] int episode indices and [num] int step indices in [0, T).
    """
    T = buf.a.shape[1]
    ke, kt = jax.random.split(key)
    e = jax.random.randint(ke, (num,), 0, stored(buf), jnp.int32)
    return e, jax.random.randint(kt, (num,), 0, T, jnp.int32)


def sample_discounted(key: Array, buf: EpisodeBuffer, num: int, gamma):
    """(episode, step) indices with P(step = t) proportional to gamma^t, t < T.

    Samples from the (truncated) discounted state visitation d_gamma of the policy-gradient
    expectation in Theorem 2 (Eq. (hg_MG)).

    Args:
      key: PRNG key.
      buf: the :class:`EpisodeBuffer` (samples among the first ``clip(count, 1, N)`` episodes).
      num: number of indices.
      gamma: discount (scalar), typically gamma_L.
    Returns:
      (e, t): [num] int episode indices and [num] int step indices in [0, T).
    """
    T = buf.a.shape[1]
    cdf = jnp.cumsum(gamma ** jnp.arange(T, dtype=jnp.float32))
    cdf = cdf / cdf[-1]
    ke, kt = jax.random.split(key)
    e = jax.random.randint(ke, (num,), 0, stored(buf), jnp.int32)
    # drawn in the cdf's dtype (float32), not JAX's default float: the same indices with
    # jax_enable_x64 on or off
    t = jnp.minimum(jnp.searchsorted(cdf, jax.random.uniform(kt, (num,), cdf.dtype)), T - 1)
    return e, t
