"""The host's side of the zygote protocol: a run's request (its arguments checked), the memfds that carry its data,
and the length-prefixed JSON frames (with fds) the zygote sends back."""

from __future__ import annotations

import collections
import json
import os
import socket
import struct
from typing import Any

from rllm_gym.sandbox.limits import SandboxLimits

FRAME = struct.Struct("!I")
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}


def build_request(
    code: str,
    *,
    stdin: str = "",
    files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    filename: str = "main.py",
    **limits: Any,
) -> dict[str, Any]:
    """The zygote's request for one run; bad arguments raise TypeError/ValueError naming the field.

    ``limits``: the fields of :class:`SandboxLimits` (their defaults and rules live there only)."""
    if not isinstance(code, str):
        raise TypeError(f"sandbox code must be a str, got {type(code).__name__}")
    if not isinstance(stdin, str):
        raise TypeError(f"sandbox stdin must be a str, got {type(stdin).__name__}")
    if "owner" in limits:  # SandboxLimits' label for messages, not a limit of the run
        raise TypeError("sandbox runs take no 'owner' argument")
    checked = SandboxLimits(**limits)
    for label, mapping in (("files", files), ("env", env)):
        if mapping is not None and (
            not isinstance(mapping, dict) or not all(isinstance(v, str) for v in [*mapping, *mapping.values()])
        ):
            raise TypeError(f"sandbox {label} must be a dict of str -> str, got {mapping!r:.100}")
    if argv is not None and (not isinstance(argv, (list, tuple)) or isinstance(argv, str)):
        raise TypeError(f"sandbox argv must be a list of arguments such as ['--n', '3'], got {argv!r:.100}")
    files = dict(files or {})
    for name in [*files, filename]:
        if not isinstance(name, str) or not name or "/" in name or name in {".", ".."}:
            raise ValueError(
                f"sandbox file names must be plain names inside the workdir such as 'data.txt', got {name!r}"
            )
    return {
        "code": code,
        "stdin": stdin,
        "timeout": float(checked.timeout),
        "memory_mb": checked.memory_mb,
        "cpu_time_s": float(checked.cpu_seconds),
        "max_output_bytes": checked.max_output_bytes,
        "file_size_mb": checked.file_size_mb,
        "max_processes": checked.max_processes,
        "files": files,
        "env": {**BASE_ENV, **(env or {})},
        "argv": [str(arg) for arg in argv or []],
        "filename": filename,
    }


def memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


class FrameReader:
    """Length-prefixed JSON frames from the zygote, each with the fds (``nfds``) sent along with it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.fds = sock, bytearray(), collections.deque()

    def read(self) -> tuple[dict[str, Any] | None, list[int]]:
        while True:
            if len(self.buffer) >= 4:
                (size,) = FRAME.unpack_from(self.buffer)
                if len(self.buffer) >= 4 + size:
                    message = json.loads(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    count = message.get("nfds", 0)
                    return message, [self.fds.popleft() for _ in range(count) if self.fds]
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 20, 64)
            self.fds.extend(fds)
            if not data:
                for fd in self.fds:
                    os.close(fd)
                return None, []
            self.buffer += data


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    header = recv_exactly(sock, 4)
    if header is None:
        return None
    body = recv_exactly(sock, FRAME.unpack(header)[0])
    return None if body is None else json.loads(body)


def recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, missing = [], size
    while missing:
        chunk = sock.recv(min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)
