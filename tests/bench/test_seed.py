"""The seed experiments end to end, at toy sizes (slow: each compiles a ResNet18)."""
import subprocess
import sys

import pytest


def _run(*args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "ember.bench", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_seed_resnet18_prints_the_table():
    out = _run("seed-resnet18", "--steps", "3", "--batch", "2", "--size", "32")
    assert "allocator" in out and "threads" in out
    for row in ("first call (compile)", "steady step (median", "speedup vs eager",
                "max |loss diff| vs eager", "ember path:"):
        assert row in out


@pytest.mark.slow
def test_seed_cifar10_fakedata(tmp_path):
    png = tmp_path / "epochs.png"
    out = _run("seed-cifar10", "--model", "resnet18", "--epochs", "1", "--samples", "64",
               "--batch", "32", "--root", str(tmp_path / "none"), "--plot", str(png))
    assert "FakeData" in out and "epoch" in out and png.exists()
