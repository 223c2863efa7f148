"""Keys that cover what real build modules depend on (issue: same key, same bytes),
through the real command line on real files:

- the user's own code, as deep as it goes: a helper module's functions and
  constants that an action's code reaches, transitively; nothing else;
- the environment of commands and worker processes: a fixed base, plus what is
  declared (``--action-env``, ``run_command(env=...)``), all of it keyed;
- the programs and scripts of the project that a command runs;
- values in canonical form that keep what can change a result (dict order,
  list vs tuple) and only that (set order).
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.in_process


HELPERS = """
import helpers_deep

SCALE = 2
UNUSED = 1


def double(x):
    return 2 * x + helpers_deep.BIAS


def triple(x):
    return 3 * x
"""

DEEP = """
BIAS = 0
"""

USES_HELPERS = """
import os
import helpers
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext

LOG = os.path.abspath("ran.log")


class Writes(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)


class Doubled(Writes):
    def _invoke(self):
        with open(LOG, "a") as log:
            log.write("doubled\\n")
        self.output.get_fs_path().write_text(str(helpers.double(21)))


class Scaled(Writes):
    def _invoke(self):
        with open(LOG, "a") as log:
            log.write("scaled\\n")
        self.output.get_fs_path().write_text(str(helpers.SCALE * 10))


class Plain(Writes):
    def _invoke(self):
        with open(LOG, "a") as log:
            log.write("plain\\n")
        self.output.get_fs_path().write_text("plain")


@entrypoint
def ep():
    ctx = BuildContext.current()
    outs = []
    for cls, name in ((Doubled, "d.txt"), (Scaled, "s.txt"), (Plain, "p.txt")):
        out = ctx.allocate_file(name)
        cls(out, desc=name, executor=ctx.executor)
        outs.append(out)
    return outs
"""


def ran(root: Path) -> list[str]:
    log = root / "ran.log"
    found = sorted(log.read_text().split()) if log.exists() else []
    log.write_text("")
    return found


def test_editing_a_helper_reruns_exactly_the_actions_whose_code_reaches_it(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    (tmp_path / "helpers.py").write_text(HELPERS)
    (tmp_path / "helpers_deep.py").write_text(DEEP)
    (tmp_path / "build.py").write_text(USES_HELPERS)
    out = tmp_path / "kiln-out/genfiles/ep"

    def build(*args: str) -> Any:
        r = kiln("build", "build.py", *args)
        assert r.returncode == 0, r.stderr
        return r

    build()
    assert ran(tmp_path) == ["doubled", "plain", "scaled"]
    assert (out / "d.txt").read_text() == "42"
    build()
    assert ran(tmp_path) == []

    # A function the action calls through the module: only that action reruns.
    (tmp_path / "helpers.py").write_text(HELPERS.replace("2 * x", "2 * x + 1"))
    explained = kiln("explain", "build.py")
    assert "d.txt: the action's code changed" in explained.stdout, explained.stdout
    build()
    assert ran(tmp_path) == ["doubled"] and (out / "d.txt").read_text() == "43"

    # A constant it reads: only the action that reads it.
    (tmp_path / "helpers.py").write_text(
        HELPERS.replace("2 * x", "2 * x + 1").replace("SCALE = 2", "SCALE = 3")
    )
    build()
    assert ran(tmp_path) == ["scaled"] and (out / "s.txt").read_text() == "30"

    # What no action reaches: nothing reruns.
    (tmp_path / "helpers.py").write_text(
        HELPERS.replace("2 * x", "2 * x + 1")
        .replace("SCALE = 2", "SCALE = 3")
        .replace("3 * x", "4 * x")
        .replace("UNUSED = 1", "UNUSED = 2")
    )
    build()
    assert ran(tmp_path) == []

    # Two modules deep (double -> helpers_deep.BIAS).
    (tmp_path / "helpers_deep.py").write_text("BIAS = 100\n")
    build()
    assert ran(tmp_path) == ["doubled"] and (out / "d.txt").read_text() == "143"

    # A fresh output directory gets the new value, not the cache's old one.
    build("--output-dir", "fresh")
    assert (tmp_path / "fresh/genfiles/ep/d.txt").read_text() == "143"


def test_installed_code_counts_by_its_distribution_and_version() -> None:
    import numpy

    from kiln.planning.code_key import CodeDigests, package_version

    digests = CodeDigests()
    assert f"numpy=={numpy.__version__}" in digests.of_value(numpy.asarray)
    assert f"numpy=={numpy.__version__}" in digests.of_value(numpy.ndarray)
    assert package_version("json").startswith("python 3.")


ENV_MODULE = """
import os
import sys
from kiln import entrypoint, run_command
from kiln.executor import ActionConcurrency, BuildAction, BuildContext


