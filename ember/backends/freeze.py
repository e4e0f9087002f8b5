"""Backend "ember", freezing: in an inference graph, module parameters and buffers are constants.

When the graph runs with grad disabled (or under `options={"freeze": True}`, never for a
training graph), the torch-level graph is rewritten before aot
(docs/design/024-layout-and-freezing.md):
  1. BatchNorm in eval mode after a conv/linear whose output only it reads is folded into that
     conv/linear's weight and bias (computed in float64, stored in the weight's dtype); any
     other eval BatchNorm becomes `x * scale + shift` with scale and shift folded once;
  2. the layout pass (layout.py) turns conv2d into oneDNN channels-last convolutions, their
     weights reordered into oneDNN's blocked layout in the constant graph;
  3. linears use packed weights (prepack.py: MKL's or oneDNN's, whichever gemmlib.py measured
     faster here), packed in the constant graph;
  4. every node computed from constants only (the folded weights, transposes, casts,
     concatenated weights) moves to a *constant graph*, run eagerly once; the rest, the *main
     graph*, takes the constant graph's outputs as extra inputs and is compiled as usual.

Stale weights: the constants are the user's own tensors, held with their identity, version
counter and data pointer at fold time. Every call compares them (an optimizer step, `.copy_()`
or `load_state_dict` bumps the version; `module.to()` / `param.data = ...` moves the data
pointer; assigning a new Parameter changes the identity) and refolds when any differs, so a
frozen graph never answers from stale weights. Refolding reruns only the constant graph (and
recompiles the main graph if the folded tensors' sizes, strides or dtypes changed). Another
module instance's tensors (two instances of one class share the captured graph) are not a
change: each instance keeps its own fold (INSTANCES of them), swapped in by identity.

Memory: the user's tensors are never freed; the folded ones (a BN-folded weight is a copy) are
extra. A graph whose folded constants would take more than FOLD_BUDGET of new memory (the
larger of 256 MiB and a quarter of the module state's bytes) is not frozen; weights are packed
only while the packed copies fit in what is left of that budget.

Weights being trained (parameters that require grad, `model.eval()` under `no_grad()` between
optimizer steps): frozen too, but a refold must pay. When their values changed and the last
fold's cost exceeds REFOLD_SHARE of the time the frozen graph ran since, the graph is compiled
unfrozen for good (an evaluation on every training step, an RL policy acting between updates):
`fold_batchnorm_per_call` then folds eval-mode BatchNorm into the conv/linear inside the graph,
recomputed on every call (nothing to go stale). So is every graph not frozen.

Graphs with symbolic sizes are frozen too (docs/design/058): parameters have static sizes;
what depends on an activation's size (packing a linear for its row count) is decided at the
traced sizes or not done.

Which inputs are module state: `nn.Parameter`s, and inputs whose capture source names a module
attribute (ember's `meta["ember_source"]`, Dynamo's `meta["grapharg"].source`).

Consumes: the captured torch-level fx.GraphModule and its (real) example inputs. Produces: a
FrozenRuntime with the captured graph's calling convention, or None (not frozen).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import operator
import re
import time
import types
import weakref

import torch
import torch.fx as fx
import torch.nn.functional as F

from .. import counters, shapes
from ..logging import get_logger
from ..runtime.pycode import compile_cached
from . import layout
from .prepack import LINEAR_PACKS, prepack_linears
from .speed import is_random

perf_log = get_logger("perf")

MIN_BUDGET = 256 << 20          # bytes of new constants always allowed ...
BUDGET_FRACTION = 0.25          # ... or this fraction of the module state, if larger
REFOLD_SHARE = 0.1              # trained weights: refold while it costs <= this share of the run
INSTANCES = 4                   # module instances whose folds one frozen graph keeps
_STATE_SOURCE = re.compile(r"\]\.|\._parameters\[|\._buffers\[|\._modules\[")
_REAL = (torch.Tensor, torch.nn.Parameter) + (
    (torch.nn.parameter.Buffer,) if hasattr(torch.nn.parameter, "Buffer") else ())


# ---- which inputs are constants -----------------------------------------------------------------
def _source_name(node: fx.Node) -> str:
    src = node.meta.get("ember_source")
    if src is None:
        src = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
        src = src() if callable(src) else src
    return src or ""


def module_state_inputs(gm: fx.GraphModule, example_inputs) -> list[int]:
    """Positions of the placeholders that hold module parameters and buffers. One traced with
    symbolic sizes is not (a DynamicCache's key/value tensors, `L['past_key_values'].layers[0]
    .keys`, look like state by their source but grow every call: folded as constants, each
    call would refold them and rebuild the main graph)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, (n, x) in enumerate(zip(phs, example_inputs))
            if isinstance(x, torch.Tensor) and
            (isinstance(x, torch.nn.Parameter) or _STATE_SOURCE.search(_source_name(n))) and
            not (isinstance(_val(n), torch.Tensor) and shapes.is_symbolic(_val(n)))]


def wants_freeze(gm, options: dict, example_inputs, consts: list[int]) -> str | None:
    """None if this graph is frozen, else why not (for the perf log)."""
    choice = options.get("freeze")
    if choice is False:
        return "options freeze=False"
    if not consts:
        return "no module state among the inputs"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return "a training graph"
    if any(type(example_inputs[i]) not in _REAL for i in consts):
        return "the example inputs are not real tensors"
    if choice:
        return None
    if torch.is_grad_enabled():
        return "grad enabled"
    return None


# ---- BatchNorm folding --------------------------------------------------------------------------
def _bn_scale(var, bn_w, eps):
    s = torch.rsqrt(var.double() + eps)
    return s if bn_w is None else s * bn_w.double()


def bn_folded_weight(w, var, bn_w, eps):
    s = _bn_scale(var, bn_w, eps)
    return (w.double() * s.reshape(-1, *[1] * (w.dim() - 1))).to(w.dtype)


def bn_folded_bias(w, b, mean, var, bn_w, bn_b, eps):
    s = _bn_scale(var, bn_w, eps)
    out = ((b.double() if b is not None else 0.0) - mean.double()) * s
    if bn_b is not None:
        out = out + bn_b.double()
    return out.to(w.dtype)


_BN_SIG = inspect.signature(F.batch_norm)
_CONV_SIG = inspect.signature(lambda input, weight, bias=None, *a: None)
_FOLDS_INTO = {F.conv1d, F.conv2d, F.conv3d, F.linear}


def _bind(sig, node):
    try:
        b = sig.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    b.apply_defaults()
    return b.arguments


def _bn_after_conv(gm: fx.GraphModule):
    """(bn, conv, bn arguments, conv arguments) for each eval-mode F.batch_norm reading a
    conv/linear output that nothing else reads."""
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not F.batch_norm:
            continue
        a = _bind(_BN_SIG, bn)
        if a is None or a["training"] is not False or a["running_mean"] is None or \
                a["running_var"] is None:
            continue
        conv = a["input"]
        if not isinstance(conv, fx.Node) or conv.op != "call_function" or \
                conv.target not in _FOLDS_INTO or len(conv.users) != 1:
            continue
        c = _bind(_CONV_SIG, conv)
        if c is None or c["weight"] is None:
            continue
        if conv.target is F.linear and _val(conv) is not None and _val(conv).dim() != 2:
            continue                     # BatchNorm1d over (N, C, L) normalizes another dim
        yield bn, conv, a, c


def _fold(gm, bn, conv, a, c, weight_fn, bias_fn) -> tuple:
    """Rewrite conv(x, w, b) → bn as conv(x, weight_fn(...), bias_fn(...)); the new nodes."""
    w, b, eps = c["weight"], c["bias"], a["eps"]
    with gm.graph.inserting_before(conv):
        nw = gm.graph.call_function(weight_fn, (w, a["running_var"], a["weight"], eps))
        nb = gm.graph.call_function(bias_fn, (w, b, a["running_mean"], a["running_var"],
                                              a["weight"], a["bias"], eps))
    nw.meta["example_value"] = _val(w)
    nb.meta["example_value"] = torch.empty(_val(w).shape[0], dtype=_val(w).dtype, device="meta")
    conv.args = (conv.args[0], nw, nb, *conv.args[3:])
    conv.kwargs = {k: v for k, v in conv.kwargs.items() if k not in ("weight", "bias")}
    bn.replace_all_uses_with(conv)
    gm.graph.erase_node(bn)
    return nw, nb


def fold_batchnorm(gm: fx.GraphModule, consts: set) -> int:
    """Fold eval-mode F.batch_norm into the conv/linear before it (in place), when every tensor
    involved is a constant: the folded weights join `consts`. How many were folded."""
    folded = 0
    for bn, conv, a, c in _bn_after_conv(gm):
        params = [c["weight"], c["bias"], a["running_mean"], a["running_var"], a["weight"],
                  a["bias"]]
        if all(p is None or p in consts for p in params):
            consts.update(_fold(gm, bn, conv, a, c, bn_folded_weight, bn_folded_bias))
            folded += 1
    return folded


def bn_affine_scale(x_dim, var, bn_w, eps):
    """A frozen BatchNorm's per-channel scale, shaped to broadcast over dim 1 of its input."""
    s = _bn_scale(var, bn_w, eps)
    return s.to(var.dtype).reshape(-1, *[1] * (x_dim - 2))


def bn_affine_shift(x_dim, mean, var, bn_w, bn_b, eps):
    s = _bn_scale(var, bn_w, eps)
    out = -mean.double() * s + (bn_b.double() if bn_b is not None else 0.0)
    return out.to(mean.dtype).reshape(-1, *[1] * (x_dim - 2))


def batchnorm_as_affine(gm: fx.GraphModule, consts: set) -> int:
    """An eval-mode BatchNorm left after folding (one that reads no conv/linear: DenseNet's
    pre-activation BN, LeViT's BN on a reshaped linear output) whose statistics and affine
    parameters are constants becomes `x * scale + shift`, scale and shift computed once in the
    constant graph: the kernel no longer computes rsqrt(var + eps) and four per-channel loads
    for every element. How many."""
    done = 0
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not F.batch_norm:
            continue
        a = _bind(_BN_SIG, bn)
        x = _val(a["input"]) if a is not None else None
        if a is None or a["training"] is not False or not isinstance(x, torch.Tensor) or \
                x.dim() < 2 or x.dtype != torch.float32 or \
                any(p is None or p not in consts for p in (a["running_mean"], a["running_var"])) \
                or any(p is not None and p not in consts for p in (a["weight"], a["bias"])):
            continue
        shape = (_val(a["running_var"]).shape[0], *[1] * (x.dim() - 2))   # static
        g = gm.graph
        with g.inserting_before(bn):
            sc = g.call_function(bn_affine_scale, (x.dim(), a["running_var"], a["weight"],
                                                   a["eps"]))
            sh = g.call_function(bn_affine_shift, (x.dim(), a["running_mean"], a["running_var"],
                                                   a["weight"], a["bias"], a["eps"]))
            mul = g.call_function(operator.mul, (a["input"], sc))
            add = g.call_function(operator.add, (mul, sh))
        for n in (sc, sh):
            n.meta["example_value"] = torch.empty(shape, dtype=x.dtype, device="meta")
            consts.add(n)
        mul.meta["example_value"] = add.meta["example_value"] = _val(bn)
        bn.replace_all_uses_with(add)
        g.erase_node(bn)
        done += 1
    if done:
        counters.bump("batchnorms_as_affine", done)
        perf_log.info("frozen: %d BatchNorms as x * scale + shift", done)
    return done


def _bn_scale_per_call(var, bn_w, eps):
    s = torch.rsqrt(var + eps)
    return s if bn_w is None else s * bn_w


def _bn_weight_per_call(w, var, bn_w, eps):
    return w * _bn_scale_per_call(var, bn_w, eps).reshape(-1, *[1] * (w.dim() - 1))


def _bn_bias_per_call(w, b, mean, var, bn_w, bn_b, eps):
    out = ((b if b is not None else 0.0) - mean) * _bn_scale_per_call(var, bn_w, eps)
    return out if bn_b is None else out + bn_b


def fold_pays(conv: fx.Node, out, w) -> bool:
    """Whether folding a BatchNorm into this conv/linear on each call is cheaper than
    normalizing its output: a pass over the weight against a pass over the output. A conv2d
    with a spatial kernel gets its weight copied into the channels-last layout by oneDNN on
    every call anyway; the fold writes it in that layout instead (layout.py), so it is free."""
    if not isinstance(out, torch.Tensor) or not isinstance(w, torch.Tensor) or \
            w.dtype != torch.float32:
        return False
    return layout.numel_hint(out) >= w.numel() or \
        conv.target is F.conv2d and w.shape[2:].numel() > 1


def fold_batchnorm_per_call(gm: fx.GraphModule) -> int:
    """An inference graph that is not frozen (its parameters require grad, the usual
    `model.eval()` under `torch.no_grad()`): fold eval-mode BatchNorm into the conv/linear
    before it inside the graph, so each call scales the weights (a pass over the weights, in
    float32) instead of normalizing the conv's output (a pass over the activations), and the
    activation after it fuses into the oneDNN conv (layout.py). Only where `fold_pays`. How
    many were folded."""
    folded = 0
    for bn, conv, a, c in _bn_after_conv(gm):
        if fold_pays(conv, _val(conv), _val(c["weight"])):
            _fold(gm, bn, conv, a, c, _bn_weight_per_call, _bn_bias_per_call)
            folded += 1
    if folded:
        gm.graph.lint()
        gm.recompile()
        counters.bump("batchnorm_folded_per_call", folded)
    return folded


def _val(node):
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


# ---- the constant graph --------------------------------------------------------------------------
def constant_nodes(gm: fx.GraphModule, consts: set) -> set:
    """`consts` (placeholders and folded nodes) plus every node computed from them only."""
    out = set(consts)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in gm.graph.nodes:
        if n in out or n.op not in ("call_function", "call_method") or not n.all_input_nodes:
            continue
        if all(i in out for i in n.all_input_nodes) and not is_random(n) and \
                isinstance(_val(n), torch.Tensor) and \
                (not layout.writes_in_place(n) or _writes_constant_copy(n, out, order)):
            out.add(n)
    return out


def _writes_constant_copy(n: fx.Node, out: set, order: dict) -> bool:
    """Whether the in-place op `n` writes into a copy the constant graph makes (Swin v2's
    `b = qkv_bias.clone(); b[C:2 * C].zero_()`), so it can run there too: the written tensor
    is (a view of) a fresh constant node, no placeholder, and nothing outside the constant
    graph reads it before the write (the main graph sees the constant graph's final values)."""
    family = _aliases(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
    return family is not None and all(a in out and a.op != "placeholder" for a in family) and \
        all(u in out or u in family or order[u] > order[n]
            for a in family for u in a.users if u is not n)


#: ops whose result is a new tensor, never a view of an input (a write into the result
#: writes no placeholder); the rest may return an alias (views, `.to()`, `.contiguous()`,
#: eval-mode dropout, in-place ops) and are walked through
_FRESH = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
          "conv_transpose3d", "batch_norm", "layer_norm", "group_norm", "linear", "matmul",
          "mm", "bmm", "addmm", "relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "hardswish",
          "hardsigmoid", "hardtanh", "leaky_relu", "elu", "softmax", "log_softmax", "add",
          "sub", "mul", "truediv", "div", "neg", "exp", "log", "sqrt", "rsqrt", "pow",
          "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
          "interpolate", "cat", "stack", "mean", "sum", "amax", "clone",
          "_convolution_pointwise", "conv2d_add"}


def _fresh(n: fx.Node) -> bool:
    if n.op not in ("call_function", "call_method") or layout.writes_in_place(n):
        return False
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name.split(".")[0] in _FRESH


def written_inputs(gm: fx.GraphModule) -> set:
    """Placeholders an in-place op may write (the written tensor, and what it may be a view
    of, back to a freshly computed tensor): state the graph updates, a KV cache (HF's
    StaticCache is a module attribute), is not a constant. A write into a conv's output
    (ResNet's in-place relu, `out += identity`) writes no weight."""
    out = set()
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method") and layout.writes_in_place(n) and \
                isinstance(n.args[0] if n.args else None, fx.Node):
            out.update(a for a in _aliases(n.args[0]) if a.op == "placeholder")
    return out


def _aliases(x: fx.Node) -> set:
    """`x` and what it may be a view of, back to freshly computed tensors (and placeholders)."""
    todo, seen = [x], set()
    while todo:
        a = todo.pop()
        seen.add(a)
        if not _fresh(a):
            todo.extend(i for i in a.all_input_nodes if i not in seen)
    return seen


_VIEWS = {"view", "reshape", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand",
          "flatten", "detach", "getitem", "narrow", "select", "view_as", "reshape_as",
          "expand_as", "contiguous", "to", "float"}


def _view_of_state(n: fx.Node) -> bool:
    """Whether a constant node is (most likely) a view of the user's tensors, not new memory:
    the freezing budget counts the rest (a gathered relative-position bias, a cat of biases)
    before packing weights into what is left of it."""
    while n.op != "placeholder":
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if name not in _VIEWS or not n.args or not isinstance(n.args[0], fx.Node) or \
                any(isinstance(a, fx.Node) for a in n.args[1:]) and not name.endswith("_as"):
            return False
        n = n.args[0]
    return True


def mutated_constant(gm: fx.GraphModule, const: set) -> bool:
    """Whether a non-constant node writes in place into a constant (then nothing is frozen)."""
    return any(n not in const and layout.writes_in_place(n) and n.args and
               n.args[0] in const for n in gm.graph.nodes)


def copy_constant_outputs(gm: fx.GraphModule, const: set) -> None:
    """A graph output the constant graph computes (not a view of the user's tensors: eager
    returns those as they are) is returned as a copy: the folded tensor lives across calls,
    and a caller writing into what it got (or into the module attribute that
    `nn.utils.weight_norm`'s hook sets to it) would change every later call's answer, where
    eager computes a fresh tensor each call."""
    g = gm.graph
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    for n in out.all_input_nodes:
        if n in const and n.op != "placeholder" and not _view_of_state(n):
            with g.inserting_before(out):
                c = g.call_method("clone", (n,))
            c.meta["example_value"] = _val(n)
            out.replace_input_with(n, c)


def split_constants(gm: fx.GraphModule, const: set):
    """(constant graph, main graph, main's inputs from gm's placeholders, boundary nodes)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    boundary = [n for n in gm.graph.nodes if n in const and
                any(u not in const for u in n.users)]
    cg = fx.Graph()
    env: dict = {}
    for n in phs:
        if n in const:
            env[n] = cg.placeholder(n.name)
    for n in gm.graph.nodes:
        if n in const and n.op != "placeholder":
            env[n] = cg.node_copy(n, lambda x: env[x])
    cg.output(tuple(env[n] for n in boundary))
    mg = fx.Graph()
    menv: dict = {}
    live = [i for i, n in enumerate(phs) if n not in const]
    for i in live:
        menv[phs[i]] = mg.node_copy(phs[i], lambda x: menv[x])
    for k, n in enumerate(boundary):
        p = mg.placeholder(f"frozen_{k}_{n.name}")
        p.meta["example_value"] = _val(n)
        menv[n] = p
    for n in gm.graph.nodes:
        if n.op != "placeholder" and n not in const:
            menv[n] = mg.node_copy(n, lambda x: menv[x])
    const_gm = fx.GraphModule(gm, cg, class_name="EmberConstants")
    main_gm = fx.GraphModule(gm, mg, class_name="EmberFrozen")
    main_gm.meta.update(gm.meta)
    return const_gm, main_gm, live


# ---- runtime -------------------------------------------------------------------------------------
class ConstGraph:
    """The constant graph's generated Python, callable and picklable by reference to its
    functions and ops (fx's own GraphModule pickling re-traces the code, which the fold
    helpers' Python does not survive): what the backend cache stores of a freeze plan."""

    def __init__(self, gm: fx.GraphModule):
        fn = gm.forward
        glb = fn.__globals__
        names = [n for n in fn.__code__.co_names if n in glb]
        self.src = gm.code
        self.refs = {n: glb[n] for n in names if not isinstance(glb[n], types.ModuleType)}
        self.modules = {n: glb[n].__name__ for n in names if isinstance(glb[n], types.ModuleType)}
        self.n_conv = sum(n.target is layout.REORDER for n in gm.graph.nodes)
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        #: outputs that are packed linear weights, and their resident bytes (prepack.py)
        self.linear_packs = {i for i, n in enumerate(outs) if n.target in LINEAR_PACKS}
        self.pack_bytes = sum(outs[i].meta["resident_bytes"] for i in self.linear_packs)
        self.fn = fn

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "fn"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        ns = {**self.refs, **{n: importlib.import_module(m) for n, m in self.modules.items()}}
        exec(compile_cached(self.src, "<ember frozen constants>"), ns)    # noqa: S102
        self.fn = functools.partial(ns["forward"], None)     # forward(self, ...)

    def __call__(self, *args):
        return self.fn(*args)


@dataclasses.dataclass
class FreezePlan:
    """What freezing decided for a graph: the constant graph, which inputs it reads (const_idx)
    and which go to the main graph (live), the memory budget. `main_gm` is None in a plan loaded
    from the backend cache: its compiled main graph is the entry under `main_key`."""
    const: ConstGraph
    main_gm: fx.GraphModule | None
    const_idx: list
    live: list
    budget: float
    n_bn: int
    n_pack: int
    main_key: str | None = None
    n_plain: int = 0                # linears on oneDNN with their plain weight (prepack.py)


class FrozenRuntime:
    """Calls the compiled main graph with the folded constants; refolds when a constant input
    is not the tensor it was, or its version counter or data pointer moved.
    `compile_main(plan, main_args)` compiles (or loads) the plan's main graph; `replan(args)`
    plans afresh (a loaded plan has no main graph to recompile when the folded tensors' sizes
    or strides change); `unfrozen(args)` compiles the graph unfrozen (weights being trained)."""

    def __init__(self, plan, compile_main, args, replan=None, unfrozen=None):
        self.plan, self.compile_main, self.replan = plan, compile_main, replan
        self.unfrozen = unfrozen
        self.refolds = 0
        self.main = self.traced = self.plain = None
        self.others = {}        # ids of another instance's constants -> its fold (_switch)
        self.run = self._checked        # the call path: _arm's straight-line code once built
        self._fast = None               # (its shape, its namespace)
        self._fold(args)

    def build(self, args, main=None) -> None:
        """Compile the main graph for the folded constants of `args` (or use `main`)."""
        if main is None and self.plan.main_gm is None:
            self.plan = self.replan(args)
            self._fold(args)
        self.main = main if main is not None else \
            self.compile_main(self.plan, self.main_args(args))
        self.specs = self._specs()
        inner = getattr(self.main, "traced", None)       # the speed check reads .traced
        self.traced = None if inner is None else types.SimpleNamespace(
            symbols=inner.symbols, mutated=[self.plan.live[i] for i in inner.mutated
                                             if i < len(self.plan.live)])

    def _fold(self, args) -> None:
        start = time.perf_counter()
        self.held = tuple(args[i] for i in self.plan.const_idx)
        self.stamp = [(t._version, t.data_ptr()) for t in self.held]
        with torch.no_grad():
            self.folded = list(self.plan.const(*self.held))
        self.fold_s = time.perf_counter() - start
        self.calls, self.run_s = 0, 0.0      # the main graph's calls and time since this fold

    def _specs(self):
        return [(f.shape, f.stride(), f.dtype, f.device) for f in self.folded]

    def main_args(self, args) -> list:
        return [args[i] for i in self.plan.live] + self.folded

    def fresh(self, args) -> bool:
        cur = [args[i] for i in self.plan.const_idx]
        return all(map(operator.is_, cur, self.held)) and \
            [(t._version, t.data_ptr()) for t in cur] == self.stamp

    def _switch(self, args) -> bool:
        """Whether the call's constants are another module instance's (not the held tensors,
        changed: those refold), now swapped in: two instances of one class compiled apart share
        the captured graph, and each call alternating between them would refold (and, weights
        requiring grad, end unfrozen). Each instance keeps its own fold, up to INSTANCES."""
        cur = [args[i] for i in self.plan.const_idx]
        if all(map(operator.is_, cur, self.held)):
            return False
        specs = self.specs
        self.others[tuple(map(id, self.held))] = (
            [weakref.ref(t) for t in self.held], self.stamp, self.folded)
        entry = self.others.pop(tuple(map(id, cur)), None)
        if entry is not None and all(r() is t for r, t in zip(entry[0], cur)) and \
                [(t._version, t.data_ptr()) for t in cur] == entry[1]:
            self.held, self.stamp, self.folded = tuple(cur), entry[1], entry[2]
            self.calls, self.run_s = 1, 0.0
            return True
        self._fold(args)
        counters.bump("instance_folds")
        if self._specs() != specs:       # another layout or dtype: one main graph, one fold
            self.others.clear()
            self.build(args)
        while len(self.others) >= INSTANCES:
            self.others.pop(next(iter(self.others)))
        return True

    def __call__(self, *args):
        return self.run(args)

    def _checked(self, args):
        """The call, every rule checked in Python: the first call after a build (it loads the
        kernels, untimed), and any call the straight-line path (_arm) refers here."""
        if self.plain is not None:
            return self.plain(*args)
        if not self.fresh(args) and not self._switch(args):
            if self.unfrozen is not None and self.fold_s > REFOLD_SHARE * self.run_s:
                return self._unfreeze(args)
            self._fold(args)
            self.refolds += 1
            counters.bump("refolds")
            perf_log.info("frozen constants changed: refolded (%d)", self.refolds)
            if self._specs() != self.specs:
                self.build(args)
        self.calls += 1
        if self.calls == 1:                  # the first call after a build loads the kernels
            out = self.main(*self.main_args(args))
        else:
            start = time.perf_counter()
            out = self.main(*self.main_args(args))
            self.run_s += time.perf_counter() - start
        self._arm()
        return out

    def _arm(self) -> None:
        """Make the per-call path straight-line code: each held constant's identity, version and
        data pointer compared, then the main graph called on the live inputs and the folded
        tensors; a call failing any comparison goes to `_checked`. The code depends only on
        the plan's positions (generated once); what it compares with and passes lives in its
        namespace, which each fold, refold or instance switch updates. Weights being trained
        (`unfrozen` set) also count the main graph's run time, which decides a refold's worth.
        Saves ~2-3 us per call on a two-constant graph against the checks in Python."""
        p, timed = self.plan, self.unfrozen is not None
        shape = (tuple(p.const_idx), tuple(p.live), len(self.folded), timed)
        if self._fast is None or self._fast[0] != shape:
            self._fast = (shape, self._namespace(shape))
        ns = self._fast[1]
        for k, (t, (version, ptr)) in enumerate(zip(self.held, self.stamp)):
            ns[f"h{k}"], ns[f"v{k}"], ns[f"p{k}"] = t, version, ptr
        for k, f in enumerate(self.folded):
            ns[f"f{k}"] = f
        ns["main"] = self.main
        self.run = ns["run"]

    def _namespace(self, shape) -> dict:
        const_idx, live, n_folded, timed = shape
        checks = [f"a[{i}] is h{k} and h{k}._version == v{k} and h{k}.data_ptr() == p{k}"
                  for k, i in enumerate(const_idx)]
        call = "main(" + "".join(f"a[{i}], " for i in live) + \
            "".join(f"f{k}, " for k in range(n_folded)) + ")"
        lines = ["def run(a):", "    if (" + ("\n            and ".join(checks) or "True") + "):"]
        if timed:
            lines += ["        t0 = clock()", f"        out = {call}",
                      "        rt.run_s += clock() - t0", "        rt.calls += 1",
                      "        return out"]
        else:
            lines.append(f"        return {call}")
        lines.append("    return checked(a)")
        ns = {"checked": self._checked, "clock": time.perf_counter, "rt": self}
        exec(compile_cached("\n".join(lines) + "\n", "<ember frozen call>"), ns)  # noqa: S102
        return ns

    def _unfreeze(self, args):
        """The weights changed again before their last fold paid off: compile the graph
        unfrozen, drop the folded copies, and run that from now on."""
        perf_log.info("frozen weights changed after %d calls (%.1f ms of run time); folding "
                      "takes %.1f ms: compiled unfrozen from now on", self.calls,
                      self.run_s * 1e3, self.fold_s * 1e3)
        counters.bump("unfrozen_graphs")
        self.plain = self.unfrozen(list(args))
        self.main = self.held = self.folded = self._fast = None
        self.run = self._checked
        return self.plain(*args)


def new_bytes(folded, held, linear_packs=(), packed=True) -> int:
    """Bytes of the folded constants that are not storage of the user's tensors, but for the
    positions in `linear_packs` (MKL-packed linear weights, whose resident size the caller
    counts: their numel is what MKL reserves, mostly untouched). `packed`: counting oneDNN-packed
    conv weights, which `options={"prepack": True}` allows beyond the budget."""
    own = {t.untyped_storage().data_ptr() for t in held}
    seen, total = set(), 0
    for i, f in enumerate(folded):
        if i in linear_packs:
            continue
        if f.layout != torch.strided:          # a oneDNN-packed conv weight: no storage
            total += f.numel() * f.element_size() if packed else 0
            continue
        p = f.untyped_storage().data_ptr()
        if p not in own and p not in seen:
            seen.add(p)
            total += f.untyped_storage().nbytes()
    return total


def state_bytes(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())


def _bytes(node) -> int:
    v = _val(node)
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def why_not(gm: fx.GraphModule, example_inputs, options: dict) -> str | None:
    """None if this graph is frozen (unless `plan` finds a reason), else why not."""
    return wants_freeze(gm, options, example_inputs, module_state_inputs(gm, example_inputs))


def plan(gm: fx.GraphModule, example_inputs, options: dict) -> FreezePlan | str:
    """The rewrites of a graph `why_not` lets freeze (BatchNorm folding, layout, packing, the
    constant graph split off), or why it is not frozen after all."""
    idx = module_state_inputs(gm, example_inputs)
    work = copy_module(gm)
    phs = [n for n in work.graph.nodes if n.op == "placeholder"]
    consts = {phs[i] for i in idx} - written_inputs(work)
    if not consts:
        return "the graph writes into all its module state"
    budget = max(MIN_BUDGET, BUDGET_FRACTION * state_bytes(
        x for x, n in zip(example_inputs, phs) if n in consts))
    # a weight computed from constants only (a weight norm, a standardized weight) is a
    # constant before BatchNorm folding and conv prepacking see it: folded, then packed
    consts = constant_nodes(work, consts)
    computed_early = set(consts)
    n_bn = fold_batchnorm(work, consts)
    batchnorm_as_affine(work, consts)
    layout.plan(work, example_inputs, options, consts=consts)
    folded = consts - computed_early
    consts = constant_nodes(work, consts)   # a bias the graph computes from constants too
    computed = {n for n in consts - folded if n.op != "placeholder" and
                not _view_of_state(n) and any(u not in consts for u in n.users)}
    n_pack, n_plain = prepack_linears(work, example_inputs, consts, options,
                                      budget - sum(map(_bytes, folded | computed)))
    const = constant_nodes(work, consts)
    if mutated_constant(work, const):
        return "the graph writes into a module's parameter or buffer"
    copy_constant_outputs(work, const)
    const_gm, main_gm, live = split_constants(work, const)
    return FreezePlan(ConstGraph(const_gm), main_gm, [i for i, n in enumerate(phs) if n in const],
                      live, budget, n_bn, n_pack, n_plain=n_plain)


def freeze(p: FreezePlan, example_inputs, options: dict, compile_main, replan, unfrozen,
           main=None):
    """A FrozenRuntime for plan `p`, or None when its folded constants are over the budget or
    the main graph writes into one. `main`: the compiled main graph, when loaded."""
    start = time.perf_counter()
    trained = options.get("freeze") is not True and any(
        example_inputs[i].requires_grad for i in p.const_idx)
    rt = FrozenRuntime(p, compile_main, list(example_inputs), replan,
                       unfrozen if trained else None)
    packed = options.get("prepack") is not True
    extra = new_bytes(rt.folded, rt.held, p.const.linear_packs, packed) + \
        (p.const.pack_bytes if packed else 0)
    if extra > p.budget:
        perf_log.info("not frozen: folded constants would add %d MiB (budget %d MiB)",
                      extra >> 20, int(p.budget) >> 20)
        return None
    rt.build(list(example_inputs), main)
    if rt.traced is not None and any(i >= len(p.live) for i in rt.main.traced.mutated):
        perf_log.info("not frozen: the graph writes into a folded constant")
        return None
    counters.bump("frozen_graphs")
    counters.bump("prepacked_linears", p.n_pack)
    counters.bump("onednn_plain_linears", p.n_plain)
    counters.bump("prepacked_convs", p.const.n_conv)
    perf_log.info("frozen: %d constant inputs, %d BatchNorms folded, %d linears and %d convs "
                  "prepacked, %d folded tensors (+%d KiB), %.0f ms", len(rt.held), p.n_bn,
                  p.n_pack, p.const.n_conv, len(rt.folded), extra >> 10,
                  (time.perf_counter() - start) * 1e3)
    return rt


def copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` whose graph a pass may rewrite (nodes' meta shared, not copied)."""
    g = fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    out = fx.GraphModule(gm, g, class_name=type(gm).__name__)
    out.meta.update(gm.meta)
    return out
