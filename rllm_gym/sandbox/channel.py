"""Calls from a test harness to a solution in another sandboxed process: plain data only, parsed without ``eval``.

A function test runs as two sandboxed processes joined by two pipes (fds 3 and 4 in each): the harness (trusted test
code) and the solution (model code). The harness imports ``_rllm_channel`` (:func:`harness_module`) and calls
``remote("name")(*args)``; the solution's process runs the model's code, then :func:`serve` answers each call with the
function's return value encoded by :func:`encode`. Only plain data crosses: None, bool, int, float, complex, str, bytes
and lists, tuples, dicts, sets and frozensets of those, with exact types (a subclass of ``int`` with its own ``__eq__``
is not plain data). Whatever bytes the solution writes instead, :func:`decode` rebuilds plain values or raises
:class:`RemoteError`: the harness never runs an object the solution made. An exception from the solution's function
comes back as a name and a message (its nearest builtin class: a class of its own under ``Exception`` comes back as
``Exception``); the harness raises the builtin ``Exception`` of that name, except for names that would steer the test
code (``StopIteration``, ``StopAsyncIteration``, the ``BaseException`` family, anything not a builtin ``Exception``):
those, and every call that gets no plain-data answer, raise :class:`RemoteError` and are recorded in ``failures``,
which the harness reads after each test, so catching them does not pass the test.

Standard library only: the zygote loads this file by path (see :mod:`rllm_gym.sandbox._zygote`); the host imports it
to decode values a harness reports.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import re
import select
import struct
import sys
import types
from typing import Any

MAX_FRAME = 16 << 20  # bytes of one request or reply
MAX_DEPTH = 64  # nesting of containers in one value
_HEADER = struct.Struct("!I")
_SCALARS = (type(None), bool, int, float, str)
_BIG = 2**63  # ints beyond this travel as hex text
_HEX = re.compile(r"-?[0-9a-f]+")


class RemoteError(Exception):
    """A call to the solution failed without a plain-data answer; ``status`` says why (``not_plain_data``, ...)."""

    def __init__(self, message: str, status: str = "runtime_error"):
        super().__init__(message)
        self.status = status


class NotPlainData(TypeError):
    pass


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data with container types tagged; raises :class:`NotPlainData` for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is int and not -_BIG <= value <= _BIG:
        return {"x": format(value, "x")}  # hex: no digit limit (str(int) stops at 4300 digits), linear time
    if kind in _SCALARS:
        return value
    if kind is list:
        return {"l": [encode(item, depth + 1) for item in value]}
    if kind is tuple:
        return {"t": [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "f": [encode(item, depth + 1) for item in value]}
    if kind is bytes:
        return {"b": base64.b64encode(value).decode("ascii")}
    if kind is complex:  # MBPP's cmath tasks take and return them
        return {"c": [value.real, value.imag]}
    raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def decode(data: Any, depth: int = 0) -> Any:
    """The plain value :func:`encode` made; raises :class:`RemoteError` for anything else."""
    if depth > MAX_DEPTH:
        raise RemoteError(f"value nested deeper than {MAX_DEPTH} levels", "not_plain_data")
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is not dict or len(data) != 1:
        raise RemoteError(f"malformed value {str(data)[:80]!r}", "not_plain_data")
    ((tag, items),) = data.items()
    if tag == "x" and type(items) is str and _HEX.fullmatch(items):
        return int(items, 16)
    if tag == "b" and type(items) is str:
        try:
            return base64.b64decode(items.encode("ascii"), validate=True)
        except ValueError as exc:
            raise RemoteError(f"malformed bytes: {exc}", "not_plain_data") from None
    if type(items) is not list:
        raise RemoteError(f"malformed value {str(data)[:80]!r}", "not_plain_data")
    if tag == "c":
        if len(items) != 2 or any(type(part) is not float for part in items):
            raise RemoteError(f"malformed complex {str(items)[:80]!r}", "not_plain_data")
        return complex(*items)
    try:
        if tag == "l":
            return [decode(item, depth + 1) for item in items]
        if tag == "t":
            return tuple(decode(item, depth + 1) for item in items)
        if tag in ("s", "f"):
            members = [decode(item, depth + 1) for item in items]
            return set(members) if tag == "s" else frozenset(members)
        if tag == "d":
            pairs = [(decode(p[0], depth + 1), decode(p[1], depth + 1)) for p in items if type(p) is list]
            if len(pairs) != len(items) or any(len(p) != 2 for p in items):
                raise RemoteError("malformed dict entries", "not_plain_data")
            return dict(pairs)
    except TypeError as exc:  # an unhashable key or set member
        raise RemoteError(f"malformed value: {exc}", "not_plain_data") from None
    raise RemoteError(f"unknown value tag {tag!r}", "not_plain_data")


def loads(text: str | bytes) -> Any:
    """JSON text -> plain value (:func:`decode`); malformed text raises :class:`RemoteError`."""
    try:
        return decode(json.loads(text))
    except (ValueError, RecursionError) as exc:
        raise RemoteError(f"malformed reply: {type(exc).__name__}", "not_plain_data") from None


# Frames on the pipes


def write_frame(fd: int, message: dict | bytes) -> None:
    """Send one frame: ``message`` as JSON, or JSON bytes already made."""
    data = message if isinstance(message, bytes) else json.dumps(message, allow_nan=True).encode()
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def read_frame(fd: int) -> bytes | None:
    """One frame's body; None at end of file; raises :class:`RemoteError` for an oversized or cut frame."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise RemoteError(f"reply larger than {MAX_FRAME} bytes", "output_limit")
    body = _read_exactly(fd, size)
    if body is None:
        raise RemoteError("the solution's process closed the channel mid-reply", "runtime_error")
    return body


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, missing = [], size
    while missing:
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


