"""A training config's YAML file read into typed values, each wrong one named in one line: the file, the key, the
value and the type it must have (``runs.yaml: max_steps: 'ten' is not an integer``).

Without this check a YAML value reached argparse as the default of its flag, and a wrong one ended the run with the
trainer's whole usage and an error about a flag the user never typed. This module imports nothing heavy.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "as_type",
    "config_relative",
    "describe_type",
    "read_config_file",
    "read_yaml_mapping",
    "train_config_hints",
]

# The spellings HfArgumentParser takes for a boolean flag.
TRUE, FALSE = ("true", "yes", "y", "t", "1"), ("false", "no", "n", "f", "0")


class ConfigError(ValueError):
    """Settings of the config (YAML keys or flags) that cannot be used; the message names each, one per line, and what
    it must be. ``problems`` holds those lines."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def read_config_file(path: Path, hints: dict[str, Any]) -> dict[str, Any]:
    """The keys of the YAML file at ``path`` with their values as the types in ``hints`` (field name -> type hint).

    Raises :class:`ConfigError` naming the file: for a file that is not a YAML mapping, and at once for every key that
    is not a field (each with its closest field) and every value of another type.
    """
    values = read_yaml_mapping(path)
    see = "see TrainConfig in train/config.py and TRL's GRPOConfig"
    unknown = sorted(str(key) for key in set(values) - set(hints))
    problems = []
    if unknown:
        named = ", ".join(key + _closest(key, sorted(hints)) for key in unknown)
        problems.append(f"{path}: unknown field{'s' if len(unknown) > 1 else ''} {named}; {see}")
    typed = {}
    for key, value in values.items():
        if key not in hints:
            continue
        try:
            typed[key] = as_type(value, hints[key])
        except TypeError:
            one = typing.get_origin(hints[key]) is list and _fits_item(value, hints[key])
            fix = f": write [{value}]" if one else ""
            problems.append(f"{path}: {key}: {yaml_text(value)} is not {describe_type(hints[key])}{fix}")
    if problems:
        raise ConfigError(*problems)
    return typed


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; :class:`ConfigError` for a missing file, bad YAML or another value."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from error
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must be a mapping of field: value lines, got {type(values).__name__}")
    return values


def config_relative(location: str, config_dir: Path) -> Path:
    """Where a config's file path points: as written when absolute or found from where the command runs, else next to
    the config (``config_dir``). Task sources, the checks made before the imports and the model card all read it so."""
    path = Path(location)
    return path if path.is_absolute() or path.exists() else config_dir / location


def train_config_hints() -> dict[str, Any]:
    """TrainConfig's fields and their types, read from train/config.py's source: importing that module loads TRL
    (about 20 s), and the checks made before that import need only these (tests/train/test_config_cli.py holds them
    equal to the class's own)."""
    import ast

    tree = ast.parse(Path(__file__).with_name("config.py").read_text())
    [train_config] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainConfig"]
    names = {"Any": Any, "list": list, "dict": dict, "str": str, "int": int, "float": float, "bool": bool}
    return {
        node.target.id: eval(ast.unparse(node.annotation), {"__builtins__": {}}, names)  # our own source's annotations
        for node in train_config.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def _closest(name: str, names: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _fits_item(value: Any, hint: Any) -> bool:
    """Whether ``value`` alone is a valid item of the list type ``hint`` (a list of one was meant)."""
    try:
        as_type(value, typing.get_args(hint)[0])
    except (TypeError, IndexError):
        return False
    return True


def yaml_text(value: Any) -> str:
    """A value as the user wrote it, near enough: strings quoted, the rest as YAML flow text."""
    return repr(value) if isinstance(value, str) else json.dumps(value, default=str)


def as_type(value: Any, hint: Any) -> Any:
    """``value`` as type ``hint`` (numbers written as text, such as YAML's ``1e-3``, become numbers); TypeError when
    it is not one. Types this does not know (dicts, callables) pass unchecked: the config's own checks see them."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (arg for arg in args if arg is not type(None)):
            try:
                return as_type(value, option)
            except TypeError:
                continue
        raise TypeError(value)
    if origin is typing.Literal:
        if value in args:
            return value
        raise TypeError(value)
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(value)
        return [as_type(item, args[0]) for item in value] if args else value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str | int) and str(value).lower() in (*TRUE, *FALSE):
            return str(value).lower() in TRUE
        raise TypeError(value)
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(value)
        try:
            number = hint(value)
        except ValueError:
            raise TypeError(value) from None
        if hint is int and isinstance(value, float) and number != value:
            raise TypeError(value)  # 2.5 steps
        return number
    if hint is str:
        if isinstance(value, bool) or value is None or not isinstance(value, str | int | float):
            raise TypeError(value)
        return str(value)  # a path or name YAML read as a number (output_dir: 2024)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if value in {member.value for member in hint} or isinstance(value, hint):
            return value
        raise TypeError(value)
    return value


def describe_type(hint: Any) -> str:
    """How a message names a type: ``an integer``, ``a number``, ``true or false``, ``a list of strings``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        named = [describe_type(arg) for arg in args if arg is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is list:
        return "a list" + (f" of {PLURALS.get(args[0], 'values')}" if args else "")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in hint)
    return NAMES.get(hint, f"a {getattr(hint, '__name__', hint)}")


NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
PLURALS = {int: "integers", float: "numbers", bool: "true/false values", str: "strings"}
