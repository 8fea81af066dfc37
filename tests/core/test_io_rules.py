"""``core.io``'s checkpoint and atomic-write rules, each with the failure it prevents: a failed
write leaves the old file and no temporary one; only our own temporary files are cleaned up; an
integer leaf that does not fit the state's dtype is refused (not wrapped around); a leaf grows
along one axis only; a legacy path prefix renames whole names; a typed key keeps its
implementation."""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bchg_jax.core.io as bio
from bchg_jax.core.io import load_state, save_state


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary_file(
    tmp_path, monkeypatch
):
    path = tmp_path / "a.json"
    bio.save_json(str(path), {"x": 1})

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        bio.save_json(str(path), {"x": 2})
    assert sorted(os.listdir(tmp_path)) == ["a.json"]  # no .tmp-* left behind
    assert path.read_text().replace(" ", "").replace("\n", "") == '{"x":1}'


def test_remove_unfinished_writes_removes_only_temporary_files(tmp_path):
    bio.save_json(str(tmp_path / "metrics.json"), {"x": 1})
    (tmp_path / (bio.TEMP_PREFIX + "abc")).write_bytes(b"half a write")
    (tmp_path / "notes.tmp-1").write_text("not a temporary file of ours")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / (bio.TEMP_PREFIX + "x")).write_text("in a subfolder")
    assert bio.remove_unfinished_writes(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "notes.tmp-1", "sub"]
    assert os.listdir(tmp_path / "sub") == [bio.TEMP_PREFIX + "x"]
    assert bio.remove_unfinished_writes(str(tmp_path / "missing")) == 0


def test_an_integer_leaf_whose_values_do_not_fit_the_dtype_is_refused(tmp_path):
    low = str(tmp_path / "low")
    save_state(low, {"n": np.array([-1, 3], np.int32)}, 1)
    with pytest.raises(ValueError, match="expected uint32"):
        load_state(low, {"n": jnp.zeros(2, jnp.uint32)})
    high = str(tmp_path / "high")
    save_state(high, {"n": np.array([0, 300], np.int32)}, 1)
    with pytest.raises(ValueError, match="expected uint8"):
        load_state(high, {"n": jnp.zeros(2, jnp.uint8)})
    # values that fit are converted
    ok = str(tmp_path / "ok")
    save_state(ok, {"n": np.array([0, 7], np.int32)}, 1)
    got = load_state(ok, {"n": jnp.zeros(2, jnp.uint8)})["n"]
    assert got.dtype == jnp.uint8 and got.tolist() == [0, 7]


def test_grow_refuses_a_leaf_shorter_along_two_axes(tmp_path):
    ckpt = str(tmp_path / "ck")
    save_state(ckpt, {"buf": np.ones((2, 3), np.float32)}, 1)
    with pytest.raises(ValueError, match=r"field \['buf'\] has shape \(2, 3\), expected \(4, 5\)"):
        load_state(ckpt, {"buf": jnp.zeros((4, 5), jnp.float32)}, grow=True)
    grown = load_state(ckpt, {"buf": jnp.zeros((4, 3), jnp.float32)}, grow=True)["buf"]
    np.testing.assert_array_equal(grown, [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]])


class Old(NamedTuple):
    z: jax.Array
    zb: jax.Array


class New(NamedTuple):
    a: jax.Array
    ab: jax.Array
    LEGACY_PATHS = ((".a", ".z"),)


class NewA(NamedTuple):
    a: jax.Array
    zb: jax.Array
    LEGACY_PATHS = ((".a", ".z"),)


def test_a_legacy_prefix_renames_whole_names_only(tmp_path):
    ckpt = str(tmp_path / "ck")
    save_state(ckpt, Old(z=np.arange(2.0, dtype=np.float32), zb=np.full(2, 7.0, np.float32)), 1)
    zeros = jnp.zeros(2, jnp.float32)
    with pytest.raises(ValueError, match=r"no field \.ab"):
        load_state(ckpt, New(a=zeros, ab=zeros))  # .ab is not .a renamed: no .ab was saved
    back = load_state(ckpt, NewA(a=zeros, zb=zeros))  # .a is .z renamed
    np.testing.assert_array_equal(back.a, [0.0, 1.0])
    np.testing.assert_array_equal(back.zb, [7.0, 7.0])


def test_a_non_default_prng_key_is_restored_with_its_implementation(tmp_path):
    ckpt = str(tmp_path / "ck")
    key = jax.random.key(3, impl="rbg")
    save_state(ckpt, {"key": key}, 1)
    back = load_state(ckpt, {"key": jax.random.key(0, impl="rbg")})["key"]
    assert str(jax.random.key_impl(back)) == str(jax.random.key_impl(key))
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.uniform(back, (3,)), jax.random.uniform(key, (3,)))


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
def test_an_atomic_write_has_the_umasks_mode_and_a_failure_closes_its_file(tmp_path, monkeypatch):
    """The written file is readable as the umask allows (mkstemp's 0600 widened to 0666 less the
    umask), the umask is left as it was, and a failure before the data is written still closes
    the temporary file's descriptor and removes it."""
    old = os.umask(0o027)
    try:
        bio.atomic_write_bytes(str(tmp_path / "a.bin"), b"x")
        assert os.stat(tmp_path / "a.bin").st_mode & 0o777 == 0o640
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(old)

    def failing_fchmod(fd, mode):
        raise OSError("no chmod here")

    monkeypatch.setattr(os, "fchmod", failing_fchmod)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(3):
        with pytest.raises(OSError, match="no chmod here"):
            bio.atomic_write_bytes(str(tmp_path / "b.bin"), b"y")
    assert sorted(os.listdir(tmp_path)) == ["a.bin"]
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds
