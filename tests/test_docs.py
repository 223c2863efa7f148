"""Every command of the README and of docs/ is run as written, so that a doc cannot
go stale silently.

Each fenced block has a language; ``sh`` blocks hold commands, one a line, and
every such line is listed in ``CHECKS`` below with how it is checked:

- ``RUN``: run by bash, in a scratch project, in the order of the doc, as written
  but for the placeholders a reader replaces too (``SUBSTITUTED``): the README's
  model URL and digest (served from 127.0.0.1: tests never reach further), the
  host names ``SCHEDULER`` and ``CACHE``, the ports 8080 and 8786 (free ports: a
  fixed one would collide with another test) and ``0.0.0.0`` (tests listen on the
  loopback only). Lines that start servers (``dask scheduler``, ``dask worker``)
  run in the background until the doc's commands are done.
- ``Syntax(reason, check)``: a command that needs the network or runs for many
  minutes; ``bash -n`` checks the line and ``check`` (its ``--help``, say) runs.
- ``Covered(test)``: a test elsewhere runs exactly that line.

A command missing from ``CHECKS``, or listed and no longer in any doc, fails the
test. ``nginx`` blocks are whole configurations: each is started by nginx and
stores and serves a file over WebDAV.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import needs
import pytest
from httpserver import HTTPTestServer
from nginx import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Syntax:
    reason: str
    check: str  # a command run in the repository's root


@dataclass(frozen=True)
class Covered:
    test: str  # path::name


RUN = "run"
_ZOO = "too long here (the whole zoo is 1,400 actions, minutes of both cores)"
_NET = "needs the network (pip installs from the package index)"
CHECKS: dict[str, str | Syntax | Covered] = {
    # README.md: the two commands (docs/testing.md repeats the second).
    "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[iree]' && "
    ".venv/bin/python examples/model_zoo.py": Syntax(
        f"{_NET}; {_ZOO}; the README's two-model line runs the same script",
        ".venv/bin/python -c 'import kiln, onnx, iree.compiler, iree.runtime, onnxruntime'",
    ),
    ".venv/bin/python examples/model_zoo.py pytorch-converted__test_AvgPool1d "
    "simple__test_sequence_model8": Covered(
        "tests/test_model_zoo.py::test_the_readmes_two_models_through_every_stage"
    ),
    ".venv/bin/pip install -q -e '.[iree,torch-zoo]' && "
    ".venv/bin/python examples/torch_zoo.py -j 2": (
        Syntax(
            f"{_NET}; the four torchvision models take many minutes of both cores; "
            "tests/test_torch_export.py runs the same actions on small modules",
            ".venv/bin/python examples/torch_zoo.py --help",
        )
    ),
    "bash scripts/test": Syntax(
        "it is the command that runs this test", "bash -n scripts/test && test -x .ci/run"
    ),
    # README.md: a build module, your own actions.
    "source .venv/bin/activate": RUN,
    "kiln --version": RUN,
    "kiln build build.py": RUN,
    "kiln explain build.py": RUN,
    'echo "hello kiln world" > words.txt': RUN,
    "kiln build words.py": RUN,
    "cat kiln-out/genfiles/words/summary.txt": RUN,
    'echo "one more" >> words.txt': RUN,
    "kiln explain words.py": RUN,
    # README.md: the command line.
    "kiln build build.py --target cpu --target vmvx": RUN,
    "python build.py --target vmvx": RUN,
    "kiln build build.py mnist -j 4": RUN,
    "kiln build build.py mnist/mnist.mlir": RUN,
    "kiln build build.py --strict": RUN,
    "kiln list build.py": RUN,
    "kiln list build.py --all": RUN,
    "kiln list build.py --json": RUN,
    "kiln explain build.py --target vmvx": RUN,
    "kiln explain build.py --json": RUN,
    "kiln build build.py --opset 18 --dry-run": RUN,
    "kiln build build.py --opset 18 --explain": RUN,
    "kiln graph build.py | dot -Tsvg > graph.svg": RUN,
    "kiln build build.py --events events.jsonl": RUN,
    "kiln build build.py --profile trace.json": RUN,
    "kiln report": RUN,
    "kiln report --list": RUN,
    "kiln report --list --json": RUN,
    "kiln report --build 1": RUN,
    "kiln devices": RUN,
    "kiln cache stats --json": RUN,
    "python -m kiln list build.py": RUN,
    "kiln build.py --list-all": RUN,
    "kiln build.py mnist --build": RUN,
    'eval "$(kiln completion bash)"': RUN,
    "kiln clean": RUN,
    # docs/performance.md.
    ".venv/bin/python benchmarks/run.py": Syntax(
        f"{_NET} (the peers Ninja and doit) and runs for 25 minutes",
        ".venv/bin/python benchmarks/run.py --help",
    ),
    ".venv/bin/python benchmarks/run.py --readme": Syntax(
        f"{_NET} (the peers Ninja and doit) and runs for 25 minutes",
        ".venv/bin/python benchmarks/run.py --help",
    ),
    # The README's comparison of two zoo builds.
    "kiln build examples/model_zoo.py --output-dir zoo-a -j 2": Syntax(
        _ZOO, ".venv/bin/kiln build --help"
    ),
    "kiln build examples/model_zoo.py --output-dir zoo-b -j 2 "
    "--iree-compile-extra-args=--iree-opt-level=O3": Syntax(_ZOO, ".venv/bin/kiln build --help"),
    "kiln compare zoo-a zoo-b --measure --budget 300": Syntax(
        "needs the two zoo builds above", ".venv/bin/kiln compare --help"
    ),
    # docs/cluster.md.
    "kiln build build.py --executor dask-local:4": RUN,
    "dask scheduler --host 0.0.0.0 --port 8786": RUN,
    "dask worker tcp://SCHEDULER:8786 --nthreads 1 --local-directory /var/tmp/dask-worker": RUN,
    "kiln build build.py --executor dask://SCHEDULER:8786 --remote-cache http://CACHE:8080 -j 64": (
        RUN
    ),
    "dask worker tcp://SCHEDULER:8786 --nthreads 1 "
    "--preload kiln.execution.cluster.worker_devices": RUN,
    "kiln devices --executor dask://SCHEDULER:8786": RUN,
    "kiln build build.py --target cuda:sm_89 --executor dask://SCHEDULER:8786 --remote-cache "
    "http://CACHE:8080": RUN,
    "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False": RUN,
    "export DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1s": RUN,
    "export DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL=1s": RUN,
    "export DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL=2s": RUN,
    # docs/events.md.
    "kiln build build.py --events build-events.jsonl": RUN,
    "jq -c 'select(.event == \"failed\") | {desc, error}' build-events.jsonl": RUN,
    # docs/porting.md.
    "python scripts/compat_upstream.py /path/to/build_api": Syntax(
        "needs iree.build's own test files, which are not part of kiln and which tests "
        "never fetch; tests/test_compat_upstream.py runs the script on a suite in their "
        "layout",
        ".venv/bin/python scripts/compat_upstream.py --help",
    ),
    "python scripts/compat_upstream.py /path/to/build_api --package iree.build": Syntax(
        "as above", ".venv/bin/python scripts/compat_upstream.py --help"
    ),
}
SERVERS = ("dask scheduler", "dask worker")


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def commands(self) -> list[str]:
        """Its command lines, without comments (a ``#`` after blanks starts one)."""
        found = []
        for line in self.text.splitlines():
            command = re.sub(r"(^|\s+)#\s.*$", "", line).strip()
            if command:
                found.append(command)
        return found


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` (indented ones in lists included)."""
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if opening:
            indent, lang, start = opening.group(1), opening.group(2), i
            body = []
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            found.append(Block(doc, start + 1, lang, "\n".join(body) + "\n"))
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def sh_commands(doc: Path) -> list[str]:
    return [c for b in blocks(doc) if b.lang == "sh" for c in b.commands]


# -- the inventory -------------------------------------------------------------------


def test_every_fenced_block_says_its_language() -> None:
    unlabeled = [f"{b.doc.name}:{b.line}" for b in all_blocks() if not b.lang]
    assert not unlabeled, f"fenced blocks without a language (sh, python, text...): {unlabeled}"


def test_every_doc_command_is_checked_and_every_check_is_in_a_doc() -> None:
    in_docs = {
        c: f"{b.doc.name}:{b.line}" for b in all_blocks() if b.lang == "sh" for c in b.commands
    }
    unchecked = sorted(f"{where}: {c}" for c, where in in_docs.items() if c not in CHECKS)
    assert not unchecked, "doc commands no test checks (add them to CHECKS):\n" + "\n".join(
        unchecked
    )
    stale = sorted(c for c in CHECKS if c not in in_docs)
    assert not stale, f"CHECKS lists commands no doc has any more: {stale}"


@pytest.mark.parametrize(
    "command", [c for c, how in CHECKS.items() if isinstance(how, Syntax)], ids=lambda c: c[:40]
)
def test_commands_too_long_or_needing_the_network_are_well_formed(command: str) -> None:
    how = CHECKS[command]
    assert isinstance(how, Syntax) and how.reason
    syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    r = subprocess.run(
        ["bash", "-c", how.check],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert r.returncode == 0, (how.check, r.stdout[-2000:], r.stderr[-2000:])
    if how.check.endswith(" --help"):  # each option the command names is one it has
        last = command.split("&&")[-1]
        for option in re.findall(r"(?<![=\S])--[\w-]+", last):
            assert option in r.stdout, (command, option)


def test_covered_commands_are_run_by_their_tests() -> None:
    for how in CHECKS.values():
        if isinstance(how, Covered):
            path, name = how.test.split("::")
            source = (ROOT / path).read_text()
            assert f"def {name}(" in source, how.test


# -- running them --------------------------------------------------------------------


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a reader who activated the README's venv."""
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "NO_COLOR": "1", **(extra or {})}


def _add_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A scratch project holding the README's build module as ``build.py``, its model
    served from 127.0.0.1 in place of the README's example URL."""
    needs.module("onnx")
    model = tmp_path / "model.onnx"
    _add_model(model)
    data = model.read_bytes()
    (module,) = [
        b
        for b in blocks(ROOT / "README.md")
        if b.lang == "python" and b.text.startswith("from kiln import *")
    ]
    with HTTPTestServer() as server:
        url = server.serve("/mnist-12.onnx", data)
        text = module.text.replace("https://example.com/mnist-12.onnx", url)
        text = text.replace('sha256="..."', f'sha256="{hashlib.sha256(data).hexdigest()}"')
        assert text != module.text
        root = tmp_path / "project"
        root.mkdir()
        (root / "build.py").write_text(text)
        (root / "words.py").write_text(readme_block("python", OWN_ACTIONS).text)
        # The venv the README's first command made, which its readers activate.
        (root / ".venv").symlink_to(VENV_BIN.parent)
        yield root


OWN_ACTIONS = "class Shout(BuildAction):"  # the README's module of its own actions


def readme_block(lang: str, holding: str) -> Block:
    """The one README block of ``lang`` whose text holds ``holding``."""
    (block,) = [b for b in blocks(ROOT / "README.md") if b.lang == lang and holding in b.text]
    return block


def own_actions_output() -> str:
    """What the README says its own actions write: the text block after the
    ``cat`` of their summary."""
    found = blocks(ROOT / "README.md")
    (i,) = [i for i, b in enumerate(found) if "cat kiln-out/genfiles/words/" in b.text]
    assert found[i + 1].lang == "text"
    return found[i + 1].text


class Shell:
    """Runs a doc's commands in ``cwd``, in order, as bash runs them."""

    def __init__(self, cwd: Path, substitutions: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.substitutions = substitutions or {}
        self.env = _env()
        self.servers: list[subprocess.Popen[bytes]] = []
        self.stderr = ""  # the last command's

    def run(self, command: str) -> str:
        """Run ``command``; its standard output."""
        assert CHECKS.get(command) == RUN, command
        line = command
        for placeholder, value in self.substitutions.items():
            line = line.replace(placeholder, value)
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            self.env[name] = value
            return ""
        if line.startswith("source "):
            self.env = self._sourced(line)
            return ""
        if line.startswith(SERVERS):
            self._serve(line)
            return ""
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=300,
            env=self.env,
        )
        assert r.returncode == 0, f"{line}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        self.stderr = r.stderr
        return r.stdout

    def _sourced(self, line: str) -> dict[str, str]:
        """The environment after bash sources what ``line`` names (a venv's
        ``activate``), as the reader's shell keeps it for the next commands."""
        r = subprocess.run(
            ["bash", "-c", f"{line} && env -0"],
            cwd=self.cwd,
            capture_output=True,
            timeout=60,
            env=self.env,
        )
        assert r.returncode == 0, (line, r.stderr.decode(errors="replace"))
        pairs = [e.split("=", 1) for e in r.stdout.decode().split("\0") if "=" in e]
        return {name: value for name, value in pairs}

    def _serve(self, line: str) -> None:
        log = open(self.cwd / f"server-{len(self.servers)}.log", "wb")  # noqa: SIM115
        self.servers.append(
            subprocess.Popen(
                ["bash", "-c", f"exec {line}"],
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        )
        log.close()

    def close(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in self.servers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


@pytest.fixture
def shell(project: Path) -> Iterator[Shell]:
    sh = Shell(project)
    try:
        yield sh
    finally:
        sh.close()


def _need(program: str) -> None:
    needs.program(program)


@pytest.mark.slow
def test_the_readme_commands_run_as_written(shell: Shell, project: Path) -> None:
    _need("dot")
    said = {}
    for command in sh_commands(ROOT / "README.md"):
        if CHECKS[command] == RUN:
            said[command] = shell.run(command)
        if command == "kiln report --build 1":  # before the tour's last line cleans it
            assert (project / "kiln-out" / "report-1.html").is_file()
    assert said["kiln --version"].startswith("kiln ")
    assert said["cat kiln-out/genfiles/words/summary.txt"] == own_actions_output()
    assert "Shouting words.txt: input words.txt changed" in said["kiln explain words.py"]
    assert (project / "graph.svg").read_text().lstrip().startswith("<?xml")
    assert (project / "events.jsonl").stat().st_size and (project / "trace.json").stat().st_size
    assert not (project / "kiln-out" / "report-1.html").exists()  # kiln clean removed it


def test_the_events_doc_commands_run_as_written(shell: Shell, project: Path) -> None:
    _need("jq")
    for command in sh_commands(ROOT / "docs" / "events.md"):
        shell.run(command)
    assert (project / "build-events.jsonl").read_text().startswith('{"event": "build_started"')


# -- nginx configurations, and the cluster doc that uses one -------------------------


def nginx_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "nginx"]


class DocNginx:
    """nginx started with a doc's configuration, its port and cache directory replaced
    by a free port and a scratch directory; pid file and error log go there too, and
    as root the workers run as root (the doc's workers run as nobody, who could not
    reach a test's private directory)."""

    def __init__(self, block: Block, root: Path) -> None:
        needs.program("nginx")
        if os.geteuid() != 0:
            pytest.skip("the doc's configuration uses nginx's default temporary paths (root's)")
        self.port = free_port()
        self.data = root / "cache"
        self.data.mkdir(parents=True)
        conf = block.text.replace("8080", str(self.port)).replace("/srv/kiln-cache", str(self.data))
        assert conf != block.text
        (root / "kiln-cache.conf").write_text(conf)
        self.proc = subprocess.Popen(
            [
                "nginx",
                "-p",
                str(root),
                "-e",
                str(root / "error.log"),
                "-c",
                str(root / "kiln-cache.conf"),
                "-g",
                f"daemon off; pid {root / 'nginx.pid'}; user root;",
            ],
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 15
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen within 15 s"
                time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.mark.parametrize("block", nginx_blocks(), ids=lambda b: f"{b.doc.name}:{b.line}")
def test_nginx_configurations_are_whole_and_serve_a_cache(block: Block, tmp_path: Path) -> None:
    server = DocNginx(block, tmp_path)
    try:
        url = f"http://127.0.0.1:{server.port}/cas/ab/blob"
        put = urllib.request.Request(url, data=b"bytes", method="PUT")
        with urllib.request.urlopen(put, timeout=10) as r:
            assert r.status in (201, 204)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == b"bytes"
        assert (server.data / "cas" / "ab" / "blob").read_bytes() == b"bytes"
    finally:
        server.close()


@pytest.mark.slow
def test_the_cluster_doc_commands_run_as_written(project: Path) -> None:
    needs.module("distributed")
    (block,) = [b for b in nginx_blocks() if b.doc.name == "cluster.md"]
    server = DocNginx(block, project.parent / "nginx")
    scheduler = free_port()
    shell = Shell(
        project,
        {
            "0.0.0.0": "127.0.0.1",
            "SCHEDULER": "127.0.0.1",
            "CACHE": "127.0.0.1",
            "8080": str(server.port),
            "8786": str(scheduler),
            "/var/tmp/dask-worker": str(project.parent / "dask-worker"),
        },
    )
    try:
        for command in sh_commands(ROOT / "docs" / "cluster.md"):
            shell.run(command)
            if command.startswith("dask scheduler"):
                _wait_listening(scheduler)
    finally:
        shell.close()
        server.close()
    assert list((server.data / "cas").rglob("*")), "nothing went through the remote cache"


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port} after 60 s"
            time.sleep(0.1)
