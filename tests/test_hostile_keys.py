"""Complete keys and hermetic actions, tried as a hostile user would, through the
real ``kiln`` command line on real build modules.

- Every kind of parameter value, changed, reruns its action; unchanged, in a new
  process (another string-hash seed), runs nothing.
- An action holding a value kiln cannot key runs on every build and is never
  cached, and kiln says so once per action type (``kiln explain`` says why);
  with ``--strict-keys`` it stops the build before anything runs (exit 2), naming
  the class, the attribute, the type and the fix.
- Editing an action's code reruns that action only; ``kiln explain`` says why.
- A ``_remotable_thunk``'s closure values are in the key.
- A PROCESS action never sees what an earlier action did to a worker process.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

pytestmark = pytest.mark.in_process


KEYED = """
import collections
import dataclasses
import enum
import pathlib

from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext
{imports}

class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@dataclasses.dataclass(frozen=True)
class Opts:
    level: int
    tags: tuple


Point = collections.namedtuple("Point", "x y")


class Keyed(BuildAction):
    def __init__(self, value, output, **kwargs):
        super().__init__(**kwargs)
        self.value = value
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write(self.desc + "\\n")
        self.output.get_fs_path().write_text(repr(self.value))


@entrypoint
def keyed():
    context = BuildContext.current()
    out = context.allocate_file("k.txt")
    Keyed({value}, out, desc="keyed", executor=context.executor)
    return out
"""


def ran(tmp_path: Path) -> list[str]:
    """The actions that ran since the last call (and forget them)."""
    log = tmp_path / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(lines)


def write(write_module: Callable[..., Path], text: str, **fields: str) -> None:
    write_module(textwrap.dedent(text).format(**fields), header=False)


CHANGES = [
    pytest.param(
        '{"alpha", "beta", "gamma", "delta"}', '{"alpha", "beta", "gamma", "epsilon"}', id="set"
    ),
    pytest.param('frozenset({"a", "b", "c"})', 'frozenset({"a", "b", "d"})', id="frozenset"),
    pytest.param('{1: "one", 2: "two"}', '{1: "one", 2: "TWO"}', id="dict-int-keys"),
    pytest.param('{1: "one"}', '{"1": "one"}', id="int-key-vs-str-key"),
    pytest.param('Opts(1, ("x", "y"))', 'Opts(2, ("x", "y"))', id="dataclass"),
    pytest.param("Point(1, 2)", "Point(1, 3)", id="namedtuple"),
    pytest.param("Mode.FAST", "Mode.SLOW", id="enum"),
    pytest.param('pathlib.Path("/opt/a")', 'pathlib.Path("/opt/b")', id="path"),
    pytest.param('b"\\x00" * 100', 'b"\\x00" * 99 + b"\\x01"', id="bytes"),
    pytest.param("[1, 2.5, None, True]", "[1, 2.5, None, 1]", id="bool-vs-int"),
    pytest.param("(1, {3, 2})", "(1, {3, 4})", id="nested"),
]


def test_an_edit_keeping_size_and_mtime_is_not_hidden_by_cached_bytecode(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    """Python trusts a .pyc whose source kept its size and mtime second; kiln must
    not build the old definition of an edited build module, and writes no bytecode
    into the user's source tree itself."""
    import py_compile

    bytecode = {"PYTHONDONTWRITEBYTECODE": ""}  # bytecode allowed, as by default
    write(write_module, KEYED, value="Mode.FAST", imports="")
    module = tmp_path / "build.py"
    stamp = module.stat().st_mtime_ns
    assert kiln("build", "build.py", env=bytecode).returncode == 0
    assert ran(tmp_path) == ["keyed"]
    assert not (tmp_path / "__pycache__").exists()  # kiln wrote none
    # A timestamp-checked .pyc of the old source, as ``import build`` would leave.
    py_compile.compile(str(module), doraise=True)
    write(write_module, KEYED, value="Mode.SLOW", imports="")  # same size
    os.utime(module, ns=(stamp, stamp))  # same mtime
    assert kiln("build", "build.py", env=bytecode).returncode == 0
    assert ran(tmp_path) == ["keyed"]
    assert "SLOW" in (tmp_path / "kiln-out" / "genfiles" / "keyed" / "k.txt").read_text()


