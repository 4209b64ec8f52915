"""Lossless converters between an rllm_gym Episode and the agoge Trajectories of one episode.

:func:`episode_to_agoge` and :func:`agoge_to_episode` fill the fields that have a counterpart natively and carry
everything else in the reserved side-channel keys (``"rllm"`` in agoge ``metadata``, ``"agoge"`` in rllm
metadata/info); each first tries to read its input as the other's output and keeps that reading only when the round
trip reproduces the input exactly. The field mapping and side-channel layout are in :mod:`rllm_gym.agoge`'s docstring.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from rllm_gym import types as rl
from rllm_gym.agoge.schema import (
    _MESSAGE,
    SCHEMA_VERSION,
    AREEvaluatedTrajectory,
    AssistantMessage,
    Chat,
    ChatMessage,
    EvaluatedTrajectory,
    LLMEvaluatedTrajectory,
    TextContent,
    TimeStep,
    Trajectory,
    message_from_openai,
    message_to_openai,
)

_RLLM, _AGOGE = "rllm", "agoge"  # the reserved side-channel keys
_KINDS: dict[str, type[Trajectory]] = {
    cls.__name__: cls for cls in (Trajectory, AREEvaluatedTrajectory, LLMEvaluatedTrajectory)
}

# Converters. _rllm_to_agoge/_agoge_from_rllm and _agoge_to_rllm/_rllm_from_agoge are exact inverse pairs; the
# public functions pick a pair and check the round trip (see the docstring of rllm_gym.agoge).


def episode_to_agoge(episode: rl.Episode) -> list[Trajectory]:
    """One agoge Trajectory per trajectory of ``episode``; :func:`agoge_to_episode` gives ``episode`` back."""
    if isinstance(episode.metadata.get(_AGOGE), dict):
        try:
            trajectories = _agoge_from_rllm(episode)
            if trajectories and _agoge_to_rllm(trajectories) == episode:
                return trajectories
        except (ValidationError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            pass  # user data that only looks like ours: carry all of it instead
    return _rllm_to_agoge(episode)


def agoge_to_episode(trajectories: list[Trajectory]) -> rl.Episode:
    """The rllm_gym Episode of agoge trajectories of one episode; :func:`episode_to_agoge` gives them back."""
    if not trajectories:
        raise ValueError("trajectories is empty: pass the agoge Trajectories of one episode (at least one)")
    ids = {t.episode_id for t in trajectories}
    if len(ids) > 1:
        raise ValueError(f"episode_id differs between trajectories ({sorted(map(str, ids))}): pass one episode")
    if all(isinstance(t.metadata.get(_RLLM), dict) for t in trajectories):
        try:
            episode = _rllm_from_agoge(trajectories)
            if _rllm_to_agoge(episode) == list(trajectories):
                return episode
        except (ValidationError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            pass
    return _agoge_to_rllm(trajectories)


def _messages_from_openai(dicts: list[dict[str, Any]]) -> tuple[list[ChatMessage], dict[str, Any]]:
    """Messages for the dicts, plus the dicts (by index) that the messages do not reproduce exactly."""
    messages, verbatim = [], {}
    for i, d in enumerate(dicts):
        message = message_from_openai(d)
        messages.append(message)
        if message_to_openai(message) != d:
            verbatim[str(i)] = d
    return messages, verbatim


def _rllm_to_agoge(episode: rl.Episode) -> list[Trajectory]:
    def shell(side: dict[str, Any], timesteps: list[TimeStep]) -> Trajectory:
        episode_data = episode.model_dump(exclude={"trajectories"})  # a fresh copy per trajectory: nothing shared
        error = episode.termination_reason == rl.TerminationReason.ERROR
        return Trajectory(
            timesteps=timesteps,
            reset_kwargs={"task": copy.deepcopy(episode_data["task"])} if episode.task is not None else {},
            error_info={"termination_reason": "error"} if error else None,
            episode_id=episode.id,
            metadata={_RLLM: {"episode": episode_data, **side}},
        )

    if not episode.trajectories:
        return [shell({"trajectory": None}, [])]
    out = []
    for trajectory in episode.trajectories:
        timesteps = []
        for step in trajectory.steps:
            messages, verbatim = _messages_from_openai(step.chat_completions)
            native = {"reward", "done", "advantage", "mc_return", "chat_completions"}
            side = {"step": step.model_dump(exclude=native), "verbatim": copy.deepcopy(verbatim)}
            timesteps.append(
                TimeStep(
                    chats=[Chat(messages=messages)], reward=step.reward, done=step.done, advantage=step.advantage,
                    mc_return=step.mc_return, metadata={_RLLM: side},
                )
            )  # fmt: skip
        out.append(shell({"trajectory": trajectory.model_dump(exclude={"steps"})}, timesteps))
    return out


def _rllm_from_agoge(trajectories: list[Trajectory]) -> rl.Episode:
    rllm_trajectories = []
    for trajectory in trajectories:
        side = copy.deepcopy(trajectory.metadata[_RLLM])  # the records built here must not share its objects
        if side["trajectory"] is None:
            continue
        steps = []
        for timestep in trajectory.timesteps:
            (chat,) = timestep.chats
            step_side = copy.deepcopy(timestep.metadata[_RLLM])
            verbatim = step_side["verbatim"]
            chat_completions = [verbatim.get(str(i)) or message_to_openai(m) for i, m in enumerate(chat.messages)]
            steps.append(
                rl.Step.model_validate(
                    {**step_side["step"], "chat_completions": chat_completions, "reward": timestep.reward,
                     "done": timestep.done, "advantage": timestep.advantage, "mc_return": timestep.mc_return}
                )
            )  # fmt: skip
        rllm_trajectories.append(rl.Trajectory.model_validate({**side["trajectory"], "steps": steps}))
    episode_data = copy.deepcopy(trajectories[0].metadata[_RLLM]["episode"])
    return rl.Episode.model_validate({**episode_data, "trajectories": rllm_trajectories})


def _assistant_text(messages: list[ChatMessage]) -> str:
    if not messages or not isinstance(messages[-1], AssistantMessage) or messages[-1].content is None:
        return ""
    content = messages[-1].content
    return content if isinstance(content, str) else "".join(p.text for p in content if isinstance(p, TextContent))


def _agoge_to_rllm(trajectories: list[Trajectory]) -> rl.Episode:
    episode_id = trajectories[0].episode_id
    try:
        rllm_id = rl.Episode(id=episode_id).id if episode_id else None
    except ValidationError:
        rllm_id = None
    rllm_id = rllm_id or f"{episode_id or 'agoge'}:0"
    evaluated = [t.evaluation for t in trajectories if isinstance(t, EvaluatedTrajectory)]
    rllm_trajectories = []
    for index, trajectory in enumerate(trajectories):
        uid = f"{rllm_id}/{index}"
        steps = []
        for t, timestep in enumerate(trajectory.timesteps):
            last = len(timestep.chats) - 1
            for c, chat in enumerate(timestep.chats):
                openai = [message_to_openai(m) for m in chat.messages]
                verbatim = {
                    str(i): m.model_dump() for i, (m, d) in enumerate(zip(chat.messages, openai, strict=True))
                    if message_from_openai(d) != m
                }  # fmt: skip
                side: dict[str, Any] = {"timestep": t, "logprobs": copy.copy(chat.logprobs), "verbatim": verbatim}
                if c == last:
                    side["fields"] = timestep.model_dump(exclude={"chats"})
                steps.append(
                    rl.Step(
                        id=f"{uid}/{t}/{c}", chat_completions=openai, model_response=_assistant_text(chat.messages),
                        reward=(timestep.reward or 0.0) if c == last else 0.0, done=timestep.done and c == last,
                        advantage=timestep.advantage, mc_return=timestep.mc_return or 0.0, info={_AGOGE: side},
                    )
                )  # fmt: skip
        rewards = [ts.reward for ts in trajectory.timesteps if ts.reward is not None]
        side = {"kind": type(trajectory).__name__, "fields": trajectory.model_dump(exclude={"timesteps"})}
        rllm_trajectories.append(
            rl.Trajectory(
                uid=uid, name="agent" if len(trajectories) == 1 else f"agent_{index}",
                task=copy.deepcopy(trajectory.reset_kwargs.get("task")), steps=steps,
                reward=sum(rewards) if rewards else None, metadata={_AGOGE: side},
            )
        )  # fmt: skip
    return rl.Episode(
        id=rllm_id,
        task=copy.deepcopy(trajectories[0].reset_kwargs.get("task")),
        termination_reason=rl.TerminationReason.ERROR if any(t.error_info is not None for t in trajectories)
        else None,
        is_correct=bool(evaluated) and all(e.get("success") is True for e in evaluated),
        trajectories=rllm_trajectories,
        metadata={_AGOGE: {"schema_version": SCHEMA_VERSION}},
    )  # fmt: skip


def _agoge_from_rllm(episode: rl.Episode) -> list[Trajectory]:
    out = []
    for trajectory in episode.trajectories:
        side = copy.deepcopy(trajectory.metadata[_AGOGE])  # the records built here must not share its objects
        timesteps: list[TimeStep] = []
        chats: list[Chat] = []
        for step in trajectory.steps:
            step_side = copy.deepcopy(step.info[_AGOGE])
            verbatim = step_side["verbatim"]
            messages = [
                _MESSAGE.validate_python(verbatim[str(i)]) if str(i) in verbatim else message_from_openai(d)
                for i, d in enumerate(step.chat_completions)
            ]
            chats.append(Chat(messages=messages, logprobs=step_side["logprobs"]))
            if "fields" in step_side:  # the last Chat of its TimeStep
                timesteps.append(TimeStep.model_validate({**step_side["fields"], "chats": chats}))
                chats = []
        if chats:
            raise ValueError("steps end in the middle of a TimeStep")
        out.append(_KINDS[side["kind"]].model_validate({**side["fields"], "timesteps": timesteps}))
    return out
