"""Strings from users and servers reach the report and the terminal escaped
(docs/reliability.md, "Trust model"): no description can end the report's data
script or open a comment, none can write a control sequence to the terminal or
forge a line of kiln's, in the plain lines and the live display alike; and
``kiln report`` reads a damaged record as untrusted: a message, never a
traceback, never a hang."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_report import run_chromium

Kiln = Callable[..., Any]

HOSTILE = [
    "<!--<script>",
    "</script><script>document.title='pwned'</script>",
    "<!-- a comment -->",
    "a\u2028b & c > d",
    "clear \x1b[2J screen",
    "retitle \x1b]0;pwned\x07 window",
    "forged\nkiln: done: 9 built, 0 up to date, 0 failed, 0 not run in 0.01s",
    "carriage\rreturn",
    "csi \x9b31m c1",
    "bidi \u202eevil",
]

MODULE = """
from kiln.base.errors import ActionFailed

DESCS = {descs!r}


class Named(BuildAction):
    def __init__(self, out, fail, **kw):
        super().__init__(**kw)
        self.out, self.fail = out, fail
        out.deps.add(self)

    def _invoke(self):
        if self.fail:
            raise ActionFailed("it failed: " + self.desc)
        self.out.get_fs_path().write_text("ok")


@entrypoint
def hostile():
    ctx = BuildContext.current()
    outs = []
    for i, desc in enumerate(DESCS):
        out = ctx.allocate_file(f"o{{i}}.txt")
        Named(out, fail=(i == 6), desc=desc, executor=ctx.executor)
        outs.append(out)
    return outs
