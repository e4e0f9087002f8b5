"""Stage aot, partitioner: split a joint forward+backward aten graph into a forward graph and a
backward graph, choosing which values the forward saves.

Consumes: the joint fx.Graph from joint.py (placeholders: inputs, constants, tangents; output
tuple: forward outputs then grads) and its counts.
Produces: `Partition` — forward GraphModule (inputs+constants → forward outputs + saved
activations), backward GraphModule (saved inputs + saved activations + tangents → grads), and the
saved set.

Two policies (`PARTITIONERS`):
  - "default": the backward recomputes nothing the forward computed; it saves every forward value
    the backward reads.
  - "min_cut" (default): a minimum s-t cut (networkx) over the tangent-independent nodes the
    backward needs, weighted by bytes. Cheap pointwise/view/cast ops may be recomputed in the
    backward; matmul/conv/sdpa/reductions/random ops never are, except inside an activation-
    checkpoint region (node.meta["recompute"]): those are always recomputed, random ops excepted,
    and those a selective-checkpoint policy saves (node.meta["sac_save"]) always saved.
    Graph inputs and forward outputs are free to save, and a bool mask costs a quarter of a
    float, so masks are saved rather than the floats made from them. A value an extern reads
    in the forward and another in the backward is saved, never recomputed (the backward would
    store it again: `_stored_for_externs`).
"""
from __future__ import annotations

import dataclasses
import operator

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov
import torch
import torch.fx as fx

from .. import shapes
from ..errors import InternalError
from ..logging import get_logger

aten = torch.ops.aten


@dataclasses.dataclass
class Partition:
    fw: fx.Graph
    bw: fx.Graph
    saved_inputs: list[int]       # positions in (inputs + constants) the backward reads
    saved_values: list[fx.Node]   # joint nodes the forward returns for the backward
    saved_nodes: list[fx.Node]    # every saved joint node (inputs first, then activations)


# ops cheap enough to recompute in the backward besides pointwise and view ops
CHEAP = frozenset({
    aten._to_copy.default, aten.clone.default, aten.full.default, aten.zeros.default,
    aten.ones.default, aten.scalar_tensor.default, aten.arange.default, aten.arange.start,
    aten.arange.start_step, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
    aten.empty_like.default, aten.expand.default, aten.copy.default, aten.where.self,
    aten.empty.memory_format, aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
})
# compute-bound ops lowered as externs: they read their tensor inputs as stored buffers
EXTERNS = frozenset({
    aten.convolution.default, aten.convolution_backward.default, aten.mm.default,
    aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
})
# never recomputed even when tagged pointwise
NEVER = frozenset({aten.bernoulli.p, aten.bernoulli.default, aten.bernoulli.Tensor,
                   aten.native_dropout.default, aten.rand_like.default, aten.randn_like.default})


