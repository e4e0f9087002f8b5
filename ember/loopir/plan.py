"""The schedule's result: what runs, in which order, and where every buffer lives.

`Plan` is the one value the schedule hands to codegen (frozen: codegen reads it, never edits
it). Its steps are `Kernel`s (an outer loop nest over `Stage`s, each a list of loop-IR nodes run
for every outer index) and `ExternStep`s (one aten call). `NodeDeps` are the read/write indices
of one node; `MemoryPlan` says after which step each buffer dies.

Consumes: loop-IR nodes (ember.loopir.nodes). Produces: the classes below, built by
ember.schedule, read by codegen and printed by ember.loopir.printer.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class NodeDeps:
    reads: dict            # buffer name -> set of index exprs (None for externs: whole buffer)
    write_index: object    # sympy expr in v-vars (None for externs)
    indirect: bool = False
    ind_sizes: dict = dataclasses.field(default_factory=dict)   # indirect index symbol -> its dim size


@dataclasses.dataclass
class Stage:
    kind: str            # "pointwise" | "reduction"
    inner: tuple
    nodes: list
    # column reductions computed in this stage's loop (schedule/columns.py): each adds its
    # value at every (outer, inner) point into a per-thread partial of its output. `axes`:
    # node name -> for each of its dims (output dims, then reduced dims) its index as an
    # expression of the kernel's loop vars v0, v1, ... (outer vars, then this stage's inner)
    columns: list = dataclasses.field(default_factory=list)
    axes: dict = dataclasses.field(default_factory=dict)
    # a reduction stage whose first `keep` inner dims are output dims of its nodes (a segmented
    # reduction, schedule/segments.py): one reduction over the rest per point of those dims
    keep: int = 0


@dataclasses.dataclass
class Kernel:
    name: str
    outer: tuple
    stages: list
    local: set = dataclasses.field(default_factory=set)   # buffers that never leave the kernel
    row_local: dict = dataclasses.field(default_factory=dict)  # local, but across stages: name -> row numel
    row_home: dict = dataclasses.field(default_factory=dict)   # row-local name -> the buffer whose row holds it

    @property
    def nodes(self):
        return [n for s in self.stages for n in s.nodes + s.columns]

    @property
    def pure_pointwise(self) -> bool:
        return all(s.kind == "pointwise" and not s.inner and not s.columns for s in self.stages)


@dataclasses.dataclass
class ExternStep:
    node: object

    @property
    def nodes(self):
        return [self.node]


@dataclasses.dataclass
class MemoryPlan:
    last_use: dict        # buffer name -> index of the last step reading or writing it
    frees: dict           # step index -> [buffer names dying after it]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The scheduled graph. Per-step facts are tuples indexed like `steps`."""
    inputs: tuple         # InputBuffers: graph placeholders (position >= 0), then constants
    outputs: tuple        # what the graph returns: TensorArgs, or constants
    nodes: tuple          # the live loop-IR nodes (dead ones dropped), in graph order
    steps: tuple          # Kernel | ExternStep, in run order
    deps: dict            # node name -> NodeDeps
    buffers: dict         # buffer name -> buffer with a layout (inputs, nodes, multi-outputs)
    memory: MemoryPlan
    reads: tuple          # per step: buffers it reads from memory (kernel-local ones excluded)
    writes: tuple         # per step: buffers it writes to memory
    in_place: frozenset   # (step index, src, dst): the kernel may store dst into src's memory
    fallbacks: tuple = () # aten ops run as fallback externs (lower's record)

    @property
    def kernels(self) -> list:
        return [s for s in self.steps if isinstance(s, Kernel)]

    @property
    def externs(self) -> list:
        return [s for s in self.steps if isinstance(s, ExternStep)]