def write_env(path):
    with open(path, "w") as f:
        f.write(os.environ.get("MODEL_SCALE", "<unset>"))


class InWorker(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.output = output
        output.deps.add(self)

    def _remotable_thunk(self):
        import functools
        return functools.partial(write_env, str(self.output.get_fs_path()))


@entrypoint
def env():
    ctx = BuildContext.current()
    cmd = run_command(name="cmd.txt",
                      command=["sh", "-c", 'echo "${{MODEL_SCALE:-<unset>}}" > {out}'])
    own = run_command(name="own.txt", env={"GREETING": "hello"},
                      command=["sh", "-c", 'echo "$GREETING" > {out}'])
    every = run_command(name="every.txt", command=["sh", "-c", "env | sort > {out}"])
    worker = ctx.allocate_file("worker.txt")
    InWorker(worker, desc="worker", executor=ctx.executor)
    return [cmd, own, every, worker]
"""


def test_an_undeclared_variable_never_reaches_a_command_or_worker(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    (tmp_path / "build.py").write_text(ENV_MODULE)
    out = tmp_path / "kiln-out/genfiles/env"
    r = kiln("build", "build.py", env={"MODEL_SCALE": "3"})
    assert r.returncode == 0, r.stderr
    assert (out / "cmd.txt").read_text() == "<unset>\n"
    assert (out / "worker.txt").read_text() == "<unset>"
    assert (out / "own.txt").read_text() == "hello\n"
    seen = dict(line.split("=", 1) for line in (out / "every.txt").read_text().splitlines())
    scratch = str(tmp_path / "kiln-out/.kiln/tmp")
    assert {k: v for k, v in seen.items() if k not in ("PWD", "SHLVL", "_")} == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONHASHSEED": "0",
        "SOURCE_DATE_EPOCH": "315532800",
        "HOME": scratch,
        "TMPDIR": scratch,
        "TMP": scratch,
        "TEMP": scratch,
        "KILN_COMMAND_ID": seen["KILN_COMMAND_ID"],
    }
    # Changing it changes nothing: it cannot make an output stale.
    r = kiln("build", "build.py", env={"MODEL_SCALE": "4"})
    assert "0 built, 4 up to date" in r.stderr


def test_a_declared_variable_reaches_commands_and_workers_and_is_keyed(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    (tmp_path / "build.py").write_text(ENV_MODULE)
    out = tmp_path / "kiln-out/genfiles/env"
    r = kiln("build", "build.py", "--action-env", "MODEL_SCALE", env={"MODEL_SCALE": "3"})
    assert r.returncode == 0, r.stderr
    assert (out / "cmd.txt").read_text() == "3\n" and (out / "worker.txt").read_text() == "3"
    r = kiln("build", "build.py", "--action-env", "MODEL_SCALE", env={"MODEL_SCALE": "3"})
    assert "0 built, 4 up to date" in r.stderr
    explained = kiln("explain", "build.py", "--action-env", "MODEL_SCALE=4")
    assert "cmd.txt: the environment its programs are given changed" in explained.stdout
    r = kiln("build", "build.py", "--action-env", "MODEL_SCALE=4")
    assert "4 built" in r.stderr  # every command and worker sees it, so each reruns
    assert (out / "cmd.txt").read_text() == "4\n" and (out / "worker.txt").read_text() == "4"
    # The command's own variables are its parameters.
    (tmp_path / "build.py").write_text(ENV_MODULE.replace('"hello"', '"bye"'))
    r = kiln("build", "build.py", "--action-env", "MODEL_SCALE=4")
    assert "1 built, 3 up to date" in r.stderr and (out / "own.txt").read_text() == "bye\n"


@pytest.mark.parametrize(
    "spec, expected",
    [("1BAD=x", "'1BAD' is not an environment variable name"), ("=x", "'' is not")],
)
def test_a_bad_action_env_is_a_usage_error(
    tmp_path: Path, kiln: Callable[..., Any], spec: str, expected: str
) -> None:
    (tmp_path / "build.py").write_text(ENV_MODULE)
    r = kiln("build", "build.py", "--action-env", spec)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert not (tmp_path / "kiln-out").exists()


def test_a_bad_command_env_is_a_definition_error(tmp_path: Path, kiln: Callable[..., Any]) -> None:
    (tmp_path / "build.py").write_text(ENV_MODULE.replace('{"GREETING": "hello"}', '{"G": 1}'))
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert "the value of G must be a string" in r.stderr and "build.py:" in r.stderr


PROGRAMS = """
from kiln import entrypoint, run_command


@entrypoint
def gen():
    own = run_command(name="own.txt", command=["./gen.sh", "{out}"])
    script = run_command(name="script.txt", command=["sh", "tools/script.sh", "{out}"])
    declared = run_command(name="declared.txt", tools=["data/table.txt"],
                           command=["cp", "{tools[0]}", "{out}"])
    return [own, script, declared]
"""


def _project(root: Path, gen: str) -> Path:
    root.mkdir(parents=True)
    (root / "build.py").write_text(PROGRAMS)
    (root / "gen.sh").write_text(f'#!/bin/sh\necho {gen} > "$1"\n')
    (root / "gen.sh").chmod(0o755)
    (root / "tools").mkdir()
    (root / "tools/script.sh").write_text('echo script > "$1"\n')
    (root / "data").mkdir()
    (root / "data/table.txt").write_text("table\n")
    return root


def test_a_commands_own_programs_are_inputs_keyed_by_content(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """Two projects whose gen.sh differ share a cache: each gets its own output. A
    relative program is the build module directory's, wherever kiln runs from."""
    a = _project(tmp_path / "a", "from-a")
    b = _project(tmp_path / "b", "from-b")
    r = kiln("build", "a/build.py", "--output-dir", "a/out")
    assert r.returncode == 0, r.stderr
    r = kiln("build", "b/build.py", "--output-dir", "b/out")
    assert r.returncode == 0, r.stderr
    assert (a / "out/genfiles/gen/own.txt").read_text() == "from-a\n"
    assert (b / "out/genfiles/gen/own.txt").read_text() == "from-b\n"
    assert "2 cached" in r.stderr  # what is the same in both projects is shared

    # Editing a program or script reruns what runs it, and only that.
    (a / "tools/script.sh").write_text('echo edited > "$1"\n')
    r = kiln("build", "a/build.py", "--output-dir", "a/out")
    assert "1 built, 2 up to date" in r.stderr, r.stderr
    assert (a / "out/genfiles/gen/script.txt").read_text() == "edited\n"
    (a / "data/table.txt").write_text("table, edited\n")
    r = kiln("build", "a/build.py", "--output-dir", "a/out")
    assert "1 built, 2 up to date" in r.stderr, r.stderr
    assert (a / "out/genfiles/gen/declared.txt").read_text() == "table, edited\n"


def test_a_missing_declared_tool_is_a_definition_error(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    root = _project(tmp_path / "p", "x")
    (root / "data/table.txt").unlink()
    r = kiln("build", "p/build.py")
    assert r.returncode == 2, r.stderr
    assert "tool 'data/table.txt' is not a file" in r.stderr


VALUES = """
import os
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext

LOG = os.path.abspath("ran.log")


class Ordered(BuildAction):
    def __init__(self, value, output, **kwargs):
        super().__init__(**kwargs)
        self.value = value
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open(LOG, "a") as log:
            log.write(self.desc + "\\n")
        self.output.get_fs_path().write_text(repr(self.value))


@entrypoint
def values():
    ctx = BuildContext.current()
    out = []
    for name, value in (("d", {D}), ("t", {T}), ("s", {S})):
        f = ctx.allocate_file(name + ".txt")
        Ordered(value, f, desc=name, executor=ctx.executor)
        out.append(f)
    return out
"""


@pytest.mark.parametrize(
    "field, before, after, reruns",
    [
        ("D", '{"a": 1, "b": 2}', '{"b": 2, "a": 1}', True),
        ("D", "{1: 'x'}", "{'1': 'x'}", True),
        ("T", "(1, [2])", "(1, (2,))", True),
        ("T", "[1, 2]", "(1, 2)", True),
        ("S", "{'x', 'y', 'z'}", "{'z', 'y', 'x'}", False),
        ("S", "frozenset({3, 1, 2})", "frozenset({2, 3, 1})", False),
    ],
)
def test_canonical_values_keep_what_code_can_tell_apart(
    tmp_path: Path,
    kiln: Callable[..., Any],
    field: str,
    before: str,
    after: str,
    reruns: bool,
) -> None:
    fields = {"D": "{}", "T": "()", "S": "set()"}

    def write(value: str) -> None:
        (tmp_path / "build.py").write_text(VALUES.format(**{**fields, field: value}))

    write(before)
    assert kiln("build", "build.py").returncode == 0
    ran(tmp_path)
    write(after)
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    name = {"D": "d", "T": "t", "S": "s"}[field]
    assert ran(tmp_path) == ([name] if reruns else []), r.stderr


def test_explain_names_a_reordered_dict(tmp_path: Path, kiln: Callable[..., Any]) -> None:
    (tmp_path / "build.py").write_text(VALUES.format(D='{"a": 1, "b": 2}', T="()", S="set()"))
    assert kiln("build", "build.py").returncode == 0
    (tmp_path / "build.py").write_text(VALUES.format(D='{"b": 2, "a": 1}', T="()", S="set()"))
    explained = kiln("explain", "build.py").stdout
    assert "d: the order of parameter value's entries changed" in explained, explained
    (tmp_path / "build.py").write_text(VALUES.format(D='{"a": 1, "b": 3}', T="()", S="set()"))
    explained = kiln("explain", "build.py").stdout
    assert "d: parameter value.b changed from 2 to 3" in explained, explained


def test_keys_do_not_depend_on_where_the_checkout_is(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """The same project in two checkouts: the second is served from the cache (the
    build module's classes are keyed by its file's name, not its path)."""
    first = tmp_path / "one"
    first.mkdir()
    (first / "helpers.py").write_text(HELPERS)
    (first / "helpers_deep.py").write_text(DEEP)
    (first / "build.py").write_text(USES_HELPERS)
    second = tmp_path / "deeper/two"
    shutil.copytree(first, second)
    r = kiln("build", "one/build.py", "--output-dir", "one/kiln-out")
    assert r.returncode == 0, r.stderr
    r = kiln("build", "deeper/two/build.py", "--output-dir", "deeper/two/kiln-out")
    assert r.returncode == 0, r.stderr
    assert "0 built, 3 cached" in r.stderr, r.stderr
    manifest = json.loads((second / "kiln-out/manifest.json").read_text())
    assert manifest["entrypoints"]["ep"]["outputs"]


def test_the_env_flag_is_documented_in_help(tmp_path: Path, kiln: Callable[..., Any]) -> None:
    (tmp_path / "build.py").write_text(textwrap.dedent(ENV_MODULE))
    r = kiln("build", "build.py", "--help")
    assert "--action-env NAME[=VALUE]" in r.stdout
    assert os.environ.get("MODEL_SCALE") is None
