"""The package layout: a family imports core/ (and, for games, the shared Theorem 2 and game
hyperparameters), never a sibling family; core/ imports no family; every family exposes the same
protocol names."""
import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "bchg_jax"
FAMILIES = ("bchg_jax.tabular", "bchg_jax.lq", "bchg_jax.games.tabular", "bchg_jax.games.lqr")
GAMES_SHARED = ("bchg_jax.games.estimators", "bchg_jax.games.hparams")
PROTOCOL = ("best_response", "rollout", "hypergradient", "leader_objective",
            "exact_hypergradient", "make_train", "TrainConfig", "HParams", "METHODS")


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:          # "from bchg_jax.games import tabular"
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


def _family(module: str):
    for fam in sorted(FAMILIES, key=len, reverse=True):
        if module == fam or module.startswith(fam + "."):
            return fam
    return None


def _violations():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module_name(path)
        own = _family(mod)
        for imp in _imports(path):
            if not imp.startswith("bchg_jax"):
                continue
            target = _family(imp)
            if mod.startswith("bchg_jax.core") and (target or imp.startswith("bchg_jax.games")
                                                    or imp.startswith("bchg_jax.problems")):
                bad.append(f"{mod} (core) imports {imp}")
            if own and target and target != own:
                bad.append(f"{mod} ({own}) imports the sibling family {imp}")
            if own and imp.startswith("bchg_jax.problems"):
                bad.append(f"{mod} ({own}) imports a problem instance {imp}")
            if own and imp.startswith("bchg_jax.games") and not target and \
                    not any(imp.startswith(s) for s in GAMES_SHARED):
                bad.append(f"{mod} ({own}) imports {imp}")
    return bad


def test_no_family_imports_a_sibling_family():
    assert _violations() == []


def test_the_check_catches_a_sibling_import(tmp_path, monkeypatch):
    """The layout check itself fails on a planted violation (a test that can fail)."""
    fake = ROOT / "lq" / "_planted_violation.py"
    fake.write_text("from bchg_jax.tabular.train import HParams\n")
    try:
        assert any("_planted_violation" in v for v in _violations())
    finally:
        fake.unlink()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_exposes_the_protocol(family):
    mod = importlib.import_module(family)
    missing = [name for name in PROTOCOL if not hasattr(mod, name)]
    assert missing == [], f"{family} lacks {missing}"
    assert set(PROTOCOL) <= set(mod.__all__)
