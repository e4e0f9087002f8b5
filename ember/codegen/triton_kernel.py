"""Stage 6, codegen (Triton): one kernel of the plan → the source of one `@triton.jit` function.

`TritonKernelCodegen` lays a kernel out as the block triton.py's docstring describes (1-D
pointwise, 2-D persistent or looped rows, var_mean's sums as one Welford pass from
triton_welford.py), emitting its bodies through triton.py's `TritonHandler`. `generate_kernels`
runs it over a plan's kernels; `module_source` joins their sources into one module, which
triton_launch.py loads and launches.

Consumes: Kernel steps (schedule.fuse), buffers by name. Produces: `TritonKernelSource`s.
"""
from __future__ import annotations

import math

import torch

from ..loopir.index import SIZE_NAME, hint, is_symbolic, numel
from ..errors import InternalError
from ..loopir.nodes import owns_loops
from ..loopir.ops import set_handler
from .cpp import kernel_args
from .cpp_loops import _coeff, collect
from .triton import (INT32_LIMIT, MAX_PERSISTENT, OUTER_PERSISTENT_MAX, PRELUDE, TritonHandler,
                     TritonKernelSource, TVal, _decode, _full2, _loop_var, _open_rloop, _reads,
                     _row_rnumel, _size)
from .triton_welford import welford_stage
from .welford import find_welford


def index_dtype(kernel, buffers: dict, args) -> str:  # noqa: D401
    """int64 when any loop or any buffer the kernel touches can index past int32."""
    sizes = [numel(kernel.outer) * max([_row_rnumel(s) for s in kernel.stages] or [1])]
    for name in args:
        b = buffers[name]
        sizes.append(b.storage_numel())
    if any(is_symbolic(x) for x in sizes):
        return "tl.int64"           # dynamic sizes: no bound known at compile time
    return "tl.int64" if max(sizes) >= INT32_LIMIT else "tl.int32"


def reduction_hint(kernel, xv) -> str:
    """"outer" when the first reduction reads its row with a larger stride than consecutive
    outputs (sum over dim 0 of a row-major matrix): then wide XBLOCK x narrow RBLOCK tiles keep
    the loads coalesced along x, which is what the GPU launch configs for it do."""
    m = len(xv)
    for stage in kernel.stages:
        if stage.kind != "reduction" or not stage.inner or not m:
            continue
        rv = [_loop_var(m + i) for i in range(len(stage.inner))]
        c = collect(lambda: [n.reduction_value(xv, rv) for n in stage.nodes],
                    {**dict(zip(xv, kernel.outer)), **dict(zip(rv, stage.inner))})
        for e in c.exprs:
            rs, xs = _coeff(e, rv[-1]), _coeff(e, xv[-1])
            if rs != 0 and xs != 0:
                return "outer" if hint(rs) > hint(xs) else "inner"
        return "inner"
    return ""


def _init(rtype, dt):
    if rtype in ("sum", "any"):
        return 0
    if rtype == "prod":
        return 1
    if rtype in ("max", "argmax"):
        return -math.inf if dt.is_floating_point else (
            0 if dt == torch.bool else -torch.iinfo(dt).max - 1)
    if rtype in ("min", "argmin"):
        return math.inf if dt.is_floating_point else (1 if dt == torch.bool else torch.iinfo(dt).max)
    raise NotImplementedError(rtype)


