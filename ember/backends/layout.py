"""Backend "ember", layout planning: convolution graphs run channels-last on oneDNN.

On CPU, oneDNN convolutions are fastest on channels-last (NHWC) activations, and its fused
`mkldnn::_convolution_pointwise` op (public, what torch exposes for CPU inference) also applies
the activation after the conv in the same pass. For an inference graph (no input requires grad
while grad is enabled; the op has no derivative) this pass rewrites, in the torch-level graph,

    y = act(conv2d(x, w, b, stride, padding, dilation, groups))
 →  y = mkldnn._convolution_pointwise(x.contiguous(channels_last), w, b, ..., "act")

and a residual add after a conv (with a relu after it) joins the conv as oneDNN's binary
post-op, `conv2d_add(x, other, w, b, ..., "relu")` (FUSE_ADD_MAX_REDUCTION). Conv outputs are
channels-last and the pointwise work, BatchNorm, pooling, interpolation and
cat after them keep that layout (their traced strides follow their inputs'). A conversion is
inserted only where a conv's input is not channels-last already: the graph input once, and
again after an op that returns a contiguous tensor (a channel shuffle's `.contiguous()`).
Every 4-D graph output comes back in the layout the captured graph had (NCHW in → NCHW out,
channels_last in → channels_last out). With frozen weights (freeze.py) the weights are
reordered once, in the constant graph, into oneDNN's blocked layout
(`mkldnn._reorder_convolution_weight`; `options={"prepack": False}`: channels-last instead); a
weight the graph computes (a BatchNorm folded on each call) is written channels-last where it
is computed (oneDNN would copy it into that layout on every call). An inference conv whose
channels-last input pixels alias in the L1 cache (`l1_aliased`, docs/design/079) is the
exception: it runs the same fused op on NCHW, oneDNN's blocked kernel.

A training graph keeps each conv2d (the fused op has no derivative) and only converts its input:
`conv2d(relayout(x, channels_last, x's layout), w, b, ...)`; aot then traces the convs,
BatchNorm, pooling and their backward in NHWC. `relayout` also puts each gradient back in its
value's layout where it crosses a conversion (an NCHW output's tangent enters the backward
channels-last, a converted input's gradient leaves in the input's layout).

An inference graph's conv1d runs the same way, as a one-row conv2d on `x.unsqueeze(2)`
(`[N, C, L]` stored `[N, L, C]`), decided per region of convs joined through [N, C, ·]
tensors: all of a region channels-last or none of it (`_conv1d_rows`, docs/design/088).

Cost rule (docs/design/024-layout-and-freezing.md): rewrite a CPU graph with at least one
float32 conv2d that has integer padding; a training graph only when its conv input activations
hold at least TRAIN_MIN_ACTIVATIONS_PER_WEIGHT elements per element of the conv weights read
from parameters (their gradients come back channels-last and are copied into the parameters'
layout; a weight the graph computes, e.g. standardized, is not counted) and the elements
converted at its boundary stay under TRAIN_MAX_BOUNDARY_PER_ACTIVATION per activation; an inference
graph only when its `.contiguous()` calls between convs (channel shuffles) copy less than
INFER_MAX_SHUFFLED_PER_ACTIVATION elements per conv input element, its boundary conversions
stay under INFER_MAX_BOUNDARY_PER_ACTIVATION per activation and, its weights not frozen,
its conv activations hold at least INFER_MIN_ACTIVATIONS_PER_WEIGHT elements per weight element
(oneDNN reorders plain weights for a channels-last input on every call).
`options={"layout": "contiguous"}` turns the pass off, `"channels_last"` skips the cost rules.
Layout-sensitive ops (as_strided, storage/stride queries) keep the whole graph in the captured
layout: their arguments were computed for the captured strides.

Consumes and produces: a torch-level fx.GraphModule (rewritten in place).
"""
from __future__ import annotations

import math
import operator
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from .. import counters, shapes
from ..logging import get_logger

perf_log = get_logger("perf")

CONV_POINTWISE = torch.ops.mkldnn._convolution_pointwise.default
CL = torch.channels_last
BINARY = torch.ops.mkldnn._convolution_pointwise.binary
REORDER = torch.ops.mkldnn._reorder_convolution_weight.default
#: frozen graphs: conv weights reordered once into oneDNN's blocked layout (docs/design/024)
PACK_CONV_WEIGHTS = True


@torch.library.custom_op("ember::conv2d_add", mutates_args=())
def conv2d_add(x: torch.Tensor, other: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor], padding: list[int], stride: list[int],
               dilation: list[int], groups: int, unary: str,
               scalars: list[float]) -> torch.Tensor:
    """unary(conv2d(x, weight, bias) + other) in one oneDNN pass (a binary post-op): the
    residual add of an inference graph. `mkldnn::_convolution_pointwise.binary` has no meta
    kernel, so aot could not trace it; this op is it with one."""
    return BINARY(x, other, weight, bias, padding, stride, dilation, groups, "add", 1.0,
                  None if unary == "none" else unary, scalars, None)


@conv2d_add.register_fake
def _(x, other, weight, bias, padding, stride, dilation, groups, unary, scalars):
    return torch.empty_like(other, memory_format=CL)     # the op's output: like other, NHWC


CONV_ADD = torch.ops.ember.conv2d_add.default

#: activations oneDNN applies inside the conv: target → (attr, scalars from the call)
_UNARY = {
    torch.relu: ("relu", lambda a, k: []), F.relu: ("relu", lambda a, k: []),
    "relu": ("relu", lambda a, k: []),
    torch.sigmoid: ("sigmoid", lambda a, k: []), "sigmoid": ("sigmoid", lambda a, k: []),
    torch.tanh: ("tanh", lambda a, k: []), "tanh": ("tanh", lambda a, k: []),
    F.silu: ("swish", lambda a, k: []), F.hardswish: ("hardswish", lambda a, k: []),
    F.hardsigmoid: ("hardsigmoid", lambda a, k: []),
    F.relu6: ("hardtanh", lambda a, k: [0.0, 6.0]),
    F.hardtanh: ("hardtanh", lambda a, k: [float(a[1] if len(a) > 1 else k.get("min_val", -1.0)),
                                           float(a[2] if len(a) > 2 else k.get("max_val", 1.0))]),
}
_LAYOUT_SENSITIVE = {"as_strided", "as_strided_", "set_", "data_ptr", "untyped_storage",
                     "storage_offset", "stride", "is_contiguous"}


