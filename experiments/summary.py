"""Summary statistics of saved learning curves, shared by the run summaries
(``experiments.report``) and the figures (``experiments.plot``); depends on numpy only."""

from __future__ import annotations

import numpy as np


def summarize(J: np.ndarray, window: int):
    """Per seed mean of the last ``window`` iterations -> (final [G,N], mean [G], se [G], best).

    ``se`` is NaN with one seed: a standard error needs two, and 0 would read as exact. A grid
    point with a non-finite seed (:func:`nonfinite_seeds`) is never ``best``; when every point
    has one, ``best`` is 0 and its mean NaN (the callers say so). A ``window`` below 1 is
    refused (ValueError): ``J[..., -0:]`` is the whole run."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be an int >= 1 (iterations of the mean), got {window!r}")
    final = J[..., -min(window, J.shape[-1]) :].mean(-1)
    n = final.shape[1]
    se = final.std(-1, ddof=1) / np.sqrt(n) if n > 1 else np.full(final.shape[0], np.nan)
    mean = final.mean(-1)
    # a grid point with a non-finite run (e.g. a diverged policy) is never "best"
    return final, mean, se, int(np.argmax(np.where(np.isfinite(mean), mean, -np.inf)))


def nonfinite_seeds(final: np.ndarray) -> np.ndarray:
    """[G] the seeds of each grid point whose final mean is not finite (a diverged run): such a
    point's mean is NaN and it cannot be ``best``, which moves the choice to another point."""
    return np.sum(~np.isfinite(final), axis=-1)
