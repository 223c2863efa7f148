"""SIGKILL ``kiln build`` at random moments; the next build must still produce
exactly what a clean build produces.

Each trial starts a build on one of a few variants of the source files (so most
builds have work to do) and kills kiln after a random delay, sometimes twice in
a row; then it runs a build to the end, on the same or another variant, and
compares every file under the output directory (outputs and manifest; not
``.kiln/``) byte for byte with a clean build of that variant in another
directory. The graph mixes process, thread, in-line and subprocess actions that
write their outputs slowly and non-atomically, so kills land mid-write. After
each kill, every process the build started must go away (worker processes die
with kiln).

``KILN_FUZZ_SEED`` and ``KILN_FUZZ_TRIALS`` override the seed and trial count.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import dead as _dead
from procs import tagged_processes, wait_untagged

MODULE = """
import functools
import hashlib
import time
from pathlib import Path


def mix(label, inputs, out, pause):
    \"\"\"Write a digest of the inputs in two halves, pausing in between.\"\"\"
    h = hashlib.sha256(label.encode())
    for path in inputs:
        h.update(Path(path).read_bytes())
    text = f"{label} {h.hexdigest()}\\n" * 200
    with open(out, "w") as f:
        f.write(text[: len(text) // 2])
        f.flush()
        time.sleep(pause)
        f.write(text[len(text) // 2 :])


class Mix(BuildAction):
    def __init__(self, label, ins, out, pause, **kw):
        super().__init__(**kw)
        self.label = label
        self.ins = ins
        self.out = out
        self.pause = pause

    def _args(self):
        paths = [str(f.get_fs_path()) for f in self.ins]
        return self.label, paths, str(self.out.get_fs_path()), self.pause

    def _invoke(self):
        mix(*self._args())

    def _remotable_thunk(self):
        return functools.partial(mix, *self._args())


KINDS = {"thread": ActionConcurrency.THREAD, "process": ActionConcurrency.PROCESS,
         "inline": ActionConcurrency.NONE}


def mixer(kind, label, inputs, pause=0.03):
    ctx = BuildContext.current()
    out = ctx.allocate_file(label)
    ins = ctx.files(inputs)
    out.deps.add(Mix(label, ins, out, pause, desc=f"{kind} {label}", executor=ctx.executor,
                     concurrency=KINDS[kind], deps=ins))
    return out


def shell(label, inputs):
    cats = " ".join(f"cat {{inputs[{i}]}};" for i in range(len(inputs)))
    script = f"exec > {{out}}; {cats} sleep 0.03; echo {label}"
    return run_command(name=label, command=["sh", "-c", script], inputs=inputs)


@entrypoint
def fuzz():
    a, b = source_file("a.txt"), source_file("b.txt")
    s1, s2 = shell("s1.txt", [a]), shell("s2.txt", [b])
    p1, p2 = mixer("process", "p1.txt", [s1]), mixer("process", "p2.txt", [s2])
    p3 = mixer("process", "p3.txt", [a, b])
    t1, t2 = mixer("thread", "t1.txt", [p1, p2]), mixer("thread", "t2.txt", [p3, s1])
    n1 = mixer("inline", "n1.txt", [t1])
    s3 = shell("s3.txt", [t1, t2])
    return [mixer("process", "p4.txt", [s3, n1]), t2, mixer("thread", "t3.txt", [p2])]
"""

VARIANTS = [("a0\n", "b0\n"), ("a1\n", "b0\n"), ("a1\n", "b1\n")]
SEED = int(os.environ.get("KILN_FUZZ_SEED", "20240611"))
TRIALS = int(os.environ.get("KILN_FUZZ_TRIALS", "20"))


def write_sources(root: Path, variant: int) -> None:
    a, b = VARIANTS[variant]
    for name, text in (("a.txt", a), ("b.txt", b)):
        path = root / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def tree(out_dir: Path) -> dict[str, bytes]:
    """Every file under ``out_dir`` but kiln's own state, by relative path; in the
    manifest, the facts of one build rather than of its outputs are left out: whether
    an output came from the shared cache, how long its action last ran, and its
    action's key parts (a thunk of absolute paths, as this module's, is keyed by
    where its output directory is)."""
    found = {
        str(p.relative_to(out_dir)): p.read_bytes()
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and p.relative_to(out_dir).parts[0] != ".kiln"
    }
    if "manifest.json" in found:
        manifest = json.loads(found["manifest.json"])
        for entrypoint in manifest["entrypoints"].values():
            for output in entrypoint["outputs"]:
                for fact in ("cached", "duration_s", "key"):
                    output.pop(fact, None)
        found["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return found


def kiln(root: Path, tag: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln",
            "build",
            "build.py",
            "-j",
            "3",
            "--action-env",
            "KILN_TEST_TAG",
        ],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag},
    )


def build(root: Path, tag: str) -> float:
    """Run a build to the end; return its wall time."""
    start = time.monotonic()
    proc = kiln(root, tag)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    return time.monotonic() - start


def kill_after(root: Path, tag: str, delay: float) -> None:
    proc = kiln(root, tag, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    proc.kill()
    proc.wait()
    wait_untagged(tag)


@pytest.mark.slow
def test_sigkill_at_random_moments_never_corrupts_the_next_build(tmp_path: Path, tag: str) -> None:
    clean: list[dict[str, bytes]] = []
    wall = 0.0
    for variant in range(len(VARIANTS)):
        root = tmp_path / f"clean{variant}"
        root.mkdir()
        (root / "build.py").write_text("from kiln import *\nfrom kiln.executor import *\n" + MODULE)
        write_sources(root, variant)
        wall = max(wall, build(root, tag))
        clean.append(tree(root / "kiln-out"))
    assert len(clean[0]) == 12  # 11 outputs and the manifest
    assert clean[0] != clean[1] != clean[2]

    rng = random.Random(SEED)
    root = tmp_path / "fuzz"
    root.mkdir()
    shutil.copy(tmp_path / "clean0" / "build.py", root / "build.py")
    for trial in range(TRIALS):
        kills = [
            (rng.randrange(len(VARIANTS)), rng.uniform(0, wall))
            for _ in range(1 if rng.random() < 0.7 else 2)
        ]
        for variant, delay in kills:
            write_sources(root, variant)
            kill_after(root, tag, delay)
        variant = kills[-1][0] if rng.random() < 0.5 else rng.randrange(len(VARIANTS))
        write_sources(root, variant)
        build(root, tag)
        got = tree(root / "kiln-out")
        what = f"seed {SEED}, trial {trial}: (variant, kill delay) {kills}, then variant {variant}"
        assert got.keys() == clean[variant].keys(), what
        wrong = [name for name in got if got[name] != clean[variant][name]]
        assert not wrong, f"{what}: differs from a clean build: {wrong}"


HANG = """
import functools
import os
import subprocess
import time
from pathlib import Path

MARKS = Path(__file__).parent / "marks"


def hang(out):
    child = subprocess.Popen(["sleep", "1000"])
    (MARKS / "pids").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(1000)


class Hang(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out

    def _remotable_thunk(self):
        return functools.partial(hang, str(self.out.get_fs_path()))


@entrypoint
def stuck():
    ctx = BuildContext.current()
    out = ctx.allocate_file("stuck.txt")
    out.deps.add(Hang(out, desc="hang", executor=ctx.executor))
    return out
"""


def test_sigkill_leaves_no_worker_or_worker_child_behind(tmp_path: Path, tag: str) -> None:
    (tmp_path / "build.py").write_text("from kiln import *\nfrom kiln.executor import *\n" + HANG)
    (tmp_path / "marks").mkdir()
    pids_file = tmp_path / "marks" / "pids"
    proc = kiln(tmp_path, tag, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (pids_file.exists() and len(pids_file.read_text().split()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the action never started"
        time.sleep(0.05)
    worker, child = map(int, pids_file.read_text().split())
    proc.kill()
    proc.wait()  # not communicate(): a survivor holding kiln's stderr would block it
    deadline = time.monotonic() + 5
    while not (_dead(worker) and _dead(child)):
        assert time.monotonic() < deadline, f"left running: worker {worker}, its child {child}"
        time.sleep(0.05)
    while left := tagged_processes(tag):  # multiprocessing's resource tracker, briefly
        assert time.monotonic() < deadline + 5, f"processes left by the killed build: {left}"
        time.sleep(0.05)


def test_a_build_killed_while_writing_the_marker_is_adopted_next_time(tmp_path: Path) -> None:
    # SIGKILL between writing .kiln/format's temporary and renaming it leaves only
    # that temporary in .kiln/: the next build takes the directory as kiln's.
    from kiln.output_dir.ownership import claim_output_dir

    kiln_dir = tmp_path / "out" / ".kiln"
    kiln_dir.mkdir(parents=True)
    (kiln_dir / ".kiln-tmp-e904c9ccfa-315236fc").write_text("kiln-output/1\n")
    assert claim_output_dir(tmp_path / "out") == kiln_dir
    assert (kiln_dir / "format").read_text().startswith("kiln-output/")
