"""A newcomer's first hour, read from the README: its first command's venv, activating
it, the first build module and the module of one's own actions saved from its blocks,
built, explained and rebuilt, and the Python API, in a scratch directory with a shell
that has no kiln on its PATH until the venv is activated.

The venv is made by the README's ``python3.11 -m venv .venv``; its ``pip install``
is replaced by a path file reusing the kiln and packages this test runs with (the
install itself is what ``bash scripts/test`` runs), and the zoo it then starts is
tests/test_model_zoo.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import test_docs
from test_docs import OWN_ACTIONS, ROOT, blocks, own_actions_output, readme_block

import kiln

README = ROOT / "README.md"
VENV, INSTALL, ZOO = (
    "python3.11 -m venv .venv",
    ".venv/bin/pip install -q -e '.[iree]'",
    ".venv/bin/python examples/model_zoo.py",
)


def newcomer_commands() -> list[str]:
    """The README's commands from its first build module to the command-line tour."""
    text = README.read_text()
    path = text[text.index("\n## A build module") : text.index("\n## The command line")]
    return [c for b in blocks(README) if b.lang == "sh" and b.text in path for c in b.commands]


def _reuse_installed_kiln(venv: Path) -> None:
    """What the README's ``pip install -e`` gives, from what is installed here: kiln's
    source first, then this interpreter's packages, and the ``kiln`` command."""
    (site,) = venv.glob("lib/python3*/site-packages")
    shared = sysconfig.get_paths()["purelib"]
    src = Path(kiln.__file__).resolve().parent.parent
    (site / "kiln-newcomer.pth").write_text(f"{src}\nimport site; site.addsitedir({shared!r})\n")
    script = venv / "bin" / "kiln"
    script.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom kiln.cli.main import main\n"
        "sys.exit(main())\n"
    )
    script.chmod(0o755)


def _bare_env() -> dict[str, str]:
    """A shell without any venv: kiln is not on its PATH."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    path = [d for d in dirs if not (Path(d) / "kiln").exists()]
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PATH": os.pathsep.join(path), "NO_COLOR": "1"}


def _bash(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_newcomer_follows_the_readme(project: Path) -> None:
    if shutil.which("python3.11") is None:
        pytest.skip("the README's venv needs python3.11 on the PATH")
    first = next(c for c in test_docs.sh_commands(README) if c.startswith(VENV))
    assert first == f"{VENV} && {INSTALL} && {ZOO}", "the README's first command changed"
    for saved in ("build.py", "words.py"):  # what the reader saves, from the README
        assert (project / saved).is_file()
    (project / ".venv").unlink()  # the suite's venv: the newcomer makes their own
    env = _bare_env()
    r = _bash(VENV, project, env)
    assert r.returncode == 0, r.stderr
    _reuse_installed_kiln(project / ".venv")

    not_yet = _bash("kiln --version", project, env)
    assert not_yet.returncode == 127 and "command not found" in not_yet.stderr

    shell = test_docs.Shell(project)
    shell.env = env
    ran = []  # (command, stdout, stderr), in the README's order
    for command in newcomer_commands():
        ran.append((command, shell.run(command), shell.stderr))
    said = {c: out for c, out, _ in ran}
    assert shell.env["VIRTUAL_ENV"] == str(project / ".venv")
    assert said["kiln --version"].strip() == f"kiln {kiln.__version__}"
    (built,) = said["kiln build build.py"].split()
    assert built.endswith("kiln-out/bin/mnist/mnist_cpu-host.vmfb") and Path(built).is_file()
    assert said["cat kiln-out/genfiles/words/summary.txt"] == own_actions_output()
    builds = [err for c, _, err in ran if c == "kiln build words.py"]
    assert len(builds) == 2, "the README builds words.py, then again"
    assert "3 built" in builds[0], builds[0]
    assert re.search(r"\b0 built\b.* 3 up to date", builds[1]), builds[1]  # a no-op
    explained = said["kiln explain words.py"]
    quoted = re.search(r"`kiln explain` says `([^`]+)`", README.read_text())
    assert quoted is not None and quoted.group(1) in explained
    assert "Counting words" in explained and "Running words/summary.txt" in explained

    api = readme_block("python", "kiln.build(")
    r = subprocess.run(
        ["python", "-c", api.text],
        cwd=project,
        env=shell.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Shouting words.txt" in r.stdout  # words.txt changed: the API rebuilt it
    assert OWN_ACTIONS in (project / "words.py").read_text()


def test_the_readmes_project_settings_are_kilns(project: Path) -> None:
    """Every key of the README's ``[tool.kiln]`` is an option kiln takes there."""
    toml = readme_block("toml", "[tool.kiln]").text
    local = toml.replace("http://cache-host:8080", "http://127.0.0.1:9")  # nothing listens
    assert local != toml
    (project / "pyproject.toml").write_text(local)
    (project / "words.txt").write_text("a b\n")
    r = _bash("kiln build words.py --dry-run", project, test_docs._env())
    assert r.returncode == 0, r.stderr
    (project / "pyproject.toml").write_text(local + "no-such-option = 1\n")
    r = _bash("kiln build words.py --dry-run", project, test_docs._env())
    assert r.returncode == 2 and "no-such-option" in r.stderr, r.stderr


project = test_docs.project
