"""What pyproject.toml promises holds: the declared Python minimum is the one the code needs, and the docs agree."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = sorted(
    path
    for folder in ("rllm_gym", "envs", "agents", "train", "benchmarks", "tests")
    for path in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in path.parts
)

# Standard-library names that appeared after 3.10, by the version that added them: using one raises the minimum.
NEWER_NAMES = {
    (3, 11): {"asyncio.Runner", "asyncio.TaskGroup", "asyncio.timeout", "tomllib", "enum.StrEnum", "typing.Self"},
    (3, 12): {"itertools.batched", "typing.override", "pathlib.Path.walk"},
    (3, 13): {"copy.replace", "warnings.deprecated"},
}


def declared_minimum() -> tuple[int, int]:
    match = re.fullmatch(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"].strip())
    assert match, f"requires-python should read '>=3.N', got {PYPROJECT['project']['requires-python']!r}"
    return 3, int(match.group(1))


def used_names(tree: ast.AST) -> set[str]:
    """Dotted names the module refers to: attribute chains (``asyncio.Runner``) and ``from x import y`` pairs."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_running_interpreter_meets_the_declared_minimum():
    assert sys.version_info[:2] >= declared_minimum()


def test_every_source_file_parses_at_the_declared_minimum():
    minimum = declared_minimum()
    for path in SOURCES:
        ast.parse(path.read_text(), filename=str(path), feature_version=minimum)


def test_no_standard_library_name_newer_than_the_declared_minimum():
    minimum = declared_minimum()
    too_new = {name: version for version, names in NEWER_NAMES.items() if version > minimum for name in names}
    offenders = []
    for path in SOURCES:
        for name in used_names(ast.parse(path.read_text())) & too_new.keys():
            offenders.append(f"{path.relative_to(ROOT)}: {name} needs Python {'.'.join(map(str, too_new[name]))}")
    assert not offenders, "raise requires-python or avoid:\n" + "\n".join(offenders)


def test_the_declared_minimum_is_needed():
    """The minimum is not higher than the code needs either: something from that version is in use."""
    minimum = declared_minimum()
    used = set().union(*(used_names(ast.parse(path.read_text())) for path in SOURCES))
    assert used & NEWER_NAMES[minimum], f"nothing needs Python {minimum}: lower requires-python"


def test_the_vllm_extra_stays_inside_what_the_installed_trl_supports():
    requirement = Requirement(next(r for r in PYPROJECT["project"]["optional-dependencies"]["vllm"] if "vllm" in r))
    trl_requires = [Requirement(text) for text in importlib.metadata.requires("trl") or []]
    supported = next(r for r in trl_requires if r.name == "vllm" and r.marker and r.marker.evaluate({"extra": "vllm"}))
    # Every release the extra admits, on the boundaries of both ranges and far out, is one TRL accepts.
    boundaries = [spec.version for spec in (*requirement.specifier, *supported.specifier)] + ["0.0.1", "999"]
    for version in boundaries:
        if requirement.specifier.contains(version, prereleases=True):
            assert supported.specifier.contains(version, prereleases=True), (version, str(supported.specifier))
    assert any(requirement.specifier.contains(v) for v in boundaries), "the vllm extra admits no supported release"


def test_ruff_targets_and_readme_state_the_same_minimum():
    major, minor = declared_minimum()
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    readme = (ROOT / "README.md").read_text()
    assert f"Python >= {major}.{minor}" in readme.split("```")[0], "the README's set-up line names another Python"


def test_no_module_imports_the_folders_that_install_under_rllm_gym():
    """``envs/``, ``agents/`` and ``train/`` install only as ``rllm_gym.envs``, ``rllm_gym.agents`` and
    ``rllm_gym.train``: a plain ``import envs`` works under ``python -m pytest`` (which puts the checkout on sys.path)
    and fails under the README's ``pytest``, and for every user of the installed package."""
    folders = {"envs", "agents", "train"}
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names if name.split(".")[0] in folders
            ]
    assert found == [], "import these as rllm_gym.<folder>...: " + ", ".join(found)
