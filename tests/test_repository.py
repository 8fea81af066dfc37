"""The repository stays lean: run outputs are regenerated, not committed (issue 28).

Only the tables and figures that the documentation shows are tracked under ``benchmarks/``
(``.gitignore`` lists them); every tracked file there is at most 1 MB and all of them together
at most 5 MB. Skipped outside a git checkout (an unpacked source distribution).
"""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_FILE = 1_000_000  # bytes, any one tracked file under benchmarks/
MAX_TOTAL = 5_000_000  # bytes, every tracked file under benchmarks/ together


def tracked_files(folder: str):
    """Paths of the files git tracks under ``folder`` (skips the test outside a checkout)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", folder], capture_output=True, timeout=60
    )
    if done.returncode != 0:
        pytest.skip("not a git checkout: " + done.stderr.decode(errors="replace").strip())
    names = [n for n in done.stdout.decode().split("\0") if n]
    return [ROOT / n for n in names if (ROOT / n).is_file()]  # deleted but not yet committed


def ignored_by_git(names):
    """Those of ``names`` (paths from the root) that git ignores and does not track."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--stdin", "-z"],
        input="\0".join(names).encode(),
        capture_output=True,
        timeout=60,
    )
    if done.returncode not in (0, 1):  # 1: none ignored
        pytest.skip("not a git checkout: " + done.stderr.decode(errors="replace").strip())
    return [n for n in done.stdout.decode().split("\0") if n]


def sizes(folder: str):
    return {str(p.relative_to(ROOT)): os.path.getsize(p) for p in tracked_files(folder)}


def test_no_tracked_benchmark_file_exceeds_1_mb():
    big = {name: size for name, size in sizes("benchmarks").items() if size > MAX_FILE}
    assert not big, (
        f"tracked files over {MAX_FILE} bytes under benchmarks/ (regenerate them "
        f"instead, and ignore them in .gitignore): {big}"
    )


def test_tracked_benchmarks_total_at_most_5_mb():
    found = sizes("benchmarks")
    assert found, "no tracked file under benchmarks/"
    total = sum(found.values())
    largest = sorted(found.items(), key=lambda kv: -kv[1])[:5]
    assert total <= MAX_TOTAL, (
        f"{total} bytes tracked under benchmarks/ (limit {MAX_TOTAL}); largest: {largest}"
    )


def test_the_documents_show_only_tracked_figures():
    """Every image README.md, benchmarks/RESULTS.md and docs/*.md embed is a tracked file."""
    import re

    tracked = {str(p.relative_to(ROOT)) for p in tracked_files(".")}
    docs = [
        ROOT / "README.md",
        ROOT / "benchmarks" / "RESULTS.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    missing = []
    for doc in docs:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", doc.read_text()):
            path = os.path.normpath(os.path.join(os.path.dirname(doc.relative_to(ROOT)), target))
            if path not in tracked:
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, f"embedded images that git does not track: {missing}"


def test_the_documents_link_only_to_files_in_the_repository():
    """Every relative Markdown link of README.md, benchmarks/RESULTS.md and docs/*.md names a
    file or folder of this checkout (no link leaves the repository)."""
    import re

    docs = [
        ROOT / "README.md",
        ROOT / "benchmarks" / "RESULTS.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken, files = [], {}
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT not in path.parents and path != ROOT:
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
            elif path.is_file():
                files[str(path.relative_to(ROOT))] = f"{doc.relative_to(ROOT)}: {target}"
    assert not broken, f"links to nothing in this repository: {broken}"
    # A linked file that git ignores is here but not in a clean clone (add it to .gitignore's
    # list of kept results and `git add` it); untracked files that are not ignored are fine.
    ignored = ignored_by_git(sorted(files))
    assert not ignored, f"links to files git ignores: {[files[n] for n in ignored]}"


def test_the_sources_name_only_scripts_that_exist():
    """Every ``benchmarks/NAME.py`` / ``experiments/NAME.py`` that a docstring or comment of the
    package, the benchmarks or the experiments names is a file of this checkout."""
    import re

    sources = [
        *sorted((ROOT / "bchg_jax").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "experiments").glob("*.py")),
    ]
    missing = []
    for src in sources:
        for name in re.findall(
            r"(?<![\w/.])((?:benchmarks|experiments)/\w+\.(?:py|sh))\b", src.read_text()
        ):
            if not (ROOT / name).is_file():
                missing.append(f"{src.relative_to(ROOT)}: {name}")
    assert not missing, f"scripts named that do not exist: {missing}"
