"""The README's library example runs and does what it says (J_L rises)."""
import os
import re

import jax
import numpy as np


def test_readme_example_runs_and_learns():
    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README must contain a python example"
    ns = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    J = np.asarray(ns["metrics"]["J"])
    assert np.all(np.isfinite(J)) and J[-100:].mean() > J[0] + 3.0
    assert abs(float(ns["g"][1])) > 0.5
