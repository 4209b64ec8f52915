"""The gateway: an OpenAI-compatible HTTP server on 127.0.0.1 that records every call of a session as a Step.

A session is one episode of an agent program. Its id is 32 random bytes (``secrets.token_urlsafe``), so the only
way to read or write a session is to have been given its URL: ``{url}/sessions/{id}/v1`` is the ``base_url`` a
program's OpenAI client needs, and nothing else. Under it, ``POST .../chat/completions`` and ``POST .../completions``
run on the gateway's policy; each call (each choice, with ``n`` > 1) becomes a Step of the session's Trajectory with
the exact prompt and completion token ids and log-probabilities. A chat that extends a recorded call (that call's
messages plus the reply the client got) continues that call's prompt and sampled ids token for token
(:mod:`rllm_gym.policies.tokens`); any other chat is rendered whole and starts a new training row.
``GET /sessions/{id}`` returns the trajectory, ``POST /sessions/{id}/reward`` sets its reward or named signals
(finite numbers: NaN and infinities are refused),
``POST /sessions`` opens a session over HTTP (``{"task": ..., "max_turns": N}``, both optional) and
``DELETE /sessions/{id}`` closes one. A session opened with ``max_turns`` refuses its call ``N + 1`` with a 400
``max_turns_exceeded`` (not retried by OpenAI clients), which the SDK turns into the episode's ``MAX_TURNS_EXCEEDED``.

``stream: true`` is answered with Server-Sent Events in OpenAI's ``chat.completion.chunk`` shape (per choice: role and
content, tool calls with their index, finish reason; usage last when ``stream_options.include_usage``). With a policy
that streams tokens (HFPolicy, VLLMPolicy) a chat reply's content, or a completion's text, goes out token by token as
it is generated (:mod:`rllm_gym.gateway.streaming`); with any other policy the chunks are sent once the reply is
complete.

Every request body is checked (:mod:`rllm_gym.gateway.protocol`); a bad one gets an OpenAI-shaped 400 naming the field,
an unknown session 404, a prompt that does not fit the context 400 ``context_length_exceeded`` (also where an
upstream OpenAI-compatible server refuses it so: a 400, 413 or 422 of the upstream's is the client's 400, with its
reason), a policy failure 502 (an infrastructure failure, never a wrong answer), and any other fault 500: no request
ends the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import secrets
import sys
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rllm_gym.gateway.protocol import (
    RequestError,
    apply_tool_choice,
    assistant_message,
    chat_chunks,
    chat_response,
    check_body,
    completion_response,
    error_body,
    finite_number,
    parse_chat_request,
    parse_completion_request,
    readable_calls,
)
from rllm_gym.gateway.recording import model_context, previous_step, record_step, vocab_size
from rllm_gym.gateway.streaming import ContentStream, opens_reasoning, send_chunks, stream_reply
from rllm_gym.policies.base import BasePolicy, Policy, PolicyError, PolicyRequest, SamplingParams
from rllm_gym.policies.openai import RequestRejected
from rllm_gym.types import ModelOutput, Step, Trajectory

__all__ = ["Gateway", "GatewaySession", "SessionLimitError"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_SESSIONS = 4096
DEFAULT_BATCH_WAIT_S = 0.05
OFF_THE_LOOP_CHARS = 64_000  # about 16k tokens: a few ms of rendering and tokenizing on the loop, at most


async def _off_the_loop(work: Callable[[], Any], size: int) -> Any:
    """``work()`` (rendering or tokenizing a prompt of ``size`` characters): inline when small, as nearly every call
    is, else in a worker thread, so that a client's megabytes of chat (seconds of rendering) never stall the loop that
    serves every other session."""
    if size < OFF_THE_LOOP_CHARS:
        return work()
    return await asyncio.to_thread(work)


_CLIENT_STATUSES = frozenset({400, 413, 422})  # an upstream's answers to a request it cannot take as it is


def _upstream_reason(body: str) -> str:
    """The ``error.message`` of an upstream's error body (OpenAI's and vLLM's shape), else the body's start."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = json.loads(body)["error"]["message"]
        if isinstance(message, str):
            return message
    return body[:300]