class TritonKernelCodegen:
    def __init__(self, kernel, buffers: dict, *, max_persistent=MAX_PERSISTENT, interpret=True,
                 welford=True):
        self.kernel, self.buffers = kernel, buffers
        self.use_welford = welford
        self.welford_pairs = 0
        self.max_persistent = max_persistent
        # C++ keeps "row-local" buffers (read across stages of one outer index) in a per-thread
        # scratch row; here they are real (scratch) buffers unless registers serve every read
        self.scratch = [n.name for n in kernel.nodes if n.name in getattr(kernel, "row_local", {})]
        self.local = set(kernel.local) - set(self.scratch)
        self.h = TritonHandler(buffers, self.local, interpret=interpret)
        # persistent kernels keep one row decoded across consecutive stages with the same
        # inner dims, so a later stage reuses the earlier stage's values (no reload, no barrier)
        self.row_scope = None
        self.row_written: set = set()   # stored in the current row scope (values still live)

    def elide_dead_stores(self, dead: set) -> list:
        """Drop stores of buffers nobody reads after this kernel (`dead`) when the kernel itself
        never reads them back from memory (all its reads hit values still in registers)."""
        gone = []
        for name in sorted(set(dead) & set(self.h.store_lines) - self.h.mem_loaded):
            for buf, i in self.h.store_lines[name]:
                buf.lines[i] = buf.lines[i].replace("tl.store(", "# dead store elided: tl.store(", 1)
            gone.append(name)
        return gone

    def generate(self, args: list, dead: set = frozenset()) -> TritonKernelSource:
        k, h = self.kernel, self.h
        outer = list(k.outer)
        m = len(outer)
        xv = [_loop_var(i) for i in range(m)]
        xnumel = numel(outer)
        pointwise = k.pure_pointwise
        rnumel = max([_row_rnumel(s) for s in k.stages if s.inner or s.kind == "reduction"] or [1],
                     key=hint)
        rhint = "" if pointwise else reduction_hint(k, [_loop_var(i) for i in range(len(outer))])
        # a symbolic row length has no upper bound: loop over it (RBLOCK chunks)
        persistent = not pointwise and not is_symbolic(rnumel) and \
            rnumel <= self.max_persistent and not (
                rhint == "outer" and rnumel > OUTER_PERSISTENT_MAX)
        idt = index_dtype(k, self.buffers, list(args) + self.scratch)
        code = h.code
        params = list(args) + self.scratch + ["XBLOCK: tl.constexpr"] + ([] if pointwise else
                                                          ["RBLOCK: tl.constexpr"])
        pid = "tl.program_id(0)" + (".to(tl.int64)" if idt == "tl.int64" else "")
        code.writeline(f"xoffset = {pid} * XBLOCK")
        if pointwise:
            code.writeline("xindex = xoffset + tl.arange(0, XBLOCK)")
        else:
            h.shapes[1] = "[XBLOCK, 1]"
            code.writeline("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        code.writeline(f"xmask = xindex < {_size(xnumel)}")
        order = list(range(m))
        if pointwise and m > 1:
            # fastest-varying xindex digit = the dim the first store walks with the smallest
            # stride, so a transposed output is written coalesced (reads may then be strided)
            c = collect(lambda: [n.store_pointwise(xv) for n in k.stages[0].nodes],
                        dict(zip(xv, outer)))
            if c.stores:
                order = sorted(order, key=lambda d: -hint(_coeff(c.stores[0], xv[d])))
        _decode(code, "xindex", [outer[d] for d in order], [xv[d] for d in order], h, 1)
        if pointwise:
            for n in k.stages[0].nodes:
                n.store_pointwise(xv)
        else:
            code.writeline("rbase = tl.arange(0, RBLOCK)[None, :]")
            if idt == "tl.int64":
                code.writeline("rbase = rbase.to(tl.int64)")
            written: set = set()
            pairs = {} if persistent or not self.use_welford else find_welford(k, xv, m)
            skip = {b for _, b in pairs.values()}
            for i, stage in enumerate(k.stages):
                if i in skip:
                    continue
                if i in pairs:
                    welford_stage(self, stage, k.stages[pairs[i][1]], pairs[i][0], xv, m, written)
                    written.update(n.name for n in stage.nodes + k.stages[pairs[i][1]].nodes)
                    continue
                self._stage(stage, xv, m, persistent, written)
                written.update(n.name for n in stage.nodes)
                if persistent and (stage.inner or stage.kind == "reduction"):
                    self.row_written.update(n.name for n in stage.nodes
                                            if stage.kind == "pointwise")
        elided = self.elide_dead_stores(set(dead) | set(self.scratch))
        body = code.getvalue()
        # dynamic shapes: the size symbols the body uses are scalar parameters after the buffers
        sizes = sorted(set(SIZE_NAME.findall(body)), key=lambda n: int(n[1:]))
        params = params[:len(args)] + sizes + params[len(args):]   # (the launcher appends scratch)
        header = f"@triton.jit\ndef {k.name}({', '.join(params)}):\n"
        return TritonKernelSource(k.name, header + body, list(args) + sizes,
                                  "pointwise" if pointwise else "reduction", xnumel, rnumel,
                                  persistent, idt, h.used_libdevice, elided, self.welford_pairs,
                                  list(self.scratch), rhint)

    def _stage(self, stage, xv, m, persistent, written):
        h = self.h
        code = h.code
        rv = [_loop_var(m + i) for i in range(len(stage.inner))]
        reads = set()
        for n in stage.nodes:
            reads |= _reads(n, xv, rv, stage)
        if persistent and (stage.inner or stage.kind == "reduction") and \
                self.row_scope != tuple(stage.inner):
            self._new_row(stage, rv)
        if reads & (written - self.local - self.row_written):
            code.writeline("tl.debug_barrier()  # this stage reads what an earlier one stored")
        if stage.kind == "pointwise" and not stage.inner:
            h.loop_mask = TVal("xmask", torch.bool, 1)
            for n in stage.nodes:
                n.store_pointwise(xv)
            return
        rn = _row_rnumel(stage)
        accs = []
        if stage.kind == "reduction":
            for n in stage.nodes:
                dt, rt = n.body.src_dtype, n.body.reduction_type
                acc = h.fresh("acc")
                acc_dt = torch.int32 if rt == "any" else dt
                code.writeline(f"{acc} = {_full2(_init(rt, acc_dt), acc_dt)}")
                if rt in ("argmax", "argmin"):
                    code.writeline(f"{acc}_i = tl.full([XBLOCK, RBLOCK], {INT32_LIMIT - 1}, tl.int64)")
                accs.append((n, acc, rt, dt))
        if persistent:
            h.loop_mask = h.emit("xmask & rmask", torch.bool, 2)
        else:
            saved = h.push()
            _open_rloop(code, h, stage, rn, rv)
        if stage.kind == "pointwise":
            for n in stage.nodes:
                n.store_pointwise(xv + rv)
        else:
            for n, acc, rt, dt in accs:
                v = h._as(n.reduction_value(xv, rv), dt)
                self._accumulate(acc, rt, dt, v)
        if not persistent:
            code.level -= 1
            h.pop(saved)
            self.row_written = set()
        h.loop_mask = TVal("xmask", torch.bool, 1)
        for n, acc, rt, dt in accs:
            res = h.fresh("red")
            code.writeline(f"{res} = {_final(acc, rt, dt)}")
            out_dt = torch.int64 if rt in ("argmax", "argmin") else (
                torch.bool if rt == "any" else dt)
            h.store(n.name, n.store_index(xv), TVal(res, out_dt, 1))

    def _new_row(self, stage, rv):
        """Decode a new row (persistent): values that varied along the old row are dead."""
        h = self.h
        h.cse = {k: v for k, v in h.cse.items() if v.level < 2}
        h.stored = {k: v for k, v in h.stored.items() if v.level < 2}
        self.row_written = set()
        code = h.code
        code.writeline("rindex = rbase")
        code.writeline(f"rmask = rindex < {_size(_row_rnumel(stage))}")
        h.levels["rindex"] = 2
        _decode(code, "rindex", list(stage.inner), rv, h, 2)
        self.row_scope = tuple(stage.inner)

    def _accumulate(self, acc, rt, dt, v):
        code = self.h.code
        mask = "(xmask & rmask)"
        vv = f"tl.broadcast_to({v}, [XBLOCK, RBLOCK])"
        if rt == "sum":
            code.writeline(f"{acc} = tl.where({mask}, {acc} + {vv}, {acc})")
        elif rt == "prod":
            code.writeline(f"{acc} = tl.where({mask}, {acc} * {vv}, {acc})")
        elif rt == "any":
            code.writeline(f"{acc} = tl.where({mask} & ({vv} != 0), 1, {acc})")
        elif rt in ("max", "min"):
            fn = "tl.maximum" if rt == "max" else "tl.minimum"
            code.writeline(f"{acc} = tl.where({mask}, {fn}({acc}, {vv}, tl.PropagateNan.ALL), {acc})")
        elif rt in ("argmax", "argmin"):
            cmp = ">" if rt == "argmax" else "<"
            nan = f" | (({vv} != {vv}) & ({acc} == {acc}))" if dt.is_floating_point else ""
            code.writeline(f"_take = {mask} & (({vv} {cmp} {acc}) | ({acc}_i == {INT32_LIMIT - 1})"
                           f"{nan})")
            code.writeline(f"{acc} = tl.where(_take, {vv}, {acc})")
            code.writeline(f"{acc}_i = tl.where(_take, tl.broadcast_to(rindex.to(tl.int64), "
                           f"[XBLOCK, RBLOCK]), {acc}_i)")
        else:
            raise NotImplementedError(f"reduction {rt}")


def _final(acc, rt, dt) -> str:
    if rt == "sum":
        return f"tl.sum({acc}, 1)[:, None]"
    if rt == "prod":
        return f"tl.reduce({acc}, 1, _prod_combine)[:, None]"
    if rt == "any":
        return f"(tl.max({acc}, 1) != 0)[:, None]"
    if rt in ("max", "min"):
        # a NaN anywhere in the row wins (torch semantics)
        red = "tl.max" if rt == "max" else "tl.min"
        if dt.is_floating_point:
            return (f"tl.where(tl.max(({acc} != {acc}).to(tl.int32), 1) != 0, _NAN, "
                    f"{red}(tl.where({acc} != {acc}, 0, {acc}), 1))[:, None]")
        return f"{red}({acc}, 1)[:, None]"
    # argmax / argmin: the best value's smallest index; a NaN row gives its first NaN
    red = "tl.max" if rt == "argmax" else "tl.min"
    if dt.is_floating_point:
        best = f"{red}(tl.where({acc} != {acc}, 0, {acc}), 1)[:, None]"
        nan_any = f"(tl.max(({acc} != {acc}).to(tl.int32), 1)[:, None] != 0)"
        pick = (f"tl.where({nan_any}, {acc} != {acc}, ({acc} == {best}) & ({acc} == {acc}))")
    else:
        pick = f"({acc} == {red}({acc}, 1)[:, None])"
    return f"tl.min(tl.where({pick}, {acc}_i, {INT32_LIMIT - 1}), 1)[:, None]"


def generate_kernels(kernels, deps, buffers: dict, *, max_persistent=MAX_PERSISTENT,
                     interpret=True, dead=None, welford=True) -> list:
    """[TritonKernelSource] for the kernels, with their argument lists (same order as C++).
    `dead`: kernel name -> buffers it writes that no later step reads (stores may be elided)."""
    out = []
    for k in kernels:
        if owns_loops(k.nodes[0]):     # lower makes Scans and Scatters for C++ only (GraphLowering(cpp=...))
            raise InternalError(f"{k.name}: a scan or scatter kernel has no Triton form")
        args = kernel_args(k, deps)
        cg = TritonKernelCodegen(k, buffers, max_persistent=max_persistent, interpret=interpret,
                                 welford=welford)
        with set_handler(cg.h):
            out.append(cg.generate(args, (dead or {}).get(k.name, frozenset())))
    return out


def module_source(sources) -> str:
    head = PRELUDE
    if any(s.libdevice for s in sources):
        head += "from triton.language.extra import libdevice\n"
    return head + "\n\n" + "\n\n".join(s.source for s in sources)
