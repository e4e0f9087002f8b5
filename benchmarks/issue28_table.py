"""Issue 28 table: feature | torch.compile graphs/breaks | ember graphs/breaks | equal to eager.
Run from the repo root: python benchmarks/issue28_table.py (reuses the cases of the unit tests)."""
import copy, functools, warnings, sys
import torch, torch.nn as nn
import torch._dynamo
from torch._dynamo.utils import counters
import ember
from ember import capture
sys.path.insert(0, "tests/unit/capture")
warnings.simplefilter("ignore")
torch.set_num_threads(1)

def eq(a, b):
    if isinstance(a, torch.Tensor):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    if isinstance(a, (tuple, list)):
        return all(eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(eq(a[k], b[k]) for k in a)
    return a == b

def run(name, make, call):
    """make() -> (obj_eager, obj_for_torch, obj_for_ember, compile(obj, which)) ; call(obj) -> result"""
    e, t, m = make(), make(), make()
    torch._dynamo.reset(); counters.clear()
    n = [0]
    def cnt(gm, ex):
        n[0] += 1
        return gm.forward
    ref = call(e)
    tc = compile_with(t, lambda f: torch.compile(f, backend=cnt), cnt)
    got_t = call(tc)
    tb = sum(counters["graph_break"].values())
    ember.reset()
    ec = compile_with(m, lambda f: ember.compile(f, backend="aot_eager"), None)
    got_e = call(ec)
    st = capture.stats()
    print(f"| {name} | {n[0]} / {tb} | {st.get('graphs', 0)} / {st.get('graph_breaks', 0)}"
          f"{' (eager frames: %d)' % st['eager_calls'] if st.get('eager_calls') else ''} | "
          f"{eq(ref, got_e)} (torch.compile: {eq(ref, got_t)}) |", flush=True)

def compile_with(obj, comp, torch_peer):
    if isinstance(obj, nn.Module):          # in place, so generate() calls the compiled module
        if torch_peer:
            obj.compile(backend=torch_peer)
        else:
            ember.compile(obj, backend="aot_eager")
        return obj
    return comp(obj)


from test_hooks import Net, _hooks, _hooked, x as hx
def make_hooks():
    torch.manual_seed(0); m = Net(); m.log = []; _hooks(m, m.log); return m
def call_hooks(m):
    xx = hx.clone().requires_grad_(); m.log.clear(); out = m(xx); out.sum().backward()
    return out, xx.grad, list(m.log)
run("module forward pre/post hooks (root + submodules, kwargs forms)", make_hooks, call_hooks)

def make_bw():
    torch.manual_seed(0); m = Net(); m.seen = []
    m.register_full_backward_hook(lambda mod, gi, go: m.seen.append(gi[0].clone()))
    return m
def call_bw(m):
    xx = hx.clone().requires_grad_(); m.seen.clear(); m(xx).pow(2).sum().backward()
    return xx.grad, list(m.seen)
run("full backward hook on the compiled module", make_bw, call_bw)

W = torch.randn(4, 5)
def call_th(f):
    w = W.clone().requires_grad_(); f(hx, w).backward(); return w.grad
run("Tensor.register_hook in forward (pure hook)", lambda: _hooked, call_th)

def f_vmap(x, w):
    return (x @ w).sin().sum(-1)
VX, VW = torch.randn(5, 3, 4), torch.randn(4, 2)
run("torch.func.vmap(compiled_fn)", lambda: f_vmap,
    lambda f: torch.func.vmap(f, in_dims=(0, None))(VX, VW))

from test_functorch import per_sample_grads
run("vmap(grad(f)) inside a compiled function", lambda: per_sample_grads, lambda f: f(VX[0]))

from test_cond import f as fcond
CX = torch.rand(6)
run("torch.cond, tensor predicate (no grad) + constant predicate", lambda: fcond,
    lambda f: (f(CX, True), f(-CX, True)))

sys.path.insert(0, "tests/unit/aot")
from test_checkpoint import SelectiveNet, _save_mm
def make_sac():
    torch.manual_seed(0); return SelectiveNet(_save_mm)
def call_sac(m):
    xx = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)); out = m(xx); out.backward()
    return out, [p.grad for p in m.parameters()]
run("selective checkpointing (policy fn)", make_sac, call_sac)

import transformers
def make_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                  bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(cfg).eval()
IDS = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(0))
GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
def gen(kw):
    def call(m):
        with torch.no_grad():
            return m.generate(IDS, **GEN, **kw)
    return call
run("GPT-2 generate, DynamicCache", make_gpt2, gen({}))
run("GPT-2 generate, static cache", make_gpt2, gen({"cache_implementation": "static"}))
