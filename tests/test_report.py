"""``kiln report``: a self-contained HTML page of the last build, checked in a
real headless Chromium (Debian's ``chromium``): the timeline is drawn, the
critical path marked, the failure shown with its log tail."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import needs
import pytest

pytestmark = pytest.mark.in_process


MODULE = """
from pathlib import Path

from kiln.base.errors import ActionFailed


class LoggedFailure(BuildAction):
    \"\"\"Writes a long log, then fails, as a compile would.\"\"\"

    def __init__(self, *, out, log, **kwargs):
        super().__init__(**kwargs)
        self._out = out
        self.log_path = log

    def _invoke(self):
        with open(self.log_path, "w") as f:
            for i in range(100):
                f.write(f"compiler pass {i} <ok>\\n")
            f.write("error: the model does not fit\\n")
        raise ActionFailed("compile failed; see its log")


@entrypoint
def chain():
    previous = []
    for i in range(3):
        step = run_command(name=f"step{i}.txt", inputs=previous,
                           command=["sh", "-c", 'sleep 0.3; echo "$0" > "$1"', f"s{i}", "{out}"])
        previous = [step]
    return previous


@entrypoint
def wide():
    return [run_command(name=f"w{i}.txt",
                        command=["sh", "-c", f"sleep 0.1; echo {i} > $0", "{out}"])
            for i in range(4)]


@entrypoint
def failing():
    ctx = BuildContext.current()
    out = ctx.allocate_file("model.vmfb")
    action = LoggedFailure(desc="Compiling failing/model.vmfb", executor=ctx.executor, out=out,
                           log=str(Path.cwd() / "compile.log"))
    out.deps.add(action)
    return run_command(name="after.txt", inputs=[out], command=["touch", "{out}"])
"""


@pytest.fixture
def built(write_module, kiln, tmp_path: Path) -> Path:
    """A finished build with a failure; returns the report's path."""
    write_module(MODULE)
    assert kiln("build", "build.py", "-j", "2").returncode == 1
    r = kiln("report", "-o", "report.html")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "report.html"
    return tmp_path / "report.html"


def test_report_needs_a_build_first(kiln) -> None:
    r = kiln("report")
    assert r.returncode == 2
    assert "no build recorded in kiln-out" in r.stderr and "kiln build" in r.stderr
    assert "Traceback" not in r.stderr


def test_report_is_self_contained_and_complete(built: Path, tmp_path: Path) -> None:
    page = built.read_text()
    # Nothing is fetched: no external script, style sheet, image or font.
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    data = json.loads(re.search(r"id='kiln-data'>(.*?)</script>", page, re.S).group(1))
    assert len(data["runs"]) == 8  # 3 + 4 built, 1 failed
    assert set(data["lanes"]) <= {"kiln-0", "kiln-1"}
    critical = [r["desc"] for r in data["runs"] if r["critical"]]
    assert critical == [f"Running chain/step{i}.txt" for i in range(3)]
    section = page[page.index("id='failures'") : page.index("id='artifacts'")]
    assert "Compiling failing/model.vmfb" in section and "compile failed; see its log" in section
    assert "error: the model does not fit" in section
    assert "compiler pass 99 &lt;ok&gt;" in section and "compiler pass 10 " not in section
    assert (tmp_path / "compile.log").as_uri() in section
    assert "1 not run because of Compiling failing/model.vmfb" in section
    step = (tmp_path / "kiln-out" / "genfiles" / "chain" / "step2.txt").read_bytes()
    assert hashlib.sha256(step).hexdigest() in page
    assert "genfiles/chain/step2.txt" in page


def chromium() -> str:
    return needs.program("chromium", "chromium-browser")


