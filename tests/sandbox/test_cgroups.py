"""The runs' memory cgroups (``rllm_gym/sandbox/_cgroups.py``): every process and thread of a run is in its slot's
cgroup, which holds its memory limit, however it joined."""

from __future__ import annotations

import pytest

from rllm_gym.sandbox import ExecutionStatus, Sandbox

# Run as a trusted program (read_view=True: no Landlock, so it reads its own /proc): the memory cgroup of the main
# thread, of a thread it starts and of a process it forks.
_WHERE = r"""
import os, threading

def memory_cgroup(path):
    with open(path) as handle:
        return next(line.split(":", 2)[2].strip() for line in handle if "memory" in line.split(":")[1].split(","))

print("main", memory_cgroup("/proc/self/cgroup"))
seen = []
thread = threading.Thread(target=lambda: seen.append(memory_cgroup("/proc/thread-self/cgroup")))
thread.start()
thread.join()
print("thread", seen[0])
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, memory_cgroup("/proc/self/cgroup").encode())
    os._exit(0)
os.waitpid(pid, 0)
print("child", os.read(read, 4096).decode())
"""


@pytest.fixture(scope="module")
def trusted_sandbox():
    with Sandbox(max_parallel=2, read_view=True) as box:
        box.start()
        if "memory_cgroup" not in box.isolation:
            pytest.skip(f"no memory cgroup here: {box.isolation}")
        yield box


def test_a_run_its_threads_and_its_children_are_in_its_slot_cgroup(trusted_sandbox):
    zygote = trusted_sandbox._proc.pid
    with open(f"/proc/{zygote}/cgroup") as handle:
        zygote_cgroup = next(line.split(":", 2)[2].strip() for line in handle if ":memory:" in line)
    slots = set()
    for _ in range(3):
        result = trusted_sandbox.run(_WHERE, run_class="verdict")
        assert result.ok, (result.status, result.stderr)
        where = dict(line.split(" ", 1) for line in result.stdout.splitlines())
        assert set(where) == {"main", "thread", "child"} and len(set(where.values())) == 1, where
        cgroup = where["main"]
        parent, _, slot = cgroup.rpartition("/")
        # The zygote's own cgroup is the slots' parent (the host sees the run's path from the root of the hierarchy).
        assert parent.endswith(f"/rllm-sandbox-{zygote}") and slot.startswith("slot-"), cgroup
        assert cgroup != zygote_cgroup
        slots.add(slot)
    assert slots


def test_a_forked_child_cannot_hold_memory_past_the_slot_limit(trusted_sandbox):
    """Memory outside every address space (a memfd's pages) written by a forked child still counts against
    ``memory_mb``: the child is charged to the run's slot, not to a cgroup without the limit."""
    program = (
        "import os\nread, write = os.pipe()\npid = os.fork()\nif pid == 0:\n"
        "    fd, chunk = os.memfd_create('hoard'), b'x' * (4 << 20)\n"
        "    for placed in range(4, 404, 4):\n"
        "        os.write(fd, chunk)\n        os.write(write, f'{placed}\\n'.encode())\n"
        "    os._exit(0)\nos.close(write)\nos.waitpid(pid, 0)\n"
        "print(max([0, *map(int, os.read(read, 1 << 16).split())]))\n"
    )
    result = trusted_sandbox.run(program, memory_mb=96, file_size_mb=1024, run_class="verdict", timeout=20)
    placed = int(result.stdout) if result.stdout.strip().isdigit() else 0
    assert placed <= 96, (placed, result.status, result.stderr[-500:])
    assert result.status in (ExecutionStatus.OK, ExecutionStatus.MEMORY_LIMIT), (result.status, result.stderr)
