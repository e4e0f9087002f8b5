"""Code objects of large generated sources come from the disk cache in a new process; a corrupt
entry is compiled again."""
import subprocess
import sys

from ember.runtime import pycode

SRC = "def f(x):\n" + "".join(f"    x = x + {i}\n" for i in range(3000)) + "    return x\n"


def test_compiled_once_then_loaded_and_corrupt_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    assert len(SRC) >= pycode.MIN_SIZE
    ns = {}
    exec(pycode.compile_cached(SRC, "<t>"), ns)
    assert ns["f"](1) == 1 + sum(range(3000))
    (entry,) = (tmp_path / "pycode").rglob("*.marshal")
    script = ("import sys; from ember.runtime import pycode; import builtins\n"
              "real = builtins.compile\n"
              "builtins.compile = lambda *a, **k: sys.exit('compiled again')\n"
              f"ns = {{}}; exec(pycode.compile_cached({SRC!r}, '<t>'), ns); print(ns['f'](2))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**__import__("os").environ, "EMBER_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(2 + sum(range(3000)))]
    for bad in (b"", entry.read_bytes()[:100], b"0" * 64 + b"\xe3junk"):
        entry.write_bytes(bad)
        ns = {}
        exec(pycode.compile_cached(SRC, "<t>"), ns)
        assert ns["f"](3) == 3 + sum(range(3000))
    assert pycode.compile_cached("x = 1\n", "<small>") is not None
    assert len(list((tmp_path / "pycode").rglob("*.marshal"))) == 1    # small ones: not cached
