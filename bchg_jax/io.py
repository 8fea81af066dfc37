"""Results on disk, written atomically (write to a temporary file, then ``os.replace``)."""
from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from typing import Dict, Iterable, Sequence

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
