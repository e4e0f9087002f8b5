"""Capture, explain: run a function once under capture and report what happened.

`explain(fn, *args, **kwargs)` → `Explanation` with graphs (fx.GraphModule), ops per graph,
guards (readable), recompiles, graph breaks (breaks.BreakInfo: reason, user file:line, kind),
the reasons of the root frame's eager entries (`unsupported`) and every frame, or rest of a
frame after a break, set to run eagerly during the call (`eager`, the warnings' text).
"""
from __future__ import annotations

import dataclasses

import torch

from ..config import CompileSettings


@dataclasses.dataclass
class Explanation:
    graphs: list
    ops_per_graph: list
    guards: list
    recompiles: int
    breaks: list
    unsupported: list
    result: object = None
    eager: list = dataclasses.field(default_factory=list)   # every frame (or rest) run eagerly

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def fallbacks(self) -> int:
        """Frames that ran eagerly (unsupported with no break point, or an internal error)."""
        return len(self.unsupported)

    def __str__(self) -> str:
        lines = [f"graphs: {len(self.graphs)}  ops: {self.ops_per_graph}  "
                 f"recompiles: {self.recompiles}  breaks: {len(self.breaks)}  "
                 f"fallbacks: {self.fallbacks}"]
        for i, b in enumerate(self.breaks):
            lines.append(f"break {i}: {b}")
        for r in self.eager:
            lines.append(f"eager: {r}")
        for i, gm in enumerate(self.graphs):
            lines.append(f"--- graph {i} ---")
            lines.append(gm.print_readable(print_output=False))
        lines.append("guards:")
        lines.extend(f"  {g}" for g in self.guards)
        return "\n".join(lines)


def explain(fn, /, *args, **kwargs) -> Explanation:
    from .breaks import EAGER, RECORD
    from .entry import STATS, compile_function, compile_module
    graphs = []
    n_breaks, n_eager = len(RECORD), len(EAGER)

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    settings = CompileSettings(backend=recording_backend, backend_name="explain")
    from .entry import FrameCache
    before = dict(STATS)
    if isinstance(fn, torch.nn.Module):
        runner = compile_module(fn, settings)
        inner = runner.runner
    else:
        runner = inner = compile_function(fn, settings)
    cache = FrameCache(getattr(inner, "code", None))
    if hasattr(inner, "cache"):
        inner.cache = cache
    try:
        result = runner(*args, **kwargs)
        recompiles = STATS.get("recompiles", 0) - before.get("recompiles", 0)
        guards = [g.describe() for e in cache.entries for g in e.guards]
        unsupported = [e.reason for e in cache.entries if e.eager]
        breaks = RECORD[n_breaks:]
        eager = EAGER[n_eager:]
    finally:
        del RECORD[n_breaks:]
        del EAGER[n_eager:]
        STATS.clear()
        STATS.update(before)
    ops = [sum(1 for n in g.graph.nodes if n.op == "call_function") for g in graphs]
    return Explanation(graphs, ops, guards, recompiles, breaks, unsupported, result, eager)
