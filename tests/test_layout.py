"""The package layout: a family imports core/ (and, for games, the shared Theorem 2 and game
hyperparameters), never a sibling family; core/ imports no family; every family exposes the same
protocol names. Across the repository's code (bchg_jax/, experiments/, benchmarks/): no import
cycle, and no module imports another module's private (``_x``) name."""

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "bchg_jax"
REPO = ROOT.parent
CODE = ("bchg_jax", "experiments", "benchmarks")  # the packages checked for cycles
FAMILIES = ("bchg_jax.tabular", "bchg_jax.lq", "bchg_jax.games.tabular", "bchg_jax.games.lqr")
GAMES_SHARED = (
    "bchg_jax.games.actor_critic",
    "bchg_jax.games.guide",
    "bchg_jax.games.estimators",
    "bchg_jax.games.hparams",
    "bchg_jax.games.control_variate",
)
PROTOCOL = (
    "best_response",
    "rollout",
    "hypergradient",
    "leader_objective",
    "exact_hypergradient",
    "make_train",
    "TrainConfig",
    "HParams",
    "METHODS",
)


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
            for alias in node.names:  # "from bchg_jax.games import tabular"
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
            if mod.startswith("bchg_jax.core") and (
                target or imp.startswith("bchg_jax.games") or imp.startswith("bchg_jax.problems")
            ):
                bad.append(f"{mod} (core) imports {imp}")
            if own and target and target != own:
                bad.append(f"{mod} ({own}) imports the sibling family {imp}")
            if own and imp.startswith("bchg_jax.problems"):
                bad.append(f"{mod} ({own}) imports a problem instance {imp}")
            if (
                own
                and imp.startswith("bchg_jax.games")
                and not target
                and not any(imp.startswith(s) for s in GAMES_SHARED)
            ):
                bad.append(f"{mod} ({own}) imports {imp}")
    return bad


def test_no_family_imports_a_sibling_family():
    assert _violations() == []


def test_the_check_catches_a_sibling_import():
    """The layout check itself fails on a planted violation (a test that can fail)."""
    planted = [
        ("bchg_jax.lq._planted", "from bchg_jax.tabular.train import HParams\n"),
        ("bchg_jax.core._planted", "from bchg_jax.games import lqr\n"),
    ]
    bad = _violations(planted)
    assert any("bchg_jax.lq._planted" in v and "sibling" in v for v in bad)
    assert any("bchg_jax.core._planted" in v for v in bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_exposes_the_protocol(family):
    mod = importlib.import_module(family)
    missing = [name for name in PROTOCOL if not hasattr(mod, name)]
    assert missing == [], f"{family} lacks {missing}"
    assert set(PROTOCOL) <= set(mod.__all__)


# ---- the repository's import graph (bchg_jax/, experiments/, benchmarks/) ---------------------


def _code_modules(repo: pathlib.Path = REPO, packages=CODE) -> dict:
    """{dotted module name: source} of every module of ``packages`` under ``repo``."""
    out = {}
    for pkg in packages:
        for path in sorted((repo / pkg).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path.read_text()
    return out


def _is_package(modules: dict, name: str) -> bool:
    return any(m.startswith(name + ".") for m in modules)


def _imported(mod: str, source: str, modules: dict):
    """(line, module imported, names taken from it) of every import statement of ``mod``, at
    module level or inside a function, relative imports resolved; ``from pkg import sub`` of a
    submodule yields ``pkg.sub``."""
    package = mod if _is_package(modules, mod) else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    yield node.lineno, sub, ()
                else:
                    yield node.lineno, base, (alias.name,)


def _import_graph(modules: dict) -> dict:
    """{module: {repository modules it imports}} (the module named, not its parent packages)."""
    graph = {m: set() for m in modules}
    for mod, source in modules.items():
        for _, target, _ in _imported(mod, source, modules):
            if target in modules and target != mod:
                graph[mod].add(target)
    return graph


def _cycle(graph: dict):
    """One import cycle of ``graph`` as [m0, m1, ..., m0], or None when it is acyclic."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                return stack[stack.index(t) :] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    """No module of bchg_jax/, experiments/, benchmarks/ imports itself through other modules
    (imports inside functions count too: they close the same circle at call time)."""
    cycle = _cycle(_import_graph(_code_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_catches_an_import_cycle():
    modules = {
        "pkg": "",
        "pkg.a": "def f():\n    from pkg.b import g\n",
        "pkg.b": "from pkg import c\n",
        "pkg.c": "from . import a\n",
    }
    assert _cycle(_import_graph(modules)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    modules["pkg.c"] = "import pkg.b\n"
    assert _cycle(_import_graph(modules)) == ["pkg.b", "pkg.c", "pkg.b"]
    del modules["pkg.c"]
    assert _cycle(_import_graph(modules)) is None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(modules: dict) -> list:
    """Every place where a module takes a private name of another of ``modules``' packages:
    ``from m import _x``, ``import m._x`` / ``from m._x import y`` outside m's own package, or
    ``alias._x`` where ``alias`` is a module or name imported from them. A package's private
    submodule (``benchmarks._timing``) may be imported by the modules of that package. Other
    libraries' private APIs are not checked (core/compile_options.py asks ``jax._src`` whether
    a backend has started, a guarded call with no public equivalent)."""
    ours = {m.split(".")[0] for m in modules}
    bad = []
    for mod, source in modules.items():
        bound = set()
        for line, target, names in _imported(mod, source, modules):
            parts = target.split(".")
            if parts[0] not in ours:
                continue
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])  # the package the private module belongs to
                if _private(part) and not (mod == owner or mod.startswith(owner + ".")):
                    bad.append(f"{mod}:{line} imports {target}")
                    break
            bad += [f"{mod}:{line} imports {target}.{n}" for n in names if _private(n)]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                bound |= {
                    a.asname or a.name.split(".")[0]
                    for a in node.names
                    if a.name.split(".")[0] in ours
                }
            elif isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").split(".")[0] in ours
            ):
                bound |= {a.asname or a.name for a in node.names}
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                bad.append(f"{mod}:{node.lineno} uses {node.value.id}.{node.attr}")
    return bad


def test_no_module_imports_a_private_name():
    """Code in bchg_jax/, experiments/, benchmarks/ uses only the public names of other modules
    (tests may reach into the module they test)."""
    assert _private_imports(_code_modules()) == []


def test_the_check_catches_a_private_import():
    modules = {
        "pkg": "",
        "pkg._helper": "",
        "pkg.m": "from pkg._helper import f\n",
        "pkg.io": "def _write():\n    pass\n",
        "other": (
            "def f():\n    from pkg.io import (save,\n        _write)\n"
            "import pkg.io as pio\npio._write()\nimport pkg._helper\n"
            "from jax._src import xla_bridge\nimport numpy as np\nnp._x\n"
        ),
    }
    assert sorted(_private_imports(modules)) == [
        "other:2 imports pkg.io._write",
        "other:5 uses pio._write",
        "other:6 imports pkg._helper",
    ]
