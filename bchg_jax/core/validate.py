"""Host-side checks shared by every problem family and trainer (clear ``ValueError`` before
anything compiles): the follower's entropy weight, discounts and horizons, LQ cost matrices,
positive numbers and integer ranges of hyperparameters."""
from __future__ import annotations

import numpy as np


def _show(value) -> str:
    """A value for an error message: numbers as numbers, arrays as lists."""
    arr = np.asarray(value)
    return repr(arr.item()) if arr.size == 1 else repr(arr.tolist())


def check_beta(beta) -> None:
    """Raises ``ValueError`` unless every entry of ``beta``, the follower's entropy weight of
    Eq. (lower) (a concrete scalar or array), is finite and > 0."""
    check_positive("beta (follower entropy coefficient)", beta)


def check_positive(name: str, value) -> None:
    """Raises ``ValueError`` (naming ``name``) unless every entry of ``value`` (a concrete scalar
    or array) is finite and > 0."""
    v = np.asarray(value, np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {_show(value)}")


def check_unit_interval(name: str, value) -> None:
    """Raises ``ValueError`` (naming ``name``) unless every entry of ``value`` (a concrete scalar
    or array) is in (0, 1]."""
    v = np.asarray(value, np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0) or np.any(v > 1):
        raise ValueError(f"{name} must be in (0, 1], got {_show(value)}")


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
      ValueError: an empty ``value``, a non-integer, or an entry outside [low, high].
    """
    v = np.asarray(value, np.float64)
    if v.size == 0 or np.any(v < low) or np.any(v > high) or np.any(v != np.round(v)):
        raise ValueError(f"{name} must be integers in [{low}, {high}], got {_show(value)}")


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
    for label, g in (("gamma_F", gamma_F), ("gamma_L", gamma_L)):
        if not 0.0 <= float(g) < 1.0:
            raise ValueError(f"{name}: {label} must be in [0, 1), got {g!r}")
    if not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"{name}: horizon must be a positive integer, got {horizon!r}")


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


def check_config(config, positive_ints=(), nonneg_ints=(), positive=(), nonneg=(),
                 unit=(), choices=None) -> None:
    """Field checks of a frozen training config: positive / non-negative integers, positive /
    non-negative numbers, numbers in (0, 1] (``unit``), and ``choices`` {field: allowed values}.

    Args:
      config: the config dataclass instance.
      positive_ints: names of fields that must be integers >= 1.
      nonneg_ints: names of fields that must be integers >= 0.
      positive: names of fields that must be > 0.
      nonneg: names of fields that must be >= 0.
      unit: names of fields that must be in (0, 1].
      choices: field name -> allowed values, or None.
    Returns:
      None.
    Raises:
      ValueError: the first field that fails, named as ``Class.field``.
    """
    cls = type(config).__name__
    for name in positive_ints:
        v = getattr(config, name)
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{cls}.{name} must be a positive integer, got {v!r}")
    for name in nonneg_ints:
        v = getattr(config, name)
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{cls}.{name} must be an integer >= 0, got {v!r}")
    for name in positive:
        if not getattr(config, name) > 0:
            raise ValueError(f"{cls}.{name} must be > 0, got {getattr(config, name)!r}")
    for name in nonneg:
        if not getattr(config, name) >= 0:
            raise ValueError(f"{cls}.{name} must be >= 0, got {getattr(config, name)!r}")
    for name in unit:
        if not 0 < getattr(config, name) <= 1:
            raise ValueError(f"{cls}.{name} must be in (0, 1], got {getattr(config, name)!r}")
    for name, ok in (choices or {}).items():
        if getattr(config, name) not in ok:
            raise ValueError(f"{cls}.{name} must be one of {tuple(ok)}, got {getattr(config, name)!r}")


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
