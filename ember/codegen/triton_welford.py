"""Stage 6, codegen (Triton): Welford for var_mean's two row sums.

The lowering turns var_mean (and so LayerNorm) into S = sum(x) and, in the next stage of the same
kernel, Q = sum((x - S * (1/n))**2). Two loops over a long row read it twice; `find_welford`
(welford.py) recognises the pair, and `welford_stage` emits one looped pass keeping per-lane mean / M2 / count, merged across lanes
with the prelude's `_welford_combine`; S = mean * count and Q = M2. Persistent kernels do not
need it (the row is already in registers and the second pass reuses it).

Consumes: a Kernel, the TritonKernelCodegen emitting it. Produces: pairs / Triton lines.
"""
from __future__ import annotations

import torch

from .triton import TVal, _full2, _loop_var, _open_rloop, _reads, _row_rnumel


def welford_stage(self, stage, stage_q, s_node, xv, m, written):
    """One looped pass for S = sum(x) and Q = sum((x - S/n)^2) (var_mean, LayerNorm):
    per-lane Welford mean/M2/count, merged across lanes with `_welford_combine`."""
    h = self.h
    code = h.code
    q_node = stage_q.nodes[0]
    rv = [_loop_var(m + i) for i in range(len(stage.inner))]
    if _reads(s_node, xv, rv, stage) & (written - self.local):
        code.writeline("tl.debug_barrier()  # this stage reads what an earlier one stored")
    dt = s_node.body.src_dtype
    rn = _row_rnumel(stage)
    wm, w2, wn = h.fresh("wmean"), h.fresh("wm2"), h.fresh("wcount")
    for name in (wm, w2, wn):
        code.writeline(f"{name} = {_full2(0.0, dt)}")
    saved = h.push()
    _open_rloop(code, h, stage, rn, rv)
    v = h._as(s_node.reduction_value(xv, rv), dt)
    mask = h.loop_mask
    code.writelines([
        f"_wv = tl.broadcast_to({v}, [XBLOCK, RBLOCK])",
        f"_wn = {wn} + 1",
        f"_wd = _wv - {wm}",
        f"{wm} = tl.where({mask}, {wm} + _wd / _wn, {wm})",
        f"{w2} = tl.where({mask}, {w2} + _wd * (_wv - {wm}), {w2})",
        f"{wn} = tl.where({mask}, _wn, {wn})",
    ])
    code.level -= 1
    h.pop(saved)
    h.loop_mask = TVal("xmask", torch.bool, 1)
    mean, m2, cnt = h.fresh("red"), h.fresh("red"), h.fresh("red")
    code.writeline(f"{mean}, {m2}, {cnt} = tl.reduce(({wm}, {w2}, {wn}), 1, _welford_combine)")
    h.store(s_node.name, s_node.store_index(xv),
            h.emit(f"({mean} * {cnt})[:, None]", dt, 1))
    h.store(q_node.name, q_node.store_index(xv), h.emit(f"{m2}[:, None]", dt, 1))
    self.welford_pairs += 1