def _val(node):
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def _pair(v):
    """[h, w] of a conv argument, or None if it is not made of python ints (a size-derived
    SymInt: `dilation=[x.size(0)]` in a dynamic graph; int() on it would specialize)."""
    v = [v] * 2 if isinstance(v, int) else list(v)
    return v if all(type(x) is int for x in v) else None


def _call_args(node: fx.Node, target, dim: int):
    """A float32 `target` call's arguments by name (conv1d/conv2d on a `dim`-D input, integer
    padding and groups), else None."""
    if node.op != "call_function" or node.target is not target:
        return None
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    a = dict(zip(names, (None, None, None, 1, 0, 1, 1)))
    a.update(zip(names, node.args))
    a.update(node.kwargs)
    x, w = _val(a["input"]), _val(a["weight"])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != dim or \
            x.dtype != torch.float32 or w.dtype != torch.float32 or \
            isinstance(a["padding"], str) or not isinstance(a["groups"], int):
        return None
    return a


def _conv1d_args(node: fx.Node):
    """(x, w, b, padding, stride, dilation, groups) of a conv1d call as the one-row conv2d
    it runs as ([1, k] kernel on [N, C, 1, L]; x and w still the 3-D nodes), else None."""
    a = _call_args(node, F.conv1d, 3)
    if a is None:
        return None
    row = []
    for k, pad in (("padding", 0), ("stride", 1), ("dilation", 1)):
        v = a[k][0] if isinstance(a[k], (tuple, list)) and len(a[k]) == 1 else a[k]
        if type(v) is not int:
            return None
        row.append([pad, v])
    return (a["input"], a["weight"], a["bias"], *row, a["groups"])


def _conv_args(node: fx.Node, rows=frozenset()):
    """(x, w, b, padding, stride, dilation, groups) of an eligible conv2d call, or of a conv1d
    in `rows` (see _conv1d_rows), else None."""
    if node in rows:
        return _conv1d_args(node)
    a = _call_args(node, F.conv2d, 4)
    if a is None:
        return None
    x = _val(a["input"])
    if x.shape[2] * x.shape[3] == 1:
        # a conv on a pooled vector (squeeze-excite, a classifier head) is a small GEMM with
        # no layout to choose; oneDNN's fused op costs a fixed ~30 us per call there (1 thread,
        # [8,256,1,1] -> 16 channels + relu: 36 us with a prepacked weight, aten conv2d + relu
        # 8.5 us), and the activation after it fuses into ember's next kernel instead
        return None
    padding, stride, dilation = (_pair(a[k]) for k in ("padding", "stride", "dilation"))
    if padding is None or stride is None or dilation is None:
        return None
    return (a["input"], a["weight"], a["bias"], padding, stride, dilation, a["groups"])


def _fused_activation(conv: fx.Node, order: dict):
    """(activation node, attr, scalars) when a fusable activation reads the conv's output
    first: as its only user, or in place (`F.relu(y, inplace=True)`, `y.relu_()`) before the
    conv's other users read the activated tensor."""
    if not conv.users:
        return None
    act = min(conv.users, key=lambda n: order.get(n, len(order)))
    name = act.target if act.op == "call_method" else getattr(act.target, "__name__", "")
    inplace = act.kwargs.get("inplace") is True or name.endswith("_")
    if len(conv.users) != 1 and not inplace:
        return None
    key = act.target if act.op == "call_function" else \
        (act.target.rstrip("_") if act.op == "call_method" else None)
    if act.op == "call_function" and name.endswith("_"):
        key = getattr(F, name.rstrip("_"), None)   # F.relu_, F.hardtanh_
    entry = _UNARY.get(key)
    if entry is None or not act.args or act.args[0] is not conv or \
            any(a is conv for a in (*act.args[1:], *act.kwargs.values())):
        return None
    try:
        return act, entry[0], entry[1](act.args, act.kwargs)
    except (TypeError, ValueError):
        return None


def numel_hint(t: torch.Tensor) -> int:
    """`t.numel()` at the traced sizes: a cost rule's input, never a guard (comparing a
    symbolic numel would record one and pin the dynamic graph to the rule's side of it)."""
    return math.prod(shapes.hint_int(s) for s in t.shape)


def symbolic(gm: fx.GraphModule) -> bool:
    """Whether capture traced some input with symbolic sizes (dynamic shapes)."""
    return any(isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and
               shapes.is_symbolic(v) for v in (_val(n) for n in gm.graph.nodes
                                                if n.op == "placeholder"))


