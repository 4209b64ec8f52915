"""An OpenAI-compatible gateway that turns any agent program's LLM calls into training data.

:class:`Gateway` serves ``/sessions/{id}/v1/chat/completions`` and ``/sessions/{id}/v1/completions`` on 127.0.0.1 in
front of one of our policies and records each session's calls as a :class:`~rllm_gym.types.Trajectory` of Steps with
exact token ids and log-probabilities (:mod:`rllm_gym.gateway.server`); the wire format and its checks are in
:mod:`rllm_gym.gateway.protocol`. :mod:`rllm_gym.sdk` runs a program against it as an episode.
"""

from rllm_gym.gateway.protocol import RequestError
from rllm_gym.gateway.server import Gateway, GatewaySession, SessionLimitError

__all__ = ["Gateway", "GatewaySession", "RequestError", "SessionLimitError"]