# The solution's side


def _find(namespace: dict, name: str) -> Any:
    if name in namespace:
        return namespace[name]
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, name):
        return getattr(solution(), name)
    raise NameError(f"the solution defines no function named {name!r}")


def serve(namespace: dict, read_fd: int = 3, write_fd: int = 4) -> None:
    """Answer calls from the harness with functions of ``namespace`` until it closes the channel."""
    while True:
        try:
            body = read_frame(read_fd)
        except (OSError, RemoteError):
            return
        if body is None:
            return
        request = json.loads(body)
        try:
            function = _find(namespace, request["fn"])
            args = [decode(arg) for arg in request["args"]]
            kwargs = {key: decode(value) for key, value in request["kwargs"].items()}
            result = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: this call failed, the next may not
            reply = _error_reply(exc)
        else:
            try:
                reply = {"ok": encode(result)}
            except NotPlainData as exc:
                reply = {"not_plain": str(exc)}
        try:
            write_frame(write_fd, reply)
        except (OSError, ValueError) as exc:  # ValueError: an int too large to print
            write_frame(write_fd, {"not_plain": f"the return value cannot be sent: {exc}"})


def _error_reply(exc: BaseException) -> dict[str, str]:
    """The nearest specific builtin class of ``exc`` (a ``ValueError`` subclass is a ``ValueError``, a class of its
    own directly under ``Exception`` is an ``Exception``) and its message, whatever its
    ``__str__`` does (raise, loop on itself, return megabytes). The harness trusts neither: the solution's process can
    write any reply it likes."""
    try:
        kind = type(exc)
        nearest = next(k for k in kind.__mro__ if getattr(builtins, k.__name__, None) is k)
        # Qualified, so that a class of its own that borrows a builtin's name ("ValueError") is not taken for it.
        own = f"{kind.__module__}.{kind.__qualname__}" if kind is not nearest else nearest.__name__
        # A class of its own under Exception is an Exception to a test that expects the base class; one under
        # BaseException keeps its name, which the harness treats as a failed call.
        name = str(own if nearest is BaseException else nearest.__name__)
    except BaseException:  # a metaclass with its own __mro__ or __name__
        name = "BaseException"
    try:
        message = str(exc)[:500]
    except BaseException:
        message = "<an exception whose str() fails>"
    return {"error": name, "message": message}


# The harness's side

# An exception class that control flow gives a meaning: raised into the test code, StopIteration ends the loop that
# called the solution (``all(map(f, xs))`` is then True), GeneratorExit and the BaseException family unwind it.
# A call that raises one of these, any name not a builtin Exception, or fails without an answer (the process died,
# the value is not plain data) raises RemoteError and is also recorded in ``failures``, so that the test fails even
# when its code catches the exception.
_STEERING = (StopIteration, StopAsyncIteration)
failures: list[tuple[str, str]] = []  # (status, reason) of the calls that failed since the harness last cleared it
# The names of the calls made since the harness last cleared it: a test that failed without calling the solution
# failed by the task's own doing (a broken setup, a missing import), not the solution's.
calls: list[str] = []


