"""A minimal OpenAI-compatible HTTP server with a fixed latency and scripted failures, for benchmarks and tests.

It answers ``/v1/chat/completions`` and ``/v1/completions`` with a canned reply after ``latency_s`` seconds, so
that the client side of :class:`~rllm_gym.policies.OpenAIPolicy` (pooling, concurrency, retries, load balancing)
can be measured and tested against a real socket without a model. Failures are queued with
:meth:`StubOpenAIServer.fail_next`: ``"429"``, ``"500"``, ``"400"``, ``"garbage"`` (a 200 with a body that is not
JSON) or ``"drop"`` (the connection closes without an answer); requests with a field named in ``refuse`` get a 400
naming it, and with ``max_context`` a prompt of more tokens than that gets vLLM's 400 ("This model's maximum context
length is ..."). Replies carry a ``usage`` that counts one token per whitespace-separated word
(:func:`count_tokens`: of every message for the prompt, of the reply for the completion), so that tests can predict
the counts a policy without a tokenizer reports. With ``reply_ids``, ``/v1/completions`` takes token-id prompts and
answers with vLLM's ``prompt_token_ids``, ``token_ids`` and logprobs. Run it as a process with
``python -m rllm_gym.policies.stub_server --port 8000 --latency 0.05``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FAILURE_MODES", "StubOpenAIServer", "count_tokens"]

FAILURE_MODES = ("429", "500", "400", "garbage", "drop")


def count_tokens(prompt: Any) -> int:
    """The stub's token count: words of a string, words of every message's content, or the length of a list of ids."""
    if isinstance(prompt, str):
        return len(prompt.split())
    if prompt and all(isinstance(item, int) for item in prompt):
        return len(prompt)
    return sum(len(str(message.get("content") or "").split()) for message in prompt or [])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Benchmarks open hundreds of connections at once; the default backlog of 5 would refuse some of them.
    request_queue_size = 1024
    stub: StubOpenAIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do, so the client's pool is exercised
    # Headers and body go out in two writes; with Nagle on, the body waits ~40 ms for a delayed ACK.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and benchmarks read stdout
        return

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/health", "/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.server.stub.model}]}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        stub = self.server.stub
        failure = stub._next_failure(self.path.rstrip("/"), body)
        time.sleep(stub.latency_s)
        if failure == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if failure == "garbage":
            self._send(200, b"<html>this is not json")
            return
        if failure in ("429", "500", "400"):
            self._send(int(failure), json.dumps({"error": {"message": f"scripted {failure}"}}).encode(), retry=True)
            return
        path = self.path.rstrip("/")
        refused = [name for name in stub.refuse if name in body]
        if refused:  # as api.openai.com answers a field it does not know
            error = {
                "message": f"Unrecognized request argument supplied: {refused[0]}",
                "type": "invalid_request_error",
            }
            self._send(400, json.dumps({"error": error}).encode())
            return
        prompt_tokens = count_tokens(body.get("messages", body.get("prompt")))
        if stub.max_context is not None and prompt_tokens > stub.max_context:  # vLLM's words and shape
            message = (
                f"This model's maximum context length is {stub.max_context} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            self._send(400, json.dumps({"error": error}).encode())
            return
        if stub.response is not None:
            self._send(200, json.dumps(stub.response).encode())
            return
        if path == "/v1/chat/completions":
            users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
            reply = stub.reply or f"echo: {users[-1] if users else ''}"
            prompt = body.get("messages", [])
            choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
        elif path == "/v1/completions":
            reply, prompt = stub.reply or "echo", body.get("prompt")
            choice = {"index": 0, "text": reply, "finish_reason": "stop"}
            if stub.reply_ids is not None and body.get("return_token_ids"):
                # vLLM's token in, token out: the prompt ids it was given and the reply's ids, each with a logprob.
                ids = stub.reply_ids(prompt) if callable(stub.reply_ids) else list(stub.reply_ids)
                choice["finish_reason"] = "length" if len(ids) >= body.get("max_tokens", len(ids) + 1) else "stop"
                choice.update(prompt_token_ids=prompt, token_ids=ids)
                choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}
        else:
            self._send(404, b'{"error": "not found"}')
            return
        data = {"id": "stub", "object": "chat.completion", "model": body.get("model"), "choices": [choice]}
        if stub.usage:
            prompt_tokens, completion_tokens = count_tokens(prompt), count_tokens(reply)
            data["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        self._send(200, json.dumps(data).encode())

    def _send(self, status: int, payload: bytes, retry: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if retry and status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(payload)


class StubOpenAIServer:
    """An OpenAI-compatible server on a background thread (``port=0`` picks a free port).

    Example::

        with StubOpenAIServer(latency_s=0.01) as server:
            policy = OpenAIPolicy("stub", server.url)
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        reply: str = "",
        model: str = "stub",
        response: dict[str, Any] | None = None,
        usage: bool = True,
        reply_ids: list[int] | Callable[[Any], list[int]] | None = None,
        refuse: Collection[str] = (),
        max_context: int | None = None,
    ) -> None:
        self.latency_s = latency_s
        self.reply = reply
        # A full JSON reply to send instead of the canned one, e.g. with vLLM's token-id extensions.
        self.response = response
        self.model = model
        self.usage = usage  # False: replies without `usage`, as some servers send them
        # Token ids of the reply (or a function of the prompt giving them), sent on /v1/completions to a request with
        # return_token_ids as vLLM sends them: a stand-in for a server that takes token prompts.
        self.reply_ids = reply_ids
        # Request fields answered with a 400 naming the field, as api.openai.com answers vLLM's extensions.
        self.refuse = tuple(refuse)
        self.max_context = max_context  # prompt tokens (count_tokens) past which a request gets vLLM's context 400
        # (path, JSON body) of the last POSTs, in order; bounded, as benchmarks send hundreds of thousands.
        self.requests: deque[tuple[str, dict[str, Any]]] = deque(maxlen=1024)
        self.hits = 0
        self._failures: deque[str] = deque()
        self._lock = threading.Lock()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.stub = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def fail_next(self, *modes: str) -> None:
        """Answer the next requests with these failures, in order, then normally again."""
        for mode in modes:
            if mode not in FAILURE_MODES:
                raise ValueError(f"unknown failure mode {mode!r}; choose from {FAILURE_MODES}")
        with self._lock:
            self._failures.extend(modes)

    def _next_failure(self, path: str, body: dict[str, Any]) -> str | None:
        with self._lock:
            self.hits += 1
            self.requests.append((path, body))
            return self._failures.popleft() if self._failures else None

    def start(self) -> StubOpenAIServer:
        # A short poll interval makes stop() quick; the default 0.5 s would dominate short tests.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> StubOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a stub OpenAI-compatible API with a fixed latency.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each request takes")
    args = parser.parse_args(argv)
    server = StubOpenAIServer(args.host, args.port, latency_s=args.latency)
    print(server.url, flush=True)
    server._httpd.serve_forever()


if __name__ == "__main__":
    main()