def run_chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_report_renders_in_headless_chromium(built: Path, tmp_path: Path) -> None:
    url = built.absolute().as_uri()
    dom = run_chromium(["--window-size=1280,1000", "--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # The timeline was drawn by the page's script: one bar per action run.
    rendered = re.search(r'id="timeline"[^>]*data-rendered="(\d+)"', html)
    assert rendered and rendered.group(1) == "8", html[:3000]
    bars = re.findall(r'<rect [^>]*class="slice ([a-z ]+)"', html)
    assert len(bars) == 8
    assert sum("critical" in b for b in bars) == 3
    assert sum("failed" in b for b in bars) == 1
    assert re.search(r'<text [^>]*class="lane-label"[^>]*>kiln-0</text>', html)
    failures = html[html.index('id="failures"') : html.index('id="artifacts"')]
    assert "error: the model does not fit" in failures

    shot = tmp_path / "report.png"
    r = run_chromium(["--window-size=1280,1400", f"--screenshot={shot}", url], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    print(f"screenshot: {shot}")


def test_clean_forgets_the_last_build(built: Path, kiln) -> None:
    assert kiln("clean").returncode == 0
    r = kiln("report")
    assert r.returncode == 2 and "no build recorded" in r.stderr


def test_clean_removes_the_report_kiln_wrote_and_keeps_one_written_elsewhere(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "chain").returncode == 0
    inside = kiln("report")
    outside = kiln("report", "-o", "mine.html")
    assert inside.returncode == 0 and outside.returncode == 0, inside.stderr + outside.stderr
    assert (tmp_path / "kiln-out" / "report.html").is_file()

    r = kiln("clean")

    assert r.returncode == 0, r.stderr
    assert "kept what kiln did not write" not in r.stderr
    assert list((tmp_path / "kiln-out").iterdir()) == []  # the report was kiln's
    assert (tmp_path / "mine.html").is_file()


def test_a_report_in_the_output_directory_named_not_in_utf8_is_cleaned(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "wide").returncode == 0
    name = "r\udcff.html"  # r, the byte 0xff (as Python decodes it), .html
    r = kiln("report", "-o", f"kiln-out/{name}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "kiln-out" / name).is_file()
    r = kiln("clean")
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "kiln-out").iterdir()) == []  # recorded as kiln's, removed


def test_report_of_a_killed_build(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "chain").returncode == 0
    events = tmp_path / "kiln-out" / ".kiln" / "last-events.jsonl"
    lines = events.read_text().splitlines()
    # As a SIGKILL leaves it: the end missing, the last line cut short.
    cut = [line for line in lines if '"finished"' not in line or "step0" in line]
    events.write_text("\n".join(cut[:-1]) + "\n" + cut[-1][:20])
    r = kiln("report", "-o", "killed.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "killed.html").read_text()
    assert "incomplete: the build did not record its end" in page
    data = json.loads(re.search(r"id='kiln-data'>(.*?)</script>", page, re.S).group(1))
    status = {r["desc"]: r["status"] for r in data["runs"]}
    assert status["Running chain/step0.txt"] == "finished"
    assert status["Running chain/step1.txt"] == status["Running chain/step2.txt"] == "running"
    step1 = next(r for r in data["runs"] if r["desc"] == "Running chain/step1.txt")
    assert step1["duration"] > 0  # running at least until the last event


FLAKY = """
import os

@entrypoint
def model():
    # Fails while FAIL is set: the same action, failing build after build.
    script = os.environ.get("FAIL", "") + ' echo > "$0"'
    return run_command(name="m.txt", command=["sh", "-c", script, "{out}"])
"""


def test_report_keeps_the_last_builds_and_shows_any(write_module, kiln, tmp_path: Path) -> None:
    write_module(FLAKY)
    failing = {"FAIL": "echo the model is broken >&2; exit 3;"}
    assert kiln("build", "build.py", env=failing).returncode == 1
    assert kiln("build", "build.py", "--retry-failed", env=failing).returncode == 1
    assert kiln("build", "build.py", "--retry-failed", env=failing).returncode == 1

    page = kiln("report")
    assert page.returncode == 0, page.stderr
    failures = (tmp_path / "kiln-out" / "report.html").read_text()
    failures = failures[failures.index("id='failures'") : failures.index("id='artifacts'")]
    # It failed in the two builds before too, and the page says so.
    assert (
        "why it ran: it failed with this same key in an earlier build; it failed in each of "
        "the 2 builds before" in failures
    )

    assert kiln("build", "build.py").returncode == 0  # fixed
    assert kiln("build", "build.py").returncode == 0  # a no-op after it
    listed = kiln("report", "--list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [(r[0], r[2]) for r in rows] == [
        ("0", "ok"),
        ("1", "ok"),
        ("2", "failed"),
        ("3", "failed"),
        ("4", "failed"),
    ]
    assert "1 up to date" in rows[0][4] and "1 built" in rows[1][4]

    # After the no-op, the build that ran is still there to see.
    earlier = kiln("report", "--build", "1")
    assert earlier.returncode == 0, earlier.stderr
    assert earlier.stdout.strip() == "kiln-out/report-1.html"
    html = (tmp_path / "kiln-out" / "report-1.html").read_text()
    data = json.loads(re.search(r"id='kiln-data'>(.*?)</script>", html, re.S).group(1))
    assert [(r["desc"], r["status"]) for r in data["runs"]] == [("Running model/m.txt", "finished")]
    assert "the build before the last" in html

    # Five are kept: one more build shifts each back a place and drops the oldest
    # (the first of the three that failed).
    assert kiln("build", "build.py").returncode == 0
    shifted = [line.split("\t") for line in kiln("report", "--list").stdout.splitlines()]
    assert [(r[0], r[2]) for r in shifted] == [
        ("0", "ok"),
        ("1", "ok"),
        ("2", "ok"),
        ("3", "failed"),
        ("4", "failed"),
    ]
    assert [r[1:] for r in shifted[1:]] == [r[1:] for r in rows[:4]]  # the same builds
    gone = kiln("report", "--build", "5")
    assert gone.returncode == 2 and "kiln keeps the last 5 builds" in gone.stderr

    assert kiln("clean").returncode == 0
    assert not (tmp_path / "kiln-out" / ".kiln").exists()


def test_a_long_target_list_is_folded(write_module, kiln, tmp_path: Path) -> None:
    write_module(
        "\n".join(
            f"@entrypoint\ndef m{i:02d}():\n    return run_command(name='x.txt', "
            "command=['touch', '{out}'])\n"
            for i in range(20)
        )
    )
    names = [f"m{i:02d}" for i in range(20)]
    assert kiln("build", "build.py", *names).returncode == 0
    assert kiln("report").returncode == 0
    page = (tmp_path / "kiln-out" / "report.html").read_text()
    targets = page[page.index("id='targets'") : page.index("</p>", page.index("id='targets'"))]
    assert "m00, m01, m02, m03, m04, m05, m06, m07 <details" in targets
    assert "<summary>and 12 more</summary>m08, m09" in targets
