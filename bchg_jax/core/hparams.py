"""Typed hyperparameters: the shared half of every family's ``HParams``.

Each family declares its grid-able hyperparameters once, as a ``NamedTuple`` with defaults and
a ``validate()`` method (a pytree, so ``vmap`` over a grid of them never retraces). This module
gives the operations they share: :func:`from_grid` (a grid dict -> validated HParams with a
leading grid axis, cast to the trainer's dtype), :func:`check_representable` (no value that the
dtype rounds to 0, a subnormal or inf, no step count that int32 cannot hold) and :func:`cast`
(any HParams -> arrays of the trainer's dtype, int32 for step counts).
"""

from __future__ import annotations

import warnings
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def cast(hp, dtype, integer_fields: Tuple[str, ...] = ()):
    """``hp`` with float fields as ``dtype`` arrays and ``integer_fields`` as int32 arrays.

    Args:
      hp: a family's ``HParams`` (a NamedTuple), scalar fields or fields with a leading [G].
      dtype: the float dtype of the trainer.
      integer_fields: names of the fields cast to int32 (step counts).
    Returns:
      an ``HParams`` of the same type whose fields are jnp arrays of unchanged shapes.
    """
    return type(hp)(
        *(
            jnp.asarray(v, jnp.int32 if f in integer_fields else dtype)
            for f, v in zip(hp._fields, hp, strict=False)
        )
    )


def check_representable(hp, dtype, integer_fields: Tuple[str, ...] = ()) -> None:
    """Every float field of ``hp`` (concrete) keeps its meaning in the trainer's ``dtype``: a
    finite nonzero value may not round to 0 or to a subnormal (``HParams(beta=1e-46)`` is > 0
    in float64, 0 in float32: the Boltzmann policy exp((Q - V) / beta) of Eq. (lower) is then
    NaN) nor overflow to inf (1e39 in float32). Every field of ``integer_fields`` is a whole
    number that int32 holds (:func:`cast` wrapped ``actor_steps=1e10`` or ``inf`` to
    -2147483648, and ``2**33`` to 0: no steps at all).

    Args:
      hp: a family's ``HParams`` with concrete fields (scalars or [G]).
      dtype: the float dtype of the trainer.
      integer_fields: names of the fields cast to int32 (step counts).
    Raises:
      ValueError: naming the field, its value and ``dtype`` (or int32).
    """
    dtype = jax.dtypes.canonicalize_dtype(dtype)  # float64 without x64 is float32
    tiny, big = float(jnp.finfo(dtype).tiny), float(jnp.finfo(dtype).max)
    low, high = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    for name, value in zip(hp._fields, hp, strict=False):
        if name in integer_fields:
            v = np.asarray(value)
            if not np.issubdtype(v.dtype, np.integer):
                v = v.astype(np.float64)
            bad = ~((v >= low) & (v <= high) & (v == np.round(v)))  # NaN and inf fail too
            if np.any(bad):
                raise ValueError(
                    f"hyperparameter {name} = {v[bad].ravel()[0].item()!r} is not a whole number "
                    f"in int32's range [{low}, {high}]: as a step count it would be truncated "
                    "or wrap around"
                )
            continue
        v = np.asarray(value, np.float64)
        with np.errstate(over="ignore"):
            rounded = np.abs(np.asarray(v, dtype).astype(np.float64))
        bad = np.isfinite(v) & (v != 0) & ((rounded < tiny) | ~np.isfinite(rounded))
        if np.any(bad):
            raise ValueError(
                f"hyperparameter {name} = {float(v[bad].ravel()[0]):.6g} does not fit in "
                f"{dtype.name} (normal magnitudes {tiny:.3g} to {big:.3g}): it would round to "
                "0, a subnormal or inf"
            )


def check_distinct_points(hp) -> None:
    """The grid points of ``hp`` (cast hyperparameters, any pytree of arrays with a leading axis
    G: a family's ``HParams``) are distinct settings: two points equal in every field after the
    cast to the trainer's dtype would train the same runs twice and report both
    (``{"lr": [0.1, 0.1]}``, or 0.1 and 0.1 + 1e-9 in float32). ``run_grid`` calls it; a caller
    that wants copies of one point (a throughput benchmark) builds the hyperparameters itself.

    Raises:
      ValueError: naming the first two points that coincide and their values.
    """
    leaves = jax.tree_util.tree_leaves_with_path(hp)
    if not leaves or np.ndim(leaves[0][1]) == 0 or np.shape(leaves[0][1])[0] < 2:
        return
    G = np.shape(leaves[0][1])[0]
    rows = np.concatenate([np.asarray(v, np.float64).reshape(G, -1) for _, v in leaves], -1)
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    for g in range(G):
        i = int(first[inverse[g]])
        if i != g:
            values = ", ".join(
                f"{jax.tree_util.keystr(path).strip('.[]')}={np.asarray(v)[g].ravel()[0]:g}"
                for path, v in leaves
            )
            raise ValueError(
                f"grid points {i} and {g} are the same setting ({values}) in the trainer's "
                "dtype: the same runs would train twice; give distinct values (more seeds give "
                "more runs of one setting)"
            )


