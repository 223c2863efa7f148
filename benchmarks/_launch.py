"""Run a command; write its wall time, CPU time and peak RSS to a JSON file.

    python -I -S _launch.py RESULT.json -- COMMAND [ARG ...]

The harness starts every measured command through this small process, because
Linux counts the memory of the process that forks and execs a child toward the
child's peak RSS: started straight from the (large) harness, every command
would appear to use at least as much memory as the harness. Started from here,
the floor is this launcher's few MiB. Exits with the command's exit status.
"""

import json
import os
import sys
import time


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
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w") as f:
        json.dump({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                   "rss_kib": usage.ru_maxrss, "returncode": code}, f)  # fmt: skip
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
