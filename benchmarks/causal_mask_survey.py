"""causal_mask_survey.py [REGEX]: what each broad-suite model's attention calls receive under
ember's capture (inference, suite sizes): q/k/v shapes, the mask's dtype/shape, the ops that build
it, is_causal, and the mask's values at run time (causal? which "masked" value? rows wholly
masked?), plus whether ember's own kernel (backends/sdpa_kernel._args) takes the call.

A custom backend sees the torch-level graph ember's capture gives its backend, then runs it with
an fx.Interpreter that records each sdpa call's real arguments."""
import re, sys
import torch
import torch.fx as fx
import torch.nn.functional as F
torch.set_num_threads(1)
import ember
from ember.backends import sdpa_kernel
from ember.bench import broad  # noqa: registers
from ember.bench.spec import REGISTRY


def builders(n: fx.Node, depth=12) -> list:
    """Names of the ops upstream of `n` (its mask's recipe), nearest first."""
    seen, out, todo = set(), [], [n]
    while todo and len(out) < depth:
        x = todo.pop(0)
        if not isinstance(x, fx.Node) or x in seen:
            continue
        seen.add(x)
        if x.op == "call_function" or x.op == "call_method":
            out.append(getattr(x.target, "__name__", str(x.target)))
        todo += list(x.all_input_nodes)
    return out


def describe(m: torch.Tensor, lq: int, lk: int) -> str:
    if m is None:
        return "none"
    mm = m.float() if m.dtype != torch.bool else torch.where(m, 0.0, float("-inf"))
    mm = mm.expand(*mm.shape[:-2], lq, lk) if mm.dim() >= 2 else mm
    vals = torch.unique(mm)
    dead = mm <= torch.finfo(torch.float32).min / 2
    causal = torch.ones(lq, lk).tril(lk - lq).bool()
    is_causal = bool((dead == ~causal).all())
    win = ""
    if not is_causal:
        live = (~dead).float()
        win = " live per row %d-%d" % (live.sum(-1).min(), live.sum(-1).max())
    return "%s %s values %s causal=%s%s" % (m.dtype, tuple(m.shape),
                                           [float(v) for v in vals[:4]], is_causal, win)


def backend(gm: fx.GraphModule, example_inputs):
    calls = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    for n in calls[:1]:
        mask = n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None)
        print("   graph: %d sdpa calls; mask built by %s; ember kernel takes it: %s" % (
            len(calls), builders(mask) if isinstance(mask, fx.Node) else mask,
            sdpa_kernel._args(n) is not None))

    class Rec(fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target is F.scaled_dot_product_attention and not Rec.done:
                Rec.done = True
                q, k, v = args[:3]
                m = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                print("   q %s k %s v %s is_causal=%s scale=%s mask %s" % (
                    tuple(q.shape), tuple(k.shape), tuple(v.shape),
                    kwargs.get("is_causal", False), kwargs.get("scale"),
                    describe(m, q.shape[2], k.shape[2])))
            return super().call_function(target, args, kwargs)
    Rec.done = False
    return lambda *a: Rec(gm).run(*a)


pat = sys.argv[1] if len(sys.argv) > 1 else "b_hf_(gpt2|gpt_neo|opt|llama|mistral|qwen2|phi)$"
for name in sorted(REGISTRY):
    if not re.search(pat, name):
        continue
    spec = REGISTRY[name]
    torch.manual_seed(0)
    m = spec.build().eval()
    print(name, spec.note)
    with torch.no_grad():
        ember.compile(m, backend=backend)(*spec.inputs(), **spec.kwargs())
