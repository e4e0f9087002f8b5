"""Stage 5, schedule: loop-IR nodes → `Plan` (ember.loopir.plan).

`schedule(lowered)` finds every node's reads and write index (deps.py), drops nodes no output
needs, groups the rest into kernels (fuse.py), moves column sums into the row kernels that read
their inputs (columns.py, C++ only), marks kernel-local buffers and buffer lifetimes
(memory.py), and records per step what it reads and writes and which stores may go in place.

Consumes: lower's result (`nodes`, `inputs`, `outputs`, `fallbacks`). Produces: a frozen `Plan`.
"""
from __future__ import annotations

import math

from ..loopir.index import is_symbolic
from ..loopir.nodes import TensorArg
from ..loopir.plan import Kernel, Plan
from .columns import attach_columns
from .deps import node_deps
from .fuse import fuse
from .segments import merge_segments
from .memory import ROW_LOCAL_MAX, ROW_LOCAL_MAX_TRITON, can_write_in_place, mark_locals, \
    plan_memory, step_reads, step_writes


def schedule(lowered, *, fusion: bool = True, row_local_max: int = ROW_LOCAL_MAX,
             row_gather: bool = False, columns: bool = False) -> Plan:
    deps = {n.name: node_deps(n) for n in lowered.nodes}
    out_names = {o.buffer.name for o in lowered.outputs if isinstance(o, TensorArg)}
    nodes = _sources_first(_dce(lowered.nodes, deps, out_names), deps)
    buffers = {b.name: b for b in lowered.inputs if b.size is not None}
    for n in nodes:
        buffers[n.name] = n
        for o in getattr(n, "outputs", []):
            buffers[o.name] = o
    steps = fuse(nodes, deps, enable=fusion, row_gather=row_gather)
    if columns and fusion:
        steps = attach_columns(merge_segments(steps, deps), deps)
    mark_locals(steps, deps, keep=out_names, row_local_max=row_local_max)
    memory = plan_memory(steps, deps, out_names)
    reads = tuple(tuple(step_reads(s, deps)) for s in steps)
    writes = tuple(tuple(step_writes(s)) for s in steps)
    in_place = frozenset((i, src, dst) for i, s in enumerate(steps) if isinstance(s, Kernel)
                         for src in reads[i] for dst in writes[i]
                         if can_write_in_place(s, deps, src, dst))
    return Plan(tuple(lowered.inputs), tuple(lowered.outputs), tuple(nodes), tuple(steps), deps,
                buffers, memory, reads, writes, in_place, tuple(lowered.fallbacks))


SMALL_TABLE = 16384    # elements: a larger value computed early (a zero fill) would live longer


def _sources_first(nodes, deps):
    """Nodes computed from the loop indices alone (an interpolation's index and weight tables)
    first: a table realized only where a later pass gathers with it would otherwise come after
    the pass it reads, and keep the two passes from fusing (fuse joins a node only to kernels
    after all its producers)."""
    pure: set = set()
    for n in nodes:
        if n.kind != "extern" and all(b in pure for b in deps[n.name].reads) and \
                not any(map(is_symbolic, n.size)) and math.prod(int(s) for s in n.size) <= SMALL_TABLE:
            pure.add(n.name)
    return [n for n in nodes if n.name in pure] + [n for n in nodes if n.name not in pure]


def _dce(nodes, deps, keep: set):
    needed = set(keep)
    out = []
    for n in reversed(nodes):
        names = {n.name} | {o.name for o in getattr(n, "outputs", [])}
        if names & needed:
            out.append(n)
            needed.update(deps[n.name].reads)
    return list(reversed(out))


__all__ = ["schedule", "Plan", "ROW_LOCAL_MAX", "ROW_LOCAL_MAX_TRITON"]
