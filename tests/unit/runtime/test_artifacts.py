"""Portable cache artifacts: save in one cache dir, load into an empty one in another process
and hit there; corrupt, truncated and foreign blobs are refused with nothing written."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ember
from ember.runtime import artifacts

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = """
def f(x):
    return (torch.sin(x) * 2 + 1).relu()
"""


def _compile_and_save(tmp_path, monkeypatch) -> bytes:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "src"))
    ns = {"torch": torch}
    exec(PROGRAM, ns)
    f = ember.compile(ns["f"], backend="ember")
    x = torch.randn(64)
    torch.testing.assert_close(f(x), ns["f"](x))
    return ember.save_cache_artifacts()


def _files(d: Path) -> list:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) \
        if d.exists() else []


def test_artifacts_make_a_fresh_cache_dir_warm_in_another_process(tmp_path, monkeypatch):
    blob = _compile_and_save(tmp_path, monkeypatch)
    assert blob.startswith(artifacts.MAGIC)
    (tmp_path / "blob").write_bytes(blob)
    script = textwrap.dedent(f"""
        import json, torch, ember
        loaded = ember.load_cache_artifacts(open({str(tmp_path / 'blob')!r}, 'rb').read())
        ns = {{"torch": torch}}
        exec({PROGRAM!r}, ns)
        f = ember.compile(ns["f"], backend="ember")
        x = torch.randn(64)
        torch.testing.assert_close(f(x), ns["f"](x))
        print(json.dumps({{"loaded": loaded, "counts": ember.stats()["counts"]}}))
    """)
    dst = tmp_path / "dst"
    env = dict(os.environ, EMBER_CACHE_DIR=str(dst), PYTHONPATH=str(ROOT), EMBER_STRICT="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == {"kernels": 1, "graphs": 1}
    counts = report["counts"]
    assert counts["graphs"] == 1 and counts["graph_cache_hits"] == 1
    assert counts["kernel_cache_hits"] == 1          # no g++ run in the loading process


def test_corrupt_truncated_and_foreign_blobs_are_refused_whole(tmp_path, monkeypatch):
    blob = _compile_and_save(tmp_path, monkeypatch)
    dst = tmp_path / "dst"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(dst))

    def refused(data, match):
        with pytest.raises(ValueError, match=match):
            ember.load_cache_artifacts(data)
        assert _files(dst) == []                     # every check comes before any write

    flipped = bytearray(blob)
    flipped[-10] ^= 0xFF
    refused(bytes(flipped), "corrupt or truncated.*nothing was loaded")
    refused(blob[:-5], "corrupt or truncated")
    refused(b"PK\x03\x04 a zip file", "not an ember cache artifact")
    refused(blob[:len(artifacts.MAGIC) + 2], "header is corrupt")

    n = struct.unpack_from(">I", blob, len(artifacts.MAGIC))[0]
    start = len(artifacts.MAGIC) + 4
    header = json.loads(blob[start:start + n])

    def with_header(h):
        raw = json.dumps(h).encode()
        return artifacts.MAGIC + struct.pack(">I", len(raw)) + raw + blob[start + n:]

    foreign = json.loads(json.dumps(header))
    foreign["environment"]["torch"] = "1.0.0"
    foreign["environment"]["march"] = "some-other-cpu"
    refused(with_header(foreign), r"another environment: torch '1\.0\.0' \(here .*march")
    future = dict(header, format=99)
    refused(with_header(future), "format 99; this ember reads format 1")
    escape = json.loads(json.dumps(header))
    escape["files"][0]["path"] = "../../etc/passwd"
    refused(with_header(escape), "bad entry")
    with pytest.raises(TypeError, match="expects bytes"):
        ember.load_cache_artifacts("not bytes")

    assert ember.load_cache_artifacts(blob) == {"kernels": 1, "graphs": 1}
    assert ember.load_cache_artifacts(blob) == {"kernels": 1, "graphs": 1}  # idempotent
    assert not [p for p in _files(dst) if p.endswith(".tmp")]


def test_a_write_that_fails_midway_leaves_nothing(tmp_path, monkeypatch):
    blob = _compile_and_save(tmp_path, monkeypatch)
    dst = tmp_path / "dst"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(dst))
    real = artifacts._write_temp
    calls = []

    def failing(d, body):
        calls.append(d)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(d, body)

    monkeypatch.setattr(artifacts, "_write_temp", failing)
    with pytest.raises(OSError, match="No space"):
        ember.load_cache_artifacts(blob)
    assert len(calls) == 3 and _files(dst) == []     # the two written temps are gone too
