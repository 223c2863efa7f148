"""``--check-reproducible`` withdraws what it finds not reproducible from every cache
the build can write to (the local cache directory and the remote), whoever stored
it: a later build in any output directory runs the action rather than being
served, says why in its explanation, and does not put its new results back in
their place; a later check that finds the action reproduced lets it be cached
again. Through the real command line, with a real nginx as the remote cache."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cache_build import entries
from nginx import NginxCache

pytestmark = pytest.mark.in_process

# ``rand.bin`` differs on every run (a command, second run in a scratch directory);
# ``dice.txt`` too (an in-line action, second run in place); ``steady.txt`` does not.
# ``flaky.txt`` has one key, and is random while FLAG exists, fixed otherwise.
MODULE = """
import random

class Dice(BuildAction):
    def __init__(self, out, **kwargs):
        super().__init__(**kwargs)
        self.out = out
        out.deps.add(self)

    def _invoke(self):
        self.out.get_fs_path().write_text(str(random.random()))


@entrypoint
def top():
    rand = run_command(name="rand.bin", command=["sh", "-c", "head -c 32 /dev/urandom > {out}"])
    steady = run_command(name="steady.txt", command=["sh", "-c", "echo steady > {out}"])
    ctx = BuildContext.current()
    dice = ctx.allocate_file("dice.txt")
    Dice(dice, desc="rolling", executor=ctx.executor)
    return [rand, steady, dice]


@entrypoint
def flaky():
    return run_command(name="flaky.txt", command=[
        "sh", "-c", "if [ -e FLAG ]; then head -c 32 /dev/urandom; else echo fixed; fi > {out}"
    ])
