"""Agent and env arguments checked against what the classes accept, before any episode (or model) starts.

Without this, a misspelt key in ``agent_args`` or ``env_args`` surfaced as a ``TypeError`` deep in a workflow, after
the model had loaded; now the error names the argument, the closest accepted name and every accepted one.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from typing import Any

__all__ = ["accepted_arguments", "check_arguments", "check_keys"]

# gym.make's own keywords, which env_args may carry next to the env class's.
GYM_MAKE_ARGUMENTS = ("max_episode_steps", "disable_env_checker", "render_mode")


def accepted_arguments(target: Any) -> set[str] | None:
    """The keyword names a class (through the ``**kwargs`` its ``__init__`` passes up) or function accepts; None when
    it takes any keyword."""
    if not isinstance(target, type):
        own, forwards = _keywords(target)
        return None if forwards else own
    names: set[str] = set()
    for cls in target.__mro__:
        if cls is object:
            return names
        if "__init__" not in vars(cls):
            continue
        own, forwards = _keywords(cls.__init__)
        if own is None:
            return None
        names |= own
        if not forwards:
            return names
    return names


def _keywords(function: Any) -> tuple[set[str] | None, bool]:
    """(keyword names, whether it takes ``**kwargs``); names None when the signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None, True
    names = {
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "cls")
    }
    return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def check_keys(label: str, owner: str, given: Iterable[str], accepted: set[str] | None) -> None:
    """Raise ValueError naming the first key of ``given`` that ``accepted`` lacks, the closest match and the rest."""
    if accepted is None:
        return
    for key in given:
        if key in accepted:
            continue
        close = difflib.get_close_matches(key, sorted(accepted), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{label}: {owner} takes no argument {key!r}{hint}; it accepts {', '.join(sorted(accepted)) or 'none'}"
        )


def check_arguments(
    env_id: str,
    *,
    agent: str | None = None,
    agent_args: dict[str, Any] | None = None,
    env_args: dict[str, Any] | None = None,
) -> None:
    """Check ``env_args`` and ``agent_args`` of a registered id against its env and agent classes (ValueError)."""
    from rllm_gym.registry import ENV_SPECS, default_agent, load

    spec = next((spec for spec in ENV_SPECS if spec.id == env_id), None)
    if spec is None:  # an id users registered with Gymnasium themselves: nothing known to check against
        return
    factory = load(spec.entry_point)
    accepted = accepted_arguments(factory)
    if accepted is not None:
        accepted |= {"parallel"} if spec.multi_agent else set(GYM_MAKE_ARGUMENTS)
    check_keys("env_args", f"{env_id} ({getattr(factory, '__name__', spec.entry_point)})", env_args or {}, accepted)
    if spec.multi_agent:
        for role, agent_cls in default_agent(env_id).items():
            args = (agent_args or {}).get(role) or {}
            check_keys(f"agent_args[{role!r}]", agent_cls.__name__, args, accepted_arguments(agent_cls))
        return
    agent_cls = load(agent) if agent else default_agent(env_id)
    check_keys("agent_args", agent_cls.__name__, agent_args or {}, accepted_arguments(agent_cls))
