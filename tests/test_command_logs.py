"""What a command prints: streamed into a spool file under ``.kiln/spool/`` while
it runs, moved into its log (``.kiln/logs/<output>.log``) when it ended, and no
log at all when it printed nothing. Through the CLI, on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

MODULE = """
import os

@entrypoint
def c():
    return [
        run_command(name="quiet.txt", command=["sh", "-c", "echo q > {out}"]),
        run_command(name="loud.txt",
                    command=["sh", "-c", os.environ.get("LOUD", "echo said; echo x > {out}")]),
    ]
"""


def _logs(tmp_path: Path) -> Path:
    return tmp_path / "kiln-out" / ".kiln" / "logs" / "c"


def _events(tmp_path: Path) -> dict[str, dict]:
    lines = (tmp_path / "kiln-out" / ".kiln" / "last-events.jsonl").read_text().splitlines()
    found = {}
    for line in lines:
        event = json.loads(line)
        if event.get("event") == "finished":
            found[event["desc"]] = event
    return found


def test_a_quiet_command_has_no_log_and_a_loud_one_has_all_it_printed(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "-j", "2", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert not (_logs(tmp_path) / "quiet.txt.log").exists()
    loud = (_logs(tmp_path) / "loud.txt.log").read_text()
    assert loud.startswith("$ sh -c ") and loud.endswith("said\n"), loud
    events = _events(tmp_path)
    assert events["Running c/quiet.txt"].get("log") is None
    assert events["Running c/loud.txt"]["log"] == str(_logs(tmp_path) / "loud.txt.log")
    # The spools are kiln's, emptied after each command.
    spools = list((tmp_path / "kiln-out" / ".kiln" / "spool").iterdir())
    assert spools and all(p.stat().st_size == 0 for p in spools)


def test_a_rerun_that_prints_nothing_removes_the_old_log(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    log = _logs(tmp_path) / "loud.txt.log"
    assert log.exists()
    r = kiln("build", "build.py", "--no-cache", env={"LOUD": "echo y > {out}"})
    assert r.returncode == 0, r.stderr
    assert "1 built" in r.stderr and not log.exists()  # no stale output shown as this run's


def test_many_commands_never_see_each_others_output(write_module, kiln, tmp_path: Path) -> None:
    write_module("""
        @entrypoint
        def c():
            return [run_command(name=f"o{i}.txt", command=[
                "sh", "-c", f"i=0; while [ $i -lt {i % 7 * 40} ]; do echo {i}-$i; i=$((i+1)); "
                            "done; : > {out}"]) for i in range(60)]
        """)
    r = kiln("build", "build.py", "-j", "4", "--no-cache")
    assert r.returncode == 0, r.stderr
    for i in range(60):
        log = _logs(tmp_path) / f"o{i}.txt.log"
        if i % 7 == 0:
            assert not log.exists()
            continue
        body = log.read_text().splitlines()[1:]
        assert body == [f"{i}-{n}" for n in range(i % 7 * 40)], (i, body[:3])


def test_a_spool_left_full_by_a_killed_build_does_not_leak(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    spool = tmp_path / "kiln-out" / ".kiln" / "spool"
    assert kiln("build", "build.py", "--no-cache", "-j", "1").returncode == 0
    for p in spool.iterdir():
        p.write_text("SECRET from a build that was killed\n")
    r = kiln("build", "build.py", "--no-cache", "-j", "1", env={"LOUD": "echo new; : > {out}"})
    assert r.returncode == 0, r.stderr
    assert not (_logs(tmp_path) / "quiet.txt.log").exists()
    assert "SECRET" not in (_logs(tmp_path) / "loud.txt.log").read_text()


def test_a_symlink_planted_as_a_spool_is_not_followed(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "--no-cache", "-j", "1").returncode == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    spool = tmp_path / "kiln-out" / ".kiln" / "spool" / "0"
    spool.unlink()
    spool.symlink_to(victim)
    r = kiln("build", "build.py", "--no-cache", "-j", "1", env={"LOUD": "echo again > {out}"})
    assert r.returncode == 1, r.stderr
    assert "cannot write the command output spool" in r.stderr and "link" in r.stderr
    assert "Traceback" not in r.stderr
    assert victim.read_text() == "precious\n" and spool.is_symlink()


def test_a_fifo_planted_as_a_spool_does_not_hang_the_build(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "--no-cache", "-j", "1").returncode == 0
    spool = tmp_path / "kiln-out" / ".kiln" / "spool" / "0"
    spool.unlink()
    os.mkfifo(spool)
    r = kiln(
        "build", "build.py", "--no-cache", "-j", "1", timeout=60, env={"LOUD": "echo again > {out}"}
    )
    assert r.returncode == 1, r.stderr
    assert "cannot write the command output spool" in r.stderr and "FIFO" in r.stderr


def test_a_build_that_wrote_outputs_syncs_them_once_and_a_noop_does_not(
    write_module, kiln_in_process, tmp_path: Path, monkeypatch
) -> None:
    """Durability is settled once per build: one ``syncfs`` of the output directory's
    filesystem before a build that wrote anything says it is done; none per output,
    none in a no-op."""
    import kiln.engine.scheduler

    calls: list[str] = []
    real = kiln.engine.scheduler.sync_filesystem
    monkeypatch.setattr(
        kiln.engine.scheduler, "sync_filesystem", lambda path: (calls.append(str(path)), real(path))
    )
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    write_module(MODULE)
    r = kiln_in_process("build", "build.py", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert calls == [str(tmp_path / "kiln-out")] and not fsyncs
    r = kiln_in_process("build", "build.py", "--no-cache")
    assert r.returncode == 0 and "0 built, 2 up to date" in r.stderr, r.stderr
    assert len(calls) == 1


def test_two_builds_in_one_process_remove_the_first_ones_log(tmp_path: Path) -> None:
    """The old logs are listed once per build, not once per process: a second build
    by the same executor whose command prints nothing removes the first one's log."""
    from kiln import run_command, source_file
    from kiln.executor import Executor
    from kiln.graph import BuildContext

    source = tmp_path / "in.txt"
    source.write_text("loud\n")
    executor = Executor(tmp_path / "out")
    with executor.get_context(""):
        assert BuildContext.current() is not None
        # y.txt, quiet, runs first: the logs directory is listed (empty) then.
        first = run_command(name="y.txt", command=["sh", "-c", ": > {out}"])
        out = run_command(
            name="x.txt",
            inputs=[source_file(str(source)), first],
            command=["sh", "-c", "grep -q loud {inputs[0]} && echo said; cp {inputs[0]} {out}"],
        )
    log = tmp_path / "out" / ".kiln" / "logs" / "x.txt.log"
    try:
        assert executor.build(out)
        assert log.read_text().endswith("said\n")
        source.write_text("quiet\n")
        assert executor.build(out)
    finally:
        executor.close()
    assert out.get_fs_path().read_text() == "quiet\n"
    assert not log.exists()


def test_a_sync_that_fails_is_said(write_module, kiln_in_process, monkeypatch) -> None:
    import kiln.engine.scheduler

    monkeypatch.setattr(kiln.engine.scheduler, "sync_filesystem", lambda path: "Input/output error")
    write_module(MODULE)
    r = kiln_in_process("build", "build.py", "--no-cache")
    assert "warning: the outputs may not all be on disk" in r.stderr, r.stderr
    assert "Input/output error" in r.stderr
