"""The experiment CLI runs a smoke configuration and writes its results."""
import csv
import json
import os

import numpy as np
import pytest

from experiments import fourrooms as cli


def test_smoke_run_writes_results(tmp_path):
    out = cli.main(["--smoke", "--lr", "0.1", "0.05", "--out", str(tmp_path / "r"), "--exact-out"])
    files = set(os.listdir(out))
    assert {"config.json", "metrics.npz", "summary.csv", "curve.png"} <= files
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["num_grid_points"] == 2 and cfg["args"]["seeds"] == 2
    data = np.load(os.path.join(out, "metrics.npz"))
    assert data["J"].shape == (2, 2, 20) and np.all(np.isfinite(data["J"]))
    rows = list(csv.DictReader(open(os.path.join(out, "summary.csv"))))
    assert len(rows) == 2 and sum(int(r["best"]) for r in rows) == 1


@pytest.mark.parametrize("argv", [["--smoke", "--beta", "0"], ["--smoke", "--batch", "300"],
                                  ["--smoke", "--method", "magic"], ["--smoke", "--lr", "-1"]])
def test_bad_arguments_exit_with_a_message(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_batch_shapes():
    assert cli.batch_shape(100) == (1, 100)
    assert cli.batch_shape(200) == (1, 200)
    assert cli.batch_shape(400) == (2, 200)
    assert cli.batch_shape(1000) == (5, 200)


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    from bchg_jax.io import save_csv, save_json, save_npz
    save_json(str(tmp_path / "a.json"), {"x": 1})
    save_npz(str(tmp_path / "b.npz"), {"y": np.arange(3)})
    save_csv(str(tmp_path / "c.csv"), ["h"], [[1], [2]])
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.npz", "c.csv"]
    assert json.load(open(tmp_path / "a.json")) == {"x": 1}
    assert (os.stat(tmp_path / "a.json").st_mode & 0o044) == 0o044  # readable by others
