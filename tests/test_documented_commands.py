"""Every command the documents give still parses: each ``python -m experiments.X ...`` and
``python -m benchmarks.Y ...`` in README.md, benchmarks/RESULTS.md and docs/*.md (shell blocks and
inline code) is handed to its module's argument parser, and an experiment's arguments also to its
validation (what runs before anything compiles). Nothing is trained. Shell variables assigned in
the same block (``L="python -m ..."``) are expanded; a command with a placeholder (``K``, ``S``,
``RUN``, ``<...>``, ``...``, ``[a|b]``, an unset ``$var``) is skipped.
"""

import argparse
import importlib
import pathlib
import re
import shlex

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *(ROOT / "docs").glob("*.md")]
COMMAND = re.compile(r"python3? -m ((?:experiments|benchmarks)\.\w+)(.*)")


def _placeholder(argv) -> bool:
    return any(re.fullmatch(r"[A-Z]+", t) or t == "..." for t in argv)


def _shell_blocks(text: str):
    """The bodies of the document's fenced code blocks (``` ... ```), continuation lines joined."""
    blocks, body = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if body is None:
                body = []
            else:
                blocks.append("\n".join(body).replace("\\\n", " "))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def documented_commands():
    """(document, module, argv) of every documented command without a placeholder."""
    found = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        lines = []
        for block in _shell_blocks(text):
            env = {}
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                for cmd in re.split(r";|&&|\|", "" if line.startswith("#") else line):
                    cmd = cmd.strip()
                    assign = re.fullmatch(r'(\w+)="(.*)"', cmd)
                    if assign:
                        env[assign.group(1)] = assign.group(2)
                        continue
                    lines.append(re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), cmd))
        lines += [" ".join(c.split()) for c in re.findall(r"`(python3? -m [^`]*)`", text)]
        for cmd in lines:
            m = COMMAND.search(cmd)
            if m is None or any(c in m.group(2) for c in "$<>[]|"):
                continue
            argv = [t for t in shlex.split(m.group(2)) if t not in (">", "&")]
            if not _placeholder(argv):
                found.append((doc.name, m.group(1), argv))
    return found


COMMANDS = documented_commands()


class _Parsed(Exception):
    pass


def test_the_documents_give_commands():
    modules = {m for _, m, _ in COMMANDS}
    assert {f"experiments.{e}" for e in ("fourrooms", "thermal", "toy_game", "lqr_game")} <= modules
    assert len(COMMANDS) >= 50, len(COMMANDS)


@pytest.mark.parametrize(
    "doc, module, argv", COMMANDS, ids=[f"{d}:{m}:{i}" for i, (d, m, _) in enumerate(COMMANDS)]
)
def test_documented_command_parses(doc, module, argv, monkeypatch):
    x64 = jax.config.jax_enable_x64
    mod = importlib.import_module(module)
    changed = jax.config.jax_enable_x64 != x64
    jax.config.update("jax_enable_x64", x64)  # the tests after this one in the process
    assert not changed, f"importing {module} changed jax_enable_x64 (a global setting)"
    where = f"{doc}: python -m {module} {shlex.join(argv)}"
    try:
        if module.startswith("experiments.") and hasattr(mod, "validate_args"):
            a = mod.parse_args(argv)
            (mod.validate_all if hasattr(mod, "validate_all") else mod.validate_args)(a)
            return
        parse = argparse.ArgumentParser.parse_args

        def parse_and_stop(self, args=None, namespace=None):
            raise _Parsed(parse(self, args, namespace))

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        with pytest.raises(_Parsed):
            mod.main(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: the parser exits {e.code}")
    except Exception as e:
        pytest.fail(f"{where}: {type(e).__name__}: {e}")
