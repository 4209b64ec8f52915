"""Isolated execution of untrusted, model-written Python: limits, namespaces, a memory cgroup and a warm fork server.

``run_python(code, stdin=..., timeout=...)`` runs a program and returns a :class:`SandboxResult` whose ``status`` says
how it ended (``ok``, ``runtime_error``, ``killed``, ``timeout``, ``memory_limit``, ``output_limit``,
``sandbox_error``) and whose ``isolation`` lists what was in effect. ``await arun_python(...)`` is the same without
blocking the event loop; any number may run at once (the sandbox queues them past ``max_parallel``).
``Sandbox.run_pair(solution, harness)`` runs trusted test code (the harness) and model code (the solution) as two
such runs joined by a channel that carries calls and plain-data return values only (:mod:`rllm_gym.sandbox.channel`):
the verdict of a function test is never decided in the process that runs model code.

How: a small warm interpreter (the "zygote", :mod:`rllm_gym.sandbox._zygote`, standard library only, started with a
scrubbed environment) forks one child per run, which is several times cheaper than starting ``python -c``. Isolation
layers, each listed in ``SandboxResult.isolation`` only when it is really in effect:

* ``rlimits``: CPU time, address space (``memory_mb``), file size, open files, no core dumps, and the process count
  (``max_processes``) when the run has its own uid (root is exempt from ``RLIMIT_NPROC``);
* ``tmpdir``: a fresh working directory, gone afterwards: with ``minimal_fs`` a private size-capped tmpfs on
  ``/sandbox`` (also ``HOME``, ``TMPDIR`` and, through links, ``/tmp`` and ``/dev/shm``) that no other run can see;
* ``scrubbed_env``: the code sees only ``PATH``, ``LANG``, ``HOME``/``TMPDIR`` (its workdir) and the ``env`` passed in,
  never the host's variables (no ``*_KEY``/``*_TOKEN``), neither in ``os.environ`` nor in ``/proc/self/environ``;
* ``session_kill``: the run is its own session; it is killed as a whole on timeout and after it ends;
* ``minimal_fs`` and ``readonly_fs``: the run's root is a new read-only tree holding ``/usr``, the interpreter and
  its virtual environment, a synthetic ``/etc`` (passwd, group, hosts), ``/dev/null``-style nodes, its own ``/proc``
  and ``/tmp``: the project's source and data files (the package folders are covered even inside site-packages), the
  user's home, the host's working directory and other runs' files do not exist for it;
* ``netns``/``ipcns``: each run has its own empty network namespace (no interface up, no abstract unix socket shared
  with another run) and IPC namespace (SysV shared memory, semaphores, message queues, POSIX message queues), which
  die with it;
* ``pidns`` and ``private_proc``: each run is pid 1's child in its own PID namespace, so nothing it starts outlives it,
  and its ``/proc`` shows only its own processes; its supervisor (pid 1) stays root, out of the code's reach;
* ``unprivileged_uid``: the code runs as a fresh uid of its own, without capabilities or ``no_new_privs`` escapes,
  so it cannot signal, trace or read the host's processes or its supervisor;
* ``seccomp`` (x86-64): EPERM for new namespaces (``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag;
  ``clone3`` gets ENOSYS so libc falls back to ``clone``), ``mount``/``umount2``/``pivot_root``/``chroot`` and the new
  mount API, ``ptrace``, ``process_vm_*``, ``bpf``, ``keyctl``, ``perf_event_open``, ``userfaultfd``, ``kexec_*``,
  modules, ``io_uring``, non-UNIX sockets, the page-cache probes (``mincore``, ``cachestat``, ``preadv2``) and what
  evicts or reads ahead file pages (``fadvise64``, ``readahead``, ``madvise`` with ``MADV_COLD``/``MADV_PAGEOUT``);
* ``landlock``: the process that runs model code lives in a root of its own that holds only its ``/sandbox``, the
  ``/dev`` nodes and the shared objects of the extension modules it may load (each held resident and locked by the
  zygote), and a Landlock ruleset refuses it anything else, so no run can warm pages of a file, or a directory entry,
  for a later run to count or time (``_landlock.py``); it imports the standard library and what the sandbox preloads
  from the zygote's memory (``_preload.py``). Needs Linux 5.13+ with Landlock; optional: where it is
  missing, a warning says so and ``Sandbox.landlock_abi`` is 0. ``Sandbox(read_view=True)`` leaves it off, for trusted
  scorers that read their own files;
* ``memory_cgroup``: ``memory_mb`` is also the limit of a memory cgroup (v1 ``memory.limit_in_bytes`` +
  ``memory.memsw``, or v2 ``memory.max``) that counts every page the run touches: anonymous, tmpfs, ``/dev/shm``,
  memfd, SysV shared memory; where no cgroup can be made, ``memory_rules`` says that seccomp refuses ``memfd_create``
  and ``shmget`` instead and ``/dev/shm`` is the capped tmpfs.

**Run classes** (``run_class``): a run whose output may reach the model (``"visible"``: public tests, revision
feedback, the ``python`` tool) never runs at the same time as one that holds hidden inputs (``"verdict"``: hidden
tests, scorers), so neither can time the other's use of the CPU; a run without a class runs alone. A verdict run's
result is released at a level of a doubling grid (0.1 s, 0.2 s, 0.4 s, ...), so a later run reading the clock learns
that level, not its duration (``_gate.py``: one gate per process, shared by its :class:`Sandbox` objects, and the
gates of one user's processes on a host take turns through ``flock``; ``Sandbox.schedule`` holds the gate's records
of a sandbox's runs). From a verdict run's submission to its release, the thread waiting for it lends its place in the
engine's env thread pool (:mod:`rllm_gym.slots`).

``strict=True`` (the default) refuses to run code when a layer of :data:`REQUIRED_LAYERS` is missing
(:class:`SandboxUnavailableError` names it); ``strict=False`` (or ``RLLM_GYM_SANDBOX_STRICT=0`` for the shared
sandbox) runs with what the OS allows (not root, not Linux) and ``isolation`` says so. A failure of the sandbox
itself is ``sandbox_error``: graders must never score it as a wrong answer, and nothing the code does can cause it.

Layout: :mod:`~rllm_gym.sandbox.limits` (a run's limits, checked by one rule), ``_result.py`` (statuses and results),
``_wire.py`` (requests and frames), ``_gate.py`` (the order of runs by class), ``_host.py`` (:class:`Sandbox`),
``_spawn.py`` (starting and stopping its zygote, the layers a strict sandbox requires),
:mod:`~rllm_gym.sandbox.channel` (the pair's plain-data calls), and the zygote's side, standard library only and loaded
by path: ``_zygote.py`` (the fork server), ``_zygote_run.py`` (one run's supervisor and solution processes),
``_isolation.py`` (the layers), ``_cgroups.py`` (the memory cgroups), ``_landlock.py`` and ``_preload.py`` (what the
zygote loads and pins for runs under Landlock).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from rllm_gym.sandbox._gate import RUN_CLASSES, check_run_class
from rllm_gym.sandbox._host import Sandbox
from rllm_gym.sandbox._result import ExecutionStatus, PairResult, SandboxResult, SandboxUnavailableError
from rllm_gym.sandbox._spawn import REQUIRED_LAYERS
from rllm_gym.sandbox._wire import build_request
from rllm_gym.sandbox.limits import DEFAULT_LIMITS, SandboxLimits

__all__ = [
    "DEFAULT_LIMITS",
    "REQUIRED_LAYERS",
    "RUN_CLASSES",
    "ExecutionStatus",
    "PairResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "arun_python",
    "default_sandbox",
    "run_python",
]

_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox that :func:`run_python` and :func:`arun_python` use (one per process after a fork).

    Strict unless the environment variable ``RLLM_GYM_SANDBOX_STRICT`` is ``0``; ``RLLM_GYM_SANDBOX_MAX_PARALLEL``
    (an int in [1, 256]) sets its ``max_parallel`` (default: the :class:`Sandbox` default).
    """
    global _default
    with _default_lock:
        if _default is None:
            strict = os.environ.get("RLLM_GYM_SANDBOX_STRICT", "1") != "0"
            _default = Sandbox(strict=strict, max_parallel=_max_parallel_from_environment())
            atexit.register(_default.close)
        return _default


