"""kiln completion bash|zsh: the script completes commands, options, choices,
the build module and its entrypoints, in a real bash and a real zsh."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from needs import program

MODULE = """
from kiln import *

@entrypoint
def hello():
    return run_command(name="h.txt", command=["sh", "-c", 'echo hi > "$0"', "{out}"])

@entrypoint
def help_me():
    return None
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "build.py").write_text(MODULE)
    (tmp_path / "notes.txt").write_text("")
    return tmp_path


def _script(shell: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


# kiln itself, as the completion script calls it: this interpreter's.
KILN_FUNCTION = f'kiln() {{ {shlex.quote(sys.executable)} -m kiln "$@"; }}\n'


def _bash(project: Path, *words: str) -> list[str]:
    bash = program("bash")
    script = project / "kiln.bash"
    script.write_text(_script("bash"))
    quoted = " ".join(shlex.quote(w) for w in words)
    code = (
        f"source {shlex.quote(str(script))}\n{KILN_FUNCTION}"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); _kiln\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    r = subprocess.run(
        [bash, "--norc", "-c", code],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stderr
    return sorted(w for w in r.stdout.splitlines() if w)


@pytest.mark.parametrize(
    "words, expected",
    [
        (("kiln", "ex"), ["explain"]),
        (("kiln", "build", "bu"), ["build.py"]),
        (("kiln", "build", "build.py", "he"), ["hello", "help_me"]),
        (("kiln", "build", "build.py", "--jo"), ["--jobs"]),
        (("kiln", "build", "build.py", "--console", ""), ["auto", "live", "plain"]),
        (("kiln", "build", "build.py", "--output-dir", "no"), ["notes.txt"]),
        (("kiln", "cache", ""), ["clear", "gc", "stats"]),
        (("kiln", "cache", "stats", "--j"), ["--json"]),
        (("kiln", "report", "--li"), ["--list"]),
        (("kiln", "compare", "--fa"), ["--fail-if"]),
        (("kiln", "devices", "--ex"), ["--executor", "--executor-timeout"]),
        (("kiln", "completion", "--h"), []),
    ],
)
def test_bash(project: Path, words: tuple[str, ...], expected: list[str]) -> None:
    assert _bash(project, *words) == expected


def test_zsh_loads_it_and_completes_entrypoints(project: Path) -> None:
    zsh = program("zsh")
    script = project / "kiln.zsh"
    script.write_text(_script("zsh"))
    # compsys runs a bash completion function through bashcompinit in sh emulation
    # (0-based arrays), with COMP_WORDS and COMP_CWORD set as bash sets them.
    code = (
        f"autoload -U compinit && compinit -u -D\nsource {shlex.quote(str(script))}\n"
        f"{KILN_FUNCTION}print -r -- $_comps[kiln]\n"
        "emulate sh -c 'COMP_WORDS=(kiln build build.py he); COMP_CWORD=3; _kiln; "
        'printf "%s\\n" "${COMPREPLY[@]}"\'\n'
    )
    r = subprocess.run(
        [zsh, "-f", "-c", code], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "_bash_complete -o filenames -F _kiln"
    assert sorted(lines[1:]) == ["hello", "help_me"]


def test_an_unknown_shell_is_a_usage_error() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "completion", "fish"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "invalid choice: 'fish'" in r.stderr


HOSTILE = """
from kiln import *

def _named(name):
    def f():
        return None
    f.__name__ = name
    return entrypoint(f)

a = _named("$(touch pwned-a)")
b = _named("`touch pwned-b`")
c = _named("x;touch pwned-c")
d = _named("*")
e = _named("~root")
g = _named("$HOME")
"""


def test_entrypoint_names_are_never_run_or_expanded_by_the_shell(tmp_path: Path) -> None:
    # bash's compgen -W expands its word list: $(...) in a name ran at completion time.
    (tmp_path / "build.py").write_text(HOSTILE)
    (tmp_path / "notes.txt").write_text("")
    got = _bash(tmp_path, "kiln", "build", "build.py", "")
    assert not list(tmp_path.glob("pwned-*"))
    assert got == sorted(
        ["$(touch pwned-a)", "`touch pwned-b`", "x;touch pwned-c", "*", "~root", "$HOME"]
    )
    assert _bash(tmp_path, "kiln", "build", "build.py", "$(") == ["$(touch pwned-a)"]
    assert _bash(tmp_path, "kiln", "build", "build.py", "*") == ["*"]
    assert not list(tmp_path.glob("pwned-*"))


def test_zsh_never_runs_an_entrypoint_name(tmp_path: Path) -> None:
    zsh = program("zsh")
    (tmp_path / "build.py").write_text(HOSTILE)
    script = tmp_path / "kiln.zsh"
    script.write_text(_script("zsh"))
    code = (
        f"autoload -U compinit && compinit -u -D\nsource {shlex.quote(str(script))}\n"
        f"{KILN_FUNCTION}"
        'emulate sh -c \'COMP_WORDS=(kiln build build.py ""); COMP_CWORD=3; _kiln; '
        'printf "%s\\n" "${COMPREPLY[@]}"\'\n'
    )
    r = subprocess.run(
        [zsh, "-f", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("pwned-*"))
    assert "$(touch pwned-a)" in r.stdout.splitlines()
