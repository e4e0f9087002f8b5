"""Disk cache: a second process starts warm; partial/corrupt entries are rebuilt."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ember.runtime import build, cache

SRC = 'extern "C" void k(float* a) { a[0] = 42.0f; }\n'


def test_build_then_hit_then_corrupt_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    src = SRC + f"// {tmp_path}\n"
    p1 = build.build(src)
    key = build.cache_key(src)
    assert cache.lookup(key) == p1
    p1.write_bytes(b"garbage")          # corrupt the .so: marker hash no longer matches
    assert cache.lookup(key) is None
    p2 = build.build(src)
    fns = build.load(p2, {"k": ["a"]})
    t = torch.zeros(1)
    fns["k"](t.data_ptr())
    assert t.item() == 42.0
    (p2.parent / f"{key}.json").unlink()   # partial entry (no marker) is rebuilt too
    assert cache.lookup(key) is None


@pytest.mark.slow
def test_second_process_is_warm(tmp_path):
    script = textwrap.dedent("""
        import time, torch
        from ember.aot import trace_aten
        from ember.decomp import get_decompositions
        from ember.backends.ember import compile_aten_graph
        x = torch.randn(64, 64)
        gm = trace_aten(lambda t: (t.exp() * 2).sum(1), (x,), decompositions=get_decompositions())
        t0 = time.perf_counter()
        fn = compile_aten_graph(gm, [x])
        fn(x)
        print(time.perf_counter() - t0)
    """)
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path))
    run = lambda: float(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                       capture_output=True, text=True).stdout.split()[-1])
    cold = run()
    files = list((tmp_path / "kernels").rglob("*.so"))
    assert len(files) == 1
    warm = run()
    assert list((tmp_path / "kernels").rglob("*.so")) == files
    assert warm < 2.0


def _graph_cache_fn(x):
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    gm = trace_aten(lambda t: (t.sin() + 1).sum(0), (x,), decompositions=get_decompositions())
    return compile_aten_graph(gm, [x])


def test_cache_dirs_are_private(tmp_path, monkeypatch):
    root = tmp_path / "fresh"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    x = torch.randn(8, 8)
    _graph_cache_fn(x)(x)
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        assert d.stat().st_mode & 0o777 == 0o700, d


def test_corrupt_graph_entry_warns_and_rebuilds(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    from ember.logging import reset_warnings
    reset_warnings()
    x = torch.randn(8, 8)
    ref = (x.sin() + 1).sum(0)
    torch.testing.assert_close(_graph_cache_fn(x)(x)[0], ref)
    [entry] = list((tmp_path / "graphs").rglob("*.json"))
    doc = entry.read_text()
    entry.write_text(doc.replace("sin", "cos"))          # same length, hash no longer matches
    with pytest.warns(UserWarning, match="corrupt"):
        out = _graph_cache_fn(x)(x)
    torch.testing.assert_close(out[0], ref)
    entry.write_text(entry.read_text()[:40])             # truncated
    with pytest.warns(UserWarning, match="corrupt"):
        reset_warnings()
        out = _graph_cache_fn(x)(x)
    torch.testing.assert_close(out[0], ref)
