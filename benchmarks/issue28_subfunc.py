"""Issue 28 table, tensor subclasses / torch.func / torch.cond with grads: feature |
torch.compile graphs/breaks | ember graphs/breaks | equal to eager (values and grads).
Run from the repo root: python benchmarks/issue28_subfunc.py (the unit tests' cases)."""
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests/unit/capture"), os.path.join(ROOT, "tests/unit/aot")]
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import ember  # noqa: E402
from ember import capture  # noqa: E402

warnings.simplefilter("ignore")
torch.set_num_threads(1)


def eq(a, b):
    if isinstance(a, torch.Tensor):
        if type(a) is not type(b):
            return False
        if hasattr(a, "__tensor_flatten__") and type(a) is not torch.Tensor:
            return all(eq(getattr(a, n), getattr(b, n)) for n in a.__tensor_flatten__()[0])
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)
    return a == b


def run(name, make, call):
    """make() -> a fresh function or module; call(obj) -> values to compare (grads included)."""
    ref = call(make())
    torch._dynamo.reset()
    counters.clear()
    n = [0]

    def cnt(gm, ex):
        n[0] += 1
        return gm.forward
    t = make()
    got_t = call(t.compile(backend=cnt) or t if isinstance(t, nn.Module) else
                 torch.compile(t, backend=cnt))
    tb = sum(counters["graph_break"].values())
    ember.reset()
    m = make()
    got_e = call(ember.compile(m, backend="aot_eager"))
    st = capture.stats()
    print(f"| {name} | {n[0]} / {tb} | {st.get('graphs', 0)} / {st.get('graph_breaks', 0)}"
          f"{' (eager calls: %d)' % st['eager_calls'] if st.get('eager_calls') else ''} | "
          f"{eq(ref, got_e)} (torch.compile: {eq(ref, got_t)}) |", flush=True)


from test_subclass import MLP, TwoTensor, f as f2, quantize  # noqa: E402

A, B, Y = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
run("TwoTensor (own, test) inputs, no grad", lambda: f2, lambda fn: fn(TwoTensor(A, B), Y))


def make_q():
    torch.manual_seed(0)
    return quantize(MLP())


QX = torch.randn(4, 16)


def call_q(m):
    x = QX.clone().requires_grad_()
    out = m(x)
    out.pow(2).sum().backward()
    return out, x.grad, m.l1.bias.grad


run("own int8 weight-only MLP, training (grads of x, biases)", make_q, call_q)


def make_ao(config):
    def make():
        import torchao.quantization as ao
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
        ao.quantize_(m, getattr(ao, config)())
        return m
    return make


AX = torch.randn(8, 64)
for cfg in ("Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig"):
    run(f"torchao {cfg} MLP, inference", make_ao(cfg), lambda m: m(AX).detach())


def g_tt(x, y):
    return ((x * 2).sin() * y).sum()


def call_tt(fn):
    from torch.testing._internal.two_tensor import TwoTensor as TT
    x = TT(A.clone(), B.clone()).requires_grad_(True)
    out = fn(x, Y)
    out.backward()
    return out, x.grad


run("torch's TwoTensor input requiring grad (fwd+bwd)", lambda: g_tt, call_tt)

from test_cond import Gate, sqrt_or_double  # noqa: E402


def make_gate():
    torch.manual_seed(0)
    return Gate()


def call_gate(m):
    x = (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)) * 2).requires_grad_()
    out = m(x)
    out.sum().backward()
    return out, x.grad, [p.grad for p in m.parameters()]


run("torch.cond, tensor predicate, grads (submodule branches)", make_gate, call_gate)


def call_sqrt(fn):
    x, w = torch.tensor([-1.0, 0.0, -2.0], requires_grad=True), torch.tensor(1.5, requires_grad=True)
    out = fn(x, w)
    out.backward()
    return out, x.grad, w.grad


run("torch.cond, untaken branch with sqrt at 0 (grads)", lambda: sqrt_or_double, call_sqrt)

from test_functorch import (MLP as PMLP, functional_grad, jac_and_vmap,  # noqa: E402
                            per_sample_grads, per_sample_param_grads, x as FX)

run("vmap(grad(f)) inside a compiled function", lambda: per_sample_grads, lambda fn: fn(FX))
LIN = nn.Linear(4, 3)
PRM = {k: v.detach() for k, v in LIN.named_parameters()}
run("grad(functional_call(m, params)) inside", lambda: functional_grad,
    lambda fn: fn(LIN, PRM, FX[0]))


def call_jac(fn):
    w = torch.randn(4, generator=torch.Generator().manual_seed(2)).requires_grad_()
    out = fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(3)), w)
    (out[0].sum() + out[1][0][0].sum() + out[1][1]).backward()
    return out, w.grad


run("jacrev + grad_and_value + vmap, outer backward", lambda: jac_and_vmap, call_jac)
PP = {k: v.detach() for k, v in PMLP.named_parameters()}
run("per-sample grads: vmap(grad(functional_call(MLP)))", lambda: per_sample_param_grads,
    lambda fn: fn(PP, torch.randn(8, 4, generator=torch.Generator().manual_seed(4)),
                  torch.randn(8, 1, generator=torch.Generator().manual_seed(5))))
