"""kiln compare against manifests, histories and outputs a hostile or careless user
made: no traceback, no hang, no read through a link, no input overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.in_process

DEVICE = "cpu:test@0123456789ab"


def _module(path: str, digest: str, samples: list[Any], unit: str = "us") -> dict[str, Any]:
    bench = {"status": "measured", "device_id": DEVICE, "time_unit": unit, "samples": samples}
    return {
        "path": path, "status": "built", "built": True, "sha256": digest, "size": 10,
        "target": "vmvx", "flags": [], "benchmark": [bench],
    }  # fmt: skip


def _write(where: Path, *outputs: dict[str, Any]) -> Path:
    doc = {"format": "kiln-manifest/2", "entrypoints": {"e": {"outputs": list(outputs)}}}
    where.write_text(json.dumps(doc))
    return where


@pytest.mark.parametrize(
    ("a", "b", "unit_a", "unit_b"),
    [
        ([10**400] + [100.0] * 9, [100.0] * 10, "us", "us"),  # no float holds it
        ([5e-324] * 10, [1.7e308] * 10, "us", "us"),  # a ratio past a float's range
        ([5e-324] * 10, [100.0] * 10, "ns", "us"),  # zero once in µs
        ([100.0] * 10, [1e305] * 10, "us", "s"),  # infinite once in µs
    ],
)
def test_numbers_no_latency_holds_are_left_out(
    kiln: Any, tmp_path: Path, a: list[Any], b: list[Any], unit_a: str, unit_b: str
) -> None:
    (tmp_path / "a.json").write_text(
        json.dumps(
            {
                "format": "kiln-manifest/2",
                "entrypoints": {"e": {"outputs": [_module("bin/m.vmfb", "a" * 64, a, unit_a)]}},
            }
        )
    )
    _write(tmp_path / "b.json", _module("bin/m.vmfb", "b" * 64, b, unit_b))
    r = kiln("compare", "a.json", "b.json", "--json")
    assert r.returncode == 0, r.stderr
    latency = json.loads(r.stdout)["rows"][0]["module"]["latency"]
    assert latency is None or latency["n_a"] < 10 or latency["n_b"] < 10


def test_one_digest_at_many_paths_is_compared_once(
    kiln: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest of thousands of paths sharing a digest: one comparison of their
    pooled samples, not one a path (each re-sorting the whole pool)."""
    import kiln.compare.diff as diff

    calls = []
    real = diff.compare_latency
    monkeypatch.setattr(diff, "compare_latency", lambda a, b: calls.append(1) or real(a, b))
    samples = [100.0 + i for i in range(10)]
    _write(tmp_path / "a.json", *(_module(f"bin/{i}.vmfb", "a" * 64, samples) for i in range(500)))
    _write(tmp_path / "b.json", *(_module(f"bin/{i}.vmfb", "b" * 64, samples) for i in range(500)))
    r = kiln("compare", "a.json", "b.json", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["rows"]) == 500 and len(calls) == 1


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("@-" + "9" * 5000, "name an output directory that 'kiln build' wrote"),
        ("@-\u0661", "name an output directory that 'kiln build' wrote"),
        ("@-1234567", "name an output directory that 'kiln build' wrote"),
        ("@-999999", "name a build as @0 (the last) to @-10"),
    ],
)
def test_history_names_beyond_what_kiln_keeps_are_refused(
    kiln: Any, tmp_path: Path, spec: str, said: str
) -> None:
    _write(tmp_path / "b.json")
    r = kiln("compare", spec, "b.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("kiln: error: @-") and said in r.stderr, r.stderr


@pytest.mark.parametrize("link", [".kiln/manifests", ".kiln"])
def test_history_is_never_read_through_a_link(kiln: Any, tmp_path: Path, link: str) -> None:
    out = tmp_path / "out"
    (out / ".kiln").mkdir(parents=True)
    _write(out / "manifest.json")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "manifests").mkdir(parents=True)
    _write(elsewhere / "manifests" / "1.json")
    _write(elsewhere / "1.json")
    if link == ".kiln":
        os.rename(out / ".kiln", tmp_path / "moved")
        (out / ".kiln").symlink_to(elsewhere)
    else:
        (out / ".kiln" / "manifests").symlink_to(elsewhere)
    r = kiln("compare", "@-1", "@0", "--output-dir", "out")
    assert r.returncode == 2, r.stdout
    assert "not a directory" in r.stderr and "link" in r.stderr, r.stderr


