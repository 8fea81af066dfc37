"""Results and checkpoints on disk, written atomically (temporary file, then ``os.replace``).

Training-state checkpoints are small npz files (a few KB per run): every leaf of the state
NamedTuple, typed PRNG keys stored as their raw key data. This keeps resume dependency-free and
atomic; orbax is not needed for states this small.
"""
from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from typing import Dict, Iterable, Sequence

import jax
import numpy as np


def _atomic_write_bytes(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are for sharing
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_json(path: str, obj) -> None:
    _atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def save_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    _atomic_write_bytes(path, buf.getvalue())


def save_csv(path: str, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    _atomic_write_bytes(path, buf.getvalue().encode())


def save_figure(path: str, fig) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format=os.path.splitext(path)[1][1:] or "png", dpi=120, bbox_inches="tight")
    _atomic_write_bytes(path, buf.getvalue())
    import matplotlib.pyplot as plt
    plt.close(fig)          # figures are written once; do not keep them open


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaves(state):
    return jax.tree_util.tree_flatten_with_path(state)[0]


def save_state(path: str, state) -> None:
    """Checkpoints any pytree of arrays (typed PRNG keys stored as raw key data), atomically.

    Leaves are stored under their tree path (``jax.tree_util.keystr``)."""
    arrays = {}
    for kp, x in _leaves(state):
        name = jax.tree_util.keystr(kp)
        if _is_key(x):
            arrays["key__" + name] = np.asarray(jax.random.key_data(x))
        else:
            arrays[name] = np.asarray(x)
    save_npz(path, arrays)


def load_state(path: str, like):
    """Restores a checkpoint written by :func:`save_state` into the structure of ``like``."""
    data = np.load(path)
    leaves = []
    for kp, ref in _leaves(like):
        name = jax.tree_util.keystr(kp)
        key_name = "key__" + name
        if name not in data.files and key_name not in data.files:
            raise ValueError(f"checkpoint {path}: no field {name} (a different method or config?)")
        if _is_key(ref):
            x = jax.random.wrap_key_data(jax.numpy.asarray(data[key_name]),
                                         impl=jax.random.key_impl(ref))
        else:
            x = jax.numpy.asarray(data[name], dtype=ref.dtype)
        if x.shape != ref.shape:
            raise ValueError(f"checkpoint {path}: field {name} has shape {x.shape}, "
                             f"expected {ref.shape} (different grid, seeds or problem?)")
        leaves.append(x)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
