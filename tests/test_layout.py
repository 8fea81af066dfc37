"""The package layout: a family imports core/ (and, for games, the shared Theorem 2 and game
hyperparameters), never a sibling family; core/ imports no family; every family exposes the same
protocol names."""
import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "bchg_jax"
FAMILIES = ("bchg_jax.tabular", "bchg_jax.lq", "bchg_jax.games.tabular", "bchg_jax.games.lqr")
GAMES_SHARED = ("bchg_jax.games.estimators", "bchg_jax.games.hparams",
                "bchg_jax.games.control_variate")
PROTOCOL = ("best_response", "rollout", "hypergradient", "leader_objective",
            "exact_hypergradient", "make_train", "TrainConfig", "HParams", "METHODS")


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(source: str):
    tree = ast.parse(source)
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


def _violations(extra=()):
    """Layout violations of every module of the package, plus ``extra`` (module, source) pairs."""
    bad = []
    modules = [(_module_name(p), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    for mod, source in modules + list(extra):
        own = _family(mod)
        for imp in _imports(source):
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


def test_the_check_catches_a_sibling_import():
    """The layout check itself fails on a planted violation (a test that can fail)."""
    planted = [("bchg_jax.lq._planted", "from bchg_jax.tabular.train import HParams\n"),
               ("bchg_jax.core._planted", "from bchg_jax.games import lqr\n")]
    bad = _violations(planted)
    assert any("bchg_jax.lq._planted" in v and "sibling" in v for v in bad)
    assert any("bchg_jax.core._planted" in v for v in bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_exposes_the_protocol(family):
    mod = importlib.import_module(family)
    missing = [name for name in PROTOCOL if not hasattr(mod, name)]
    assert missing == [], f"{family} lacks {missing}"
    assert set(PROTOCOL) <= set(mod.__all__)