"""


def _write(write_module: Callable[..., Path], tmp_path: Path) -> None:
    write_module(MODULE.replace("FLAG", str(tmp_path / "flag")))


def _served(stderr: str) -> set[str]:
    return {ln.split("cached: ", 1)[1] for ln in stderr.splitlines() if "] cached: " in ln}


def _marks(data: dict[str, bytes]) -> int:
    return sum(b'"not_reproducible"' in d for d in data.values())


NOTE = "not served from the cache: --check-reproducible found it not reproducible"


def test_a_check_withdraws_from_the_cache_dir_what_an_earlier_build_stored(
    tmp_path: Path, kiln: Callable[..., Any], write_module: Callable[..., Path]
) -> None:
    _write(write_module, tmp_path)
    cache = ("--cache-dir", str(tmp_path / "cache"))
    first = kiln("build", "build.py", "top", "--output-dir", "one", *cache)
    assert first.returncode == 0 and "3 built" in first.stderr, first.stderr
    assert len(entries(tmp_path / "cache")) == 3
    # The check, in another output directory, is served all three, then runs them again.
    check = kiln("build", "build.py", "top", "--output-dir", "two", "--check-reproducible", *cache)
    assert check.returncode == 1, check.stderr
    assert _served(check.stderr) == {"Running top/rand.bin", "Running top/steady.txt", "rolling"}
    assert "2 not reproducible" in check.stderr, check.stderr
    assert _marks(entries(tmp_path / "cache")) == 2
    # A plain build in a third output directory runs them again, and says why.
    third = kiln("build", "build.py", "top", "--output-dir", "three", "--explain", *cache)
    assert third.returncode == 0, third.stderr
    assert _served(third.stderr) == {"Running top/steady.txt"}, third.stderr
    assert "2 built, 1 cached" in third.stderr, third.stderr
    noted = [ln for ln in third.stderr.splitlines() if NOTE in ln]
    assert len(noted) == 2, third.stderr
    assert any("rand.bin" in ln and "differs" in ln for ln in noted), noted
    # ... and did not put what it made in place of the withdrawal: a fourth runs them too.
    assert _marks(entries(tmp_path / "cache")) == 2
    fourth = kiln("build", "build.py", "top", "--output-dir", "four", *cache)
    assert "2 built, 1 cached" in fourth.stderr, fourth.stderr
    # ``kiln explain`` (a dry run) says the same, and writes nothing.
    explained = kiln("explain", "build.py", "top", "--output-dir", "five", *cache)
    lines = [ln for ln in explained.stdout.splitlines() if "rand.bin" in ln]
    assert len(lines) == 1 and NOTE in lines[0] and "would be served" not in lines[0], lines
    assert any(
        "steady.txt" in ln and "would be served" in ln for ln in explained.stdout.splitlines()
    )


def test_a_check_withdraws_from_the_remote_cache_for_every_machine(
    tmp_path: Path,
    kiln: Callable[..., Any],
    write_module: Callable[..., Path],
    nginx_cache: NginxCache,
) -> None:
    """Three machines (three cache directories) share one remote: the first stores,
    the second checks, the third must not be served what the check withdrew."""
    _write(write_module, tmp_path)
    remote = ("--remote-cache", nginx_cache.url)

    def build(out: str, cache: str, *more: str) -> Any:
        return kiln(
            "build", "build.py", "top", "--output-dir", out, "--cache-dir", cache, *remote, *more
        )

    assert build("one", "c1").returncode == 0
    assert len(nginx_cache.files("ac")) == 3
    check = build("two", "c2", "--check-reproducible")
    assert check.returncode == 1 and "2 not reproducible" in check.stderr, check.stderr
    assert _served(check.stderr) == {"Running top/rand.bin", "Running top/steady.txt", "rolling"}
    served_by_remote = {p.name: p.read_bytes() for p in nginx_cache.files("ac")}
    assert _marks(served_by_remote) == 2 and len(served_by_remote) == 3
    assert _marks(entries(tmp_path / "c2")) == 2
    third = build("three", "c3", "--explain")
    assert third.returncode == 0, third.stderr
    assert _served(third.stderr) == {"Running top/steady.txt"}, third.stderr
    assert sum(NOTE in ln for ln in third.stderr.splitlines()) == 2, third.stderr
    # The third machine kept the withdrawal: it does not ask the remote again.
    assert _marks(entries(tmp_path / "c3")) == 2
    assert _marks({p.name: p.read_bytes() for p in nginx_cache.files("ac")}) == 2
    # A remote withdrawal of ``kiln explain`` (a dry run) is no hit either.
    explained = kiln(
        "explain", "build.py", "top", "--output-dir", "x", "--cache-dir", "c4", *remote
    )
    assert sum(NOTE in ln for ln in explained.stdout.splitlines()) == 2, explained.stdout


def test_a_check_that_cannot_upload_says_the_remote_may_still_serve_it(
    tmp_path: Path,
    kiln: Callable[..., Any],
    write_module: Callable[..., Path],
    nginx_cache: NginxCache,
) -> None:
    _write(write_module, tmp_path)
    remote = ("--remote-cache", nginx_cache.url)
    kiln("build", "build.py", "top", "--output-dir", "one", "--cache-dir", "c1", *remote)
    check = kiln(
        "build",
        "build.py",
        "top",
        "--output-dir",
        "two",
        "--cache-dir",
        "c2",
        *remote,
        "--remote-cache-upload",
        "no",
        "--check-reproducible",
    )
    assert check.returncode == 1, check.stderr
    assert "cannot withdraw from the remote cache" in check.stderr, check.stderr
    assert check.stderr.count("cannot withdraw") == 1
    assert _marks(entries(tmp_path / "c2")) == 2  # this machine's cache: withdrawn


def test_a_later_check_that_reproduces_it_lets_it_be_cached_again(
    tmp_path: Path, kiln: Callable[..., Any], write_module: Callable[..., Path]
) -> None:
    _write(write_module, tmp_path)
    flag = tmp_path / "flag"
    flag.touch()
    cache = ("--cache-dir", str(tmp_path / "cache"))

    def build(out: str, *more: str) -> Any:
        return kiln("build", "build.py", "flaky", "--output-dir", out, *cache, *more)

    assert build("one").returncode == 0
    assert build("two", "--check-reproducible").returncode == 1
    flag.unlink()  # from now on it is reproducible, under the same key
    third = build("three")
    assert "1 built" in third.stderr and not _served(third.stderr), third.stderr
    assert (tmp_path / "three/genfiles/flaky/flaky.txt").read_text() == "fixed\n"
    assert _marks(entries(tmp_path / "cache")) == 1  # a plain build does not clear it
    # A check in a new output directory runs it, finds it reproduced: cached again.
    four = build("four", "--check-reproducible")
    assert four.returncode == 0 and "1 built" in four.stderr, four.stderr
    assert _marks(entries(tmp_path / "cache")) == 0
    five = build("five")
    assert _served(five.stderr) == {"Running flaky/flaky.txt"}, five.stderr
    assert (tmp_path / "five/genfiles/flaky/flaky.txt").read_text() == "fixed\n"


def test_a_check_of_an_up_to_date_output_that_reproduces_clears_the_withdrawal(
    tmp_path: Path, kiln: Callable[..., Any], write_module: Callable[..., Path]
) -> None:
    """The action is up to date in the checked directory (not run by the build, only by
    the check): what it has there goes into the cache in place of the withdrawal."""
    _write(write_module, tmp_path)
    flag = tmp_path / "flag"
    flag.touch()
    cache = ("--cache-dir", str(tmp_path / "cache"))

    def build(out: str, *more: str) -> Any:
        return kiln("build", "build.py", "flaky", "--output-dir", out, *cache, *more)

    build("one")
    assert build("two", "--check-reproducible").returncode == 1
    flag.unlink()
    build("three")
    again = build("three", "--check-reproducible")
    assert again.returncode == 0 and "1 up to date" in again.stderr, again.stderr
    assert _marks(entries(tmp_path / "cache")) == 0
    four = build("four")
    assert _served(four.stderr) == {"Running flaky/flaky.txt"}, four.stderr


def test_a_withdrawal_is_an_entry_an_older_reader_takes_for_a_miss(
    tmp_path: Path, kiln: Callable[..., Any], write_module: Callable[..., Path]
) -> None:
    """Its format: kiln-ac/1 with no outputs (an older kiln finds nothing to serve)."""
    _write(write_module, tmp_path)
    cache = ("--cache-dir", str(tmp_path / "cache"))
    kiln("build", "build.py", "top", "--output-dir", "one", *cache)
    kiln("build", "build.py", "top", "--output-dir", "two", "--check-reproducible", *cache)
    marks = [
        json.loads(d) for d in entries(tmp_path / "cache").values() if b"not_reproducible" in d
    ]
    assert len(marks) == 2
    for mark in marks:
        assert mark["format"] == "kiln-ac/1" and mark["outputs"] == []
        assert "differs" in mark["not_reproducible"]


def test_a_remote_withdrawal_is_read_as_untrusted_text(
    tmp_path: Path,
    kiln: Callable[..., Any],
    write_module: Callable[..., Path],
    nginx_cache: NginxCache,
) -> None:
    """A withdrawal on the remote (a hostile one: a control sequence, a huge reason)
    is a miss; its reason reaches the terminal escaped and bounded, and the
    machine keeps it as its own cache's withdrawal."""
    _write(write_module, tmp_path)
    remote = ("--remote-cache", nginx_cache.url)
    kiln("build", "build.py", "top", "--output-dir", "one", "--cache-dir", "c1", *remote)
    (steady,) = [
        p
        for p in nginx_cache.files("ac")
        if json.loads(p.read_bytes())["action"].endswith("steady.txt")
    ]
    key = json.loads(steady.read_bytes())["key"]
    why = "\x1b[2J\x1b]0;owned\x07" + "x" * 100_000
    steady.write_text(
        json.dumps({"format": "kiln-ac/1", "key": key, "action": "?", "outputs": [],
                    "not_reproducible": why})
    )  # fmt: skip
    r = kiln(
        "build", "build.py", "top", "--output-dir", "two", "--cache-dir", "c2", *remote, "--explain"
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert _served(r.stderr) == {"Running top/rand.bin", "rolling"}, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if NOTE in ln]
    assert "steady.txt" in line and len(line) < 1500, line
    kept = [json.loads(d) for d in entries(tmp_path / "c2").values() if b"not_reproducible" in d]
    assert len(kept) == 1 and len(kept[0]["not_reproducible"]) <= 1000