LAYOUTS = ("auto", "channels_last", "contiguous")
#: training: rewrite when the convs' input activations hold at least this many elements per
#: conv weight element. oneDNN returns a channels-last input's weight gradients channels-last,
#: and autograd copies each into its parameter's (NCHW) layout: a cost that grows with the
#: weights, where the gain (convs, BatchNorm, pooling on NHWC) grows with the activations.
#: Recalibrated on the broad suite's sizes (benchmarks/layout_ab.py --mode train, 1 thread,
#: channels-last / NCHW vs eager, docs/design/024): resnet18 b4 (0.78) 1.19/1.16, resnet50 b2
#: (0.91) 1.11/1.11, resnext50 b2 (1.22) 1.18/1.07, dla34 b4 (1.46) 1.15/1.21, cspresnet50 b4
#: (1.62) 1.05/1.05, poolformer_s12 b4 (1.99) 1.30/1.04; it was 2 (resnet18 b8 at 160: 0.92/1.02).
TRAIN_MIN_ACTIVATIONS_PER_WEIGHT = 1.0
#: training: stay NCHW when the elements converted at the graph's boundary (NCHW inputs that
#: reach a conv and their gradients, NCHW outputs computed from a conv and their tangents) are
#: over this many per conv input activation element: a graph of a few convs between NCHW
#: inputs and outputs (a graph break, the op sweep's conv+BN rows) spends more on the four
#: conversions than channels-last saves. Measured (conv-BN-act stacks of depth d, b8, NCHW
#: input requiring grad, 4-D output, 1 thread; 4/d conversions per activation; ember
#: channels-last / NCHW vs eager): depthwise 144x56x56 d=1 0.96/1.38, d=2 1.08/1.12, d=4
#: 1.33/1.15; dense 3x3 64x56x56 d=1 0.90/1.08, d=2 1.14/1.20, d=4 1.16/1.05.
TRAIN_MAX_BOUNDARY_PER_ACTIVATION = 1.5
#: inference: stay in the captured layout when the NCHW `.contiguous()` calls between convs
#: (channel shuffles) copy at least this many elements per conv input activation element. In
#: a channels-last region each is a transposing copy to NCHW and the next conv's conversion a
#: second one. Measured (benchmarks/layout_ab.py, b8/b4, 1 thread, docs/design/024):
#: shufflenet_v2 (0.40) 1.22x eager channels-last vs 1.43x NCHW; coat_lite_tiny (0.18, a
#: token-to-image permute before each patch embedding) 1.08x channels-last vs 1.04x NCHW.
INFER_MAX_SHUFFLED_PER_ACTIVATION = 0.25
#: inference, weights not frozen: rewrite when the convs' input activations hold at least this
#: many elements per conv weight element. oneDNN reorders a plain weight into its blocked
#: layout on every channels-last call (NCHW 1x1 convs run as a GEMM on the weight as it is),
#: a cost that grows with the weights, where the gain grows with the activations. Measured
#: (benchmarks/layout_ab.py, 1 thread, docs/design/024), channels-last vs NCHW: wide_resnet50_2
#: b1 (0.21) 0.88x vs 1.05x eager, fcn_resnet50 b1 (0.72) 0.98x vs 1.04x, resnet18 b4 (0.78)
#: 1.23x vs 1.15x. Frozen weights are reordered once: the rule does not apply.
INFER_MIN_ACTIVATIONS_PER_WEIGHT = 0.75
#: inference: stay in the captured layout when the elements converted at the graph's boundary
#: (NCHW inputs that reach a conv, NCHW outputs computed from a conv) are over this many per
#: conv input activation element, as TRAIN_MAX_BOUNDARY_PER_ACTIVATION for training. Measured
#: (conv-BN-act stacks of depth d, b8, NCHW in and out, frozen weights, 1 thread, Zen 4, load
#: 15; 2/d conversions per activation; ember channels-last / NCHW vs eager, docs/design/067):
#: depthwise 144x56x56 d=1 0.72/1.20, d=2 1.08/1.21, d=4 1.41/1.22; dense 3x3 64x56x56 d=1
#: 0.93/1.03, d=2 1.02/1.03, d=4 1.12/1.05.
INFER_MAX_BOUNDARY_PER_ACTIVATION = 0.75


#: inference: a conv whose channels-last input pixels alias in the L1 cache runs NCHW instead
#: (oneDNN's blocked nChw16c kernel, the one eager NCHW gets). With an NHWC input, oneDNN's
#: brgconv kernel reads the pixels of an output row at a step of stride x C_in x 4 bytes; at a
#: multiple of 4 KiB they all fall in one L1 set, and past some row width the kernel misses in
#: L1. Measured (benchmarks/conv_alias.py, 1 thread, Zen 4, b1, 3x3 unless stated; channels-last
#: prepacked / NCHW speed; benchmarks/results/conv_alias_2026-12-07_s24_zen4.txt), stride 1:
#: C_in 1024 -> 512 at output width 16/18/20/24/28: 1.19/1.14/1.12/1.00/0.88; C_in 1024 -> 256
#: at 56: 0.66; C_in 2048 -> 512 at 28/14/7: 0.88/1.03/2.08; C_in 3072 at 28: 0.88; not
#: aliased, C_in 960/1536 at 28: 1.07/1.08, 512/768 at 56: 0.98/0.91; C_out 64/128 (C_in 1024,
#: 28): 1.13/1.09; 5x5: 0.86; dilation 2/12: 0.94/1.18; a 1x1 conv (a GEMM over contiguous
#: pixels): 1.12. Stride 2, output width 28: C_in 512 (a 4 KiB step) 0.88-0.90, C_in 1024
#: 0.85, C_in 384 and 256: 1.15/1.14; output width 14, C_in 512: 0.95.
ALIAS_BYTES = 4096
ALIAS_MIN_OUT_WIDTH = 28
ALIAS_MIN_OUT_CHANNELS = 256
ALIAS_MAX_DILATION = 2


def l1_aliased(x: torch.Tensor, w: torch.Tensor, padding, stride, dilation, groups) -> bool:
    """Whether oneDNN's channels-last kernel loses to its blocked NCHW one on this inference
    conv: a spatial kernel reading channels-last pixels a multiple of ALIAS_BYTES apart for
    neighbouring outputs, on output rows at least ALIAS_MIN_OUT_WIDTH wide (see ALIAS_BYTES)."""
    c_in, kh, kw = w.shape[1:]
    # [-1]: the width's entry (a one-element list, `dilation=[2]`, holds both)
    out_w = (shapes.hint_int(x.shape[3]) + 2 * padding[-1] - dilation[-1] * (kw - 1) - 1) \
        // stride[-1] + 1
    return groups == 1 and kh * kw > 1 and max(dilation) <= ALIAS_MAX_DILATION and \
        stride[-1] * c_in * x.element_size() % ALIAS_BYTES == 0 and \
        w.shape[0] >= ALIAS_MIN_OUT_CHANNELS and out_w >= ALIAS_MIN_OUT_WIDTH


