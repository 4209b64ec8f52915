"""ScriptedPolicy: canned or function-generated replies with fake token ids and logprobs, for tests and demos.

Envs, agents, engines and trainers are tested with it instead of a model: replies come from a list (in order) or a
function of the messages, and go through the same ModelOutput construction as the real backends, so reasoning and
tool calls are split out exactly as they would be from a model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from rllm_gym.policies.base import BasePolicy, Messages, PolicyError, PolicyRequest, SamplingParams, build_model_output
from rllm_gym.policies.tokens import TokenHistory, prompt_ids_for
from rllm_gym.types import ModelOutput, Step

__all__ = ["ScriptedPolicy"]

Reply = str | ModelOutput


class ScriptedPolicy(BasePolicy):
    """A policy that plays a script.

    Args:
        replies: a list of replies used in order (``str`` or a full ``ModelOutput``), or a function
            ``(messages) -> reply`` (sync or async) called for every request.
        cycle: start the list over when it runs out instead of raising.
        tokenizer: used for real token ids when given (the prompt rendered by its chat template, when it has one);
            otherwise ids are the UTF-8 bytes of the text (prompt: of the last message). Each logprob is
            ``fake_logprob``. With a chat template, an episode's later prompts continue the previous call's ids as
            the real backends' do (``token_history="sampled"``), or re-render the chat (``"template"``).

    ``calls`` records the messages of every request. The length limit is honoured like a model would: with fake
    ids, a reply longer than ``max_tokens`` bytes is cut and its finish reason is ``"length"``.

    Example::

        policy = ScriptedPolicy(lambda messages: f"you said {messages[-1]['content']}")
        out = await policy.generate([{"role": "user", "content": "hi"}])
        assert out.content == "you said hi"
    """

    def __init__(
        self,
        replies: Sequence[Reply] | Callable[[Messages], Any],
        *,
        cycle: bool = False,
        tokenizer: Any = None,
        fake_logprob: float = -0.5,
        token_history: TokenHistory = "sampled",
    ) -> None:
        if isinstance(replies, str):
            raise TypeError("ScriptedPolicy(replies=...) takes a list of replies or a function, not a single string")
        if not callable(replies) and not isinstance(replies, Sequence):
            raise TypeError(f"ScriptedPolicy(replies=...) takes a list of replies or a function, got {replies!r}")
        self._replies = replies if callable(replies) else list(replies)
        if not callable(replies) and not self._replies:
            raise ValueError("ScriptedPolicy(replies=[]) has nothing to say: give at least one reply")
        super().__init__(tokenizer, token_history=token_history)
        self.cycle = cycle
        self.fake_logprob = fake_logprob
        self.calls: list[Messages] = []
        self._index = 0

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        messages = request.messages
        if messages is None:
            messages = [{"role": "user", "content": "", "prompt_ids": request.prompt_ids}]
        self.calls.append(list(messages))  # a copy: the caller's chat keeps growing
        reply = await self._next_reply(messages)
        if isinstance(reply, ModelOutput):
            return reply
        if not isinstance(reply, str):
            raise PolicyError(f"ScriptedPolicy replies must be str or ModelOutput, got {type(reply).__name__}")
        output = self._to_output(reply, messages, request.prompt_ids, request.params, request.previous)
        if request.on_token is not None and self.streams_tokens:
            for token in output.completion_ids:  # one at a time, as a model samples them
                request.on_token([token])
                await asyncio.sleep(0)
        return output

    @property
    def streams_tokens(self) -> bool:
        """With a tokenizer, ``generate(on_token=...)`` hands over a text reply's ids one by one before returning."""
        return self.tokenizer is not None

    async def _next_reply(self, messages: Messages) -> Reply:
        if callable(self._replies):
            reply = self._replies(messages)
            return await reply if asyncio.iscoroutine(reply) else reply
        if self._index >= len(self._replies):
            if not self.cycle:
                raise PolicyError(
                    f"ScriptedPolicy ran out of replies after {len(self._replies)} calls; "
                    "add more replies or pass cycle=True"
                )
            self._index = 0
        reply = self._replies[self._index]
        self._index += 1
        return reply

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(text.encode("utf-8"))

    def _to_output(
        self,
        reply: str,
        messages: Messages,
        prompt_ids: Sequence[int] | None,
        params: SamplingParams,
        previous: Step | None,
    ) -> ModelOutput:
        if prompt_ids is None and self.tokenizer is not None and self.tokenizer.chat_template:
            # As a real backend does: the previous call's tokens continued by the new messages (the first call: the
            # whole chat through the chat template), ready for the assistant's reply.
            prompt_ids = prompt_ids_for(self.tokenizer, messages, None, {}, previous, self.token_history)
        elif prompt_ids is None:
            prompt_ids = self._encode(str(messages[-1].get("content", ""))) if messages else []
        completion_ids = self._encode(reply)
        finish_reason = "stop"
        if len(completion_ids) > params.max_tokens:
            completion_ids = completion_ids[: params.max_tokens]
            finish_reason = "length"
            if self.tokenizer is not None:
                reply = self.tokenizer.decode(completion_ids)
            else:
                reply = bytes(completion_ids).decode("utf-8", errors="ignore")
        return build_model_output(
            reply,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            logprobs=[self.fake_logprob] * len(completion_ids),
            finish_reason=finish_reason,
        )