@pytest.mark.parametrize(("before", "after"), CHANGES)
def test_each_kind_of_value_is_keyed(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    before: str,
    after: str,
) -> None:
    write(write_module, KEYED, value=before, imports="")
    first = kiln("build", "build.py")
    assert first.returncode == 0, first.stderr
    assert ran(tmp_path) == ["keyed"]
    # A new process hashes strings with another seed: sets and dicts must not care.
    again = kiln("build", "build.py")
    assert again.returncode == 0, again.stderr
    assert ran(tmp_path) == []

    write(write_module, KEYED, value=after, imports="")
    changed = kiln("build", "build.py")
    assert changed.returncode == 0, changed.stderr
    assert ran(tmp_path) == ["keyed"]
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []


def test_a_numpy_array_changing_one_element_is_keyed(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    needs.module("numpy")
    zeros = "numpy.zeros(1000, dtype=numpy.float32)"
    one_changed = "numpy.where(numpy.arange(1000) == 500, 1.0, 0.0).astype(numpy.float32)"
    write(write_module, KEYED, value=zeros, imports="import numpy")
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["keyed"]
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []
    write(write_module, KEYED, value=one_changed, imports="import numpy")
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["keyed"]
    # Same values, another dtype: another key.
    write(
        write_module, KEYED, value=one_changed.replace("float32", "float64"), imports="import numpy"
    )
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["keyed"]


def test_explain_names_the_changed_field(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write(write_module, KEYED, value='Opts(1, ("x",))', imports="")
    assert kiln("build", "build.py").returncode == 0
    write(write_module, KEYED, value='Opts(3, ("x",))', imports="")
    result = kiln("explain", "build.py")
    assert result.returncode == 0, result.stderr
    assert "keyed: parameter value.level changed from 1 to 3" in result.stdout


UNKEYABLE = """
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext


class Healthy(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write("healthy\\n")
        self.output.get_fs_path().write_text("ok")


class Holder(Healthy):
{holder}


@entrypoint
def both():
    context = BuildContext.current()
    good = context.allocate_file("good.txt")
    Healthy(good, desc="healthy", executor=context.executor)
    bad = context.allocate_file("bad.txt")
    Holder(bad, desc="holder", executor=context.executor)
    return [good, bad]
"""

OPEN_FILE = """
    def __init__(self, output, **kwargs):
        super().__init__(output, **kwargs)
        self.handle = open(__file__)
"""


@pytest.mark.parametrize(
    ("holder", "expected"),
    [
        pytest.param(
            OPEN_FILE,
            ["attribute 'handle'", "_io.TextIOWrapper", "key_exclude = ('handle',)", "params()"],
            id="open-file",
        ),
        pytest.param(
            """
    def __init__(self, output, **kwargs):
        super().__init__(output, **kwargs)
        handle = open(__file__)
        self.reader = lambda: handle.read()
""",
            ["attribute 'reader'", "closure value 'handle'", "_io.TextIOWrapper"],
            id="lambda",
        ),
        pytest.param(
            """
    def __init__(self, output, **kwargs):
        super().__init__(output, **kwargs)
        self.options = {"lock": __import__("threading").Lock()}
""",
            ["attribute 'options'", "['lock']", "_thread.lock"],
            id="nested",
        ),
        pytest.param(
            """
    def __init__(self, output, **kwargs):
        super().__init__(output, **kwargs)
        from kiln import source_file
        self.extra = source_file("build.py")
""",
            ["attribute 'extra'", "neither an input", "deps="],
            id="undeclared-file",
        ),
        pytest.param(
            """
    def __init__(self, output, **kwargs):
        super().__init__(output, **kwargs)
        self.loop = []
        self.loop.append(self.loop)
""",
            ["attribute 'loop'", "contains itself"],
            id="self-reference",
        ),
    ],
)
def test_a_value_kiln_cannot_key_stops_a_strict_build_before_anything_runs(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    holder: str,
    expected: list[str],
) -> None:
    write(write_module, UNKEYABLE, holder=textwrap.indent(textwrap.dedent(holder), "    "))
    result = kiln("build", "build.py", "--strict-keys")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "action Holder ('holder', defined at" in result.stderr
    for text in expected:
        assert text in result.stderr
    assert ran(tmp_path) == []  # the healthy action did not run either


@pytest.mark.parametrize("holder", [OPEN_FILE, "    pass\n"], ids=["unkeyable", "keyed"])
def test_an_action_kiln_cannot_key_runs_every_build_and_is_never_cached(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    holder: str,
) -> None:
    """Without --strict-keys the unkeyable action runs on every build (as iree.build
    runs every action), never up to date and never from the cache, even into a
    fresh output directory; its keyed neighbour is skipped, then cached. The keyed
    variant shows the test would see a skip."""
    write(write_module, UNKEYABLE, holder=textwrap.indent(textwrap.dedent(holder), "    "))
    unkeyed = "handle" in holder
    note = "kiln: Holder actions ('holder', defined at"
    first = kiln("build", "build.py")
    assert first.returncode == 0, first.stderr
    assert ran(tmp_path) == ["healthy", "healthy"]
    assert first.stderr.count(note) == (1 if unkeyed else 0)
    if unkeyed:
        assert "attribute 'handle' holds a value of type _io.TextIOWrapper" in first.stderr
        assert "run on every build and are never cached" in first.stderr
    again = kiln("build", "build.py")
    assert again.returncode == 0, again.stderr
    assert ran(tmp_path) == (["healthy"] if unkeyed else [])
    explained = kiln("explain", "build.py")
    assert (
        "holder: kiln cannot key it, so it runs on every build: attribute 'handle'"
        in (explained.stdout)
    ) is unkeyed
    fresh = kiln("build", "build.py", "--output-dir", "fresh")  # the cache serves the keyed one
    assert fresh.returncode == 0, fresh.stderr
    assert ran(tmp_path) == (["healthy"] if unkeyed else [])
    assert ("1 cached" if unkeyed else "2 cached") in fresh.stderr


def test_excluded_attributes_are_not_keyed(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    holder = "key_exclude = ('handle',)\n" + textwrap.dedent(OPEN_FILE)
    write(write_module, UNKEYABLE, holder=textwrap.indent(holder, "    "))
    result = kiln("build", "build.py")
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["healthy", "healthy"]


TWO_CLASSES = """
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext
{comment}

def decorate(text):
    return {decoration}


class Writer(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def log(self):
        with open("ran.log", "a") as log:
            log.write(self.desc + "\\n")


class First(Writer):
    def _invoke(self):
        self.log()
        self.output.get_fs_path().write_text({first})


class Second(Writer):
    def _invoke(self):
        self.log()
        self.output.get_fs_path().write_text(decorate("second"))


@entrypoint
def pair():
    context = BuildContext.current()
    a, b = context.allocate_file("a.txt"), context.allocate_file("b.txt")
    First(a, desc="first", executor=context.executor)
    Second(b, desc="second", executor=context.executor)
    return [a, b]
"""


def test_editing_one_actions_code_reruns_that_action_only(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    fields = {"comment": "", "decoration": "text", "first": '"first"'}
    write(write_module, TWO_CLASSES, **fields)
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["first", "second"]

    # Lines move and a comment appears: no code changed, nothing runs.
    write(write_module, TWO_CLASSES, **{**fields, "comment": "# a comment\n\n\n"})
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []

    write(write_module, TWO_CLASSES, **{**fields, "first": '"first, edited"'})
    explained = kiln("explain", "build.py")
    assert explained.returncode == 0, explained.stderr
    assert "first: the action's code changed" in explained.stdout
    assert "second:" not in explained.stdout
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["first"]
    assert (tmp_path / "kiln-out" / "genfiles" / "pair" / "a.txt").read_text() == "first, edited"

    # A helper function that only Second calls.
    write(
        write_module,
        TWO_CLASSES,
        **{**fields, "first": '"first, edited"', "decoration": "text.upper()"},
    )
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["second"]
    assert (tmp_path / "kiln-out" / "genfiles" / "pair" / "b.txt").read_text() == "SECOND"


THUNK = """
import os

from kiln import entrypoint
from kiln.executor import ActionConcurrency, BuildAction, BuildContext


class Scaled(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.output = output
        output.deps.add(self)

    def _remotable_thunk(self):
        factor = int(os.environ.get("FACTOR", "1"))  # a closure value from outside
        path = str(self.output.get_fs_path())
        log_path = os.path.abspath("ran.log")  # the worker runs in the output directory

        def run():
            with open(log_path, "a") as log:
                log.write("scaled\\n")
            with open(path, "w") as out:
                out.write(str(21 * factor))

        return run


@entrypoint
def scaled():
    context = BuildContext.current()
    out = context.allocate_file("scaled.txt")
    Scaled(out, desc="scaled", executor=context.executor)
    return out
"""


def test_a_thunks_closure_values_are_keyed(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module(THUNK, header=False)
    out = tmp_path / "kiln-out" / "genfiles" / "scaled" / "scaled.txt"
    assert kiln("build", "build.py", env={"FACTOR": "1"}).returncode == 0
    assert ran(tmp_path) == ["scaled"] and out.read_text() == "21"
    assert kiln("build", "build.py", env={"FACTOR": "1"}).returncode == 0
    assert ran(tmp_path) == []
    explained = kiln("explain", "build.py", env={"FACTOR": "2"})
    assert "closure values of its _remotable_thunk changed" in explained.stdout
    assert not (tmp_path / "ran.log").read_text()
    result = kiln("build", "build.py", env={"FACTOR": "2"})
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["scaled"] and out.read_text() == "42"


HERMETIC = """
import json
import os
import sys
from pathlib import Path

from kiln import entrypoint
from kiln.executor import ActionConcurrency, BuildAction, BuildContext


def pollute(path):
    os.environ["KILN_LEAK"] = "process"
    os.chdir("/")
    json.LEAKED = True          # a module global of an imported module
    sys.path.append("/leak")
    os.getcwd = lambda: "/patched"
    Path(path).write_text("polluted")


def observe(path, before):
    seen = {
        "leak": os.environ.get("KILN_LEAK"),
        "thread_leak": os.environ.get("KILN_THREAD_LEAK"),
        "given": os.environ.get("KILN_GIVEN"),
        "cwd": os.getcwd(),
        "json_global": hasattr(json, "LEAKED"),
        "sys_path": "/leak" in sys.path,
        "getcwd": os.getcwd.__name__,
    }
    Path(path).write_text(json.dumps(seen))


class InProcess(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        os.environ["KILN_THREAD_LEAK"] = "thread"  # kiln's own process
        self.output.get_fs_path().write_text("thread")


class OutOfProcess(BuildAction):
    def __init__(self, output, fn, inputs, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, deps=inputs, **kwargs)
        self.output = output
        self.fn = fn
        self.inputs = inputs
        output.deps.add(self)

    def _remotable_thunk(self):
        fn, path = self.fn, str(self.output.get_fs_path())
        return lambda: fn(path) if fn is pollute else fn(path, None)


@entrypoint
def hermetic():
    context = BuildContext.current()
    ex = context.executor
    t = context.allocate_file("thread.txt")
    InProcess(t, desc="thread", executor=ex)
    first = context.allocate_file("first.txt")
    OutOfProcess(first, pollute, [t], desc="pollute", executor=ex)
    second = context.allocate_file("second.txt")
    OutOfProcess(second, observe, [first], desc="observe", executor=ex)
    return second
"""


def test_a_process_action_never_sees_what_an_earlier_one_did(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module(HERMETIC, header=False)
    # -j 1: one worker thread, the same pool for both actions, one after the other.
    args = ("build", "build.py", "-j", "1", "--action-env", "KILN_GIVEN")
    result = kiln(*args, env={"KILN_GIVEN": "yes"})
    assert result.returncode == 0, result.stderr
    seen = json.loads((tmp_path / "kiln-out" / "genfiles" / "hermetic" / "second.txt").read_text())
    assert seen == {
        "leak": None,
        "thread_leak": None,  # set in kiln's process after the build started
        "given": "yes",  # declared with --action-env: kiln's value
        "cwd": str(tmp_path),  # where the build started, as iree.build's; not "/"
        "json_global": False,
        "sys_path": False,
        "getcwd": "getcwd",
    }


READS_ITS_INPUT = """
import os

from kiln import entrypoint, run_command
from kiln.executor import ActionConcurrency, BuildAction, BuildContext
import sys


class FromConfig(BuildAction):
    def __init__(self, config, output, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, deps=[config], **kwargs)
        self.config = config
        self.output = output
        output.deps.add(self)

    def _remotable_thunk(self):
        # Needs its input to exist: on a clean tree, not before it is built.
        base = int(self.config.get_fs_path().read_text())
        extra = int(os.environ.get("EXTRA", "0"))
        path = str(self.output.get_fs_path())
        log_path = os.path.abspath("ran.log")  # the worker runs in the output directory

        def run():
            with open(log_path, "a") as log:
                log.write("from-config\\n")
            with open(path, "w") as out:
                out.write(str(base + extra))

        return run


@entrypoint
def configured():
    context = BuildContext.current()
    config = run_command(name="config.txt", command=[sys.executable, "-c",
                         "import sys; open(sys.argv[1], 'w').write('40')", "{out}"])
    out = context.allocate_file("result.txt")
    FromConfig(context.file(config), out, desc="from-config", executor=context.executor)
    return out
"""


def test_a_thunk_that_needs_its_inputs_is_keyed_once_they_exist(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module(READS_ITS_INPUT, header=False)
    out = tmp_path / "kiln-out" / "genfiles" / "configured" / "result.txt"
    first = kiln("build", "build.py")
    assert first.returncode == 0, first.stderr
    assert ran(tmp_path) == ["from-config"] and out.read_text() == "40"
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []
    explained = kiln("explain", "build.py", env={"EXTRA": "2"})
    assert "from-config: the code or closure values of its _remotable_thunk changed" in (
        explained.stdout
    )
    assert kiln("build", "build.py", env={"EXTRA": "2"}).returncode == 0
    assert ran(tmp_path) == ["from-config"] and out.read_text() == "42"


CYCLE = """
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext


def ping(n):
    return "ping" if n <= 0 else pong(n - 1)


def pong(n):
    return "pong" if n <= 0 else ping(n - 1)


class Ping(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write(self.desc + "\\n")
        self.output.get_fs_path().write_text(ping(3) + Pong.__name__)


class Pong(Ping):
    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write(self.desc + "\\n")
        self.output.get_fs_path().write_text(pong({n}) + Ping.__name__)


def declare(cls, name):
    context = BuildContext.current()
    out = context.allocate_file(name)
    cls(out, desc=name, executor=context.executor)
    return out


@entrypoint
def a():
    return declare(Ping, "ping.txt")


@entrypoint
def b():
    return declare(Pong, "pong.txt")
"""


def test_code_that_refers_to_itself_keys_the_same_whatever_is_built_first(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write(write_module, CYCLE, n="2")
    assert kiln("build", "build.py", "b").returncode == 0
    assert ran(tmp_path) == ["pong.txt"]
    assert kiln("build", "build.py", "a", "b").returncode == 0
    assert ran(tmp_path) == ["ping.txt"]
    assert kiln("build", "build.py", "b", "a").returncode == 0
    assert ran(tmp_path) == []
    write(write_module, CYCLE, n="4")  # Pong's code: Ping's code names Pong, so both
    assert kiln("build", "build.py", "b").returncode == 0
    assert ran(tmp_path) == ["pong.txt"]
    assert kiln("build", "build.py", "a", "b").returncode == 0
    assert ran(tmp_path) == ["ping.txt"]