def recomputable(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem or is_size_node(node):
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target in NEVER or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return torch.Tag.pointwise in target.tags or target.is_view or target in CHEAP


def _checkpoint_nodes(joint: fx.Graph, fw_outs) -> tuple[set[fx.Node], set[fx.Node]]:
    """Nodes inside an activation-checkpoint region (ember/regions.py) that do not leave it:
    recomputed in the backward whatever they cost, as eager's checkpoint does. A region's outputs
    (read by forward nodes outside it, or graph outputs) are saved, not recomputed, like the next
    block's input eager saves; a random op is saved (a recompute would draw new numbers).
    Returns (recomputed inside, region outputs)."""
    fw = _ancestors(fw_outs)
    out, leaving = set(), set()
    for n in joint.nodes:
        tag = n.meta.get("recompute")
        if tag is None or n.op != "call_function" or n.target in NEVER or \
                isinstance(n.target, torch._ops.OpOverload) and \
                torch.Tag.nondeterministic_seeded in n.target.tags:
            continue
        if n.meta.get("sac_save") or \
                any(u.op == "output" or u in fw and u.meta.get("recompute") != tag for u in n.users):
            leaving.add(n)
        else:
            out.add(n)
    return out, leaving


def _is_view(n: fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and n.target.is_view


def _stored_in_forward(n: fx.Node, dep: set) -> bool:
    """The forward stores n whatever is saved: an extern's or reduction's result, or an input
    an extern reads (directly or through views). A view stores nothing: counted once, as before."""
    if not recomputable(n) or _is_view(n):
        return True
    todo = [u for u in n.users if u not in dep]
    while todo:
        u = todo.pop()
        if u.op != "call_function":
            continue
        if u.target in EXTERNS:
            return True
        if _is_view(u):
            todo.extend(v for v in u.users if v not in dep)
    return False


def _stored_for_externs(n: fx.Node, dep: set) -> bool:
    """Read (directly or through views) by an extern in the forward and by one in the
    backward: the forward stores n for its own extern, so saving it writes nothing more, while
    a recompute would store it again in the backward for that extern (a ReLU output between a
    BatchNorm and the next conv: the conv's weight gradient reads it). Inductor's partitioner
    bans these recomputations too (is_materialized_backwards). Not a view: recomputing one
    costs nothing, and a saved view of a parameter would break on the optimizer's in-place
    step ("a view was created in no_grad mode ... modified inplace")."""
    if _is_view(n):
        return False
    fw = bw = False
    todo = list(n.users)
    while todo and not (fw and bw):
        u = todo.pop()
        if u.op != "call_function":
            continue
        if _is_view(u):
            todo.extend(u.users)
        elif u.target in EXTERNS:
            if u in dep:
                bw = True
            else:
                fw = True
    return fw and bw


def is_size_node(node: fx.Node) -> bool:
    """Size arithmetic (dynamic shapes): aten.sym_size and operator.* on SymInts. Recomputed
    where needed, never saved."""
    return node.op == "call_function" and isinstance(node.meta.get("val"), (torch.SymInt,
                                                                           torch.SymFloat))


def nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return shapes.hint_int(val.numel()) * val.element_size()
    return 1 << 40          # tuples and numbers cannot be saved as tensors


def _ancestors(outputs, stop=frozenset()) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [o for o in outputs if o is not None]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in stop:
            continue
        stack.extend(n.all_input_nodes)
    return seen


def _split_io(joint: fx.Graph, n_primals: int, n_fw_outputs: int):
    placeholders = [n for n in joint.nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:n_primals], placeholders[n_primals:]
    out = next(n for n in joint.nodes if n.op == "output")
    outs = list(out.args[0])
    return primals, tangents, outs[:n_fw_outputs], outs[n_fw_outputs:]


def _tangent_dependent(joint: fx.Graph, tangents) -> set[fx.Node]:
    dep = set(tangents)
    for n in joint.nodes:
        if n.op == "call_function" and any(a in dep for a in n.all_input_nodes):
            dep.add(n)
    return dep


def _saved_default(joint, primals, tangents, fw_outs, grads) -> set[fx.Node]:
    fw = _ancestors(fw_outs)
    for n in list(fw):                      # tuple results travel as their getitems
        fw.update(u for u in n.users if u.target is operator.getitem)
    needed = _ancestors(grads)
    bw_region = {n for n in needed if n not in fw and n.op == "call_function"}
    saved = {g for g in grads if g not in bw_region and g not in tangents}
    for n in bw_region:
        saved.update(a for a in n.all_input_nodes if a not in bw_region and a not in tangents)
    return saved


def _saved_min_cut(joint, primals, tangents, fw_outs, grads) -> set[fx.Node]:
    dep = _tangent_dependent(joint, tangents)
    needed = _ancestors(grads)
    cand = {n for n in needed if n not in dep}
    forced, leaving = _checkpoint_nodes(joint, fw_outs)
    # a forward output is held by the caller anyway (eager's autograd saves softmax's output
    # itself): saving it is free, like an input, where recomputing it would redo its exp
    outs = {o for o in fw_outs if isinstance(o, fx.Node)}
    g = nx.DiGraph()
    g.add_node("source")
    g.add_node("sink")
    for n in cand:
        if n in forced:
            g.add_edge(f"{n.name}_in", f"{n.name}_out")        # no capacity: never cut (saved)
        else:
            # a value the forward stores anyway (an extern's or a reduction's result, an
            # extern's input) costs its bytes; saving one the forward would not store costs a
            # store more, so it counts double (Inductor's weights): BatchNorm's backward saves
            # the conv output, not x - mean
            weight = 0 if n.op == "placeholder" or n in outs else \
                nbytes(n) * (1 if _stored_in_forward(n, dep) else 2)
            g.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=weight)
            if n.op == "placeholder" or not recomputable(n) or n in leaving or \
                    _stored_for_externs(n, dep):
                g.add_edge("source", f"{n.name}_in")
        for u in n.users:
            if u in cand:
                g.add_edge(f"{n.name}_out", f"{u.name}_in")
            elif u in dep:
                g.add_edge(f"{n.name}_out", "sink")
        if n in grads or n.meta.get("sac_save"):      # selective checkpointing: saved
            g.add_edge(f"{n.name}_out", "sink")
    # Boykov-Kolmogorov: the same cut value as the default preflow-push, 2-3x faster on these
    # long, narrow graphs (densenet121's joint: 0.42 -> 0.16 s)
    _, (reach, _) = nx.minimum_cut(g, "source", "sink", flow_func=boykov_kolmogorov)
    return {n for n in cand if f"{n.name}_in" in reach and f"{n.name}_out" not in reach}


PARTITIONERS = {"default": _saved_default, "min_cut": _saved_min_cut}


def _extract(joint: fx.Graph, inputs: list[fx.Node], outputs: list[fx.Node],
             lazy: frozenset = frozenset()) -> fx.Graph:
    """The subgraph computing `outputs` from `inputs`, in joint order, except that a node in
    `lazy` (recomputed activations of a checkpoint region) is emitted just before its first use,
    so a region's recomputation lives only while its own backward runs."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        p = g.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    needed = _ancestors(outputs, stop=frozenset(inputs))

    def emit(n):
        stack = [n]
        while stack:
            m = stack[-1]
            if m in env:
                stack.pop()
                continue
            if m.op == "placeholder":
                raise InternalError(f"ember.aot partition: {m.name} is needed but not an input")
            missing = [a for a in m.all_input_nodes if a not in env]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            env[m] = g.node_copy(m, lambda x: env[x])

    for n in joint.nodes:
        if n in needed and n not in env and n.op != "output" and n not in lazy:
            emit(n)
    g.output(tuple(env[o] for o in outputs))
    g.lint()
    return g


def partition(joint: fx.Graph, *, n_primals: int, n_fw_outputs: int, policy: str = "min_cut",
              mutated: frozenset = frozenset()) -> Partition:
    """Split `joint` (see module docstring); `n_primals` counts inputs and constants."""
    if policy not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {policy!r}; valid: {', '.join(PARTITIONERS)}")
    primals, tangents, fw_outs, grads = _split_io(joint, n_primals, n_fw_outputs)
    saved = PARTITIONERS[policy](joint, primals, tangents, fw_outs, grads)
    primal_pos = {p: i for i, p in enumerate(primals)}
    saved_inputs = sorted(primal_pos[n] for n in saved if n in primal_pos)
    order = {n: i for i, n in enumerate(joint.nodes)}
    saved_values = sorted((n for n in saved if n not in primal_pos), key=order.__getitem__)
    saved_nodes = [primals[i] for i in saved_inputs] + saved_values
    fw = _extract(joint, primals, fw_outs + saved_values)
    lazy = frozenset(n for n in joint.nodes if n.meta.get("recompute") is not None)
    bw = _extract(joint, saved_nodes + tangents, grads, lazy)
    log = get_logger("aot")            # per call: EMBER_LOGS is read when asked
    if log.isEnabledFor(20):
        total = sum(nbytes(n) for n in saved_values)
        log.info("partition (%s): fwd %d nodes, bwd %d nodes, saved %d inputs + %d activations "
                 "(%d bytes)", policy, len(fw.nodes), len(bw.nodes), len(saved_inputs),
                 len(saved_values), total)
        for n in saved_nodes:
            v = n.meta.get("val")
            kind = "input" if n in primal_pos else str(n.target)
            log.info("  saved %s: %s %s %s", n.name, kind, tuple(v.shape), v.dtype)
    return Partition(fw=fw, bw=bw, saved_inputs=saved_inputs, saved_values=saved_values,
                     saved_nodes=saved_nodes)
