"""Starting and stopping a sandbox's zygote (``_zygote.py``, run as a script): its configuration, the hello that says
which layers it put in force, the checks on them (a strict sandbox refuses to run without a required layer; a warning
when model code runs without ``landlock``) and what is left to clean up on the host when it stops."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import IO, Any

from rllm_gym.sandbox._result import SandboxUnavailableError
from rllm_gym.sandbox._wire import BASE_ENV, read_frame

_ZYGOTE = Path(__file__).with_name("_zygote.py")
_STARTUP_TIMEOUT_S = 30.0
REQUIRED_LAYERS = (
    "rlimits",
    "tmpdir",
    "scrubbed_env",
    "session_kill",
    "minimal_fs",
    "readonly_fs",
    "netns",
    "ipcns",
    "pidns",
    "private_proc",
    "unprivileged_uid",
    "seccomp",
    "memory_cgroup|memory_rules",
)


class ZygoteProcess:
    """A started zygote as the host holds it: ``proc``, the socket to it (``sock``), its stderr (for error messages),
    the folder its view was assembled in, its memory cgroup and the layers in force (``isolation``,
    ``landlock_abi``)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, log: IO[bytes], view_base: str, hello: dict):
        self.proc, self.sock, self.log, self.view_base = proc, sock, log, view_base
        self.isolation: list[str] = list(hello["isolation"])
        self.cgroup: str | None = hello.get("cgroup")
        self.landlock_abi = int(hello.get("landlock_abi") or 0)

    @classmethod
    def start(cls, options: dict[str, Any], strict: bool) -> ZygoteProcess:
        """Start a zygote for a sandbox's ``options`` (``max_parallel``, ``isolate``, ``packages``, ``preload``,
        ``read_view``) and wait for its hello. Raises RuntimeError when it cannot start and
        :class:`SandboxUnavailableError` when ``strict`` and a layer of :data:`REQUIRED_LAYERS` is missing."""
        host, child = socket.socketpair()
        # An empty folder of the host's where the zygote, in its own mount namespace, assembles its view's root.
        view_base = tempfile.mkdtemp(prefix="rllm-sandbox-view-")
        # A random uid range per zygote: runs of two zygotes never share a uid (RLIMIT_NPROC counts per uid).
        config = {
            **options,
            "uid_base": 1_000_000 + secrets.randbelow(8_000_000) * 512,
            "hidden": _project_folders(),
            "view_base": view_base,
        }
        argv = [sys.executable, "-I", str(_ZYGOTE), str(child.fileno()), json.dumps(config)]
        log = tempfile.TemporaryFile()  # noqa: SIM115 (the zygote's stderr, kept for error messages)
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(child.fileno(),),
                env=dict(BASE_ENV),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                cwd="/",
            )
        finally:
            child.close()
        host.settimeout(_STARTUP_TIMEOUT_S)
        try:
            hello = read_frame(host)
        except (OSError, ValueError) as exc:
            hello = {"hello": False, "error": f"{type(exc).__name__}: {exc}"}
        if not hello or not hello.get("hello"):
            proc.kill()
            proc.wait()
            host.close()
            _remove_view_base(view_base)
            raise RuntimeError(f"the sandbox zygote failed to start: {hello and hello.get('error')} {_tail(log)}")
        host.settimeout(None)
        zygote = cls(proc, host, log, view_base, hello)
        if options["isolate"] and not options["read_view"] and "landlock" not in zygote.isolation:
            warnings.warn(
                "the sandbox runs model code without its 'landlock' layer (it needs Linux 5.13 or later with Landlock "
                "enabled, and the minimal_fs view, which needs root): a run can read the interpreter's files, so one "
                "run can warm pages of them in the page cache and a later run can probe which; the layers in force: "
                f"{zygote.isolation}",
                RuntimeWarning,
                stacklevel=5,
            )
        missing = [layer for layer in REQUIRED_LAYERS if not set(layer.split("|")) & set(zygote.isolation)]
        if strict and missing:
            host.close()  # no reader uses it yet
            zygote.stop()
            raise SandboxUnavailableError(
                f"the sandbox cannot isolate model code here: missing layers {missing} (in effect: "
                f"{zygote.isolation}). It needs Linux, root (or a container with CAP_SYS_ADMIN) and x86-64 for "
                "seccomp; pass Sandbox(strict=False) or set RLLM_GYM_SANDBOX_STRICT=0 to run with weaker isolation "
                "at your own risk"
            )
        return zygote

    def log_tail(self) -> str:
        return _tail(self.log)

    def stop(self) -> None:
        """Close the socket (the zygote then kills its runs and exits), wait for it (killed after 5 s) and remove
        what it leaves on the host: its cgroup (emptied by the zygote, seen by path only here) and its view's
        folder."""
        with contextlib.suppress(OSError):  # the host's reader thread sees its end, and closes nothing itself
            self.sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.cgroup is not None:
            _remove_cgroup(self.cgroup)
            self.cgroup = None
        _remove_view_base(self.view_base)


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read()[-2000:].decode(errors="replace")


def _remove_view_base(folder: str) -> None:
    """The view's mounts lived in the zygote's mount namespace: on the host the folder is empty."""
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def _project_folders() -> list[str]:
    """The folders of this project's packages: the sandbox's view covers them wherever they are installed."""
    folders = []
    for name in ("rllm_gym", "rllm_gym.envs", "rllm_gym.agents", "rllm_gym.train"):
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders.append(os.path.realpath(location))
    return sorted(set(folders))


def _remove_cgroup(path: str) -> None:
    with contextlib.suppress(OSError):
        for entry in os.listdir(path):
            if entry.startswith("slot-"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(path, entry))
        os.rmdir(path)