def _conv1d_rows(gm: fx.GraphModule, example_inputs) -> set:
    """The conv1d nodes of an inference graph that run as one-row channels-last conv2d on
    oneDNN (`[N, C, L]` stored as `[N, L, C]`). Decided per region, not per conv: a region
    is the convs joined through the [N, C, ·] tensors between them (pointwise ops, norms,
    pads and slices along L keep N and C; a transpose, a reshape or a GEMM ends it). The ops
    inside a region follow their inputs' layout, so a region in one layout pays its
    conversions at its ends only; a region in two (s24: wav2vec2's feature encoder, one conv
    channels-last, the next NCL) transposes every activation between them (0.90x eager). A
    region runs channels-last when none of its convs is l1_aliased as a one-row conv2d (those
    lose channels-last: wav2vec2's 512-channel stride-2 convs 0.82-0.88x); the graph-wide
    rules of why_not weigh its boundary conversions and weights. Measured (1 thread, Zen 4,
    benchmarks/conv1d_layout.py, docs/design/088), ATen NCL / channels-last prepacked:
    wav2vec2's first conv (1 -> 512, k 10, s 5) 1.57x, its positional conv (384, k 128,
    16 groups) 2.6x, whisper's stems (80 -> 384 k 3; 384 -> 384 k 3 s 2) 1.10x / 1.05x,
    depthwise k 4 (Mamba) 3.2x, depthwise k 31 (Conformer) 13.9x, dilated k 3 (TCN) 1.1-1.5x,
    k 1 1.18x."""
    if training_graph(example_inputs):
        return set()
    args = {n: a for n in gm.graph.nodes if (a := _conv1d_args(n)) is not None}
    if not args:
        return set()
    parent: dict = {}

    def find(n):
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    for n in gm.graph.nodes:
        if n in args:
            parent[find(n)] = find(args[n][0])      # a conv joins its input's region
        elif n.op in ("call_function", "call_method") and _nc(_val(n)) is not None:
            for i in n.all_input_nodes:
                if _nc(_val(i)) == _nc(_val(n)):
                    parent[find(i)] = find(n)
    regions: dict = {}
    for n in args:
        regions.setdefault(find(n), []).append(n)
    rows = set()
    for convs in regions.values():
        if not any(l1_aliased(_val(x).unsqueeze(2), _val(w).unsqueeze(2), pad, stride, dil, g)
                   for x, w, _, pad, stride, dil, g in map(args.get, convs)):
            rows.update(convs)
    return rows


def _nc(t) -> tuple | None:
    """(N, C) of a 3-D tensor at its traced sizes (no guard on a symbolic size), else None."""
    return tuple(shapes.hint_int(d) for d in t.shape[:2]) \
        if isinstance(t, torch.Tensor) and t.dim() == 3 else None


