"""constraints.txt pins the tested versions of the libraries that change the numbers, inside pyproject's ranges, and
the set-up commands that install the project with its test extras (the README's two and CI's) install through it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What the training numerics, the embedded model and the figures depend on (issue 33): each must be pinned.
NUMERICS = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "trl", "accelerate", "peft", "datasets")


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        text = line.split("#")[0].strip()
        if not text:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][^\s;]*)", text)
        assert match, f"constraints.txt:{number}: {text!r} should read 'name==version'"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"constraints.txt:{number}: {name} is pinned twice"
        found[name] = Version(match.group(2))
    return found


def project_requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    texts = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return [Requirement(text) for text in texts if not text.startswith("rllm-gym")]


def test_the_numerics_libraries_are_pinned():
    assert set(map(canonicalize_name, NUMERICS)) <= pins().keys()


def test_every_pin_is_inside_the_ranges_pyproject_declares():
    pinned = pins()
    checked = 0
    for requirement in project_requirements():
        version = pinned.get(canonicalize_name(requirement.name))
        if version is not None:
            assert requirement.specifier.contains(version, prereleases=True), f"{requirement} excludes {version}"
            checked += 1
    assert checked >= len(NUMERICS)


def test_pyproject_keeps_ranges_not_pins():
    for requirement in project_requirements():
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), str(requirement)


def install_commands(text: str) -> list[str]:
    """The pip commands in ``text`` that install the project with its test and serve extras (the README's set-up;
    other environments, such as a vLLM one that takes vLLM's own pins, are not asked to)."""
    commands = re.split(r"&&|\n", text)
    return [command.strip() for command in commands if re.search(r"pip install .*-e \"?\.\[test,serve\]", command)]


def test_readme_and_ci_install_the_project_through_the_constraints():
    readme_setup = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    for name, text in (("README.md's set-up", readme_setup), (".ci/run", (ROOT / ".ci" / "run").read_text())):
        commands = install_commands(text)
        assert commands, f"{name} installs no project"
        for command in commands:
            assert "-c constraints.txt" in command, f"{name}: {command!r} ignores constraints.txt"
    assert len(install_commands(readme_setup)) == 2  # the main job's and the tests'
