"""Values that code can tell apart have different keys, and what an in-process
action sees of kiln's time zone and locale is in its key, through the real
``kiln`` command line on real build modules.

- Each pair of values below is told apart by code (a NaN's sign or payload, a
  numpy scalar and a 0-d array, a subclass's instance and the plain value, a set
  and a frozenset, field order, a pure path): changing one into the other reruns
  the action, and its output is the new value's.
- Editing a method of the class of an enum or dataclass held in a parameter
  reruns the action.
- Keying a 200 MB array copies none of it (tracemalloc's peak).
- An in-process user action is rebuilt when kiln runs with another ``TZ``,
  ``LC_ALL``, ``LC_TIME``, ``LANG`` or ``SOURCE_DATE_EPOCH``; a PROCESS action (its
  environment is fixed) is not; ``kiln explain`` names the variable;
  ``--check-reproducible`` finds an output that takes the time zone.
"""

from __future__ import annotations

import os
import sys
import textwrap
import tracemalloc
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import needs
import pytest

VALUE = """
import collections
import dataclasses
import enum
import pathlib
import pickle
import struct

from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext
{imports}

{classes}


def describe(value):
    kind = type(value)
    parts = [kind.__module__ + "." + kind.__qualname__, repr(value)]
    if isinstance(value, float):
        parts.append(struct.pack(">d", value).hex())
    if dataclasses.is_dataclass(value):
        parts.append(str([f.name for f in dataclasses.fields(value)]))
    if hasattr(value, "tobytes"):
        parts.append(value.tobytes().hex())
    parts.append(repr(vars(value)) if hasattr(value, "__dict__") else "")
    parts.append(repr(getattr(value, "default_factory", None)))
    try:  # a NaN's bits inside a container or a complex
        parts.append(pickle.dumps(value).hex())
    except Exception:
        pass
    return " ".join(parts)


class Keyed(BuildAction):
    def __init__(self, value, output, **kwargs):
        super().__init__(**kwargs)
        self.value = value
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write(self.desc + "\\n")
        self.output.get_fs_path().write_text(describe(self.value))


@entrypoint
def keyed():
    context = BuildContext.current()
    out = context.allocate_file("k.txt")
    Keyed({value}, out, desc="keyed", executor=context.executor)
    return out
"""

TAGGED = """
class Tag(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


class Labelled(str):
    def __new__(cls, text, label):
        made = super().__new__(cls, text)
        made.label = label
        return made
"""

NAN = 'struct.unpack(">d", bytes.fromhex("{}"))[0]'


def _pair(before: str, after: str, name: str, classes: str = "", imports: str = "") -> Any:
    return pytest.param(before, after, classes, imports, id=name)


NP = "import numpy"
DISTINCT = [
    _pair(NAN.format("7ff8000000000000"), NAN.format("fff8000000000000"), "nan-sign"),
    _pair(NAN.format("7ff8000000000000"), NAN.format("7ff8000000000001"), "nan-payload"),
    _pair("[1.0, (float('nan'),)]", "[1.0, (-float('nan'),)]", "nan-nested"),
    _pair("complex(1, float('nan'))", "complex(1, -float('nan'))", "nan-complex"),
    _pair('numpy.float64("nan")', '-numpy.float64("nan")', "numpy-float64-nan", imports=NP),
    _pair("1.5", "numpy.float64(1.5)", "float-vs-numpy-float64", imports=NP),
    _pair(
        "numpy.float32(1.5)", "numpy.array(1.5, dtype=numpy.float32)", "scalar-vs-0d", imports=NP
    ),
    _pair('"fast"', 'Tag("fast")', "str-subclass", TAGGED),
    _pair("3", "Count(3)", "int-subclass", TAGGED),
    _pair("0.5", "Ratio(0.5)", "float-subclass", TAGGED),
    _pair('Labelled("x", 1)', 'Labelled("x", 2)', "subclass-attribute", TAGGED),
    _pair("{1, 2}", "frozenset({1, 2})", "set-vs-frozenset"),
    _pair('b"ab"', 'bytearray(b"ab")', "bytes-vs-bytearray"),
    _pair('{"a": 1}', "collections.OrderedDict(a=1)", "dict-vs-ordereddict"),
    _pair("collections.defaultdict(int)", "collections.defaultdict(list)", "defaultdict-factory"),
    _pair('pathlib.Path("a")', 'pathlib.PurePosixPath("a")', "path-vs-pure-path"),
    _pair(
        "Opts(a=1, b=2)",
        "Opts(a=1, b=2)",
        "dataclass-field-order",
        "@dataclasses.dataclass\nclass Opts:\n    a: int\n    b: int\n|"
        "@dataclasses.dataclass\nclass Opts:\n    b: int\n    a: int\n",
    ),
    _pair(
        "P(x=1, y=2)",
        "P(x=1, y=2)",
        "namedtuple-field-order",
        'P = collections.namedtuple("P", "x y")|P = collections.namedtuple("P", "y x")',
    ),
]


