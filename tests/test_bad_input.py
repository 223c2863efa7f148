"""Bad input, one row each: the message and exit status, no traceback unless
``-v``, and nothing lost.

Every case starts from an output directory where the entrypoint ``good`` is
built. The bad build must exit with the documented status (2: the build
definition or command line is wrong; 1: an action failed) and a message naming
what to change (the file and line, the target, the path, the option), print a
traceback only with ``-v``, and leave ``good``'s output as it was: a build of
the good module afterwards finds it up to date.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import needs
import pytest
from httpserver import HTTPTestServer

pytestmark = pytest.mark.in_process


HEADER = "from kiln import *\nfrom kiln.executor import *\n"
GOOD = """
@entrypoint
def good():
    return run_command(name="good.txt", command=["sh", "-c", "echo good > {out}"])
"""


@dataclass
class Case:
    """A bad build: ``extra`` is appended to the good module (or ``module``
    replaces it); ``args`` follow ``kiln build build.py``. ``expect`` are
    substrings of stderr, formatted with ``module`` (its path), ``line`` (of
    the line marked ``# HERE``), ``first`` (``# FIRST``), ``defined`` (``# DEF``) and
    ``tmp``."""

    id: str
    code: int
    expect: list[str]
    extra: str = ""
    module: str | None = None
    args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ("build", "build.py")
    setup: Callable[[Path], None] | None = None
    user_traceback: bool = False  # an exception in the user's action shows where it came from


def _a_file(tmp: Path) -> None:
    (tmp / "afile").write_text("a regular file, where a directory should be\n")


CUSTOM = """
class Make(BuildAction):
    def __init__(self, out, fail=False, write=True, **kw):
        super().__init__(**kw)
        self.out, self.fail, self.write = out, fail, write

    def _invoke(self):
        if self.fail:
            raise RuntimeError("boom in action")
        if self.write:
            self.out.get_fs_path().write_text("made")


def make(name, deps=(), **kw):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    out.deps.add(Make(out, desc=f"make {name}", executor=ctx.executor, deps=deps, **kw))  # DEF
    return out
"""

CASES = [
    Case(
        "entrypoint-name-with-a-slash",
        2,
        ["entrypoint name 'models/mnist' (at {module}:{line}) is not a name"],
        extra=(
            "def make():  # HERE\n"
            "    return run_command(name='x.txt', command=['sh', '-c', 'echo > {{out}}'])\n"
            "make.__name__ = 'models/mnist'\n"
            "mnist = entrypoint(make)\n"
        ),
    ),
    Case(
        "path-taken-by-an-entrypoint",
        2,
        ["duplicate path 'dot': defined at {module}:{line} and already at {module}:{first}"],
        extra=(
            "@entrypoint  # FIRST\n"
            "def dot():\n"
            "    return run_command(name='ls.txt', inputs=[source_file('.')],  # HERE\n"
            "                       command=['sh', '-c', 'ls {{inputs[0]}} > {{out}}'])\n"
        ),
    ),
    # -- the build module --------------------------------------------------------
    Case(
        "syntax-error",
        2,
        ["{module}:{line}: syntax error in build module", "def broken(:"],
        extra="@entrypoint\ndef broken(:  # HERE\n    pass\n",
    ),
    Case(
        "exception-at-import",
        2,
        ["{module}:{line}: error while loading build module {module}: JSONDecodeError"],
        extra="import json\njson.loads('{')  # HERE\n",
    ),
    Case(
        "import-error",
        2,
        [
            "{module}:{line}: error while loading build module {module}: ModuleNotFoundError: "
            "No module named 'kiln_no_such_module'"
        ],
        extra="import kiln_no_such_module  # HERE\n",
    ),
    Case(
        "entrypoint-raises",
        2,
        ["{module}:{line}: error while analysing entrypoint 'broken' of {module}: KeyError: 'x'"],
        extra="@entrypoint\ndef broken():\n    return {}['x']  # HERE\n",
    ),
    Case(
        "no-entrypoints",
        2,
        ["build module {module} defines no entrypoints; mark a function with @entrypoint"],
        module="x = 1\n",
    ),
    Case("module-missing", 2, ["build module nope.py does not exist"], argv=("build", "nope.py")),
    # -- the graph ---------------------------------------------------------------
    Case(
        "cycle",
        2,
        [
            "dependency cycle: loop/a -> make a -> loop/b -> make b -> loop/a",
            "break one of these edges",
        ],
        extra=CUSTOM
        + textwrap.dedent("""
            @entrypoint
            def loop():
                ctx = BuildContext.current()
                a, b = ctx.allocate_file("a"), ctx.allocate_file("b")
                a.deps.add(Make(a, desc="make a", executor=ctx.executor, deps=[b]))
                b.deps.add(Make(b, desc="make b", executor=ctx.executor, deps=[a]))
                return a
            """),
    ),
    Case(
        "duplicate-path",
        2,
        [
            "duplicate path 'twice/x.txt': defined at {module}:{line} and already at "
            "{module}:{first}; give one of them another name"
        ],
        extra=textwrap.dedent("""
            @entrypoint
            def twice():
                run_command(name="x.txt", command=["true"])  # FIRST
                return run_command(name="x.txt", command=["true"])  # HERE
            """),
    ),
    Case(
        "path-escapes-output-root",
        2,
        [
            "path '../../x.txt' (in 'escape', at {module}:{line}) leaves the 'gen' output root "
            "{tmp}/kiln-out/genfiles"
        ],
        extra=textwrap.dedent("""
            @entrypoint
            def escape():
                return run_command(name="../../x.txt", command=["true"])  # HERE
            """),
    ),
    Case(
        "unknown-file",
        2,
        ["file 'good/god.txt' is not known in the build graph; did you mean: good/good.txt?"],
        extra=textwrap.dedent("""
            @entrypoint
            def uses():
                return run_command(name="y.txt", command=["true"], inputs=["/good/god.txt"])
            """),
    ),
    Case(
        "missing-source-file",
        2,
        [
            "source file {tmp}/nope.txt does not exist (source_file('nope.txt') in entrypoint "
            "'src', at {module}:{line})"
        ],
        extra=textwrap.dedent("""
            @entrypoint
            def src():
                return source_file("nope.txt")  # HERE
            """),
    ),
    Case(
        "conflicting-cl-args",
        2,
        [
            "option --level is defined twice with different settings: at {module}:{first} and "
            "at {module}:{line}"
        ],
        extra=textwrap.dedent("""
            @entrypoint
            def one(level=cl_arg("level", default=1, type=int)):  # FIRST
                return None

            @entrypoint
            def two(level=cl_arg("level", default=2, type=int)):  # HERE
                return None
            """),
    ),
    Case(
        "cl-arg-clashes-with-an-iree-build-option",
        2,
        [
            "cl_arg 'output-dir' at {module}:{line} clashes with --output-dir, an option of "
            "kiln's that iree.build has too"
        ],
        extra="@entrypoint\ndef mine(o=cl_arg('output-dir')):  # HERE\n    return None\n",
    ),
    # -- the command line --------------------------------------------------------
    Case("unknown-target", 2, ["unknown target 'goood'; did you mean: good"], args=("goood",)),
    Case("jobs-zero", 2, ["argument -j/--jobs: must be at least 1, got 0"], args=("-j", "0")),
    Case("unknown-option", 2, ["unrecognized arguments: --frobnicate"], args=("--frobnicate",)),
    Case(
        "unknown-compile-target",
        2,
        ["argument --target: unknown --target 'tpu'"],
        args=("--target", "tpu"),
    ),
    Case(
        "output-dir-under-a-file",
        2,
        ["cannot write to the output directory {tmp}/afile/out: Not a directory"],
        args=("--output-dir", "afile/out"),
        setup=_a_file,
    ),
    Case(
        "output-dir-is-a-file",
        2,
        ["cannot write to the output directory {tmp}/afile: Not a directory"],
        args=("--output-dir", "afile"),
        setup=_a_file,
    ),
    Case(
        "explain-output-dir-under-a-file",
        2,
        ["cannot write to the output directory {tmp}/afile/out: Not a directory"],
        argv=("explain", "build.py"),
        args=("--output-dir", "afile/out"),
        setup=_a_file,
    ),
    # -- actions -----------------------------------------------------------------
    Case(
        "action-raises",
        1,
        [
            "  * make boom.txt\n      defined at {module}:{defined}",
            "RuntimeError: boom in action",
            "1 failed",
        ],
        extra=CUSTOM + "@entrypoint\ndef boom():\n    return make('boom.txt', fail=True)  # HERE\n",
        user_traceback=True,
    ),
    Case(
        "action-writes-no-output",
        1,
        [
            "'make lazy.txt' finished without writing its output "
            "{tmp}/kiln-out/genfiles/lazy/lazy.txt"
        ],
        extra=CUSTOM + "@entrypoint\ndef lazy():\n    return make('lazy.txt', write=False)\n",
    ),
    Case(
        "command-fails",
        1,
        [
            "'Running fails/f.txt': command exited with status 3: sh -c \"echo oops >&2; exit 3\"",
            "oops",
        ],
        extra=textwrap.dedent("""
            @entrypoint
            def fails():
                return run_command(name="f.txt", command=["sh", "-c", "echo oops >&2; exit 3"])
            """),
    ),
    Case(
        "command-not-found",
        1,
        ["'Running nocmd/n.txt': cannot run 'kiln-no-such-program': No such file or directory"],
        extra="@entrypoint\ndef nocmd():\n"
        "    return run_command(name='n.txt', command=['kiln-no-such-program'])\n",
    ),
    Case(
        "command-bad-placeholder",
        1,
        ["'Running fmt/f.txt': cannot format the command", "{{{{ and }}}} for literal braces"],
        extra="@entrypoint\ndef fmt():\n"
        "    return run_command(name='f.txt', command=['sh', '-c', 'x {{out}'])\n",
    ),
]


def _line_of(text: str, mark: str) -> int:
    return next((i for i, ln in enumerate(text.splitlines(), 1) if ln.endswith(mark)), 0)


@pytest.fixture(scope="module")
def built_good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output directory where ``good`` is built (copied into each test)."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("good")
    (root / "build.py").write_text(HEADER + GOOD)
    subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py"],
        cwd=root,
        check=True,
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return root / "kiln-out"


@pytest.fixture
def good_dir(built_good: Path, tmp_path: Path) -> Iterator[Path]:
    shutil.copytree(built_good, tmp_path / "kiln-out")
    (tmp_path / "build.py").write_text(HEADER + GOOD)
    yield tmp_path / "kiln-out" / "genfiles" / "good" / "good.txt"


def check_bad_build(kiln, tmp_path: Path, case: Case, good: Path) -> str:  # type: ignore[no-untyped-def]
    """Run ``case``'s build, plain and with -v; check status, message, tracebacks and
    that ``good`` survived. Returns the plain run's stderr."""
    before = (good.read_bytes(), good.stat().st_mtime_ns)
    text = HEADER + (case.module if case.module is not None else GOOD + case.extra)
    module = tmp_path / "build.py"
    module.write_text(text)
    if case.setup is not None:
        case.setup(tmp_path)
    fields = {
        "module": module,
        "tmp": tmp_path,
        "line": _line_of(text, "# HERE"),
        "first": _line_of(text, "# FIRST"),
        "defined": _line_of(text, "# DEF"),
    }

    r = kiln(*case.argv, *case.args)
    assert r.returncode == case.code, r.stderr
    for expected in case.expect:
        assert expected.format(**fields) in r.stderr
    if not case.user_traceback:
        assert "Traceback" not in r.stderr
    verbose = kiln(*case.argv, *case.args, "-v")
    assert verbose.returncode == case.code
    assert "Traceback (most recent call last)" in verbose.stderr

    # Nothing lost: the good output is untouched and still up to date.
    assert (good.read_bytes(), good.stat().st_mtime_ns) == before
    module.write_text(HEADER + GOOD)
    again = kiln("build", "build.py", "good")
    assert again.returncode == 0, again.stderr
    assert "0 built, 1 up to date" in again.stderr
    return r.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(kiln, tmp_path: Path, good_dir: Path, case: Case) -> None:
    check_bad_build(kiln, tmp_path, case, good_dir)


# -- fetching ---------------------------------------------------------------------

FETCH = """
@entrypoint
def get(url=cl_arg("url"), sha=cl_arg("sha", default=None)):
    return fetch_http(name="blob.bin", url=url, sha256=sha, retries=0)
"""


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server() -> Iterator[HTTPTestServer]:
    with HTTPTestServer() as s:
        yield s


@pytest.mark.parametrize("failure", ["404", "refused", "checksum"])
def test_fetch_failures(
    kiln, tmp_path: Path, good_dir: Path, server: HTTPTestServer, failure: str
) -> None:
    if failure == "404":
        url = server.status("/missing.bin", 404)
        args, expect = ("--url", url), [f"HTTP 404 Not Found fetching {url}"]
    elif failure == "refused":
        url = f"http://127.0.0.1:{_unused_port()}/m.bin"
        args, expect = ("--url", url), ["connection refused", url]
    else:
        url = server.serve("/m.bin", b"abc")
        actual = hashlib.sha256(b"abc").hexdigest()
        args = ("--url", url, "--sha", "0" * 64)
        expect = [f"checksum mismatch for {url}: expected {'0' * 64}, got {actual}"]
    case = Case(
        f"fetch-{failure}",
        1,
        [e.replace("{", "{{").replace("}", "}}") for e in expect],
        extra=FETCH,
        args=args,
    )
    check_bad_build(kiln, tmp_path, case, good_dir)
    assert not (tmp_path / "kiln-out" / "genfiles" / "get" / "blob.bin").exists()
    assert list((tmp_path / "kiln-out" / "genfiles" / "get").iterdir()) == []  # no temporary


# -- ML actions (tests/test_ml_actions.py covers them within full pipelines) ------

MLIR = """
func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {
  %0 = arith.addf %a, %a : tensor<3xf32>
  return %0 : tensor<3xf32>
}
"""


def test_corrupt_onnx(kiln, tmp_path: Path, good_dir: Path) -> None:
    needs.module("onnx")
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07not a model")
    extra = (
        "@entrypoint\ndef imp():\n"
        "    return onnx_import(name='b.mlir', source=source_file('broken.onnx'))\n"
    )
    stderr = check_bad_build(kiln, tmp_path, Case("onnx", 1, [], extra=extra), good_dir)
    assert f"{tmp_path}/broken.onnx" in stderr and "1 failed" in stderr


def test_mlir_compile_error(kiln, tmp_path: Path, good_dir: Path) -> None:
    needs.module("iree.compiler")
    (tmp_path / "bad.mlir").write_text("func.func @main( -> {\n")
    extra = (
        "@entrypoint\ndef bad():\n"
        "    return compile(name='bad', source=source_file('bad.mlir'), targets=['vmvx'])\n"
    )
    case = Case("compile", 1, ["iree-compile failed on", "bad.mlir", "error"], extra=extra)
    check_bad_build(kiln, tmp_path, case, good_dir)
    assert not (tmp_path / "kiln-out" / "bin" / "bad" / "bad_vmvx.vmfb").exists()


def test_verify_mismatch(kiln, tmp_path: Path, good_dir: Path) -> None:
    np = needs.module("numpy")
    needs.module("iree.runtime")
    (tmp_path / "double.mlir").write_text(MLIR)
    x = np.array([1, 2, 3], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "wrong.npy", x * 3)
    extra = textwrap.dedent("""
        @entrypoint
        def check():
            (module,) = compile(name="double", source=source_file("double.mlir"), targets=["vmvx"])
            return verify(name="check.json", module=module, inputs=[source_file("x.npy")],
                          expected=[source_file("wrong.npy")])
        """)
    case = Case("verify", 1, ["do not match", "1 built", "1 failed"], extra=extra)
    check_bad_build(kiln, tmp_path, case, good_dir)
    assert (tmp_path / "kiln-out" / "bin" / "check" / "double_vmvx.vmfb").exists()
    assert not (tmp_path / "kiln-out" / "genfiles" / "check" / "check.json").exists()


# -- the build state --------------------------------------------------------------


def _foreign_db(path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes(text TEXT)")
    db.execute("INSERT INTO notes VALUES ('somebody else''s data')")
    db.commit()
    db.close()


@pytest.mark.parametrize("kind", ["corrupt", "foreign"])
def test_unusable_state_db_is_kept_aside_and_the_build_goes_on(
    kiln, tmp_path: Path, good_dir: Path, kind: str
) -> None:
    state = tmp_path / "kiln-out" / ".kiln" / "state.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    if kind == "corrupt":
        state.write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    else:
        state.unlink()
        _foreign_db(state)
    original = state.read_bytes()
    good = good_dir.read_bytes()

    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert f"warning: build state {state} was unreadable" in r.stderr
    assert "starting a clean build" in r.stderr and "Traceback" not in r.stderr
    (aside,) = state.parent.glob("state.db.corrupt-*")
    assert f"moved it to {aside}" in r.stderr
    assert aside.read_bytes() == original  # nothing lost: the old file is kept
    assert good_dir.read_bytes() == good
    again = kiln("build", "build.py")
    assert "0 built, 1 up to date" in again.stderr and "warning" not in again.stderr


@pytest.mark.parametrize("digest", ["abc", "g" * 64, "0" * 63, "0" * 65, "sha256:" + "0" * 64])
def test_a_malformed_sha256_is_a_definition_error_at_its_line(write_module, kiln, digest) -> None:
    module = write_module(
        f"""
        @entrypoint
        def model():
            return fetch_http(name="m.onnx", url="http://127.0.0.1:9/m.onnx",
                              sha256={digest!r})
        """
    )
    line = next(i for i, t in enumerate(module.read_text().splitlines(), 1) if "fetch_http" in t)
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"{module}:{line}: fetch of http://127.0.0.1:9/m.onnx: sha256=" in r.stderr
    assert "64 hexadecimal digits" in r.stderr
    assert not (module.parent / "kiln-out").exists()  # found at definition, nothing ran


def test_a_well_formed_sha256_in_capitals_and_spaces_is_accepted(write_module, kiln) -> None:
    write_module(
        f"""
        @entrypoint
        def model():
            return fetch_http(name="m.onnx", url="http://127.0.0.1:9/m.onnx",
                              sha256=" {"AB" * 32} ")
        """
    )
    r = kiln("list", "build.py")
    assert r.returncode == 0, r.stderr


def test_a_duplicate_path_made_by_a_helper_names_both_callers(write_module, kiln) -> None:
    module = write_module(
        """
        def echo(name):
            return run_command(name=name, command=["sh", "-c", 'echo x > "$0"', "{out}"])


        @entrypoint
        def twice():
            first = echo("same.txt")
            second = echo("same.txt")
            return [first, second]
        """
    )
    lines = module.read_text().splitlines()
    helper = next(i for i, t in enumerate(lines, 1) if "return run_command" in t)
    first, second = (i for i, t in enumerate(lines, 1) if 'echo("same.txt")' in t)
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert (
        f"duplicate path 'twice/same.txt': defined at {module}:{helper} (called from line "
        f"{second}) and already at {module}:{helper} (called from line {first})"
    ) in r.stderr, r.stderr
