"""Run a command; write its wall time, CPU time and peak RSS to a JSON file.

    python -I -S _launch.py RESULT.json -- COMMAND [ARG ...]

The harness starts every measured command through this small process, because
Linux counts the memory of the process that forks and execs a child toward the
child's peak RSS: started straight from the (large) harness, every command
would appear to use at least as much memory as the harness. Started from here,
the floor is this launcher's few MiB. Exits with the command's exit status.

Wall time ends when the command exits. CPU time comes two ways:

- ``cpu_s``: user + sys of the command and of every process it started. The
  launcher is a child subreaper, so a descendant whose parent exits without
  waiting for it (a worker pool, a helper left behind) is re-parented here and
  reaped here once it exits (at most ``LINGER_S`` after the command; then it is
  killed), and its time is counted rather than lost. ``rss_kib`` is the largest
  peak RSS among all of them.
- ``sys_s``: the kernel's part of ``cpu_s`` (system time), to tell a build
  bound by its file system from one bound by its own work.
- ``own_cpu_s``: the command's process alone (all its threads, none of its
  children). Once the command has exited, and before it is reaped,
  ``waitid(WNOWAIT)`` leaves it a zombie whose ``/proc/PID/stat`` still holds
  utime and stime (fields 14-15, the whole thread group) apart from cutime and
  cstime (16-17, the children it reaped). ``None`` where /proc cannot be read.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
import time

LINGER_S = 30.0
PR_SET_CHILD_SUBREAPER = 36


def stat_times(pid: int) -> "tuple[float, float] | None":
    """(own, children) CPU seconds of ``pid`` from /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])  # fields 14-17
    return (utime + stime) / tick, (cutime + cstime) / tick


def subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_the_rest() -> int:
    """Wait for adopted descendants (killing them after LINGER_S); how many there were."""
    deadline, count = time.monotonic() + LINGER_S, 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return count
        if pid:
            count += 1
        elif time.monotonic() > deadline:
            for name in os.listdir("/proc"):  # our children: their parent is us
                if name.isdigit() and os.getpid() == _parent(int(name)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(name), signal.SIGKILL)
            deadline = float("inf")
        else:
            time.sleep(0.01)


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def main() -> int:
    result, sep, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if sep != "--" or not argv:
        print(__doc__, file=sys.stderr)
        return 2
    adopting = subreaper()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"cannot run {argv[0]}: {e}", file=sys.stderr)
        os._exit(127)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - start
    times = stat_times(pid)
    _, status, _ = os.wait4(pid, 0)
    adopted = reap_the_rest() if adopting else 0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w") as f:
        json.dump(
            {
                "wall_s": wall,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "sys_s": usage.ru_stime,
                "own_cpu_s": times[0] if times else None,
                "children_cpu_s": times[1] if times else None,
                "adopted": adopted,
                "rss_kib": usage.ru_maxrss,
                "returncode": code,
            },
            f,
        )
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
