"""The agoge trajectory schema (Chat, TimeStep, Task, Trajectory and its evaluated forms) and lossless converters.

agoge groups an episode into TimeSteps, each holding one or more immutable Chats; rllm_gym groups it into
Trajectories of Steps, one Step per LLM call. Both are pydantic v2 models here, and :func:`episode_to_agoge` /
:func:`agoge_to_episode` translate between them so that ``agoge_to_episode(episode_to_agoge(ep)) == ep`` and
``episode_to_agoge(agoge_to_episode(ts)) == ts``. Fields with a counterpart are filled natively (table below);
everything else travels in a side channel, the reserved key ``"rllm"`` of agoge ``metadata`` (an extension field
on TimeStep and Trajectory that agoge readers ignore) or ``"agoge"`` of rllm metadata/info. Each converter first
tries to read its input as the output of the opposite converter and keeps that reading only when converting back
reproduces the input exactly, so user data that happens to use a reserved key, or an edited record, is never lost.

============================  ========================================  ==========================================
rllm_gym (types.py)           agoge (this module)                       note
============================  ========================================  ==========================================
Episode (one)                 list[Trajectory], one per rllm Trajectory  an Episode with no trajectories gives one
                                                                        Trajectory with no timesteps
Episode.id                    Trajectory.episode_id                     ids not shaped ``task:idx`` get ``:0``
Episode.task                  Trajectory.reset_kwargs["task"]           as ``env.reset(options={"task": ...})``
Episode.termination_reason    Trajectory.error_info                     ``ERROR`` <-> error_info is not None
Episode.is_correct            evaluation["success"]                     agoge -> rllm only
Step (one LLM call)           TimeStep with one Chat                    a TimeStep with k Chats gives k Steps
Step.chat_completions         Chat.messages                             OpenAI dicts; see :func:`message_to_openai`
Step.reward/done/advantage/   TimeStep.reward/done/advantage/mc_return  a multi-Chat TimeStep's reward and done go
mc_return                                                               on its last Step
Step.model_response           last assistant message's text             agoge -> rllm only
everything else (ids, token   metadata["rllm"] / metadata, info         Chat.logprobs (per templated token) is
ids, logprobs, model_output,  ["agoge"]                                 not Step.logprobs (per response token)
signals, artifacts, ...)
============================  ========================================  ==========================================

Side channels: agoge ``Trajectory.metadata["rllm"]`` = ``{"episode": Episode fields but trajectories,
"trajectory": Trajectory fields but steps}``; ``TimeStep.metadata["rllm"]`` = ``{"step": Step fields but the native
ones, "verbatim": {index: chat dict no message reproduces}}``. rllm ``Trajectory.metadata["agoge"]`` =
``{"kind": class name, "fields": all but timesteps}``; ``Step.info["agoge"]`` = ``{"timestep": t, "logprobs":
Chat.logprobs, "verbatim": {index: message}, "fields": TimeStep fields but chats (last Step of a TimeStep only)}``;
``Episode.metadata["agoge"]`` marks an import.
"""

from rllm_gym.agoge import schema
from rllm_gym.agoge.convert import agoge_to_episode, episode_to_agoge
from rllm_gym.agoge.schema import *  # noqa: F403  # the schema's public names, listed once in schema.__all__
from rllm_gym.agoge.schema import Content as Content  # type aliases: importable, outside __all__ as before
from rllm_gym.agoge.schema import ContentPart as ContentPart

__all__ = [*schema.__all__, "agoge_to_episode", "episode_to_agoge"]
