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
    for marker in ("after capture", "after guards", "after aot: forward graph",
                   "after aot: backward graph", "after lower:", "after schedule:",
                   "after kernels (backward)", "wrapper"):
        assert marker in out, marker
    # every stage of the frame in its one folder, in the order the stages ran, each once
    files = [line.split()[1] for line in out.splitlines() if line.startswith("==== ")]
    assert all(f.startswith("graph_1/") for f in files), files
    stages = [f.split("/")[1].split("_", 1)[1].split(".")[0] for f in files]
    assert stages == ["capture", "aot_forward", "aot_backward", "lower", "schedule", "kernels",
                      "wrapper", "guards", "backward_lower", "backward_schedule",
                      "backward_kernels", "backward_wrapper"], stages
