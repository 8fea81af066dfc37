"""The README's library example runs and does what it says (J_L rises)."""

import os
import re

import numpy as np
import pytest


def test_readme_example_runs_and_learns():
    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README must contain a python example"
    ns = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    J = np.asarray(ns["metrics"]["J"])
    assert np.all(np.isfinite(J)) and J[-100:].mean() > J[0] + 3.0
    assert abs(float(ns["g"][1])) > 0.5
    assert abs(float(ns["g"][0])) > 0.01  # the transition's parameter matters (it was a no-op)


@pytest.mark.slow
def test_readme_on_chunk_example_streams_every_chunk(capsys):
    """The README's ``run_grid(on_chunk=...)`` logging example (second python block) runs on
    the first block's trainer and is called once per chunk."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    ns = {}
    exec(compile(blocks[0].replace("iterations=2000", "iterations=10"), "README.md", "exec"), ns)
    exec(compile(blocks[1], "README.md", "exec"), ns)
    assert ns["logged"] == [1000] and ns["metrics"]["J"].shape == (2, 4, 1000)
    if ns["writer"] is None:  # tensorboardX not installed: printed lines
        out = capsys.readouterr().out
        assert out.count("at iteration 500") == 2 and out.count("at iteration 1000") == 2
