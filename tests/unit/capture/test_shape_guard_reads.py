"""Dynamic shapes (#23): a dynamic graph's size relations read each size once per call.

The relations the trace assumed (`4 * (C // 4) == C`, `C // 4 != 1`, ...) are SHAPE guards;
written inline, each called `x.size(i)` for every symbol it mentions (a channel shuffle's 16
relations: 85 `size()` calls, ~40 us a call). A first guard binds each symbol's source to a
local of the check function; the relations use the locals."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F

import ember
from ember.capture.entry import stats


def shuffle(x):
    b, c, h, w = x.shape
    return F.relu(x.view(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)) + 1.0


def test_sizes_read_once_and_relations_still_guard(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    f = ember.compile(shuffle)
    for shape in [(2, 16, 8, 8), (3, 8, 6, 6), (2, 12, 5, 7), (5, 20, 3, 2)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(f(x), shuffle(x), rtol=0, atol=0)
    assert stats().get("graphs", 0) == 2            # static, then one dynamic graph
    guards = [p.read_text() for p in (tmp_path / "debug").rglob("*guards.py")
              if "__z0" in p.read_text()]
    assert len(guards) == 1
    code = "\n".join(line for line in guards[0].splitlines() if not line.startswith("#"))
    code = code.split("except Exception")[0]       # the guard chain (not the graph's call)
    # one read of each size symbol's source: C, H, W and the batch
    assert len(re.findall(r"\.size\(", code)) == 4, code
    assert re.search(r"__z\d // 4", code), code
    # a relation that fails (C // 4 == 1) still recompiles, with eager's values
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(f(x), shuffle(x), rtol=0, atol=0)
    assert stats().get("graphs", 0) == 3
    ember.reset()
