"""Results and checkpoints on disk, written atomically (temporary file, then ``os.replace``).

Results (json, npz, csv, figures) are written to a temporary file in the same folder and moved
into place. Training states are orbax checkpoints (``save_state(dir, state, step)`` ->
``dir/<step>/``, written to a temporary folder and renamed by orbax's ``CheckpointManager``, one
step kept; the previous one is deleted only after the new one is complete); leaves are stored
with their tree paths, typed PRNG keys as their raw key data, so a restore into a state of
another shape fails with a clear error (``load_state``).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import os
import shutil
import tempfile
from typing import Dict, Iterable, Sequence

import jax
import numpy as np

TEMP_PREFIX = ".tmp-"  # atomic_write_bytes' temporary files (remove_unfinished_writes)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically: to a temporary file in the same folder (readable
    by others as the umask allows), fsynced, then moved into place with ``os.replace``, and the
    folder fsynced (the rename itself survives a power loss; skipped where a folder cannot be
    opened, e.g. Windows); a failure leaves ``path`` as it was and removes the temporary file.

    Args:
      path: destination file (parent folders are created).
      data: the file's bytes.
    Returns:
      None.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:  # closes fd whatever fails below
            if hasattr(os, "fchmod"):  # mkstemp creates 0600; results are for sharing
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux 4.7+:
    ``/proc/self/status``); elsewhere set and restored at once (``os.umask`` has no read-only
    form), a moment in which another thread's new file would get mode 0666 / 0777."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o077)  # the safe side for that moment
    os.umask(umask)
    return umask


def remove_unfinished_writes(folder: str) -> int:
    """Removes the temporary files that :func:`atomic_write_bytes` left in ``folder`` (not its
    subfolders) when the process was killed mid-write (``.tmp-*``: a write that never
    finished; the file it was replacing is whole). For a run folder about to be written again
    by the one process that owns it: a temporary file of a write still in progress elsewhere
    would be removed too.

    Args:
      folder: a folder (a missing one holds nothing).
    Returns:
      the number of files removed.
    """
    if not os.path.isdir(folder):
        return 0
    removed = 0
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        if name.startswith(TEMP_PREFIX) and os.path.isfile(p) and not os.path.islink(p):
            try:
                os.remove(p)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _fsync_folder(folder: str) -> None:
    """fsync a folder (its entries: a rename into it), where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # no folder descriptors (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that does not sync folders
        pass
    finally:
        os.close(fd)


def save_json(path: str, obj) -> None:
    """Writes ``obj`` as indented, key-sorted JSON, atomically.

    Args:
      path: destination file (parent folders are created).
      obj: a JSON-serialisable object (other values are written with ``str``).
    Returns:
      None.
    """
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def save_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:
    """Writes named arrays as a compressed ``.npz``, atomically.

    Args:
      path: destination file (parent folders are created).
      arrays: name -> array of any shape (converted with ``np.asarray``).
    Returns:
      None.
    """
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    atomic_write_bytes(path, buf.getvalue())


