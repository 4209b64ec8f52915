"""OpenAIPolicy: a policy on any OpenAI-compatible server (``vllm serve``, SGLang, ``transformers serve``).

Requests go over one pooled ``aiohttp.ClientSession`` with a concurrency limit (httpx's connection pool scans every
connection for every request, which capped it near 100 requests/s at 256 in flight; see ``bench_policies.py``). The
session is closed by :meth:`OpenAIPolicy.aclose` or ``async with``, and otherwise when its event loop shuts down
(the end of ``asyncio.run``); a policy used from a new loop opens a new one. 429s, 5xx, timeouts, dropped
connections and unreadable bodies are retried with exponential backoff (and ``Retry-After`` when the server sends
it); other 4xx answers fail at once with the server's message. With several base URLs (a fleet of replicas) each
request goes to the replica with the fewest requests in flight, and a replica that fails with a connection error or
a 5xx leaves the rotation for a cool-down. Token ids and log-probabilities come from the server when it returns them:
every request asks with vLLM's ``return_token_ids`` unless the server refused that once (it is then asked without,
after one warning) or sent no ids; with a tokenizer too, once the server has sent ids, chats are sent as token ids to
``/completions``, each call continuing the previous call's tokens (token in, token out). Otherwise the server renders
the chat as text (``ModelOutput.text_rendered``): its ids are recorded where it sent them, else the prompt is rendered
and the reply tokenized locally with the model's tokenizer, and ``logprobs`` stays empty. Without a tokenizer or
server ids the ids stay empty (never guessed) and the token counts (``ModelOutput.prompt_length``,
``completion_length``) come from the reply's ``usage``; where there are ids, the counts are their lengths, since the
trainer and ``max_prompt_length`` work on those ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl
from aiohttp.helpers import get_env_proxy_for_url

from rllm_gym.policies.base import (
    BasePolicy,
    PolicyError,
    PolicyRequest,
    SamplingParams,
    build_model_output,
    render_prompt_ids,
)
from rllm_gym.policies.openai_wire import (
    EXTENSION_FIELDS,
    chat_request_body,
    logprob_entries,
    reply_text,
    usage_counts,
)
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.types import ModelOutput

__all__ = ["OpenAIPolicy", "RequestRejected", "chat_request_body", "reply_text", "usage_counts"]

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429})


class RequestRejected(PolicyError):
    """The server answered a request with a client error (4xx other than 408/429): ``status`` and the start of its
    ``body``, which names what it refused."""

    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass
class _Replica:
    base_url: str
    in_flight: int = 0
    down_until: float = 0.0
    requests: int = 0
    proxy: tuple[yarl.URL, aiohttp.BasicAuth | None] | None = None


def _env_proxy(url: str) -> tuple[yarl.URL, aiohttp.BasicAuth | None] | None:
    """The proxy that ``HTTP_PROXY``/``HTTPS_PROXY`` name for ``url`` (``NO_PROXY`` respected), as httpx and the openai
    client read them; never one for a loopback host. Read once per session: aiohttp's own ``trust_env`` reads the
    environment and ``.netrc`` again on every request, in a thread."""
    target = yarl.URL(url)
    host = target.host or ""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return None
    if host == "localhost":
        return None
    try:
        return get_env_proxy_for_url(target)
    except LookupError:
        return None


class OpenAIPolicy(BasePolicy):
    """A policy on one or more OpenAI-compatible servers.

    Args:
        model: the model name the server expects (``vllm serve NAME``; ``transformers serve PATH`` wants ``PATH``).
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``, or a list of them (replicas).
        tokenizer: a tokenizer (folder, hub name or object) for local prompt rendering and reply tokenization when
            the server returns no token ids; ``None`` leaves ids empty in that case.
        enable_thinking: sent as ``chat_template_kwargs`` (and used for local rendering) when set.
        return_token_ids: whether to ask for the server's token ids and logprobs with vLLM's extensions
            (``return_token_ids``, ``logprobs``). ``None`` (default): ask, and when the server refuses the fields (an
            HTTP 400/422 naming one) ask again without them, warn once and never ask that policy's server again; a
            server that accepts them but sends no ids is not asked again either. ``True``: ask, and a refusal is an
            error. ``False``: never ask. Once the server has returned ids and a ``tokenizer`` is given, chats go to
            ``/completions`` as token ids: token in, token out (each call's prompt is the previous call's prompt and
            sampled ids followed by the new messages' tokens). Otherwise the server renders the chat text itself and
            the output says so (``ModelOutput.text_rendered``); without a tokenizer or server ids the ids stay empty.
        token_history: ``"sampled"`` (default) or ``"template"`` (re-render the whole chat each call), for token
            prompts; see :class:`~rllm_gym.policies.HFPolicy`.
        request_logprobs: send the standard ``logprobs: true``.
        max_concurrency: the most requests in flight from this policy, over all replicas.
        timeout_s: per-attempt timeout of a request.
        max_retries: retries after the first attempt for 429/5xx/timeouts/connection errors/unreadable replies.
        backoff_s, max_backoff_s: exponential backoff base and cap (with jitter).
        cooldown_s: how long a replica that failed stays out of the rotation.
    """

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str] = "http://127.0.0.1:8000/v1",
        *,
        api_key: str | None = None,
        tokenizer: Any = None,
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        return_token_ids: bool | None = None,
        request_logprobs: bool = False,
        token_history: TokenHistory = "sampled",
        max_concurrency: int = 64,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        cooldown_s: float = 30.0,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(
                f"OpenAIPolicy(model=...) must be the served model's name, e.g. 'Qwen/Qwen3-0.6B', got {model!r}"
            )
        if not isinstance(base_url, (str, Sequence)):
            raise ValueError(f"OpenAIPolicy(base_url=...) must be a URL or a list of URLs, got {base_url!r}")
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("OpenAIPolicy(base_url=...) needs at least one URL, e.g. 'http://127.0.0.1:8000/v1'")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"OpenAIPolicy(base_url=...) must be an http(s) URL like 'http://host:8000/v1', got {url!r}"
                )
        for name, value, minimum in (("max_concurrency", max_concurrency, 1), ("max_retries", max_retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"OpenAIPolicy({name}=...) must be an int >= {minimum}, got {value!r}")
        for name, value in (
            ("timeout_s", timeout_s),
            ("backoff_s", backoff_s),
            ("max_backoff_s", max_backoff_s),
            ("cooldown_s", cooldown_s),
        ):
            positive = name == "timeout_s"
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 < value < math.inf if positive else 0 <= value < math.inf)
            ):
                bound = "> 0" if positive else ">= 0"
                raise ValueError(f"OpenAIPolicy({name}=...) must be a finite number of seconds {bound}, got {value!r}")
        self.model = model
        self.replicas = [_Replica(url.rstrip("/")) for url in urls]
        if isinstance(tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        super().__init__(
            tokenizer,
            enable_thinking=enable_thinking,
            chat_template_kwargs=chat_template_kwargs,
            token_history=token_history,
        )
        if return_token_ids not in (None, True, False):
            raise ValueError(
                "OpenAIPolicy(return_token_ids=...) must be None (ask, and go on without when the server refuses), "
                f"True (ask; a refusal is an error) or False (never ask), got {return_token_ids!r}"
            )
        self.return_token_ids = return_token_ids
        # Whether the server returns token ids: as set, or (None) unknown until its first reply or refusal says.
        self._server_ids: bool | None = return_token_ids
        self.request_logprobs = request_logprobs
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.cooldown_s = cooldown_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._closer: AsyncIterator[None] | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turn = 0
        # Attempts that were retried, for tests and metrics.
        self.retries = 0
        self._warned_count = False

    @property
    def server_token_ids(self) -> bool | None:
        """Whether the server returns its token ids and logprobs: ``None`` until its first reply (or refusal) says,
        with ``return_token_ids=None``."""
        return self._server_ids

    @property
    def token_prompts(self) -> bool:
        """Whether chats go out as token ids on ``/completions`` (token in, token out): once the server has returned
        token ids (a vLLM server) and with a tokenizer to render them; otherwise the server renders the chat text."""
        return self._server_ids is True and self.tokenizer is not None

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        params = request.params
        if request.prompt_ids is not None:
            return await self._generate_from_ids(request.prompt_ids, params)
        if self.token_prompts:
            # The previous call's prompt and sampled ids, continued by the new messages (rllm_gym.policies.tokens).
            return await self._generate_from_ids(self.prompt_token_ids(request), params)
        data = await self._post_asking_for_ids(
            "/chat/completions",
            lambda ask: chat_request_body(
                self.model,
                request.messages or [],
                params,
                tools=request.tools,
                template_kwargs=self.template_kwargs,
                request_logprobs=self.request_logprobs,
                return_token_ids=ask,
            ),
        )
        choice = data["choices"][0]
        text = reply_text(choice.get("message") or {})
        server_prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if server_prompt_ids is None and self.tokenizer is not None:
            # A local rendering of the whole chat: the server rendered its own (text_rendered says so).
            messages, tools = request.messages or [], request.tools
            server_prompt_ids = render_prompt_ids(self.tokenizer, messages, tools, self.template_kwargs)
        return self._to_output(data, choice, text, server_prompt_ids, params, text_rendered=True)

    async def _generate_from_ids(self, prompt_ids: list[int], params: SamplingParams) -> ModelOutput:
        # Token-id prompts on /completions are a vLLM/SGLang feature; transformers serve wants a string prompt.
        def body(ask: bool) -> dict[str, Any]:
            body = chat_request_body(self.model, [], params, return_token_ids=ask)
            del body["messages"]
            body["prompt"] = prompt_ids
            if self.request_logprobs or ask:
                body["logprobs"] = 0  # /completions takes a number of alternatives: 0 = the sampled token's only
            return body

        data = await self._post_asking_for_ids("/completions", body)
        choice = data["choices"][0]
        return self._to_output(data, choice, choice.get("text") or "", prompt_ids, params)

    async def _post_asking_for_ids(self, path: str, body: Callable[[bool], dict[str, Any]]) -> dict[str, Any]:
        """POST ``body(ask)``, asking for the server's token ids unless it is known not to give them; a refusal of
        the fields (with ``return_token_ids=None``) is answered by asking again without them, and remembered."""
        ask = self._server_ids is not False
        try:
            data = await self._post(path, body(ask))
        except RequestRejected as error:
            if not (ask and self.return_token_ids is None and _names_extension_fields(error)):
                raise
            if self._server_ids is not False:  # once, however many requests were in flight
                self._server_ids = False
                logger.warning(
                    "the server refuses vLLM's token-id fields (%s; HTTP %d: %s): asking without them from now on; "
                    "Steps get no server token ids or logprobs (with a tokenizer, local ids marked text_rendered)",
                    ", ".join(EXTENSION_FIELDS),
                    error.status,
                    error.body[:200],
                )
            return await self._post(path, body(False))
        if ask and self._server_ids is None:
            choice = data["choices"][0]
            # An empty reply has an empty list of ids: None (or no field) is what a server without them sends.
            self._server_ids = choice.get("token_ids") is not None or logprob_entries(choice)[1] is not None
        return data

    def _to_output(
        self,
        data: dict[str, Any],
        choice: dict[str, Any],
        text: str,
        prompt_ids: Sequence[int] | None,
        params: SamplingParams,
        *,
        text_rendered: bool = False,
    ) -> ModelOutput:
        logprobs, ids_from_logprobs = logprob_entries(choice)
        completion_ids = choice.get("token_ids") or ids_from_logprobs
        finish_reason = choice.get("finish_reason")
        if completion_ids is not None and self.tokenizer is not None:
            text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
            for stop in params.stop:
                text = text.split(stop, 1)[0]
        if completion_ids is None and self.tokenizer is not None:
            completion_ids = self.tokenizer.encode(text, add_special_tokens=False)
            # The server dropped the EOS token from the text; HFPolicy and vLLM keep it in the ids.
            if finish_reason in ("stop", "tool_calls") and not params.stop and self.tokenizer.eos_token_id is not None:
                completion_ids.append(self.tokenizer.eos_token_id)
        completion_ids = list(completion_ids or [])
        if len(logprobs) != len(completion_ids):
            logprobs = []  # locally re-tokenized text does not line up with the server's tokens
        # Token ids, when there are any, decide the counts; without them the server's `usage` does, so that counts
        # (max_prompt_length, the response-token metrics) are not silently 0 for a policy with no tokenizer.
        prompt_tokens, completion_tokens = usage_counts(data)
        if prompt_ids and prompt_tokens is not None and prompt_tokens != len(prompt_ids) and not self._warned_count:
            self._warned_count = True
            logger.warning(
                "the server counted %d prompt tokens where the local prompt ids have %d: the server renders the chat "
                "differently (another chat template or tokenizer?); the local ids and their count are used",
                prompt_tokens,
                len(prompt_ids),
            )
        return build_model_output(
            text,
            prompt_ids=prompt_ids or [],
            completion_ids=completion_ids,
            logprobs=logprobs,
            finish_reason=finish_reason,
            prompt_length=None if prompt_ids else prompt_tokens,
            completion_length=None if completion_ids else completion_tokens,
            text_rendered=text_rendered,
        )

    # HTTP -----------------------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        closer, self._session, self._closer = self._closer, None, None
        if closer is not None and self._loop is asyncio.get_running_loop():
            await closer.aclose()  # its `finally` closes the session

    async def __aenter__(self) -> OpenAIPolicy:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _open_session(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """A new session on the running loop: a session is bound to the event loop it was created on, so a new loop
        (a new ``asyncio.run``) needs a new one."""
        self._loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, connect=min(10.0, self.timeout_s))
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers)
        for replica in self.replicas:
            replica.proxy = _env_proxy(replica.base_url)
        self._session, self._semaphore = session, asyncio.Semaphore(self.max_concurrency)
        # A suspended async generator is closed by the loop's shutdown_asyncgens() (asyncio.run does it), so the
        # session is closed on its own loop even when the caller never calls aclose().
        self._closer = _close_at_loop_shutdown(session)
        await anext(self._closer)
        return session, self._semaphore

    def _pick_replica(self) -> _Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]  # up or cooling down, it is the one to try
        now = time.monotonic()
        up = [r for r in self.replicas if r.down_until <= now]
        if not up:
            # Every replica is cooling down: try the one that has rested longest rather than fail outright.
            return min(self.replicas, key=lambda r: r.down_until)
        fewest = min(r.in_flight for r in up)
        candidates = [r for r in up if r.in_flight == fewest]
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass  # an HTTP-date Retry-After: fall back to our own schedule
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        return delay * (0.5 + random.random() / 2)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        session, semaphore = self._session, self._semaphore
        if session is None or semaphore is None or self._loop is not asyncio.get_running_loop():
            session, semaphore = await self._open_session()
        attempts = self.max_retries + 1
        last_error = ""
        async with semaphore:
            for attempt in range(attempts):
                replica = self._pick_replica()
                url = replica.base_url + path
                retry_after: str | None = None
                replica.in_flight += 1
                replica.requests += 1
                try:
                    proxy, proxy_auth = replica.proxy or (None, None)
                    request = session.post(url, json=body, proxy=proxy, proxy_auth=proxy_auth, allow_redirects=False)
                    async with request as response:
                        status, payload = response.status, await response.read()
                        retry_after = response.headers.get("Retry-After")
                except (TimeoutError, aiohttp.ClientError) as error:
                    replica.down_until = time.monotonic() + self.cooldown_s
                    if isinstance(error, TimeoutError):
                        last_error = f"{url}: no answer within timeout_s={self.timeout_s:g} s ({type(error).__name__})"
                    else:
                        last_error = f"{url}: {type(error).__name__}: {error}"
                else:
                    if status == 200:
                        try:
                            data = json.loads(payload)
                            if not isinstance(data, dict) or not data.get("choices"):
                                raise ValueError("no 'choices' in the reply")
                            return data
                        except ValueError as error:
                            last_error = f"{url}: unreadable reply ({error}): {_head(payload, 200)!r}"
                    elif status in _RETRY_STATUS or status >= 500:
                        if status >= 500:
                            replica.down_until = time.monotonic() + self.cooldown_s
                        last_error = f"{url}: HTTP {status}: {_head(payload, 300)}"
                    else:
                        raise RequestRejected(
                            f"{url} rejected the request with HTTP {status}: {_head(payload, 500)} "
                            f"(model={self.model!r}; check the model name and the request fields the server accepts)",
                            status,
                            _head(payload, 2000),
                        )
                finally:
                    replica.in_flight -= 1
                if attempt + 1 < attempts:
                    self.retries += 1
                    await asyncio.sleep(self._backoff(attempt, retry_after))
        urls = ", ".join(r.base_url for r in self.replicas)
        raise PolicyError(
            f"POST {path} failed after {attempts} attempts ({self.max_retries} retries) on [{urls}]; "
            f"last error: {last_error}. Is the server up and reachable?"
        )


def _names_extension_fields(error: RequestRejected) -> bool:
    """Whether a rejection is the server refusing vLLM's token-id fields (a 400 or 422 that names one of them)."""
    return error.status in (400, 422) and any(field in error.body for field in EXTENSION_FIELDS)


def _head(payload: bytes, chars: int) -> str:
    """The start of a reply body as text, for error messages."""
    return payload[: 4 * chars].decode("utf-8", errors="replace")[:chars]


async def _close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await session.close()
