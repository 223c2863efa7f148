"""Run a command; write its wall time, CPU time and peak RSS to a JSON file.

    python -I -S _launch.py RESULT.json -- COMMAND [ARG ...]

The harness starts every measured command through this small process, because
Linux counts the memory of the process that forks and execs a child toward the
child's peak RSS: started straight from the (large) harness, every command
would appear to use at least as much memory as the harness. Started from here,
the floor is this launcher's few MiB. Exits with the command's exit status.

CPU time comes two ways. ``cpu_s`` is ``os.wait4``'s user + sys: the command and
every descendant it waited for. ``own_cpu_s`` is the command's process alone
(all its threads, none of its children): once the command has exited, and
before it is reaped, ``waitid(WNOWAIT)`` leaves it a zombie whose
``/proc/PID/stat`` still holds utime and stime (fields 14-15, the whole thread
group) apart from cutime and cstime (16-17, the children it reaped). ``None``
where /proc cannot be read.
"""

import json
import os
import sys
import time


def stat_times(pid: int) -> "tuple[float, float] | None":
    """(own, children) CPU seconds of ``pid`` from /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])  # fields 14-17
    return (utime + stime) / tick, (cutime + cstime) / tick


def main() -> int:
    result, sep, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if sep != "--" or not argv:
        print(__doc__, file=sys.stderr)
        return 2
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
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w") as f:
        json.dump({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                   "own_cpu_s": times[0] if times else None,
                   "children_cpu_s": times[1] if times else None,
                   "rss_kib": usage.ru_maxrss, "returncode": code}, f)  # fmt: skip
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
