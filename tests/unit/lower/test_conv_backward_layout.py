"""lower: convolution_backward on a channels-last input. torch's oneDNN backward of a 1x1,
stride-2 conv with 2-7 input channels corrupts memory on channels-last inputs (eager too); the
training layout pass makes a stem conv's input channels-last, so the rule gives that one call
NCHW copies (timm mobileone_s0 and fastvit_t8 crashed the process). The check runs in a child
process: without the rule it segfaults or hangs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import copy, torch
from torch import nn
import ember

class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 1, stride=2)
        self.c3 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.c1(x) + self.c3(x)))

torch.manual_seed(0)
ref = Stem()
m = copy.deepcopy(ref)
ember.compile(m, options={"layout": "channels_last"})
x = torch.randn(2, 3, 32, 32)
w = torch.rand(2, 16, 16, 16)
for mod in (m, ref):
    (mod(x) * w).sum().backward()
for (name, a), b in zip(m.named_parameters(), ref.parameters()):
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=name)
assert ember.stats()["counts"].get("graphs") == 1
print("grads match")
"""


def test_strided_1x1_conv_backward_on_channels_last_input(tmp_path):
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT), EMBER_STRICT="1",
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0 and "grads match" in out.stdout, out.stderr[-2000:]