def ran(tmp_path: Path) -> list[str]:
    """The actions that ran since the last call (and forget them)."""
    log = tmp_path / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(lines)


def write_value(tmp_path: Path, value: str, classes: str = "", imports: str = "") -> None:
    text = VALUE.format(value=value, classes=classes, imports=imports)
    (tmp_path / "build.py").write_text(text)


@pytest.mark.in_process
@pytest.mark.parametrize(("before", "after", "classes", "imports"), DISTINCT)
def test_values_code_can_tell_apart_have_different_keys(
    tmp_path: Path, kiln: Callable[..., Any], before: str, after: str, classes: str, imports: str
) -> None:
    if imports:
        needs.module("numpy")
    first_classes, _, second_classes = classes.partition("|")
    write_value(tmp_path, before, first_classes, imports)
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert ran(tmp_path) == ["keyed"]
    built = (tmp_path / "kiln-out/genfiles/keyed/k.txt").read_text()
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []  # unchanged: nothing runs

    write_value(tmp_path, after, second_classes or first_classes, imports)
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert ran(tmp_path) == ["keyed"], r.stderr
    rebuilt = (tmp_path / "kiln-out/genfiles/keyed/k.txt").read_text()
    assert rebuilt != built  # the action could tell: the old output was stale
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == []


METHODS = """
class Mode(enum.Enum):
    FAST = 1

    def flag(self):
        return "{flag}"


@dataclasses.dataclass
class Opts:
    level: int

    @property
    def flag(self):
        return "{flag}"
"""


@pytest.mark.in_process
@pytest.mark.parametrize("value", ["Mode.FAST", "Opts(1)"])
def test_editing_a_method_of_a_parameters_class_reruns_the_action(
    tmp_path: Path, kiln: Callable[..., Any], value: str
) -> None:
    """The action reads ``self.value.flag``: the class's code is part of the value."""
    flag = "flag()" if value.startswith("Mode") else "flag"  # a method; a property
    module = VALUE.replace("describe(self.value)", f"str(self.value.{flag})")

    def write(text: str) -> None:
        classes = METHODS.replace("{flag}", text)
        (tmp_path / "build.py").write_text(module.format(value=value, classes=classes, imports=""))

    write("--fast")
    assert kiln("build", "build.py").returncode == 0
    assert ran(tmp_path) == ["keyed"]
    write("--quick")
    explained = kiln("explain", "build.py")
    assert "keyed: the code of parameter value's class changed" in explained.stdout, explained
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert ran(tmp_path) == ["keyed"]
    assert (tmp_path / "kiln-out/genfiles/keyed/k.txt").read_text() == "--quick"


BIG = """
from big_array_for_kiln import ARRAY

from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext


class Sums(BuildAction):
    def __init__(self, value, output, **kwargs):
        super().__init__(**kwargs)
        self.value = value
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        self.output.get_fs_path().write_text(str(self.value.shape))


@entrypoint
def big():
    context = BuildContext.current()
    out = context.allocate_file("shape.txt")
    Sums(ARRAY{view}, out, desc="sums", executor=context.executor)
    return out
"""


@pytest.fixture
def big_array() -> Iterator[Any]:
    """A 200 MB array in a module the build module imports (made before the
    measure starts, so that only what keying it takes is measured)."""
    numpy = needs.module("numpy")
    holder = types.ModuleType("big_array_for_kiln")
    holder.ARRAY = numpy.arange(50_000_000, dtype=numpy.float32).reshape(5000, 10000)  # type: ignore[attr-defined]
    sys.modules[holder.__name__] = holder
    try:
        yield holder.ARRAY  # type: ignore[attr-defined]
    finally:
        del sys.modules[holder.__name__]