def training_graph(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def why_not(gm: fx.GraphModule, example_inputs, options: dict,
            frozen: bool = False) -> str | None:
    """None if the graph is rewritten channels-last, else why not. `frozen`: its conv weights
    are constants, reordered once (no per-call weight reorder to weigh)."""
    choice = options.get("layout", "auto")
    if choice is False:
        choice = "contiguous"
    if choice == "contiguous":
        return "options layout=contiguous"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if not tensors or any(x.device.type != "cpu" for x in tensors):
        return "not a CPU graph"
    if symbolic(gm) and training_graph(example_inputs):
        return "a training graph with dynamic sizes"
    for n in gm.graph.nodes:
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        name = name.split(".")[0]            # torch.ops.aten.as_strided.default
        if n.op in ("call_function", "call_method") and name in _LAYOUT_SENSITIVE:
            return f"a layout-sensitive op ({name})"
    rows = _conv1d_rows(gm, example_inputs)
    convs = [a for a in (_conv_args(n, rows) for n in gm.graph.nodes) if a is not None]
    if not convs:
        return "no float32 conv2d (or conv1d region to run channels-last)"
    acts = sum(numel_hint(_val(a[0])) for a in convs)
    weights = sum(numel_hint(_val(a[1])) for a in convs)
    if choice == "auto" and not training_graph(example_inputs):
        shuffled = _between_convs(gm.graph, convs, rows)
        if not frozen and acts < INFER_MIN_ACTIVATIONS_PER_WEIGHT * weights:
            return (f"an inference graph whose conv activations ({acts}) are under "
                    f"{INFER_MIN_ACTIVATIONS_PER_WEIGHT:g}x its conv weights ({weights}): "
                    "oneDNN would reorder each plain weight for its channels-last input on "
                    "every call")
        if shuffled >= INFER_MAX_SHUFFLED_PER_ACTIVATION * acts:
            return (f"an inference graph whose .contiguous() calls between convs (a channel "
                    f"shuffle) copy {shuffled} elements, at least "
                    f"{INFER_MAX_SHUFFLED_PER_ACTIVATION:g}x its conv activations ({acts}): "
                    "each makes the region NCHW and the next conv converts it back")
        boundary = _boundary_conversions(gm, example_inputs, training=False, rows=rows)
        if boundary is not None and boundary > INFER_MAX_BOUNDARY_PER_ACTIVATION * acts:
            return (f"an inference graph whose NCHW inputs and outputs would be converted at "
                    f"its boundary ({boundary} elements), over "
                    f"{INFER_MAX_BOUNDARY_PER_ACTIVATION:g}x its conv activations ({acts})")
    if choice == "auto" and training_graph(example_inputs):
        params = sum(numel_hint(_val(a[1])) for a in convs if not _computed_beyond_views(a[1]))
        if acts < TRAIN_MIN_ACTIVATIONS_PER_WEIGHT * params:
            return (f"a training graph whose conv activations ({acts}) are under "
                    f"{TRAIN_MIN_ACTIVATIONS_PER_WEIGHT:g}x its conv weights read from "
                    f"parameters ({params})")
        if any(_makes_contiguous(n) for n in gm.graph.nodes):
            return ("a training graph with a .contiguous() (a channel shuffle): its region "
                    "would be converted to NCHW and back, forward and backward")
        boundary = _boundary_conversions(gm, example_inputs)
        if boundary is not None and boundary > TRAIN_MAX_BOUNDARY_PER_ACTIVATION * acts:
            return (f"a training graph whose NCHW inputs, outputs and their gradients would "
                    f"be converted at its boundary ({boundary} elements), over "
                    f"{TRAIN_MAX_BOUNDARY_PER_ACTIVATION:g}x its conv activations ({acts})")
    return None


def _boundary_conversions(gm: fx.GraphModule, example_inputs, training=True,
                          rows=frozenset()) -> int | None:
    """Elements a channels-last step converts at the graph's boundary: each NCHW 4-D input
    that reaches a conv (converted in the forward; in training its gradient converted back
    when it requires grad) and each 4-D output computed from a conv that eager returns NCHW
    (converted in the forward; in training its tangent converted in the backward); the same
    for the [N, C, L] inputs and outputs of `rows` (conv1d run channels-last). None: the
    graph does not run on meta tensors (plan keeps it as captured)."""
    eager = eager_layouts(gm, example_inputs)
    if eager is None:
        return None
    g = gm.graph
    convs = [n for n in g.nodes if _conv_args(n, rows) is not None]
    # the inputs a conv input is computed from without a conv in between (a conv's output
    # is channels-last already; its weight is not converted)
    after, before = _downstream(convs), _upstream((_conv_args(n, rows)[0] for n in convs),
                                                  set(convs))
    total = 0
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    for n, x in zip(placeholders, example_inputs):
        if n in before and _nchw(x):
            total += x.numel() * (2 if training and x.requires_grad else 1)
    # a conv1d row converts its input where eager stores it [N, C, L] and no row computed it
    # (a transposed [N, L, C] activation is channels-last already)
    after1 = _downstream(rows)
    total += sum(eager[x].numel() for x in {_conv_args(n, rows)[0] for n in rows}
                 if x not in after1 and _ncl(eager.get(x)))
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    found = []
    fx.node.map_arg(out.args[0], found.append)
    for v in found:
        if v in after and _nchw(eager.get(v)) or v in after1 and _ncl(eager.get(v)) and \
                any(_nc(_val(r)) == _nc(eager[v]) for r in _upstream([v]) & rows):
            total += (2 if training else 1) * eager[v].numel()
    return total


def _nchw(t) -> bool:
    """A 4-D tensor stored NCHW whose channels-last layout differs."""
    return isinstance(t, torch.Tensor) and t.dim() == 4 and _format(t) is not None and \
        _format(t) != CL and _channels_last(t, sizes_only=True)


def _ncl(t) -> bool:
    """A 3-D tensor stored [N, C, L] whose channels-last layout ([N, L, C]) differs."""
    return isinstance(t, torch.Tensor) and t.dim() == 3 and t.is_contiguous() and \
        t.shape[1] != 1 and t.shape[2] != 1


def _between_convs(g: fx.Graph, convs, rows=frozenset()) -> int:
    """Elements written by the NCHW `.contiguous()` calls on a path from a conv's output to a
    conv's input (ShuffleNet's channel shuffle; not an attention block's after the last conv)."""
    after = _downstream([n for n in g.nodes if _conv_args(n, rows) is not None])
    before = _upstream(a[0] for a in convs)
    return sum(numel_hint(_val(n)) for n in after & before
               if _makes_contiguous(n) and isinstance(_val(n), torch.Tensor))


def _downstream(nodes) -> set:
    """The nodes computed from `nodes` (themselves included)."""
    seen, todo = set(nodes), list(nodes)
    while todo:
        for u in todo.pop().users:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _upstream(nodes, stop=frozenset()) -> set:
    """The nodes `nodes` are computed from (themselves included), not walking past `stop`."""
    seen, todo = set(), [n for n in nodes if isinstance(n, fx.Node)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            if n not in stop:
                todo.extend(n.all_input_nodes)
    return seen


def _makes_contiguous(n: fx.Node) -> bool:
    """`t.contiguous()` (NCHW), as ShuffleNet's channel shuffle ends."""
    return (n.op == "call_method" and n.target == "contiguous" or
            n.op == "call_function" and n.target is torch.Tensor.contiguous) and \
        n.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format


def plan(gm: fx.GraphModule, example_inputs, options: dict, consts=None) -> bool:
    """Rewrite `gm` in place (see the module docstring); whether it was rewritten. `consts`:
    nodes holding frozen weights, converted to channels-last once, in the constant graph."""
    why = why_not(gm, example_inputs, options, frozen=consts is not None)
    if why is not None:
        perf_log.info("layout: kept as captured: %s", why)
        return False
    eager = eager_layouts(gm, example_inputs)
    if eager is None:
        perf_log.info("layout: kept as captured: the graph does not run on meta tensors")
        return False
    g = gm.graph
    order = {n: i for i, n in enumerate(g.nodes)}
    training = training_graph(example_inputs)
    rows = _conv1d_rows(gm, example_inputs)
    row_outs = []                            # the rewritten rows' [N, C, L] outputs
    n_conv = n_nchw = 0
    for conv in list(g.nodes):
        args = _conv_args(conv, rows)
        if args is None:
            continue
        x, w, b, padding, stride, dilation, groups = args
        if conv in rows:                     # [N, C, L] as [N, C, 1, L], its weight [O, I, 1, k]
            with g.inserting_before(conv):
                x, w = (_unsqueezed(g, t, consts) for t in (x, w))
        if training:        # the fused op has no derivative: conv2d itself, on a channels-last x
            with g.inserting_before(conv):
                xcl = g.call_function(relayout, (x, CL, None))
            xcl.meta["example_value"] = _val(x)
            conv.replace_input_with(x, xcl)
            n_conv += 1
            continue
        fused = _fused_activation(conv, order)
        act, attr, scalars = fused if fused else (None, "none", [])
        nchw = l1_aliased(_val(x), _val(w), padding, stride, dilation, groups)
        with g.inserting_before(conv):
            xcl = g.call_method("contiguous", (x,), {} if nchw else {"memory_format": CL})
            xcl.meta["example_value"] = _val(x)       # example values stay the captured ones
            if nchw:
                # the plain weight: oneDNN reorders it for its blocked kernel on each call
                # (a pack from REORDER is made for the channels-last kernel); a channels-last
                # weight would make oneDNN take the channels-last kernel
                if _computed(w) or not _val(w).is_contiguous():
                    w = g.call_method("contiguous", (w,))
                    w.meta["example_value"] = _val(w.args[0]).contiguous()
                    if consts is not None and w.args[0] in consts:
                        consts.add(w)
                n_nchw += 1
            elif consts is not None and w in consts and PACK_CONV_WEIGHTS and \
                    options.get("prepack", "auto") is not False:
                # made for the traced input size; oneDNN takes it for any other (the conv's
                # result does not depend on it: checked at other batch and spatial sizes)
                w = g.call_function(REORDER, (w, padding, stride, dilation, groups,
                                              [shapes.hint_int(s) for s in _val(x).shape]))
                w.meta["example_value"] = _val(w.args[0])     # sizes only: opaque
                consts.add(w)
            elif consts is not None and w in consts or _computed(w):
                w = g.call_method("contiguous", (w,), {"memory_format": CL})
                w.meta["example_value"] = _val(w.args[0]).contiguous(memory_format=CL)
                if consts is not None and w.args[0] in consts:
                    consts.add(w)
            new = g.call_function(CONV_POINTWISE, (xcl, w, b, padding, stride, dilation,
                                                   groups, attr, scalars, ""))
        last = act if act is not None else conv
        new.meta["example_value"] = _val(last)
        if conv in rows:
            new.meta["example_value"] = _val(last).unsqueeze(2)
            with g.inserting_after(new):
                new = g.call_method("squeeze", (new, 2))
            new.meta["example_value"] = _val(last)
            row_outs.append(new)
        if last in eager:
            eager[new] = eager[last]
        if act is not None:                  # an in-place act: the conv's users read it too
            act.replace_all_uses_with(new)
            g.erase_node(act)
        conv.replace_all_uses_with(new)
        g.erase_node(conv)
        n_conv += 1
    n_add = 0 if training else _fuse_residual_adds(g, eager)
    if training:
        gm.recompile()
        now = eager_layouts(gm, example_inputs)
        if now is None:
            raise RuntimeError("ember: a rewritten training graph does not run on meta tensors")
        _gradient_layouts(g, now, example_inputs)
    _restore_outputs(g, eager, now if training else None, _downstream(row_outs))
    g.lint()
    gm.recompile()
    counters.bump("channels_last_graphs")
    counters.bump("residual_adds_fused", n_add)
    counters.bump("convs_nchw_l1_aliased", n_nchw)
    counters.bump("conv1d_channels_last", len(rows))
    perf_log.info("layout: %d conv2d run channels-last on oneDNN (%d of them conv1d rows), "
                  "%d with the residual add, %d NCHW (channels-last rows alias in L1)",
                  n_conv - n_nchw, len(rows), n_add, n_nchw)
    return True


def _unsqueezed(g: fx.Graph, t: fx.Node, consts) -> fx.Node:
    """`t.unsqueeze(2)`: a conv1d's input or weight as its one-row conv2d's (a constant when
    `t` is one)."""
    u = g.call_method("unsqueeze", (t, 2))
    u.meta["example_value"] = _val(t).unsqueeze(2)
    if consts is not None and t in consts:
        consts.add(u)
    return u


_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                       operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
                       operator.ior, operator.ixor, operator.ilshift, operator.irshift}


def writes_in_place(node: fx.Node) -> bool:
    """Whether a torch-level node writes into its first argument (`relu_`, `inplace=True`,
    `x += y`)."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or \
        node.kwargs.get("inplace") is True or node.target in _IN_PLACE_OPERATORS


#: a residual add is fused into the conv when each output element sums at most this many
#: products (in_channels/groups x kh x kw). oneDNN's binary post-op saves a pass over the
#: output, but slows the conv's own loop a little: measured (1 thread, resnet50's 1x1 convs,
#: batch 2-16, docs/design/024) the fused op won 20-25% at 64, 0-7% at 128, lost 2-5% at
#: 256 and 512.
FUSE_ADD_MAX_REDUCTION = 128
_ADDS = {operator.add, operator.iadd, torch.add, "add", "add_"}
_IN_PLACE_ADDS = {operator.iadd, "add_"}


def _residual_add(y: fx.Node, order: dict):
    """(add, other) when the first reader of the conv output `y` adds another tensor of its
    shape and dtype to it: `y + other` (y read by nothing else), or `y += other` in place
    (y's later readers read the sum)."""
    if not y.users:
        return None
    add = min(y.users, key=lambda n: order.get(n, len(order)))
    key = add.target if add.op in ("call_function", "call_method") else None
    if key not in _ADDS or add.kwargs or len(add.args) != 2:
        return None
    a, other = add.args
    if key not in _IN_PLACE_ADDS and a is not y:
        a, other = other, a                   # y + other == other + y (out of place only)
    if a is not y or other is y or not isinstance(other, fx.Node) or \
            key not in _IN_PLACE_ADDS and len(y.users) != 1:
        return None
    yv, ov = _val(y), _val(other)
    if not isinstance(ov, torch.Tensor) or ov.shape != yv.shape or ov.dtype != yv.dtype:
        return None
    # the fused op runs where the add was: nothing in between may write into what it reads
    n = y.next
    while n is not add:
        if writes_in_place(n):
            return None
        n = n.next
    return add, other


def _fuse_residual_adds(g: fx.Graph, eager: dict) -> int:
    """`act(conv(x) + other)` → conv2d_add(x, other, ..., act): oneDNN adds the residual (and
    applies the activation) as the conv writes its output, instead of a kernel reading the
    conv's output and `other` again. Out of place: `other` is read, never written (the in-place
    form, oneDNN's "sum", would write into it; aot would clone it first, which costs the pass
    it saves). groups == 1 only: oneDNN fuses nothing else (the op computes it unfused)."""
    order = {n: i for i, n in enumerate(g.nodes)}
    fused = 0
    for y in list(g.nodes):
        if y.target is not CONV_POINTWISE or y.args[7] != "none" or y.args[6] != 1 or \
                getattr(y.args[0], "kwargs", {}).get("memory_format") is not CL or \
                not isinstance(_val(y.args[1]), torch.Tensor) or \
                _val(y.args[1]).shape[1:].numel() > FUSE_ADD_MAX_REDUCTION:
            continue
        found = _residual_add(y, order)
        if found is None:
            continue
        add, other = found
        x, w, b, padding, stride, dilation, groups = y.args[:7]
        with g.inserting_before(add):
            s = g.call_function(CONV_ADD, (x, other, w, b, padding, stride, dilation, groups,
                                           "none", []))
        s.meta["example_value"] = _val(y)
        order[s] = order[add]                 # where it reads `other` (a later conv's y)
        eager[s] = eager.get(add, eager.get(y))
        add.replace_all_uses_with(s)
        y.replace_all_uses_with(s)            # in place: y's later readers read the sum
        g.erase_node(add)
        g.erase_node(y)
        act = _fused_activation(s, order)
        if act is not None and act[1] == "relu":      # the only one oneDNN applies after a sum
            act, attr, scalars = act
            s.args = (*s.args[:8], attr, scalars)
            if act in eager:
                eager[s] = eager[act]
            act.replace_all_uses_with(s)
            g.erase_node(act)
        fused += 1
    return fused


def _computed(w) -> bool:
    """A weight the graph computes (a BatchNorm folded on each call, a standardized weight):
    written channels-last where it is computed, so oneDNN does not copy it into that layout
    on every call (it converts a plain weight to its input's layout first)."""
    return isinstance(w, fx.Node) and w.op != "placeholder" and isinstance(_val(w), torch.Tensor)


#: ops that only re-view a tensor: a weight computed by them alone is still the parameter's
#: storage, converted (and its gradient copied back) like the parameter itself
_VIEW_ONLY = {"view", "reshape", "reshape_as", "view_as", "flatten", "unsqueeze", "squeeze",
              "contiguous", "detach"}


def _computed_beyond_views(w) -> bool:
    """A conv weight the graph computes from its parameters by more than re-viewing them
    (a weight standardization, a weight norm, a folded BatchNorm): such a weight is written
    channels-last by the kernel that computes it, and its channels-last gradient is read by
    that kernel's backward, so neither costs a layout copy per call. The training cost rule
    counts only the other conv weights."""
    while _computed(w) and w.op in ("call_function", "call_method"):
        name = w.target if isinstance(w.target, str) else getattr(w.target, "__name__", "")
        if name not in _VIEW_ONLY:
            return True
        w = w.args[0] if w.args else None
    return False


def _cpu_follows_input(n: fx.Node) -> bool:
    """Ops whose CPU kernel returns channels-last for a channels-last input where the meta
    kernel says contiguous (besides the conv, whose weight counts too)."""
    if n.target in (F.group_norm, F.pixel_shuffle, torch.pixel_shuffle):
        return True
    return n.target is F.pad and n.kwargs.get("mode", n.args[2] if len(n.args) > 2 else
                                              "constant") in ("reflect", "replicate")


def _on_meta(target, args, kwargs):
    """(target, args, kwargs) of a call that stays on the meta device where it names another:
    `device=` (any call), a positional device of `Tensor.to` (`x.to(x.device)`,
    `x.to("cpu", torch.float32)`, `x.to(0)`) and the device moves `x.cpu()`, `x.cuda(...)`
    (meta → meta; a move keeps the strides). On meta each would copy out of the meta tensor
    ("Cannot copy out of meta tensor") or meet a CPU tensor."""
    if isinstance(kwargs.get("device"), (str, torch.device, int)):
        kwargs = {**kwargs, "device": "meta"}
    name = target if isinstance(target, str) else getattr(target, "__name__", None)
    if name not in ("to", "cpu", "cuda") or not isinstance(target, str) and \
            getattr(torch.Tensor, name) is not target:
        return target, args, kwargs
    if name != "to":
        fmt = {k: v for k, v in kwargs.items() if k == "memory_format"}
        return "to" if isinstance(target, str) else torch.Tensor.to, (args[0], "meta"), fmt
    # to(device, dtype, ...), to(dtype, ...), to(other, ...): a device comes first
    if len(args) > 1 and (isinstance(args[1], (str, torch.device)) or
                          type(args[1]) is int):
        args = (args[0], "meta", *args[2:])
    return target, args, kwargs


class _EagerLayouts(fx.Interpreter):
    """Runs the graph on meta tensors, giving conv outputs (and _cpu_follows_input's) the
    layout the CPU kernel returns: channels-last when the input (a conv's weight) is. Tensors
    the graph creates and moves are made on meta too (eager_layouts sets meta as the default
    device; a device the call names is replaced by _on_meta): stochastic depth's
    `torch.empty(..., device=cpu)` mask kept convnext, efficientnet and edgenext graphs in
    their captured layout, wav2vec2's `x.to(x.device)` its whole graph."""

    def call_function(self, target, args, kwargs):
        return super().call_function(*_on_meta(target, args, kwargs))

    def call_method(self, target, args, kwargs):
        return super().call_method(*_on_meta(target, args, kwargs))

    def run_node(self, n):
        out = super().run_node(n)
        if n.op == "call_function" and isinstance(out, torch.Tensor) and out.dim() == 4 and (
                n.target in (F.conv2d, CONV_POINTWISE) or _cpu_follows_input(n)):
            ins = n.args[:2] if n.target in (F.conv2d, CONV_POINTWISE) else n.args[:1]
            if any(isinstance(t, torch.Tensor) and t.dim() == 4 and _channels_last(t)
                   for t in (self.env.get(i, i) for i in ins)) and \
                    _channels_last(out, sizes_only=True):
                out = out.contiguous(memory_format=CL)
        self.values[n] = out
        return out


def _channels_last(t: torch.Tensor, sizes_only=False) -> bool:
    """Whether `t` is (or, sizes_only, could be told to be) stored channels-last."""
    n, c, h, w = t.shape
    if c == 1 or h * w == 1:
        return False
    return sizes_only or t.is_contiguous(memory_format=CL)


def eager_layouts(gm: fx.GraphModule, example_inputs) -> dict | None:
    """node → a meta tensor with the strides eager CPU PyTorch gives it; None if the graph
    cannot run on meta tensors."""
    interp = _EagerLayouts(gm)
    interp.values = {}
    metas = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
             if isinstance(x, torch.Tensor) else x for x in example_inputs]
    try:
        with torch.no_grad(), torch.device("meta"):
            interp.run(*metas)
    except Exception as exc:  # noqa: BLE001 - any failure keeps the captured layout
        perf_log.info("layout: meta run failed: %s", exc)
        return None
    return interp.values


def _format(t) -> torch.memory_format | None:
    """The memory format a 4-D tensor is dense in (NCHW first), else None."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        return None
    return torch.contiguous_format if t.is_contiguous() else \
        CL if t.is_contiguous(memory_format=CL) else None


def _restore_outputs(g: fx.Graph, eager: dict, now: dict | None = None,
                     after_rows=frozenset()) -> None:
    """Give each computed 4-D output the memory format eager gives it, and each 3-D output
    computed from a conv1d run channels-last (`after_rows`) eager's order of its strides.
    `now` (training): the rewritten graph's layouts; an output converted from channels-last
    gets its tangent converted to channels-last on entry to the backward (relayout), so the
    backward's kernels read one layout."""
    out = next(n for n in reversed(g.nodes) if n.op == "output")

    def restore(v):
        if not isinstance(v, fx.Node) or v.op == "placeholder":
            return v
        if v in after_rows and _dense_order(eager.get(v)) is not None:
            return _in_order(g, v, eager[v], out)
        fmt = _format(eager.get(v))
        if fmt is None:
            return v
        have = _format(now.get(v)) if now is not None else None
        with g.inserting_before(out):
            r = g.call_function(relayout, (v, fmt, have)) if have not in (None, fmt) else \
                g.call_method("contiguous", (v,), {"memory_format": fmt})
        r.meta["example_value"] = eager[v]
        return r
    out.args = (fx.node.map_aggregate(out.args[0], restore),)


def _dense_order(t) -> list | None:
    """A 3-D tensor's dims from the outermost stride in, when it is dense (some permutation
    of it is contiguous), else None."""
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        return None
    order = sorted(range(3), key=lambda d: -t.stride(d) if t.shape[d] != 1 else -t.numel())
    return order if t.permute(order).is_contiguous() else None


def _in_order(g: fx.Graph, v: fx.Node, want: torch.Tensor, out: fx.Node) -> fx.Node:
    """`v` stored in the order of `want`'s strides: `v.permute(o).contiguous().permute(o⁻¹)`
    (`v.contiguous()` for [N, C, L]; no copy when v is stored so already)."""
    order = _dense_order(want)
    inverse = sorted(range(3), key=order.__getitem__)
    with g.inserting_before(out):
        p = g.call_method("permute", (v, *order))
        c = g.call_method("contiguous", (p,))
        r = g.call_method("permute", (c, *inverse))
    for n in (p, c, r):
        n.meta["example_value"] = want.permute(order) if n is not r else want
    return r


class _Relayout(torch.autograd.Function):
    """x in memory format `fmt` (None: as it is); its gradient in `grad_fmt` (None: as it
    comes). The gradient's layout is the point: autograd's own layout conversions (clone,
    contiguous) pass the gradient through in whatever layout it arrives."""

    @staticmethod
    def forward(ctx, x, fmt, grad_fmt):
        ctx.grad_fmt = grad_fmt
        return x.view_as(x) if fmt is None else x.contiguous(memory_format=fmt)

    @staticmethod
    def backward(ctx, g):
        return (g if ctx.grad_fmt is None else g.contiguous(memory_format=ctx.grad_fmt)), None, None


def relayout(x: torch.Tensor, fmt, grad_fmt) -> torch.Tensor:
    """`x.contiguous(memory_format=fmt)` whose gradient comes back in `grad_fmt` (a graph
    node's target: aot traces the Function's forward and, in the joint backward, its backward)."""
    return _Relayout.apply(x, fmt, grad_fmt)


def _gradient_layouts(g: fx.Graph, now: dict, example_inputs) -> None:
    """Training graphs: each gradient leaves a layout conversion in the layout of the value it
    is the gradient of (`now`: the rewritten graph's layouts). A conv's input converted to
    channels-last gets its gradient (channels-last, from oneDNN) converted back to the
    input's layout once, by a blocked copy, instead of the producer's backward kernels reading
    two layouts (or autograd copying it at accumulation); a 4-D graph input's gradient comes
    back in the input's layout, however the graph used it."""
    for n in g.nodes:
        if n.op == "call_function" and n.target is relayout and n.args[2] is None:
            have = _format(now.get(n.args[0]))
            if have is not None and have != n.args[1]:
                n.args = (n.args[0], n.args[1], have)
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    first = next(n for n in g.nodes if n.op != "placeholder")
    for n, x in zip(placeholders, example_inputs):
        users = [u for u in n.users if u.op != "output"]
        have = _format(now.get(n))
        if getattr(x, "requires_grad", False) and have is not None and users:
            with g.inserting_before(first):
                r = g.call_function(relayout, (n, None, have))
            r.meta["example_value"] = _val(n)
            for u in users:
                u.replace_input_with(n, r)