class SessionLimitError(RuntimeError):
    """The gateway already has ``max_sessions`` sessions open."""


@dataclasses.dataclass
class GatewaySession:
    """One episode's recording: its id (the secret), its URLs and its Trajectory (filled in as calls arrive).

    ``max_turns`` is the most LLM calls the session takes (``None``: no limit); ``calls`` counts those it took, and
    ``turns_exceeded`` says a call past the limit was refused (400 ``max_turns_exceeded``). ``policy_error`` is the
    first policy failure one of its calls met (a 502): a program may catch that error and answer anyway, but its
    episode's outcome is then the infrastructure's, which the SDK reports as an error rather than score."""

    id: str
    base_url: str
    trajectory: Trajectory
    max_turns: int | None = None
    calls: int = 0
    turns_exceeded: bool = False
    policy_error: str | None = None

    @property
    def environ(self) -> dict[str, str]:
        """``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for a program in another process (the key is the session id:
        the gateway needs none, but OpenAI clients refuse to start without one)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.id}


class Gateway:
    """An OpenAI-compatible server in front of ``policy``, recording each session's calls as a Trajectory.

    Args:
        policy: any :class:`~rllm_gym.policies.Policy`. With a :class:`~rllm_gym.policies.base.BasePolicy` (HFPolicy,
            VLLMPolicy, OpenAIPolicy with a tokenizer) the gateway builds the prompt ids itself, so it can refuse a
            prompt over ``max_context_tokens`` before generating.
        sampling_params: defaults for the fields a request leaves out (``max_tokens``, ``temperature``, ...).
        host, port: where to listen; ``port=0`` picks a free port (read :attr:`url` after :meth:`start`).
        max_context_tokens: prompt plus ``max_tokens`` must fit; defaults to the model's ``max_position_embeddings``
            when the policy has a model with that config field, else no limit.
        max_body_bytes: larger request bodies get a 413.
        max_sessions: the most sessions open at once; one more gets a 429 (HTTP) or a RuntimeError (Python), so a
            client that opens sessions in a loop cannot exhaust the memory.
        batch_wait_s: while the gateway is up, a batching policy (HFPolicy) whose batch does not yet hold every open
            session's call waits this long after its latest request for more (or its own ``batch_wait_s``, if
            longer): the loop sends a batch's replies one by one, and with a few milliseconds the next batch left
            without the programs still reading theirs, which then stayed a batch apart for the whole episode.

    Example::

        async with Gateway(HFPolicy()) as gateway:
            session = gateway.open_session(task={"question": "2+2?"})
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.id)
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "2+2?"}])
            trajectory = gateway.close_session(session.id)       # one Step with its token ids and logprobs
    """

    def __init__(
        self,
        policy: Policy,
        *,
        sampling_params: SamplingParams | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_context_tokens: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        batch_wait_s: float = DEFAULT_BATCH_WAIT_S,
    ) -> None:
        if not callable(getattr(policy, "generate", None)):
            raise TypeError(f"Gateway(policy=...) must be a Policy (an object with async generate()), got {policy!r}")
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"Gateway(sampling_params=...) must be a SamplingParams, got {sampling_params!r}")
        limits = (("max_context_tokens", max_context_tokens), ("max_body_bytes", max_body_bytes))
        for name, value in (*limits, ("max_sessions", max_sessions)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"Gateway({name}=...) must be an int >= 1, got {value!r}")
        if isinstance(batch_wait_s, bool) or not isinstance(batch_wait_s, (int, float)) or not 0 <= batch_wait_s < 60:
            raise ValueError(f"Gateway(batch_wait_s=...) must be seconds in [0, 60), got {batch_wait_s!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ValueError(f"Gateway(port=...) must be in [0, 65535] (0 picks a free port), got {port!r}")
        self.policy = policy
        self.sampling_params = sampling_params or SamplingParams()
        self.host, self.port = host, port
        self.max_context_tokens = max_context_tokens or model_context(policy)
        self.max_body_bytes = max_body_bytes
        self.max_sessions = max_sessions
        self.batch_wait_s = batch_wait_s
        self.tokenizer = getattr(policy, "tokenizer", None)
        self.url = ""
        self._sessions: dict[str, GatewaySession] = {}
        self._runner: web.AppRunner | None = None
        self._paces_batches = False
        self._policy_batch_wait_s = 0.0  # the policy's own, restored at close

    # Life cycle

    async def start(self) -> str:
        """Listen and return the gateway's URL (``http://127.0.0.1:<port>``)."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/sessions", self._open)
        app.router.add_get("/sessions/{sid}", self._get)
        app.router.add_delete("/sessions/{sid}", self._delete)
        app.router.add_post("/sessions/{sid}/reward", self._reward)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat)
        app.router.add_post("/sessions/{sid}/v1/completions", self._completions)
        app.router.add_get("/sessions/{sid}/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        hf = sys.modules.get("rllm_gym.policies.hf")  # a BatchingPolicy exists only once its module was imported
        if hf is not None and isinstance(self.policy, hf.BatchingPolicy) and self.policy.expected_requests is None:
            # Each open session has at most one call coming (as an episode in flight has): a batch goes out as soon
            # as every open session is in it, rather than splitting when replies reach programs a few ms apart.
            self.policy.expected_requests = self._expected_requests
            self._policy_batch_wait_s = self.policy.batch_wait_s
            self.policy.batch_wait_s = max(self.policy.batch_wait_s, self.batch_wait_s)
            self._paces_batches = True
        port = runner.addresses[0][1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self.url = ""
        if self._paces_batches:
            self.policy.expected_requests = None
            self.policy.batch_wait_s = self._policy_batch_wait_s
            self._paces_batches = False

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Sessions

    def open_session(self, task: Any = None, *, name: str = "agent", max_turns: int | None = None) -> GatewaySession:
        """A new session (the gateway must be started) whose Trajectory has ``task`` and ``input={"task": task}``;
        with ``max_turns``, its call number ``max_turns + 1`` is refused (400 ``max_turns_exceeded``)."""
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"open_session(max_turns=...) must be an int >= 1 (LLM calls) or None, got {max_turns!r}")
        if not self.url:
            raise RuntimeError("Gateway.open_session() needs a started gateway: await gateway.start() first")
        if len(self._sessions) >= self.max_sessions:
            raise SessionLimitError(
                f"the gateway has {len(self._sessions)} sessions open, its max_sessions: close finished ones "
                "(DELETE /sessions/{id}) or raise Gateway(max_sessions=...)"
            )
        sid = secrets.token_urlsafe(32)
        trajectory = Trajectory(name=name, task=task, input={"task": task})
        session = GatewaySession(sid, f"{self.url}/sessions/{sid}/v1", trajectory, max_turns)
        self._sessions[sid] = session
        return session

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def close_session(self, sid: str) -> Trajectory:
        """Forget the session and return its Trajectory; later calls under it get 404, and a call still running is
        answered but not recorded (the Trajectory returned here is the episode's last word)."""
        session = self._sessions.pop(sid, None)
        if session is None:
            raise KeyError(f"no open gateway session {sid[:8]}...")
        if self._paces_batches:
            self.policy.requests_changed()  # one call fewer to wait for
        return session.trajectory

    def _expected_requests(self) -> int:
        return max(1, len(self._sessions))

    def _session(self, request: web.Request) -> GatewaySession:
        session = self._sessions.get(request.match_info["sid"])
        if session is None:
            raise RequestError(
                "no such session: open one with POST /sessions (or the SDK), and use its URL as is",
                status=404,
                code="session_not_found",
                param=None,
            )
        return session

    def _record(self, session: GatewaySession, output: ModelOutput, chat: list[dict[str, Any]], tools: Any) -> None:
        """Record a finished call, unless its session closed while it ran: that episode is over (its Trajectory may be
        scored and training already), so a late call (a program's background thread, say) is answered, not kept."""
        if self._sessions.get(session.id) is session:
            record_step(session.trajectory, output, chat, tools)

    @staticmethod
    def _count_call(session: GatewaySession) -> None:
        """Count one LLM call of ``session``, or refuse it past the session's ``max_turns``."""
        if session.max_turns is not None and session.calls >= session.max_turns:
            session.turns_exceeded = True
            raise RequestError(
                f"this session's limit of {session.max_turns} LLM calls (max_turns) is reached: the episode ends "
                "here, return the program's answer",
                code="max_turns_exceeded",
            )
        session.calls += 1

    # Handlers

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as error:
            return web.json_response(error.body(), status=error.status)
        except web.HTTPRequestEntityTooLarge:
            message = f"the request body is over the gateway's limit of {self.max_body_bytes} bytes"
            return web.json_response(error_body(message, code="request_too_large"), status=413)
        except web.HTTPException as error:  # aiohttp's own 404/405 for unknown paths
            body = error_body(f"{error.reason}: {request.method} {request.path}", code=f"http_{error.status}")
            return web.json_response(body, status=error.status)
        except PolicyError as error:
            return web.json_response(error_body(str(error), type="server_error", code="policy_error"), status=502)
        except (ConnectionResetError, asyncio.CancelledError):  # the client went away mid-reply
            raise
        except Exception as error:  # never the server: a fault in one request is that request's 500
            logger.exception("gateway request %s %s failed", request.method, request.path)
            message = f"internal error: {type(error).__name__}: {error}"
            return web.json_response(error_body(message, type="server_error"), status=500)

    async def _json(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as error:  # ValueError: bad UTF-8, bad JSON, an int of 4300+ digits
            raise RequestError(f"the request body is not valid JSON: {error}"[:300], param=None) from None
        return check_body(body)

    async def _open(self, request: web.Request) -> web.Response:
        body = await self._json(request) if request.can_read_body else {}
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object such as {'task': {...}}", param=None)
        max_turns = body.get("max_turns")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
            raise RequestError("'max_turns' must be an integer >= 1 (LLM calls) or null", param="max_turns")
        try:
            session = self.open_session(body.get("task"), max_turns=max_turns)
        except SessionLimitError as error:
            raise RequestError(str(error), status=429, code="too_many_sessions", type="rate_limit_error") from None
        return web.json_response({"id": session.id, "base_url": session.base_url}, status=201)

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(self._session(request).trajectory.to_dict())

    async def _delete(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return web.json_response(self.close_session(session.id).to_dict())

    async def _models(self, request: web.Request) -> web.Response:
        self._session(request)
        return web.json_response(
            {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "rllm-gym"}]}
        )

    async def _reward(self, request: web.Request) -> web.Response:
        self._session(request)  # an unknown session is a 404 before its body is read
        body = await self._json(request)
        session = self._session(request)  # a session closed while the body came in is over: 404, not a late reward
        if not isinstance(body, dict) or not ({"reward", "signals"} & body.keys()):
            raise RequestError("the body must be {'reward': <number>} and/or {'signals': {name: number}}", param=None)
        reward, signals = body.get("reward"), body.get("signals", {})
        # A reward of NaN or an infinity (JSON as Python reads it takes both) would train on garbage: refused.
        if reward is not None and finite_number(reward) is None:
            raise RequestError(f"'reward' must be a finite number, got {json.dumps(reward)[:80]}", param="reward")
        if not isinstance(signals, dict) or not all(finite_number(v) is not None for v in signals.values()):
            raise RequestError("'signals' must be an object of finite numbers, e.g. {'format': 1.0}", param="signals")
        trajectory = session.trajectory
        if reward is not None:
            trajectory.reward = finite_number(reward)
        if signals:
            trajectory.signals = {**trajectory.signals, **{str(k): finite_number(v) for k, v in signals.items()}}
        return web.json_response({"reward": trajectory.reward, "signals": trajectory.signals})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        chat = parse_chat_request(await self._json(request))
        params = self._params(chat.sampling)
        previous = previous_step(session.trajectory, chat.messages)
        size = max(request.content_length or 0, sum(len(message["content"]) for message in chat.messages))
        prompt_ids = await self._prompt_ids(PolicyRequest(chat.messages, None, params, chat.tools, previous), size)
        opening = chat.tool_choice.opening
        if opening is not None:  # a call is required: the reply starts with the tool-call opening, as prompt tokens
            if prompt_ids is None:
                raise RequestError(
                    "'tool_choice' 'required' or a named function needs a policy with a tokenizer (the gateway starts "
                    "the reply with the tool-call opening as prompt tokens); this one has none: use 'auto'",
                    param="tool_choice",
                )
            prompt_ids = [*prompt_ids, *self.tokenizer.encode(opening, add_special_tokens=False)]
        params = self._fit(prompt_ids, params, chat.sampling.max_tokens is None)
        self._count_call(session)  # a request refused above made no LLM call

        def finish(outputs: list[ModelOutput]) -> dict[str, Any]:
            outputs = [readable_calls(apply_tool_choice(output, chat.tool_choice)) for output in outputs]
            replies = [assistant_message(output) for output in outputs]
            for output, reply in zip(outputs, replies, strict=True):
                self._record(session, output, [*chat.messages, reply], chat.tools)
            return chat_response(outputs, replies, chat.model, self.tokenizer, chat.logprobs)

        def generate(on_tokens: list[Any] | None = None) -> Any:
            messages, tools = chat.messages, chat.tools
            return self._generate(session, chat.sampling.n, params, messages, tools, previous, prompt_ids, on_tokens)

        if chat.stream and prompt_ids is not None and getattr(self.policy, "streams_tokens", False):
            # A reply that continues a forced tool-call opening has no content to send as it comes.
            live, reasoning = opening is None, opens_reasoning(self.tokenizer, prompt_ids)
            streams = [ContentStream(self.tokenizer, params.stop, live=live, in_reasoning=reasoning)]
            streams += [
                ContentStream(self.tokenizer, params.stop, live=live, in_reasoning=reasoning)
                for _ in range(chat.sampling.n - 1)
            ]
            return await stream_reply(
                request, generate, finish, streams, model=chat.model, include_usage=chat.include_usage
            )
        response = finish(await generate())
        if chat.stream:  # a policy with whole replies only: the reply's chunks at once
            return await send_chunks(request, chat_chunks(response, chat.include_usage))
        return web.json_response(response)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        completion = parse_completion_request(await self._json(request))
        params = self._params(completion.sampling)
        if isinstance(completion.prompt, str):
            if self.tokenizer is None:
                raise RequestError(
                    "this gateway's policy has no tokenizer: send 'prompt' as token ids", param="prompt"
                )
            encode = functools.partial(self.tokenizer.encode, completion.prompt, add_special_tokens=False)
            prompt_ids = list(await _off_the_loop(encode, len(completion.prompt)))
        else:
            prompt_ids = self._known_ids(completion.prompt)
        params = self._fit(prompt_ids, params, completion.sampling.max_tokens is None)
        self._count_call(session)

        def finish(outputs: list[ModelOutput]) -> dict[str, Any]:
            outputs = [readable_calls(output) for output in outputs]  # the text stays raw; the record stays readable
            for output in outputs:
                self._record(session, output, [], None)
            return completion_response(outputs, completion.model, self.tokenizer, completion.logprobs)

        def generate(on_tokens: list[Any] | None = None) -> Any:
            return self._generate(session, completion.sampling.n, params, None, None, None, prompt_ids, on_tokens)

        if completion.stream and self.tokenizer is not None and getattr(self.policy, "streams_tokens", False):
            streams = [ContentStream(self.tokenizer, params.stop, raw=True) for _ in range(completion.sampling.n)]
            model = completion.model
            return await stream_reply(request, generate, finish, streams, model=model, include_usage=False, text=True)
        response = finish(await generate())
        if completion.stream:
            base = {key: response[key] for key in ("id", "object", "created", "model")}
            return await send_chunks(request, [{**base, "choices": [choice]} for choice in response["choices"]])
        return web.json_response(response)

    # Generation

    def _known_ids(self, ids: list[int]) -> list[int]:
        """``ids`` when every one is in the model's vocabulary (where the gateway knows its size): an id past it is
        the client's mistake (a 400), not a policy failure, and on a GPU it would fault the device for every
        session."""
        size = vocab_size(self.policy)
        if size is not None and max(ids) >= size:
            position = next(i for i, t in enumerate(ids) if t >= size)
            raise RequestError(
                f"'prompt[{position}]' is token id {ids[position]}, outside the model's vocabulary of {size} ids"[
                    :200
                ],
                param=f"prompt[{position}]",
            )
        return ids

    def _params(self, sampling: Any) -> SamplingParams:
        fields = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        }
        changes = {key: value for key, value in fields.items() if value is not None}
        if sampling.stop:
            changes["stop"] = sampling.stop
        return dataclasses.replace(self.sampling_params, **changes)

    async def _prompt_ids(self, request: PolicyRequest, size: int) -> list[int] | None:
        """The prompt ids the policy would build (continued from ``previous`` or rendered whole); ``None`` for a
        policy that does not work on token ids (it gets the messages). ``size``: the request's size in bytes."""
        if not isinstance(self.policy, BasePolicy) or self.policy.tokenizer is None:
            return None
        try:
            return await _off_the_loop(functools.partial(self.policy.prompt_token_ids, request), size)
        except Exception as error:  # a chat the template cannot render (a tool message without a call, ...)
            raise RequestError(
                f"the chat template cannot render 'messages': {error}"[:400], param="messages"
            ) from None

    def _fit(self, prompt_ids: list[int] | None, params: SamplingParams, default_max: bool) -> SamplingParams:
        limit = self.max_context_tokens
        if limit is None or prompt_ids is None:
            return params
        room = limit - len(prompt_ids)
        if room >= params.max_tokens:
            return params
        if default_max and room >= 1:  # the client did not ask for a length: the gateway's default shrinks to fit
            return dataclasses.replace(params, max_tokens=room)
        raise RequestError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(prompt_ids) + params.max_tokens} tokens ({len(prompt_ids)} in the messages, {params.max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="messages",
            code="context_length_exceeded",
        )

    async def _generate(
        self,
        session: GatewaySession,
        n: int,
        params: SamplingParams,
        messages: list[dict[str, Any]] | None,
        tools: list[dict[str, Any]] | None,
        previous: Step | None,
        prompt_ids: list[int] | None,
        on_tokens: list[Any] | None = None,
    ) -> list[ModelOutput]:
        """``n`` choices; with ``on_tokens`` (one callback per choice, for a policy that streams tokens) each choice's
        ids as they come."""

        async def one(seed: int | None, on_token: Any) -> ModelOutput:
            choice = params if seed is None else dataclasses.replace(params, seed=seed)
            streamed = {} if on_token is None else {"on_token": on_token}
            if prompt_ids is not None:
                return await self.policy.generate(None, choice, prompt_ids=prompt_ids, **streamed)
            return await self.policy.generate(messages, choice, tools=tools, previous=previous, **streamed)

        # n choices with one seed would be n copies: each choice gets its own seed.
        seeds = [None] * n if params.seed is None or n == 1 else [params.seed + i for i in range(n)]
        try:
            return list(await asyncio.gather(*map(one, seeds, on_tokens or [None] * n)))
        except RequestRejected as error:
            if error.status not in _CLIENT_STATUSES:  # 401, 404, ...: the gateway's upstream is set up wrong
                session.policy_error = session.policy_error or str(error)
                raise
            # The upstream refused what the client asked (a prompt past its context, a field it does not take): the
            # client's 400, with the upstream's reason, as the gateway answers what it can check itself.
            reason = _upstream_reason(error.body)
            context = "context length" in reason.lower() or "context_length" in reason.lower()
            raise RequestError(
                f"the model's server refused the request: {reason}"[:600],
                param="messages" if context else None,
                code="context_length_exceeded" if context else None,
            ) from None
        except PolicyError as error:
            session.policy_error = session.policy_error or str(error)
            raise
        except Exception as error:
            failure = PolicyError(f"the policy failed: {type(error).__name__}: {error}")
            session.policy_error = session.policy_error or str(failure)
            raise failure from error