"""


@pytest.fixture
def hostile_module(write_module: Callable[..., Path]) -> Path:
    return write_module(MODULE.format(descs=HOSTILE))


# -- the report -----------------------------------------------------------------------


def test_no_description_can_break_the_reports_script(
    hostile_module: Path, kiln_in_process: Kiln, tmp_path: Path
) -> None:
    r = kiln_in_process("build", "build.py", "-j", "2")
    assert r.returncode == 1, r.stderr
    r = kiln_in_process("report", "-o", "report.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report.html").read_text()
    blob = re.search(r"id='kiln-data'>(.*?)</script>", page, re.S).group(1)
    assert "<" not in blob and ">" not in blob and "&" not in blob
    data = json.loads(blob)
    assert {run["desc"] for run in data["runs"]} == set(HOSTILE)  # read back as written
    dom = run_chromium(
        ["--window-size=1280,1000", "--dump-dom", (tmp_path / "report.html").as_uri()], tmp_path
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    rendered = re.search(r'id="timeline"[^>]*data-rendered="(\d+)"', html)
    assert rendered and rendered.group(1) == str(len(HOSTILE)), html[:3000]
    assert "<title>pwned" not in html and html.count("<script") == 2


def _damage(events: Path, how: str) -> None:
    lines = events.read_bytes().splitlines()
    records = [json.loads(line) for line in lines]
    if how == "mistyped fields":
        for rec in records[1:]:
            rec.update(time="soon", duration="long", deps=5, outputs="x", lane=[1], desc={"a": 1})
        records[-1]["counts"] = {"built": "many", "failed": None}
        records[0]["targets"] = "all"
        records[0]["jobs"] = "two"
    lines = [json.dumps(rec).encode() for rec in records]
    if how == "a list line":
        lines.insert(1, b"[1, 2, 3]")
        lines.insert(2, b'"a string"')
        lines.insert(3, b"null")
    elif how == "invalid UTF-8":
        lines.insert(1, b'{"event": "started", "action": "x\xff\xfe", "time": 1}')
        lines.append(b"\xc3\x28\xa0\xa1")
    elif how == "a bad first line":
        lines[0] = b'{"event": "build_started", "time": "yesterday"}'
    events.write_bytes(b"\n".join(lines) + b"\n")


@pytest.mark.parametrize(
    "how", ["mistyped fields", "a list line", "invalid UTF-8", "a bad first line"]
)
def test_a_damaged_record_is_read_as_untrusted(
    how: str, hostile_module: Path, kiln_in_process: Kiln, tmp_path: Path
) -> None:
    kiln_in_process("build", "build.py")
    _damage(tmp_path / "kiln-out/.kiln/last-events.jsonl", how)
    r = kiln_in_process("report", "-o", "report.html")
    assert "Traceback" not in r.stderr
    if how == "a bad first line":
        assert r.returncode == 2 and "does not hold a kiln build's events" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "report.html").read_text().endswith("</html>\n")


@pytest.mark.parametrize("time", ["1e300", "-1e300", "8589934592", "-1"])
def test_a_build_time_no_clock_shows_is_not_believed(
    time: str, hostile_module: Path, kiln_in_process: Kiln, tmp_path: Path
) -> None:
    """A kept build whose start time is out of any clock's range (1e300 overflowed
    the date formatting: a traceback) is not a build kiln recorded: ``kiln report``
    says so, and ``--list`` and the page's kept builds leave it out."""
    hostile = f'{{"event": "build_started", "seq": 1, "time": {time}}}\n'
    alone = tmp_path / "alone/.kiln"
    alone.mkdir(parents=True)
    (alone / "last-events.jsonl").write_text(hostile)
    for args in (["report"], ["report", "--list"]):
        r = kiln_in_process(*args, "--output-dir", "alone")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said = kiln_in_process("report", "--output-dir", "alone").stderr
    assert "does not hold a kiln build's events" in said
    said = kiln_in_process("report", "--list", "--output-dir", "alone").stderr
    assert "no build recorded" in said

    for _ in range(3):
        kiln_in_process("build", "build.py")
    (tmp_path / "kiln-out/.kiln/previous-1-events.jsonl").write_text(hostile)
    listed = kiln_in_process("report", "--list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["0", "2"]
    page = kiln_in_process("report", "-o", "report.html")
    assert page.returncode == 0 and "Traceback" not in page.stderr, page.stderr
    assert "Kept builds (2)" in (tmp_path / "report.html").read_text()
    before = kiln_in_process("report", "--build", "1")
    assert before.returncode == 2 and "does not hold a kiln build's events" in before.stderr


@pytest.mark.parametrize(
    "manifest",
    [
        {"entrypoints": []},
        {"entrypoints": {"e": []}},
        {"entrypoints": {"e": {"outputs": [1, {"path": 5, "sha256": 7, "verification": "x"}]}}},
        {"entrypoints": {"e": {"outputs": [{"size": "big", "verification": [1, {"passed": 2}]}]}}},
        [1, 2],
    ],
)
def test_a_damaged_manifest_is_read_as_untrusted(
    manifest: object, hostile_module: Path, kiln_in_process: Kiln, tmp_path: Path
) -> None:
    kiln_in_process("build", "build.py")
    (tmp_path / "kiln-out/manifest.json").write_text(json.dumps(manifest))
    r = kiln_in_process("report", "-o", "report.html")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_fifos_in_the_record_never_hang_the_report(
    hostile_module: Path, kiln_in_process: Kiln, kiln_subprocess: Kiln, tmp_path: Path
) -> None:
    kiln_in_process("build", "build.py")
    events = tmp_path / "kiln-out/.kiln/last-events.jsonl"
    records = [json.loads(line) for line in events.read_text().splitlines()]
    fifo = tmp_path / "a.fifo"
    os.mkfifo(fifo)
    for rec in records:
        if rec.get("event") == "failed":
            rec["log"] = str(fifo)  # a log tail read from a FIFO would block
    events.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    r = kiln_subprocess("report", "-o", "report.html", timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    events.unlink()
    os.mkfifo(events)
    r = kiln_subprocess("report", "-o", "report.html", timeout=60)
    assert r.returncode == 2 and "a FIFO" in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- the terminal ---------------------------------------------------------------------

# What a terminal would obey in kiln's output, were a user's string printed raw.
RAW = ["\x1b[2J", "\x1b]0;", "\x07", "\r", "\x9b", "\u202e"]


def _assert_escaped(text: str) -> None:
    for seq in RAW:
        assert seq not in text, (seq, text)
    assert "\\x1b[2J" in text and "\\x1b]0;pwned\\x07" in text and "\\x9b31m" in text
    assert "\\u202eevil" in text and "carriage\\rreturn" in text
    done = [line for line in text.splitlines() if line.startswith(("kiln: done", "kiln: FAILED"))]
    assert done == [done[-1]] and done[0].startswith("kiln: FAILED"), done  # none forged


@pytest.mark.parametrize("console", ["plain", "live"])
def test_user_strings_reach_the_terminal_escaped(
    console: str, hostile_module: Path, kiln_subprocess: Kiln
) -> None:
    r = kiln_subprocess("build", "build.py", "-j", "1", "--console", console)
    assert r.returncode == 1, r.stderr
    _assert_escaped(r.stderr)
    assert "forged\\nkiln: done: 9 built" in r.stderr  # the description, on one line
    verbose = kiln_subprocess(
        "build",
        "build.py",
        "-j",
        "1",
        "--console",
        console,
        "-v",
        "--output-dir",
        "v",
        "--no-cache",
    )
    _assert_escaped(verbose.stderr)


def test_listing_shows_descriptions_escaped(hostile_module: Path, kiln_in_process: Kiln) -> None:
    r = kiln_in_process("list", "build.py", "--all")
    assert r.returncode == 0, r.stderr
    for seq in RAW:
        assert seq not in r.stdout
    assert "forged\\nkiln: done" in r.stdout


# -- what user code writes while kiln runs it -----------------------------------------

# Each line a build module, its actions and their workers write: a screen clear and
# a retitle, behind a tag that finds the line.
WRITES_MODULE = r"""
import ctypes, functools, logging, os, subprocess, sys, warnings

BAD = "\x1b[2J \x1b]0;pwned\x07 \x9b31m \x08\x7f\x85"
sys.stderr.write(f"M1 {BAD} at import\n")


def work(path):
    print(f"W1 {BAD} print")
    print(f"W2 {BAD} print to stderr", file=sys.stderr)
    warnings.warn(f"W3 {BAD} warning")
    logging.warning(f"W4 {BAD} logging")
    os.write(2, f"W5 {BAD} os.write\n".encode())
    subprocess.run([sys.executable, "-c", f"print({'W6 ' + BAD + ' a program'!r})"], check=True)
    ctypes.CDLL(None).printf(f"W7 {BAD} the C library's printf\n".encode())  # buffered
    open(path, "w").write("x")


class InWorker(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        return functools.partial(work, str(self.out.get_fs_path()))


class InKiln(BuildAction):
    def __init__(self, out, tag, **kw):
        super().__init__(**kw)
        self.out, self.tag = out, tag
        out.deps.add(self)

    def _invoke(self):
        t = self.tag
        sys.stderr.write(f"{t}1 {BAD} sys.stderr.write\n")
        print(f"{t}2 {BAD} print to stderr", file=sys.stderr)
        warnings.warn(f"{t}3 {BAD} warning")
        logging.warning(f"{t}4 {BAD} logging")
        sys.stdout.buffer.write(f"{t}5 {BAD} stdout bytes\n".encode())
        sys.stderr.buffer.write(f"{t}6 {BAD} stderr bytes\n".encode())
        for byte in f"{t}7 {BAD} \u00e9\u20ac one byte at a time\n".encode():
            sys.stderr.buffer.write(bytes([byte]))
        sys.stderr.flush()
        self.out.get_fs_path().write_text("x")


@entrypoint
def worker():
    ctx = BuildContext.current()
    return InWorker(ctx.allocate_file("w.txt"), desc="w", executor=ctx.executor).out


def flood(path):
    subprocess.Popen(["yes", BAD])  # left running, writing without a pause
    open(path, "w").write("x")


class Flood(InWorker):
    def _remotable_thunk(self):
        return functools.partial(flood, str(self.out.get_fs_path()))


@entrypoint
def flooded():
    ctx = BuildContext.current()
    return Flood(ctx.allocate_file("f.txt"), desc="f", executor=ctx.executor).out


@entrypoint
def thread():
    ctx = BuildContext.current()
    return InKiln(ctx.allocate_file("t.txt"), "T", desc="t", executor=ctx.executor).out


@entrypoint
def inline():
    ctx = BuildContext.current()
    out = ctx.allocate_file("i.txt")
    none = ActionConcurrency.NONE
    return InKiln(out, "I", desc="i", executor=ctx.executor, concurrency=none).out
"""


# Each kind of control character a terminal obeys: ESC (a sequence), BEL (C0), a
# CSI of C1 (\x9b, as some terminals read it), backspace, DEL and C1's NEL (a newline
# to some, and to str.splitlines). What kiln must show of BAD on the line it came in.
CONTROLS = ["\x1b", "\x07", "\x9b", "\x08", "\x7f", "\x85"]
BAD_SHOWN = "\\x1b[2J \\x1b]0;pwned\\x07 \\x9b31m \\x08\\x7f"


def _assert_shown_escaped(stderr: str, tags: list[str], live: bool = False) -> None:
    """No control character of BAD in ``stderr`` (with ``live``, where the display
    writes its own ESC sequences: none of BAD's), and a line shows each tag's BAD."""
    raw = ["\x1b[2J", "\x1b]0;", *CONTROLS[1:]] if live else CONTROLS
    for char in raw:
        assert char not in stderr, (char, stderr)
    for tag in tags:
        assert f"{tag} {BAD_SHOWN}" in stderr, (tag, stderr)


def _assert_lines_escaped(stderr: str, tags: list[str]) -> None:
    for char in CONTROLS:
        assert char not in stderr, (char, stderr)
    for tag in tags:
        lines = [line for line in stderr.splitlines() if f"{tag} " in line]
        assert lines and BAD_SHOWN in lines[0], (tag, stderr)


@pytest.mark.parametrize(
    ("target", "tags"),
    [
        ("worker", ["W1", "W2", "W3", "W4", "W5", "W6", "W7"]),
        ("thread", ["T1", "T2", "T3", "T4", "T5", "T6", "T7"]),
        ("inline", ["I1", "I2", "I3", "I4", "I5", "I6", "I7"]),
    ],
)
def test_what_user_code_writes_reaches_the_terminal_escaped(
    target: str, tags: list[str], write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    """Whatever the stream (print, sys.stderr, warnings, logging, the bytes under them,
    a worker's descriptors and the programs it starts): escaped, at import too."""
    write_module(WRITES_MODULE)
    r = kiln_subprocess("build", "build.py", target, "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "kiln: done: 1 built" in r.stderr
    _assert_lines_escaped(r.stderr, ["M1", *tags])
    if target != "worker":  # a character written a byte at a time arrives whole
        assert "\u00e9\u20ac one byte at a time" in r.stderr, r.stderr
    assert "\x1b" not in r.stdout and r.stdout.strip().endswith(".txt")


def test_a_program_a_worker_leaves_writing_does_not_hold_the_action(
    write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    """What the worker copies once its action returned is bounded: a program the
    action left writing without a pause neither keeps it from replying nor reaches
    the terminal raw."""
    write_module(WRITES_MODULE)
    r = kiln_subprocess("build", "build.py", "flooded", "--no-cache", timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kiln: done: 1 built" in r.stderr
    assert "\x1b" not in r.stderr


# Multi-line text kiln prints of a failure: the tail of a failed command's log, an
# action's error and its traceback (-v), an error at the module's import.
FAILURES_MODULE = r"""
import sys
from kiln.base.errors import ActionFailed

BAD = "\x1b[2J \x1b]0;pwned\x07 \x9b31m \x08\x7f\x85"
SAYS = (f"import sys; print({'L1 ' + BAD!r}); "
        f"sys.stderr.write({'L2 ' + BAD + chr(10)!r}); sys.exit(3)")


class Fails(BuildAction):
    def __init__(self, out, how, **kw):
        super().__init__(**kw)
        self.out, self.how = out, how
        out.deps.add(self)

    def _invoke(self):
        if self.how == "error":
            raise ActionFailed(f"E1 {BAD} first line\nE2 {BAD} second line")
        raise ValueError(f"V1 {BAD} first line\nV2 {BAD} second line")


@entrypoint
def tail():
    return run_command(name="t.txt", command=[sys.executable, "-c", SAYS])


@entrypoint
def error():
    ctx = BuildContext.current()
    return Fails(ctx.allocate_file("e.txt"), "error", desc="e", executor=ctx.executor).out


@entrypoint
def raised():
    ctx = BuildContext.current()
    return Fails(ctx.allocate_file("r.txt"), "raise", desc="r", executor=ctx.executor).out


if "--import-fails" in sys.argv:
    raise RuntimeError(f"I1 {BAD} at import\nI2 {BAD} its second line")
"""


@pytest.mark.parametrize("console", ["plain", "live"])
@pytest.mark.parametrize(
    ("target", "tags"),
    [("tail", ["L1", "L2"]), ("error", ["E1", "E2"]), ("raised", ["V1", "V2"])],
)
def test_what_a_failure_shows_reaches_the_terminal_escaped(
    target: str,
    tags: list[str],
    console: str,
    write_module: Callable[..., Path],
    kiln_subprocess: Kiln,
) -> None:
    """The multi-line texts of a failure keep their lines, never their control
    characters: C0, ESC, DEL and C1 alike, with -v (tracebacks) too."""
    write_module(FAILURES_MODULE)
    for out, verbose in (("o", []), ("v", ["-v"])):
        argv = ["build", "build.py", target, "--console", console, "--output-dir", out]
        r = kiln_subprocess(*argv, "--no-cache", *verbose)
        assert r.returncode == 1, r.stderr
        _assert_shown_escaped(r.stderr, tags, live=console == "live")


def test_an_error_at_import_reaches_the_terminal_escaped(
    write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    write_module(FAILURES_MODULE)
    for verbose in ([], ["-v"]):
        r = kiln_subprocess("build", "build.py", "--import-fails", *verbose)
        assert r.returncode != 0 and "I1 " in r.stderr, r.stderr
        _assert_shown_escaped(r.stderr, ["I1", "I2"])


SILENCER_MODULE = """
import os, sys


class Silencer(BuildAction):
    def __init__(self, out, how, fails, **kw):
        super().__init__(**kw)
        self.out, self.how, self.fails = out, how, fails
        out.deps.add(self)

    def _invoke(self):
        if self.how == "close":
            sys.stderr.close()
            sys.stdout.close()
        else:
            sys.stderr = sys.stdout = open(os.devnull, "w")
        if not self.fails:
            self.out.get_fs_path().write_text("x")


@entrypoint
def silence(how=cl_arg("how", default="close"), fails=cl_arg("fails", default=0, type=int)):
    ctx = BuildContext.current()
    out = ctx.allocate_file("s.txt")
    return Silencer(out, how, fails, desc="s", executor=ctx.executor).out
"""


@pytest.mark.parametrize(("how", "fails"), [("close", 0), ("close", 1), ("replace", 1)])
def test_user_code_cannot_silence_kiln(
    how: str, fails: int, write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    """An action that closes or replaces sys.stderr and sys.stdout: kiln still says
    how the build ended, with the status that says it, and prints the outputs."""
    write_module(SILENCER_MODULE)
    r = kiln_subprocess("build", "build.py", "--how", how, "--fails", str(fails), "--no-cache")
    if fails:
        assert r.returncode == 1, r.stderr
        assert "finished without writing its output" in r.stderr
        assert r.stderr.splitlines()[-1].startswith("kiln: FAILED: 0 built"), r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert r.stderr.splitlines()[-1].startswith("kiln: done: 1 built"), r.stderr
        assert r.stdout.strip().endswith("s.txt"), r.stdout