@pytest.mark.in_process
@pytest.mark.parametrize(
    "view", ["", ".T", "[:, ::3]"], ids=["contiguous", "transposed", "strided"]
)
def test_keying_a_large_array_copies_none_of_it(
    tmp_path: Path, kiln: Callable[..., Any], big_array: Any, view: str
) -> None:
    size = big_array.nbytes
    (tmp_path / "build.py").write_text(BIG.format(view=view))
    tracemalloc.start()
    try:
        r = kiln("build", "build.py")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.returncode == 0, r.stderr
    assert "1 built" in r.stderr, r.stderr
    assert peak < size // 4, f"peak {peak / 1e6:.0f} MB while keying a {size / 1e6:.0f} MB array"
    # The key is the array's: one element changed reruns it.
    r = kiln("build", "build.py")
    assert "1 up to date" in r.stderr, r.stderr
    big_array[4999, 9999] = -1
    r = kiln("build", "build.py")
    assert "1 built" in r.stderr, r.stderr


CONVENTIONS = """
import locale
import os
import time

from kiln import entrypoint
from kiln.executor import ActionConcurrency, BuildAction, BuildContext


def shown():
    locale.setlocale(locale.LC_ALL, "")
    return " ".join([
        time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(0)),
        repr(locale.setlocale(locale.LC_ALL)),
        repr(os.environ.get("SOURCE_DATE_EPOCH")),
        repr(os.environ.get("LANG")),
    ])


LOG = os.path.abspath("ran.log")


def write_shown(path):
    with open(LOG, "a") as log:
        log.write(os.path.basename(path) + "\\n")
    with open(path, "w") as f:
        f.write(shown())


class InKiln(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        write_shown(self.output.get_fs_path())


class InWorker(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.output = output
        output.deps.add(self)

    def _remotable_thunk(self):
        path = str(self.output.get_fs_path())
        return lambda: write_shown(path)


@entrypoint
def conventions():
    context = BuildContext.current()
    here = context.allocate_file("thread.txt")
    InKiln(here, desc="thread", executor=context.executor)
    there = context.allocate_file("worker.txt")
    InWorker(there, desc="worker", executor=context.executor)
    return [here, there]
"""

# LC_ALL empty: unset for the C library, so that LANG and LC_TIME count.
BASE_ENV = {"TZ": "UTC0", "LANG": "C.UTF-8", "LC_ALL": "", "SOURCE_DATE_EPOCH": "0"}
OUT = "kiln-out/genfiles/conventions"


@pytest.mark.parametrize(
    ("name", "value", "seen"),
    [
        ("TZ", "<+09>-9", "1970-01-01 09:00 +09"),
        ("LC_ALL", "C", "'C'"),
        ("LC_TIME", "C", "LC_TIME=C"),
        ("LANG", "C", "'C'"),
        ("SOURCE_DATE_EPOCH", "315532800", "'315532800'"),
    ],
)
def test_an_in_process_action_is_rebuilt_under_another_time_zone_or_locale(
    tmp_path: Path, kiln_subprocess: Callable[..., Any], name: str, value: str, seen: str
) -> None:
    """kiln itself runs with another value: the in-process action reruns and sees
    it; the PROCESS action, whose environment is fixed, does not rerun; explain
    names the variable."""
    (tmp_path / "build.py").write_text(CONVENTIONS)
    base = {**BASE_ENV}
    r = kiln_subprocess("build", "build.py", env=base)
    assert r.returncode == 0, r.stderr
    assert ran(tmp_path) == ["thread.txt", "worker.txt"]
    before = (tmp_path / OUT / "thread.txt").read_text()
    assert "1970-01-01 00:00 UTC" in before
    r = kiln_subprocess("build", "build.py", env=base)
    assert ran(tmp_path) == [], r.stderr

    changed = {**base, name: value}
    explained = kiln_subprocess("explain", "build.py", env=changed)
    assert explained.returncode == 0, explained.stderr
    old = {**os.environ, **base}.get(name)
    said = "thread: the time zone or locale of kiln's process, which its code sees, changed: "
    said += f"{name} from {'unset' if old is None else repr(old)} to {value!r}"
    assert said in explained.stdout, explained.stdout
    assert "worker:" not in explained.stdout.replace("worker: up to date", "")
    r = kiln_subprocess("build", "build.py", env=changed)
    assert r.returncode == 0, r.stderr
    assert ran(tmp_path) == ["thread.txt"], r.stderr  # the worker's environment is fixed
    assert seen in (tmp_path / OUT / "thread.txt").read_text()
    assert kiln_subprocess("build", "build.py", env=changed).returncode == 0
    assert ran(tmp_path) == []