def _exception(name: Any, message: str) -> Exception:
    """The builtin exception of that name (so ``pytest.raises(ValueError)``-style tests work); RemoteError, recorded
    in ``failures``, for a name that would steer the test code or is no builtin ``Exception``."""
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, (RemoteError, *_STEERING)):
        # A class whose constructor needs more than a message (UnicodeDecodeError) is raised as its nearest base
        # that takes one (ValueError), which still passes a test expecting that base.
        for base in kind.__mro__:
            if isinstance(base, type) and issubclass(base, Exception):
                try:
                    return base(str(message))
                except Exception:
                    continue
    return _failure(f"the solution raised {str(name)[:100]}: {message}", "runtime_error")


def _failure(message: str, status: str) -> RemoteError:
    failures.append((status, message[:300]))
    return RemoteError(message, status)


# Set by the first call that got no answer within its time limit: the solution is still working on it, so any later
# call would read that call's late reply. Every later call fails at once instead (the verdict is decided anyway).
stalled: list[str] = []


def call(name: str, *args: Any, read_fd: int = 3, write_fd: int = 4, **kwargs: Any) -> Any:
    """Call the solution's ``name`` with plain-data arguments; returns its plain-data result."""
    return _call(name, args, kwargs, None, read_fd, write_fd)


def _call(name: str, args: tuple, kwargs: dict, time_limit: float | None, read_fd: int = 3, write_fd: int = 4) -> Any:
    calls.append(name)
    if stalled:
        raise _failure(f"an earlier call ({stalled[0]}) got no answer within its time limit", "timeout")
    try:
        request = {"fn": name, "args": [encode(a) for a in args], "kwargs": {k: encode(v) for k, v in kwargs.items()}}
    except NotPlainData as exc:
        raise _failure(f"the test passes an argument that is not plain data: {exc}", "harness_error") from None
    data = json.dumps(request, allow_nan=True).encode()
    if len(data) > MAX_FRAME:  # the solution's side would refuse it, and end: no fault of the solution's
        raise _failure(
            f"the test's arguments take {len(data)} bytes, more than the {MAX_FRAME} a call may", "harness_error"
        )
    try:
        write_frame(write_fd, data)
        if time_limit is not None and not select.select([read_fd], [], [], time_limit)[0]:
            stalled.append(name)
            raise _failure(f"the solution did not answer within {time_limit:g} s (the per-test limit)", "timeout")
        body = read_frame(read_fd)
    except OSError as exc:  # it died before reading the request (EPIPE) or mid-reply: the same verdict as EOF
        raise _failure(f"the solution's process ended before answering ({exc.strerror})", "runtime_error") from None
    except RemoteError as exc:
        raise _failure(str(exc), exc.status) from None
    if body is None:
        raise _failure("the solution's process ended before answering", "runtime_error")
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        raise _failure("malformed reply from the solution's process", "not_plain_data") from None
    if type(reply) is not dict or len(reply) not in (1, 2):
        raise _failure("malformed reply from the solution's process", "not_plain_data")
    if "ok" in reply and len(reply) == 1:
        try:
            return decode(reply["ok"])
        except RemoteError as exc:
            raise _failure(str(exc), exc.status) from None
    if "not_plain" in reply:
        raise _failure(f"the return value is not plain data: {str(reply['not_plain'])[:200]}", "not_plain_data")
    if "error" in reply:
        raise _exception(reply["error"], str(reply.get("message", ""))[:500])
    raise _failure("malformed reply from the solution's process", "not_plain_data")


def remote(name: str, time_limit: float | None = None) -> Any:
    """A function that forwards each call to the solution's ``name``; a call that gets no answer within
    ``time_limit`` wall-clock seconds fails with status ``timeout``, and so does every call after it."""

    def function(*args: Any, **kwargs: Any) -> Any:
        return _call(name, args, kwargs, time_limit)

    function.__name__ = function.__qualname__ = name
    return function


def harness_module() -> types.ModuleType:
    """The ``_rllm_channel`` module a harness imports."""
    module = types.ModuleType("_rllm_channel", __doc__)
    for item in (RemoteError, encode, decode, call, remote):
        setattr(module, item.__name__, item)
    module.failures = failures  # the same list: the harness reads and clears it per test
    module.calls = calls
    module.stalled = stalled
    sys.modules["_rllm_channel"] = module
    return module