def warn_narrower_grid(grid: Dict[str, np.ndarray], dtype, integer_fields=()) -> None:
    """Warns when a float grid array is narrower than the trainer's ``dtype``: its values were
    already rounded (``np.float32(0.1)`` is 0.10000000149 in a float64 trainer), so the run is
    not the one the printed grid suggests, nor a rerun with Python floats."""
    narrow = sorted(
        k
        for k, v in grid.items()
        if k not in integer_fields
        and np.issubdtype(np.asarray(v).dtype, np.floating)
        and np.finfo(np.asarray(v).dtype).bits < np.finfo(np.dtype(dtype)).bits
    )
    if narrow:
        warnings.warn(
            f"grid values {narrow} are {np.asarray(grid[narrow[0]]).dtype} arrays, narrower than "
            f"the trainer's {np.dtype(dtype)}: they keep their rounding (0.1 becomes "
            "0.10000000149 from float32); give Python floats or float64 arrays",
            stacklevel=4,
        )


def from_grid(
    cls, grid: Dict[str, np.ndarray], dtype, integer_fields: Tuple[str, ...] = (), **validate_kw
):
    """Grid dict (name -> one value per grid point, or a scalar for all) -> ``cls`` with a
    leading axis G, validated on the host and cast. Unknown names are an error that lists the
    valid ones; missing names take the class defaults.

    Args:
      cls: the family's ``HParams`` class.
      grid: name -> [G] values (every non-scalar entry of one length G) or a scalar.
      dtype: the float dtype of the trainer.
      integer_fields: names of the fields cast to int32.
      **validate_kw: passed to ``cls.validate``.
    Returns:
      a validated ``cls`` whose every field is a [G] array (G = 1 when all entries are scalars).
    Raises:
      ValueError: unknown names, values that are not numbers (a string, a bool), an empty
        axis, values of more than one axis, grid axes of different lengths, ``validate``
        failures, or a value that does not fit in ``dtype`` (:func:`check_representable`).
    """
    unknown = sorted(set(grid) - set(cls._fields))
    if unknown:
        raise ValueError(
            f"unknown hyperparameter(s) {unknown} for {cls.__module__}.HParams; "
            f"valid names: {list(cls._fields)}"
        )
    kinds = {k: np.asarray(v).dtype for k, v in grid.items()}
    odd = {k: str(d) for k, d in kinds.items() if d.kind not in "iuf"}
    if odd:  # NumPy would read "0.1" as 0.1 and True as 1
        raise ValueError(
            f"grid values are numbers (ints or floats), got {odd}: strings and bools are not "
            "read as hyperparameters"
        )
    empty = sorted(k for k, v in grid.items() if np.ndim(v) == 1 and np.size(v) == 0)
    if empty:
        raise ValueError(f"grid axis {empty} is empty: give at least one value per grid point")
    deep = {k: np.shape(v) for k, v in grid.items() if np.ndim(v) > 1}
    if deep:  # (product_grid flattens several axes into the one grid axis)
        raise ValueError(
            f"grid values are scalars or 1-d [G] (one value per grid point), got shapes {deep}; "
            "build a multi-axis grid with bchg_jax.core.sweep.product_grid"
        )
    sizes = {len(np.atleast_1d(v)) for v in grid.values() if np.ndim(v) > 0}
    if len(sizes) > 1:
        raise ValueError(
            f"grid axes must have one length (one value per grid point), got "
            f"{ {k: np.shape(v) for k, v in grid.items()} }"
        )
    G = sizes.pop() if sizes else 1
    warn_narrower_grid(grid, dtype, integer_fields)
    values = [
        np.broadcast_to(np.asarray(grid.get(f, cls._field_defaults.get(f)), np.float64), (G,))
        for f in cls._fields
    ]
    hp = cls(*values).validate(**validate_kw)
    check_representable(hp, dtype, integer_fields)
    return cast(hp, dtype, integer_fields)


class HParamsMixin:
    """Shared methods of the families' ``HParams``: subclass it together with a ``NamedTuple``
    of fields (``class HParams(HParamsMixin, _Fields)``) and define ``validate()``;
    ``INTEGER_FIELDS`` names the fields traced as int32 (step counts)."""

    __slots__ = ()
    INTEGER_FIELDS: Tuple[str, ...] = ()

    @classmethod
    def from_grid(cls, grid: Dict[str, np.ndarray], dtype=jnp.float32, **validate_kw):
        """Grid dict (name -> one value per grid point, or a scalar for all) -> validated
        HParams with a leading grid axis, float fields of ``dtype``.

        Args:
          grid: name -> [G] values or a scalar (see :func:`from_grid`).
          dtype: float dtype of the result.
          **validate_kw: passed to ``validate``: the trainer's own bounds, e.g. the game
            trainers' ``max_steps`` (a step count above it would run as ``max_steps`` under a
            trace). ``trainer.hparams(grid)`` passes the trainer's dtype and bounds.
        Returns:
          an instance of this class, every field a [G] array.
        """
        return from_grid(cls, grid, dtype, cls.INTEGER_FIELDS, **validate_kw)

    def check_representable(self, dtype) -> None:
        """Raises ``ValueError`` if a float field would round to 0, a subnormal or inf in
        ``dtype`` (:func:`check_representable`)."""
        check_representable(self, dtype, self.INTEGER_FIELDS)

    def cast(self, dtype):
        """These hyperparameters as arrays: float fields of ``dtype``, step counts int32.

        Args:
          dtype: float dtype of the result.
        Returns:
          an instance of this class with unchanged field shapes (see :func:`cast`).
        """
        return cast(self, dtype, self.INTEGER_FIELDS)