UNKEYED = """
class Fixed(InKiln):
    def _invoke(self):
        self.output.get_fs_path().write_text(time.strftime("%Y", time.gmtime(0)))


class Clock(InKiln):
    def _invoke(self):
        self.output.get_fs_path().write_text(str(time.time_ns()))


class Dice(InKiln):
    def _invoke(self):
        self.output.get_fs_path().write_bytes(os.urandom(16))


@entrypoint"""

MORE_OUTPUTS = """
made = [here, there]
for name, kind in [("fixed", Fixed), ("clock", Clock), ("dice", Dice)]:
    made.append(context.allocate_file(name + ".txt"))
    kind(made[-1], desc=name, executor=context.executor)
return made
"""


def test_check_reproducible_keeps_what_the_key_holds_and_varies_the_rest(
    tmp_path: Path, kiln_subprocess: Callable[..., Any], _private_cache: Path
) -> None:
    """An in-process action whose output takes kiln's time zone (which its key holds)
    is run again under the same one: it reproduces, and stays in the cache for
    another output directory. What no key holds still shows: the time, chance (a
    worker's directory: ``test_same_bytes``)."""
    module = CONVENTIONS.replace(
        "    return [here, there]", textwrap.indent(MORE_OUTPUTS, "    ")
    ).replace("@entrypoint", UNKEYED)
    (tmp_path / "build.py").write_text(module)
    zone = {**BASE_ENV, "TZ": "<+09>-9"}
    r = kiln_subprocess("build", "build.py", "--check-reproducible", env=zone)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if " differs " in ln or " written " in ln]
    found = sorted(ln.split("'")[1] for ln in lines)
    assert found == ["clock", "dice"], r.stderr
    assert not any("with TZ=" in ln for ln in lines), lines  # keyed: never varied
    assert "2 not reproducible" in r.stderr, r.stderr
    assert "1970-01-01 09:00 +09" in (tmp_path / OUT / "thread.txt").read_text()
    ran(tmp_path)
    # Not withdrawn: a fresh output directory under the same zone takes it from the cache.
    fresh = kiln_subprocess("build", "build.py", "--output-dir", "fresh", env=zone)
    assert fresh.returncode == 0, fresh.stderr
    assert "thread.txt" not in ran(tmp_path), fresh.stderr
    shown = tmp_path / "fresh/genfiles/conventions/thread.txt"
    assert "1970-01-01 09:00 +09" in shown.read_text()
    # Under another zone it is another key: built again, with that zone.
    other = kiln_subprocess("build", "build.py", "--output-dir", "other", env=BASE_ENV)
    assert other.returncode == 0, other.stderr
    assert "thread.txt" in ran(tmp_path), other.stderr
    shown = tmp_path / "other/genfiles/conventions/thread.txt"
    assert "1970-01-01 00:00 UTC" in shown.read_text()


def test_check_reproducible_passes_a_time_zone_dependent_action(
    tmp_path: Path, kiln_subprocess: Callable[..., Any]
) -> None:
    """The build with only the keyed, zone-dependent actions passes the check."""
    (tmp_path / "build.py").write_text(CONVENTIONS)
    r = kiln_subprocess("build", "build.py", "--check-reproducible", env=BASE_ENV)
    assert r.returncode == 0, r.stderr
    assert "not reproducible" not in r.stderr, r.stderr
    r = kiln_subprocess("build", "build.py", "--check-reproducible", env=BASE_ENV)
    assert r.returncode == 0, r.stderr


def test_only_the_locale_categories_of_the_environment_are_keyed() -> None:
    # A terminal's LC_TERMINAL (forwarded by ssh) sets no locale: keying it made a
    # build from one terminal rebuild every in-process action in another, or in CI.
    from kiln.base.action_env import local_conventions

    base = {"LANG": "C.UTF-8", "LC_TIME": "C", "PATH": "/bin"}
    keyed = local_conventions(base)
    assert keyed["LC_TIME"] == "C" and keyed["LANG"] == "C.UTF-8"
    with_terminal = {**base, "LC_TERMINAL": "iTerm2", "LC_TERMINAL_VERSION": "3.5"}
    assert local_conventions(with_terminal) == keyed
