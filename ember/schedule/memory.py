"""Stage 5, schedule: buffer lifetimes.

`plan_memory` marks kernel-local buffers (written and read only inside one kernel, at the
written index, and either a reduction result or read in the writer's own loop), and computes
for every step the buffers whose last use it is, so the wrapper can free or reuse them.

Consumes: steps from fuse(), NodeDeps, the names of graph outputs. Produces: `MemoryPlan`.
"""
from __future__ import annotations

from ..loopir.index import contiguous_strides, hint
from ..loopir.ops import compute_dtype
from ..loopir.plan import ExternStep, Kernel, MemoryPlan
from .deps import row_gather, tensor_args


# elements of a per-thread row scratch: a longer row (softmax over a 32000 vocabulary) stays in
# the cache as a row scratch too (C++: a thread's heap buffer, codegen/cpp.py); as a global
# buffer it cost a write and a read-back of the whole tensor through memory. Triton keeps the
# smaller bound (its scratch is a global buffer the launcher holds).
ROW_LOCAL_MAX = 1 << 18
ROW_LOCAL_MAX_TRITON = 16384


def step_reads(step, deps) -> list:
    if isinstance(step, ExternStep):
        return list(dict.fromkeys(a.buffer.name for a in tensor_args(step.node)))
    names = []
    for n in step.nodes:
        for b in deps[n.name].reads:
            if b not in step.local and b not in names:
                names.append(b)
    return names


def step_writes(step) -> list:
    if isinstance(step, ExternStep):
        node = step.node
        return [o.name for o in node.outputs] if node.outputs else [node.name]
    return [n.name for n in step.nodes if n.name not in step.local]


def mark_locals(steps, deps, keep: set, row_local_max: int = ROW_LOCAL_MAX) -> None:
    readers: dict = {}
    for i, step in enumerate(steps):
        for n in step.nodes:
            for b in (deps[n.name].reads or {}):
                readers.setdefault(b, []).append((i, n))
    for i, step in enumerate(steps):
        if not isinstance(step, Kernel):
            continue
        stage_of = {n.name: s for s in step.stages for n in s.nodes + s.columns}
        for n in step.nodes:
            if n.name in keep or stage_of[n.name].keep:
                # (a segmented reduction's results are stored: one per kept point)
                continue
            rs = readers.get(n.name, [])
            if not rs:
                continue
            ok = all(j == i and all(idx == deps[n.name].write_index or _gathers_row(step, stage_of, n, r, idx, deps)
                                    for idx in deps[r.name].reads[n.name]) for j, r in rs)
            if ok and n.kind == "pointwise" and not all(
                    stage_of[r.name] is stage_of[n.name] for _, r in rs):
                # read by later stages of the same outer iteration: a per-row scratch array
                inner = stage_of[n.name].inner
                size = 1
                for s_ in inner:
                    size *= s_
                # (a symbolic row size is judged by its hint: C++ keeps it in a thread's heap
                # scratch, any length; kept in memory, dynamic softmax ran at 0.58x the static
                # kernel, design 054)
                # (the row array is indexed by the stored index: only a row-major layout,
                # not a channels-last one, keeps a row's elements within [0, size))
                if not inner and step.outer:
                    # one value per outer iteration (a row's mean or rstd that only this
                    # kernel's later stages read): a C++ scalar / Triton register, never stored
                    # (an inference LayerNorm wrote its dead rstd row by row, design 089)
                    step.local.add(n.name)
                elif inner and hint(size) <= row_local_max and step.outer \
                        and tuple(n.stride) == tuple(contiguous_strides(n.size)):
                    step.local.add(n.name)
                    step.row_local[n.name] = size
                continue
            if ok:
                step.local.add(n.name)
        if isinstance(step, Kernel) and step.row_local:
            step.row_home = row_homes(step, deps)


def _gathers_row(kernel, stage_of, writer, reader, idx, deps) -> bool:
    """A read by a later stage anywhere in the row `writer` stored in this outer iteration
    (schedule/fuse.py, row_gather): the row scratch is indexed by the read's inner part."""
    sw, sr = stage_of[writer.name], stage_of[reader.name]
    return sw is not sr and kernel.stages.index(sr) > kernel.stages.index(sw) and row_gather(
        idx, deps[writer.name].write_index, len(kernel.outer), sr.inner, sw.inner,
        deps[reader.name].ind_sizes)


def row_homes(kernel, deps) -> dict:
    """Row scratch that lives in the row of a buffer the kernel stores in the stage that last
    reads the scratch, at the same index and after every read of it there (softmax's exp row
    in the output row it is divided into, as eager does): no scratch memory, and the row the
    last stage writes is already in the cache. Same dtype (a float row, stored as computed),
    one scratch per buffer."""
    homes: dict = {}
    stages = kernel.stages
    # (a stage's columns run after its nodes in its loop: a scratch they read has no home there)
    pos = {n.name: (i, j) for i, s in enumerate(stages) for j, n in enumerate(s.nodes + s.columns)}
    for name in kernel.row_local:
        readers = [pos[n.name] for n in kernel.nodes if name in deps[n.name].reads]
        if not readers:
            continue
        last_stage = max(i for i, _ in readers)
        last_read = max(j for i, j in readers if i == last_stage)
        src = stages[pos[name][0]].nodes[pos[name][1]]
        for home in stages[last_stage].nodes[last_read:]:
            if home.name in kernel.local or home.name in homes.values() \
                    or home.kind != "pointwise" or home.dtype != src.dtype \
                    or compute_dtype(home.dtype) != home.dtype \
                    or deps[home.name].write_index != deps[name].write_index:
                continue
            homes[name] = home.name
            break
    return homes


def plan_memory(steps, deps, outputs: set) -> MemoryPlan:
    last: dict = {}
    for i, step in enumerate(steps):
        for b in step_reads(step, deps) + step_writes(step):
            last[b] = i
    # an extern's view (an overload whose schema aliases an argument: view_as_complex, _conj, a
    # view op with no lowering) shares its argument's memory: the argument lives as long as the
    # view (freed earlier, its memory was reused by a later buffer while the view was still read)
    keep = set(outputs)
    for i in reversed(range(len(steps))):
        step = steps[i]
        if not isinstance(step, ExternStep) or not getattr(step.node.op, "is_view", False):
            continue
        views = step_writes(step)
        for b in step_reads(step, deps):
            last[b] = max([last[b]] + [last[v] for v in views])
            if any(v in keep for v in views):
                keep.add(b)
    frees: dict = {}
    for b, i in last.items():
        if b not in keep:
            frees.setdefault(i, []).append(b)
    return MemoryPlan(last, frees)


def can_write_in_place(step, deps, src: str, dst: str) -> bool:
    """May kernel `step` store buffer `dst` into `src`'s memory (src dies here)? Only in a plain
    pointwise loop where src is read exactly at dst's write index and by no node after dst."""
    if not isinstance(step, Kernel) or not step.pure_pointwise or len(step.stages) != 1:
        return False
    nodes = step.stages[0].nodes
    names = [n.name for n in nodes]
    if dst not in names:
        return False
    write = deps[dst].write_index
    after = False
    for n in nodes:
        reads = deps[n.name].reads.get(src)
        if reads is not None:
            if after or any(idx != write for idx in reads):
                return False
        if n.name == dst:
            after = True
    return True