def _max_parallel_from_environment() -> int | None:
    """``RLLM_GYM_SANDBOX_MAX_PARALLEL`` as an int, None where unset; a clear error where it is not a number."""
    text = os.environ.get("RLLM_GYM_SANDBOX_MAX_PARALLEL", "").strip()
    if not text:
        return None
    if not (text.isdecimal() and 1 <= int(text) <= 256):
        raise ValueError(
            f"RLLM_GYM_SANDBOX_MAX_PARALLEL must be an int in [1, 256] (runs at once), got {text!r}: fix or unset it"
        )
    return int(text)


def run_python(code: str, *, sandbox: Sandbox | None = None, **kwargs: Any) -> SandboxResult:
    """Run untrusted Python source as ``__main__`` in the sandbox and wait for it.

    Args:
        code: the program. sandbox: a :class:`Sandbox` to use instead of :func:`default_sandbox`.
        stdin: fed to its standard input (default ``""``). files: extra ``{name: text}`` written into its working
            directory. env: extra environment variables. argv: its ``sys.argv[1:]``.
        timeout, memory_mb, cpu_time_s, max_output_bytes, file_size_mb, max_processes: the run's limits, with the
            defaults and rules of :class:`~rllm_gym.sandbox.limits.SandboxLimits` (``timeout`` 5 s, ``memory_mb``
            512, ``cpu_time_s`` the timeout, ``max_output_bytes`` 1 MiB per stream: past it the run is killed with
            ``output_limit`` and ``truncated=True``).

        run_class: ``"visible"`` when its output may reach the model, ``"verdict"`` when only a verdict comes out of
            it (hidden tests, scorers), None (default) to run it alone: runs of the two classes never run at the same
            time, and a verdict's result waits for its release level (:mod:`rllm_gym.sandbox._gate`).

    Bad arguments raise ``ValueError``/``TypeError``; everything that goes wrong at run time is in the result.
    """
    return (sandbox or default_sandbox()).run(code, **kwargs)


async def arun_python(code: str, *, sandbox: Sandbox | None = None, **kwargs: Any) -> SandboxResult:
    """:func:`run_python` for asyncio: awaits the run without blocking the loop. Takes the same keyword arguments."""
    check_run_class(kwargs.get("run_class"))  # bad arguments raise here, in the caller's frame
    build_request(code, **{key: value for key, value in kwargs.items() if key != "run_class"})
    return await (sandbox or default_sandbox()).arun(code, **kwargs)
