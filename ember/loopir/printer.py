"""Print the loop IR and the schedule as readable Python, each with a header line.

`print_lowered(inputs, nodes, outputs)`: every computed buffer as a `def` over its loop
variables (x0.. outer, r0.. reduced) whose body is the `ops` calls it makes, run under
`PrintHandler`; every extern as its aten call. `print_plan(plan)`: the steps in run order (kernel
calls with their loops and stages, extern calls), and the buffers freed after each.

    # after lower: 9 buffers, 2 reductions, 3 externs
    def buf2(x0, r0):  # reduction sum -> float32[5] stride (1,), over r0 < 16
        t0 = ops.load('buf1', 16*x0 + r0)
        return t0  # reduced with sum

Consumes: loop-IR nodes (ember.loopir.nodes), a Plan (ember.loopir.plan). Produces: text.
"""
from __future__ import annotations

import itertools

import sympy
import torch

from .index import sym
from .nodes import Scan, Scatter
from .ops import OpsHandler, set_handler
from .plan import ExternStep


class _Name(str):
    """A printed value: its repr is the bare name."""

    def __repr__(self) -> str:
        return str(self)


def _arg(a) -> str:
    if isinstance(a, torch.dtype):
        return f"torch.{str(a).split('.')[-1]}"
    if hasattr(a, "buffer") and hasattr(a, "stride"):         # a TensorArg
        if a.is_whole:
            return a.buffer.name
        return f"as_strided({a.buffer.name}, {tuple(a.size)}, {tuple(a.stride)}, {a.offset})"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, sympy.Basic):
        return str(a)
    return repr(a)


class PrintHandler(OpsHandler):
    """Each op becomes one line `tN = ops.<op>(...)`; values are the names."""

    def __init__(self, indent: str = "    "):
        self.lines: list[str] = []
        self.indent = indent
        self.ids = itertools.count()

    def _emit(self, call: str) -> _Name:
        name = _Name(f"t{next(self.ids)}")
        self.lines.append(f"{self.indent}{name} = {call}")
        return name

    def default(self, name, *args, **kwargs):
        parts = [_arg(a) for a in args] + [f"{k}={_arg(v)}" for k, v in kwargs.items()]
        return self._emit(f"ops.{name}({', '.join(parts)})")

    def store(self, name, index, value):
        self.lines.append(f"{self.indent}ops.store({name!r}, {_arg(index)}, {value})")

    def masked(self, mask, body, other):
        self.lines.append(f"{self.indent}# masked by {mask}: the body below, else {other!r}")
        value = body()
        return self._emit(f"ops.masked({mask}, {value}, {other!r})")

    def indirect_indexing(self, value, size, check=True):
        name = f"i{next(self.ids)}"
        self.lines.append(f"{self.indent}{name} = ops.indirect_indexing({value}, {_arg(size)})")
        return sym(name)


def _layout(b) -> str:
    dtype = str(b.dtype).split(".")[-1]
    return f"{dtype}{list(b.size)} stride {tuple(b.stride)}"


def _body(node) -> list[str]:
    h = PrintHandler()
    xv = [sym(f"x{i}") for i in range(len(node.ranges))]
    rv = [sym(f"r{i}") for i in range(len(node.rranges))]
    with set_handler(h):
        if node.kind == "pointwise":
            node.store_pointwise(xv)
            over = ", ".join(f"{v} < {n}" for v, n in zip(xv, node.ranges))
            b = node.body
            kind = (f"{'reverse ' if b.reverse else ''}cumsum along dim {b.dim} of the value "
                    f"stored here" if isinstance(b, Scan) else
                    f"scatter{'_add' if b.accumulate else ''} along dim {b.dim} of {b.count} "
                    f"per row (reads at scatter_k < {b.count})" if isinstance(b, Scatter)
                    else "pointwise")
            head = f"def {node.name}({', '.join(map(str, xv))}):  # {kind} -> " \
                   f"{_layout(node)}{', over ' + over if over else ''}"
            return [head] + h.lines
        value = node.reduction_value(xv, rv)
    over = ", ".join(f"{v} < {n}" for v, n in zip(rv, node.rranges))
    rtype = node.body.reduction_type
    head = (f"def {node.name}({', '.join(map(str, xv + rv))}):  # reduction {rtype} -> "
            f"{_layout(node)}, over {over or 'one element'}")
    return [head] + h.lines + [f"    return {value}  # reduced with {rtype}, stored at "
                               f"{_arg(node.store_index(xv))}"]


def _extern(node) -> str:
    args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
    call = f"{node.op}({', '.join(args)})"
    if node.outputs:
        outs = ", ".join(o.name for o in node.outputs)
        return f"{outs} = {call}  # extern, {len(node.outputs)} outputs"
    how = f"out={node.out_variant}" if node.out_variant is not None else "result copied"
    return f"{node.name} = {call}  # extern ({how}) -> {_layout(node)}" + \
        ("  FALLBACK" if node.fallback else "")


def print_lowered(inputs, nodes, outputs) -> str:
    kinds = [getattr(n, "kind", "") for n in nodes]
    lines = [f"# after lower: {len(nodes)} buffers, {kinds.count('reduction')} reductions, "
             f"{kinds.count('extern')} externs",
             "import torch", "from ember.loopir.ops import ops", ""]
    for b in inputs:
        what = "a size" if b.size is None else _layout(b)
        where = f"input {b.position}" if b.position >= 0 else "constant"
        lines.append(f"# {b.name}: {where}, {what}")
    for n in nodes:
        lines.append("")
        lines.extend([_extern(n)] if n.kind == "extern" else _body(n))
    lines += ["", f"# returns {_arg(tuple(outputs))}"]
    return "\n".join(lines) + "\n"


def plan_summary(plan) -> str:
    frees = sum(len(v) for v in plan.memory.frees.values())
    local = sum(len(k.local) for k in plan.kernels)
    return (f"{len(plan.kernels)} kernels, {len(plan.externs)} externs, {local} kernel-local "
            f"buffers, {frees} buffers freed early, {len(plan.in_place)} in-place candidates")


def print_plan(plan) -> str:
    lines = [f"# after schedule: {plan_summary(plan)}", ""]
    for i, step in enumerate(plan.steps):
        if isinstance(step, ExternStep):
            lines.append(_extern(step.node))
        else:
            lines.append(f"# {step.name}: for {' x '.join(map(str, step.outer)) or 'one'} "
                         f"outer iterations, {len(step.stages)} stage(s)")
            for s in step.stages:
                inner = " x ".join(map(str, s.inner)) or "-"
                kind = f"{s.kind} keeping {s.keep}" if s.keep else s.kind
                lines.append(f"#   {kind:9} inner {inner:12} {' '.join(n.name for n in s.nodes)}")
                if s.columns:
                    lines.append(f"#     + column sums in its loop: {' '.join(n.name for n in s.columns)}")
            if step.local:
                lines.append(f"#   kernel-local: {' '.join(sorted(step.local))}")
            lines.append(f"{', '.join(plan.writes[i]) or '_'} = {step.name}"
                         f"({', '.join(plan.reads[i])})")
        dying = plan.memory.frees.get(i, [])
        if dying:
            lines.append(f"del {', '.join(dying)}  # last use")
    lines.append(f"return {_arg(tuple(plan.outputs))}")
    return "\n".join(lines) + "\n"


__all__ = ["PrintHandler", "print_lowered", "print_plan", "plan_summary"]