def test_html_never_overwrites_a_manifest_it_compares(kiln: Any, tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", _module("bin/m.vmfb", "a" * 64, [100.0] * 10))
    _write(tmp_path / "b.json")
    before = a.read_bytes()
    r = kiln("compare", "a.json", "b.json", "--html", "a.json")
    assert r.returncode == 2, r.stderr
    assert a.read_bytes() == before


def test_a_path_no_file_system_holds(kiln: Any, tmp_path: Path) -> None:
    """A NUL in a module's path, with --measure; a lone surrogate, with --html: no
    traceback, the page written escaped."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    nul = "bin/m\x00_vmvx.vmfb"
    _write(tmp_path / "a" / "manifest.json", _module(nul, "a" * 64, [100.0] * 10))
    _write(tmp_path / "b" / "manifest.json", _module(nul, "b" * 64, [100.0] * 10))
    r = kiln("compare", "a", "b", "--measure", "--budget", "5", "--json")
    assert r.returncode == 0, r.stderr
    assert any("not a path below" in n for n in json.loads(r.stdout)["notes"])
    odd = "bin/\ud800.vmfb"
    _write(tmp_path / "c.json", _module(odd, "c" * 64, [100.0] * 10))
    _write(tmp_path / "d.json", _module(odd, "d" * 64, [100.0] * 10))
    r = kiln("compare", "c.json", "d.json", "--html", "page.html")
    assert r.returncode == 0, r.stderr
    assert "\\ud800" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_recorded_inputs_are_read_only_as_regular_files_through_real_directories(
    tmp_path: Path,
) -> None:
    """--measure remakes a benchmark's inputs from what it recorded: a FIFO where the
    model was (it blocked in open), or a directory that is a link out of the output
    directory, gives nothing to run on, at once."""
    import signal

    from kiln.actions.bench import recorded_inputs
    from kiln.output_dir.names import file_below

    def blocked(*_: Any) -> None:
        raise AssertionError("blocked on a FIFO")

    signal.signal(signal.SIGALRM, blocked)  # a FIFO opened for reading blocks for good
    signal.alarm(20)
    root = tmp_path / "out"
    (root / "models").mkdir(parents=True)
    os.mkfifo(root / "models" / "m.onnx")
    record = {"source": "generated", "model": "models/m.onnx", "seed": 0, "shapes": {}}
    assert recorded_inputs(record, str(root)) is None
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "input.npy").write_bytes(b"x")
    (root / "bin").symlink_to(outside)
    given = {"source": "given", "paths": ["bin/input.npy"]}
    assert recorded_inputs(given, str(root)) is None
    assert file_below(root, "bin/input.npy") is None
    (root / "real").mkdir()
    (root / "real" / "input.npy").write_bytes(b"x")
    assert file_below(root, "real/input.npy") == root / "real" / "input.npy"
    assert file_below(root, "real") is None  # a directory: no file
    (root / "real" / "link.npy").symlink_to(root / "real" / "input.npy")
    assert file_below(root, "real/link.npy") is None
    assert file_below(root, "real/link.npy", follow_last=True) == root / "real" / "link.npy"
    (root / "real" / "fifo.npy").symlink_to(root / "models" / "m.onnx")
    assert file_below(root, "real/fifo.npy", follow_last=True) is None
    signal.alarm(0)


@pytest.mark.parametrize("redirect", [">&-", "> /dev/full"])
def test_stdout_that_cannot_be_written_is_said_not_a_traceback(redirect: str) -> None:
    command = f"{sys.executable} -m kiln --version {redirect}"
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("kiln: error: cannot write to standard output"), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("spelling", ["size>" + "9" * 400 + "%", "size>\u0661%", "slower>1e9%"])
def test_fail_if_thresholds_that_would_turn_the_gate_off_are_refused(spelling: str) -> None:
    from kiln.base.errors import UsageError
    from kiln.compare.gate import parse_conditions

    with pytest.raises(UsageError):
        parse_conditions([spelling])


def test_kiln_report_writes_a_page_for_a_path_no_file_system_holds(
    kiln: Any, tmp_path: Path
) -> None:
    """A lone surrogate in a manifest's path (its page embeds the comparison too):
    written escaped, as compare --html writes it, not a UnicodeEncodeError."""
    (tmp_path / "build.py").write_text(
        "from kiln import *\n\n\n@entrypoint\ndef e():\n"
        "    return run_command(name='a.txt', command=['sh', '-c', 'echo a > {out}'])\n"
    )
    assert kiln("build", "build.py", "--output-dir", "out").returncode == 0
    manifest = tmp_path / "out" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["entrypoints"]["e"]["outputs"].append(_module("bin/\ud800.vmfb", "c" * 64, [1.0] * 10))
    manifest.write_text(json.dumps(doc))
    r = kiln("report", "--output-dir", "out", "-o", "page.html")
    assert r.returncode == 0, r.stderr
    assert "\\ud800" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_benchmarks_on_other_inputs_are_not_pooled_or_compared(kiln: Any, tmp_path: Path) -> None:
    """A batch-1 and a batch-32 benchmark of one module measure other work: each
    digest's samples are pooled by what they ran on, and A and B are compared only on
    the same inputs (they were pooled by digest and device alone)."""
    small = {"source": "generated", "seed": 1, "shapes": {"N": 1}}
    large = {"source": "generated", "seed": 1, "shapes": {"N": 32}}

    def module(digest: str, *runs: tuple[dict[str, Any], float]) -> dict[str, Any]:
        out = _module("bin/m.vmfb", digest, [])
        out["benchmark"] = [
            {"status": "measured", "device_id": DEVICE, "time_unit": "us", "inputs": inputs,
             "samples": [level * (1 + i / 1000) for i in range(10)]}
            for inputs, level in runs
        ]  # fmt: skip
        return out

    _write(tmp_path / "a.json", module("a" * 64, (small, 100.0)))
    _write(tmp_path / "b.json", module("b" * 64, (large, 3000.0)))
    r = kiln("compare", "a.json", "b.json", "--json")
    row = json.loads(r.stdout)["rows"][0]["module"]
    assert row["latency"] is None and "other inputs" in row["latency_note"], row
    # on the same inputs in both: compared on those alone, the others left out
    _write(tmp_path / "b.json", module("b" * 64, (large, 3000.0), (small, 101.0)))
    r = kiln("compare", "a.json", "b.json", "--json")
    latency = json.loads(r.stdout)["rows"][0]["module"]["latency"]
    assert latency["verdict"] == "within noise" and latency["n_b"] == 10, latency


def test_recorded_inputs_are_made_again_only_as_recorded(tmp_path: Path) -> None:
    """A given file edited since the build, a final link out of the output directory
    (kiln links only the sources, in .kiln/src), or shapes that bound too much or
    not every input: nothing to run on, rather than other inputs than the record's."""
    import numpy as np

    from kiln.actions.bench import recorded_inputs, sane_shapes

    root = tmp_path / "out"
    (root / "bin").mkdir(parents=True)
    np.save(root / "bin" / "x.npy", np.arange(4, dtype=np.float32))
    given = {"source": "given", "paths": ["bin/x.npy"]}
    made = recorded_inputs(given, str(root))
    assert made is not None and made[0].tolist() == [0, 1, 2, 3]
    from kiln.actions.output_record import fingerprint

    given["sha256"] = [fingerprint(made[0])["sha256"]]
    assert recorded_inputs(given, str(root)) is not None
    np.save(root / "bin" / "x.npy", np.ones(4, dtype=np.float32))  # edited since
    assert recorded_inputs(given, str(root)) is None
    secret = tmp_path / "secret.npy"
    np.save(secret, np.zeros(2, dtype=np.float32))
    (root / "bin" / "planted.npy").symlink_to(secret)
    assert recorded_inputs({"source": "given", "paths": ["bin/planted.npy"]}, str(root)) is None
    (root / ".kiln" / "src").mkdir(parents=True)
    (root / ".kiln" / "src" / "source.npy").symlink_to(secret)  # as kiln links a source
    linked = recorded_inputs({"source": "given", "paths": [".kiln/src/source.npy"]}, str(root))
    assert linked is not None and linked[0].tolist() == [0, 0]
    # each input within the bound, all of them over it
    assert sane_shapes({"x": [1 << 14, 1 << 14]})
    assert not sane_shapes({"x": [1 << 14, 1 << 14], "y": [1]})


def test_measure_skips_a_module_benchmarked_on_other_inputs(kiln: Any, tmp_path: Path) -> None:
    """A and B benchmarked on other inputs are other work: --measure does not time
    them against each other (each would run on its own build's inputs)."""

    def module(digest: str, batch: int) -> dict[str, Any]:
        out = _module("bin/m.vmfb", digest, [100.0] * 10)
        out["benchmark"][0]["inputs"] = {"source": "generated", "seed": 1, "shapes": {"x": [batch]}}
        return out

    _write(tmp_path / "a.json", module("a" * 64, 1))
    _write(tmp_path / "b.json", module("b" * 64, 32))
    r = kiln("compare", "a.json", "b.json", "--measure", "--budget", "5", "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert "--measure: bin/m.vmfb not measured: benchmarked on other inputs in A and B" in notes