def save_csv(path: str, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    """Writes a CSV table, atomically.

    Args:
      path: destination file (parent folders are created).
      header: column names.
      rows: the rows, each a sequence of cells.
    Returns:
      None.
    """
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_bytes(path, buf.getvalue().encode())


def save_figure(path: str, fig) -> None:
    """Saves a matplotlib figure (format from the extension, default png), atomically, and
    closes it.

    Args:
      path: destination file (parent folders are created).
      fig: a ``matplotlib.figure.Figure``.
    Returns:
      None.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format=os.path.splitext(path)[1][1:] or "png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)  # figures are written once; do not keep them open


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaves(state):
    return jax.tree_util.tree_flatten_with_path(state)[0]


def _manager(directory: str):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=1, create=True, enable_async_checkpointing=False
        ),
    )


def check_checkpoint_path(directory: str) -> None:
    """``directory`` is a folder whose orbax checkpoints can be read back.

    Orbax finds the parts of a saved state with a glob pattern built from the folder's path,
    and tensorstore reads a backslash as a separator: a path with a ``[...]`` character class
    in one of its names (``runs/lr[0.1]``) or with a backslash was saved without an error but
    every restore failed (``load_state``: damaged or unreadable), so the run could never be
    resumed or extended.

    Args:
      directory: the checkpoint folder (or a folder above it).
    Returns:
      None.
    Raises:
      ValueError: a path orbax could not read back, naming the part at fault.
    """
    path = os.path.abspath(directory)
    bad = [part for part in path.split(os.sep) if not fnmatch.fnmatchcase(part, part)]
    if "\\" in path or bad:
        what = f"the name {bad[0]!r} (a glob pattern)" if bad else "a backslash"
        raise ValueError(
            f"checkpoint folder {path!r}: orbax cannot read back a checkpoint saved under a path "
            f"with {what}; use a folder whose path has no [...] and no backslash"
        )


def save_state(directory: str, state, step: int = 0) -> None:
    """Checkpoints any pytree of arrays with orbax (``directory/<step>/``), atomically.

    Orbax writes each step to a temporary folder and renames it when complete; the previous
    step is deleted only after that, so a run killed while saving keeps its last checkpoint.
    The temporary folders of saves that a kill interrupted are removed before the next save
    (orbax, finding one of the step it writes, removed it with an absl WARNING).
    Leaves are stored with their tree paths (``jax.tree_util.keystr``), typed PRNG keys as raw
    key data, so a restore checks the structure leaf by leaf.

    Args:
      directory: the checkpoint folder (created if needed); the step goes to ``directory/<step>/``.
      state: any pytree of arrays (e.g. a trainer state with leaves [G, N, ...]).
      step: the step number to record (e.g. iterations done); a later save needs another
        step (orbax does not overwrite one in place).
    Returns:
      None.
    Raises:
      ValueError: ``directory`` already holds a checkpoint of this ``step``, or its path is one
        orbax cannot read back (:func:`check_checkpoint_path`).
    """
    import orbax.checkpoint as ocp

    check_checkpoint_path(directory)
    # before the manager opens (a barrier of every process): no save of this run is under way
    if jax.process_index() == 0 and os.path.isdir(directory):
        _remove_unfinished(directory)

    arrays, names, keys = {}, [], []
    for i, (kp, x) in enumerate(_leaves(state)):
        names.append(jax.tree_util.keystr(kp))
        keys.append(bool(_is_key(x)))
        arrays[f"leaf{i:05d}"] = np.asarray(jax.random.key_data(x) if _is_key(x) else x)
    # one manager for the check and the save: opening one is a barrier of every process (a
    # multi-host run), so each process must open as many as the others
    with _manager(directory) as mgr:
        if mgr.latest_step() == int(step):
            raise ValueError(
                f"checkpoint {directory} already holds step {int(step)}; save with another step "
                "(e.g. the iterations done), or into another folder"
            )
        mgr.save(
            int(step),
            args=ocp.args.Composite(
                arrays=ocp.args.StandardSave(arrays),
                meta=ocp.args.JsonSave({"names": names, "keys": keys, "step": int(step)}),
            ),
            force=True,
        )
        mgr.wait_until_finished()


def _remove_unfinished(directory: str) -> None:
    """Removes the temporary folders of saves that never finished (a run killed while writing
    step k leaves ``k.orbax-checkpoint-tmp...``; a resume with another ``--chunk`` never writes
    step k again, so nothing else would remove it: a whole extra copy of the state)."""
    for name in os.listdir(directory):
        if ".orbax-checkpoint-tmp" in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def checkpoint_step(directory: str):
    """The step of the latest complete checkpoint in ``directory``, or None.

    Args:
      directory: the checkpoint folder.
    Returns:
      int or None.
    """
    if not os.path.isdir(directory):
        return None
    with _manager(directory) as mgr:
        return mgr.latest_step()


def checkpoint_exists(directory: str) -> bool:
    """True when ``directory`` holds a complete checkpoint written by :func:`save_state`.

    Args:
      directory: the checkpoint folder.
    Returns:
      bool.
    """
    if not os.path.isdir(directory):
        return False
    with _manager(directory) as mgr:
        return mgr.latest_step() is not None


def _check_dtype(directory: str, name: str, raw: np.ndarray, dtype) -> None:
    """A saved leaf's dtype is ``dtype``, or an integer one whose values ``dtype`` holds."""
    dtype = np.dtype(dtype)
    if raw.dtype == dtype:
        return
    if (
        np.issubdtype(raw.dtype, np.integer)
        and np.issubdtype(dtype, np.integer)
        and (raw.size == 0 or np.iinfo(dtype).min <= raw.min() <= raw.max() <= np.iinfo(dtype).max)
    ):
        return
    raise ValueError(
        f"checkpoint {directory}: field {name} is {raw.dtype}, expected {dtype} (a run saved "
        "in another precision; load_state(..., cast=True) converts it)"
    )


def _grows(saved, wanted) -> bool:
    """Same rank, one axis shorter in ``saved``, every other axis equal."""
    if len(saved) != len(wanted):
        return False
    diff = [(m, n) for m, n in zip(saved, wanted, strict=False) if m != n]
    return len(diff) == 1 and diff[0][0] < diff[0][1]


def _saved_name(name: str, index, like) -> str:
    """``name``, or the path its leaf had in an older version of ``like``'s type: a state type
    may list ``LEGACY_PATHS`` ((new path prefix, old path prefix), ...), tried in order when the
    checkpoint lacks ``name``."""
    if name in index:
        return name
    for new, old in getattr(type(like), "LEGACY_PATHS", ()):
        if name == new or (name.startswith(new) and name[len(new)] in ".["):
            if old + name[len(new) :] in index:
                return old + name[len(new) :]
    return name


def load_state(directory: str, like, grow: bool = False, cast: bool = False):
    """Restores the latest checkpoint of :func:`save_state` into the structure of ``like``.

    Args:
      directory: the checkpoint folder.
      like: a pytree with the expected structure, leaf shapes and dtypes (typed PRNG keys are
        restored with ``like``'s key implementation); for a grid run,
        ``bchg_jax.core.sweep.state_template(trainer, grid, seeds)``.
      grow: accept a saved leaf that is shorter than ``like``'s along exactly one axis and
        complete it with ``like``'s values there (an off-policy episode buffer, sized by the
        number of iterations, when a run is extended; its ``count`` keeps the saved episodes).
        The axes that index the runs never grow: those of ``like.step`` where ``like`` has a
        step counter ([G, N] for a grid state), so a checkpoint of fewer seeds or grid points
        is refused, not completed with runs at iteration 0.
      cast: accept a saved leaf of another dtype and convert it (a float32 checkpoint into a
        float64 state continues as a mixed-precision run; the reverse rounds); by default
        only an integer leaf whose values fit ``like``'s integer dtype is converted.
      A leaf the checkpoint lacks is read from its old path if ``like``'s type names one in
      ``LEGACY_PATHS`` (a state type renamed since the checkpoint was saved).
    Returns:
      a pytree of ``like``'s structure holding the saved arrays.
    Raises:
      ValueError: no checkpoint, a damaged or unreadable one, a missing leaf, a leaf of
        another shape, or (without ``cast``) of another dtype.
    """
    import orbax.checkpoint as ocp

    with _manager(directory) as mgr:
        step = mgr.latest_step()
        if step is None:
            raise ValueError(f"no checkpoint in {directory}")
        try:
            got = mgr.restore(
                step,
                args=ocp.args.Composite(
                    arrays=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
                ),
            )
            names, data = got["meta"]["names"], got["arrays"]
        except Exception as err:  # orbax / tensorstore / json errors of a damaged folder
            raise ValueError(
                f"checkpoint {directory} (step {step}) is damaged or unreadable "
                f"({type(err).__name__}: {err})"
            ) from err
    step_like = getattr(like, "step", None)  # its axes index the runs ([G, N] for a grid)
    runs = 0 if step_like is None else np.ndim(step_like)
    index = {n: i for i, n in enumerate(names)}
    leaves = []
    for kp, ref in _leaves(like):
        name = _saved_name(jax.tree_util.keystr(kp), index, like)
        if name not in index:
            raise ValueError(
                f"checkpoint {directory}: no field {name} (a different method or config?)"
            )
        raw = np.asarray(data[f"leaf{index[name]:05d}"])
        if _is_key(ref):
            x = jax.random.wrap_key_data(jax.numpy.asarray(raw), impl=jax.random.key_impl(ref))
        else:
            if not cast:
                _check_dtype(directory, name, raw, ref.dtype)
            x = jax.numpy.asarray(raw, dtype=ref.dtype)
        if (
            grow
            and x.shape != ref.shape
            and _grows(x.shape, ref.shape)
            and x.shape[:runs] == ref.shape[:runs]
        ):
            axis = next(
                i for i, (m, n) in enumerate(zip(x.shape, ref.shape, strict=False)) if m != n
            )
            tail = jax.lax.slice_in_dim(
                jax.numpy.asarray(ref), x.shape[axis], ref.shape[axis], axis=axis
            )
            x = jax.numpy.concatenate([x, tail], axis=axis)
        if x.shape != ref.shape:
            raise ValueError(
                f"checkpoint {directory}: field {name} has shape {x.shape}, "
                f"expected {ref.shape} (different grid, seeds or problem?)"
            )
        leaves.append(x)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
