"""docs/walkthrough.py runs and shows every stage: capture, aot, loop IR, schedule, the generated
C++ and wrapper."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_walkthrough_prints_every_stage():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "walkthrough.py"), "--brief"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "output and grads equal eager" in out
    for marker in ("after capture", "guards", "after aot: forward graph", "after aot: backward graph",
                   "after lower:", "after schedule:", "kernels.cpp", "wrapper"):
        assert marker in out, marker
    # the forward graph's loop IR and plan, in the order the stages ran, in its own folder
    fwd = [line for line in out.splitlines() if line.startswith("==== graph_1/")]
    stages = [line.split("_", 2)[-1].split(".")[0] for line in fwd]
    assert stages[-4:] == ["lower", "schedule", "kernels", "wrapper"], fwd
