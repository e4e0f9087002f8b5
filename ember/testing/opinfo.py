"""OpInfo conformance harness: PyTorch's OpInfo database through an ember backend vs eager.

For each (op, dtype) it takes up to `max_samples` sample inputs and checks
- forward: the backend's compiled callable (see below) vs eager outputs;
- backward (differentiable ops, floating dtypes): grads of sum(out * cotangent) w.r.t. every
  input that requires grad, vs eager.
Backends: "aot_eager", "ember" (our backend stages only: capture is Dynamo's or none) and
"decomp" (ember.testing.DecompMode on real tensors: the table alone, no tracer).

By default the backend is called directly on a one-node torch-level graph that calls the op
(fast: no Dynamo); with `use_dynamo(torch.compile, torch._dynamo.reset)` (the conformance
tests do it under EMBER_OPINFO_DYNAMO=1) samples go through torch.compile(fn, backend=...).
A case is (op name, dtype, "fwd"|"bwd"); it passes when every sample passes. Cases whose samples
all fail in eager, or that our backend never saw (Dynamo ran them eagerly), are "skip".
"""
from __future__ import annotations

import dataclasses
import os
import traceback

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

# Ops whose results are random draws or depend on memory/uninitialised data: the forward
# cannot be compared elementwise with eager (as in PyTorch's own compiler OpInfo tests).
NONDETERMINISTIC = {
    "bernoulli", "normal", "normal_", "rand_like", "randn_like", "randint_like", "randint", "randn",
    "rand", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "uniform", "cauchy", "exponential", "geometric", "log_normal",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "torch.empty", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "bernoulli_", "nn.functional.scaled_dot_product_attention",
}


@dataclasses.dataclass
class CaseResult:
    op: str
    variant: str
    dtype: str
    kind: str             # "fwd" | "bwd"
    status: str           # "pass" | "fail" | "skip"
    samples: int = 0
    passed: int = 0
    reason: str = ""

    @property
    def key(self) -> str:
        return case_key(self.op, self.variant, self.dtype, self.kind)


def case_key(op, variant, dtype, kind) -> str:
    name = op + ("." + variant if variant else "")
    return f"{name}|{dtype}|{kind}"


def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def family(opinfo) -> str:
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
    for prefix in ("nn.functional.", "linalg.", "special.", "fft.", "sparse.", "masked.", "signal."):
        if opinfo.name.startswith(prefix):
            return prefix[:-1]
    if isinstance(opinfo, UnaryUfuncInfo):
        return "unary"
    if isinstance(opinfo, BinaryUfuncInfo):
        return "binary"
    if isinstance(opinfo, ReductionOpInfo):
        return "reduction"
    return "other"


# ------------------------------------------------------------------------------ backends

class CountingBackend:
    """Wraps a raw (no eager fallback) ember backend and counts the graphs it compiled."""

    def __init__(self, name: str):
        from ember.backends.registry import _raw_backend
        self.name = name
        self.inner = _raw_backend(name)
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs)


def _graph_module(fn, n_inputs):
    """A torch-level GraphModule `(t0, ..., tn) -> tuple(tree_leaves(fn(t0, ..., tn)))`: the one
    node calls fn, so the backend traces fn itself (no Dynamo capture in between)."""
    import torch.fx as fx

    def flat(*ts):
        return tuple(tree_leaves(fn(*ts)))
    g = fx.Graph()
    phs = [g.placeholder(f"t{i}") for i in range(n_inputs)]
    g.output(g.call_function(flat, tuple(phs)))
    return fx.GraphModule(torch.nn.Module(), g)


def _compiled(fn, backend_name, n_inputs=0, via_dynamo=False):
    """(callable, counter) running fn through the named backend: directly (the backend gets a
    one-node torch-level graph calling fn; fast) or through torch.compile (Dynamo's capture)."""
    if backend_name == "decomp":
        from .decomp_mode import DecompMode

        class _Counter:
            graphs = 1

        def run(*args):
            with DecompMode():
                return fn(*args)
        return run, _Counter()
    backend = CountingBackend(backend_name)
    if not via_dynamo:
        gm = _graph_module(fn, n_inputs)
        state = {}

        def run(*args):
            if "compiled" not in state:
                state["compiled"] = backend(gm, list(args))
            return tuple(state["compiled"](*args))
        return run, backend
    if _DYNAMO["compile"] is None:
        raise RuntimeError("the Dynamo path needs ember.testing.opinfo.use_dynamo(torch.compile, reset)")
    return _DYNAMO["compile"](fn, backend=backend, dynamic=False), backend


# The Dynamo path is injected by the tests (tests/conformance/conftest.py): product code under
# ember/ does not touch torch.compile / torch._dynamo.
_DYNAMO = {"compile": None, "reset": None}


def use_dynamo(compile_fn, reset_fn):
    """Route samples through `compile_fn(fn, backend=..., dynamic=False)` (torch.compile)."""
    _DYNAMO["compile"], _DYNAMO["reset"] = compile_fn, reset_fn


def _reset():
    if _DYNAMO["reset"] is not None:
        _DYNAMO["reset"]()


# ------------------------------------------------------------------------------ one sample

def _as_fn(opinfo, sample):
    """fn(*tensors) calling the op on the sample, and the sample's tensors."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    op = opinfo.op

    def fn(*tensors):
        vals = list(leaves)
        for i, t in zip(idx, tensors):
            vals[i] = t
        inp, args, kwargs = tree_unflatten(vals, spec)
        return op(inp, *args, **kwargs)
    return fn, [leaves[i] for i in idx]


def _fresh(tensors, grad):
    out = []
    for t in tensors:
        c = t.detach().clone()
        if grad and t.requires_grad:
            c.requires_grad_(True)
        out.append(c)
    return out


def _tols(dtype):
    # torch.testing defaults, a little looser: decompositions reassociate sums
    # (complex as its real dtype: its math runs on real pairs, decomp/complex.py)
    return {torch.float32: (1e-5, 1e-5), torch.float64: (1e-7, 1e-7),
            torch.complex64: (1e-5, 1e-5), torch.complex128: (1e-7, 1e-7),
            torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}.get(dtype, (0, 0))


def _compare(got, ref, dtype):
    rtol, atol = _tols(dtype)
    g_leaves, r_leaves = tree_leaves(got), tree_leaves(ref)
    if len(g_leaves) != len(r_leaves):
        raise AssertionError(f"output structure differs: {len(g_leaves)} vs {len(r_leaves)} leaves")
    for g, r in zip(g_leaves, r_leaves):
        if isinstance(r, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                raise AssertionError(f"expected a tensor, got {type(g).__name__}")
            if r.is_floating_point() or r.is_complex():
                torch.testing.assert_close(g, r, rtol=rtol, atol=atol, equal_nan=True,
                                           check_device=True, check_stride=False)
            else:
                torch.testing.assert_close(g, r, rtol=0, atol=0, check_stride=False)
        elif isinstance(r, float) and isinstance(g, float):
            torch.testing.assert_close(g, r, rtol=rtol, atol=atol, equal_nan=True)
        elif g != r:
            raise AssertionError(f"non-tensor output differs: {g!r} vs {r!r}")


def _grads(fn, tensors, cotangent_seed=0, cot_dtype=None):
    inputs = [t for t in tensors if t.requires_grad]
    out = fn(*tensors)
    outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs or not inputs:
        return None
    gen = torch.Generator().manual_seed(cotangent_seed)
    cots = [torch.randn(o.shape, generator=gen, dtype=cot_dtype or o.dtype).to(o) for o in outs]
    return torch.autograd.grad(outs, inputs, cots, allow_unused=True)


def _exact_reference(fn, tensors, dtype, grad):
    """The same computation in float64 from the same float32 values (and cotangents)."""
    t64 = [t.detach().double().requires_grad_(t.requires_grad) if t.dtype == dtype else
           t.detach() for t in tensors]
    torch.manual_seed(0)
    return _grads(fn, t64, cot_dtype=dtype) if grad else fn(*t64)


def _no_further_from_exact(got, ref, exact, dtype):
    """float32 mismatches where eager is the inexact one (LayerNorm over one element: eager's
    grad is rounding noise times 1/sqrt(eps), ours is 0): pass when every element of ours is
    within twice eager's own distance from the float64 value (plus the usual tolerances)."""
    rtol, atol = _tols(dtype)
    for g, r, e in zip(tree_leaves(got), tree_leaves(ref), tree_leaves(exact)):
        if isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(g, torch.Tensor):
            e = e.to(torch.float64)
            slack = 2 * (r.double() - e).abs() + atol + rtol * e.abs()
            bad = ((g.double() - e).abs() > slack) & ~(g.isnan() & r.isnan())
            if bad.any():
                return False
    return True




def check_sample(opinfo, sample, dtype, kind, backend_name, via_dynamo=None):
    """None when the sample passes; "skip: ..." when eager itself fails or the backend never
    compiled it; otherwise a one-line failure reason."""
    fn, tensors = _as_fn(opinfo, sample)
    grad = kind == "bwd"
    torch.manual_seed(0)
    try:
        ref = _grads(fn, _fresh(tensors, True)) if grad else fn(*_fresh(tensors, False))
    except Exception as e:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return f"skip: eager raised {type(e).__name__}"
    if grad and ref is None:
        return "skip: no differentiable output"
    torch.manual_seed(1)
    try:
        other = _grads(fn, _fresh(tensors, True)) if grad else fn(*_fresh(tensors, False))
        _compare(other, ref, dtype)
    except AssertionError:
        # eager itself gives different results under another seed (dropout in training, ...):
        # the backend draws numbers its own way, nothing to compare elementwise
        return "skip: random sample (eager output depends on the RNG seed)"
    except Exception:  # noqa: BLE001
        pass
    via_dynamo = (_DYNAMO["compile"] is not None) if via_dynamo is None else via_dynamo
    if not via_dynamo:
        # the direct path returns the flat tuple of tensor leaves; non-tensor outputs need Dynamo
        leaves = tree_leaves(ref)
        if all(isinstance(v, torch.Tensor) for v in leaves) and leaves:
            if not grad:
                ref = tuple(leaves)
        elif _DYNAMO["compile"] is not None:
            via_dynamo = True
        else:
            return "skip: non-tensor outputs need the Dynamo path (EMBER_OPINFO_DYNAMO=1)"
    if via_dynamo:
        _reset()
    compiled, counter = _compiled(fn, backend_name, len(tensors), via_dynamo)
    torch.manual_seed(0)
    try:
        got = _grads(compiled, _fresh(tensors, True)) if grad else compiled(*_fresh(tensors, False))
    except Exception as e:  # noqa: BLE001
        reason = _reason(e)
        if "data-dependent" in reason:
            # the op reads tensor values back to Python (.item(), equal, nonzero): under capture
            # that is a graph break, not something a single aten graph can express
            return "skip: data-dependent op (graph break under capture): " + reason[7:]
        if "changed the global RNG state" in reason:
            # the OpInfo wraps a random op in torch.manual_seed (wrapper_set_seed): under capture
            # the seeding call is a graph break; one aten graph cannot express it, and the
            # tracer refuses it rather than drawing from the wrong state
            return "skip: reseeds the RNG inside the op (graph break under capture)"
        return reason
    if counter.graphs == 0:
        return "skip: not captured (Dynamo ran it eagerly)"
    try:
        _compare(got, ref, dtype)
    except AssertionError as e:
        if dtype == torch.float32:
            try:
                exact = _exact_reference(fn, tensors, dtype, grad)
                if not via_dynamo and not grad:
                    exact = tuple(tree_leaves(exact))
                if _no_further_from_exact(got, ref, exact, dtype):
                    return None
            except Exception:  # noqa: BLE001 - no float64 reference: the mismatch stands
                pass
        first = str(e).strip().splitlines()
        return "mismatch: " + (" ".join(first[:3]) if first else "values differ")[:300]
    return None


def _reason(e: BaseException) -> str:
    inner = e
    while getattr(inner, "inner_exception", None) is not None:
        inner = inner.inner_exception
    while inner.__cause__ is not None and type(inner).__name__ in ("BackendCompilerFailed",
                                                                     "InternalTorchDynamoError"):
        inner = inner.__cause__
    msg = str(inner).strip().splitlines()
    text = msg[0] if msg else ""
    if os.environ.get("EMBER_OPINFO_TRACE"):
        traceback.print_exception(e)
    return f"error: {type(inner).__name__}: {text}"[:300]


# ------------------------------------------------------------------------------ one case

def run_case(opinfo, dtype, kind, backend_name="aot_eager", max_samples=4) -> CaseResult:
    res = CaseResult(opinfo.name, opinfo.variant_test_name, str(dtype).replace("torch.", ""), kind,
                     "skip")
    if opinfo.name in NONDETERMINISTIC:
        res.reason = "skip: nondeterministic op"
        return res
    if kind == "bwd" and not (opinfo.supports_autograd and (dtype.is_floating_point or dtype.is_complex)):
        res.reason = "skip: not differentiable"
        return res
    try:
        samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=(kind == "bwd")))
    except Exception as e:  # noqa: BLE001
        res.reason = f"skip: sample_inputs raised {type(e).__name__}"
        return res
    reasons = []
    for sample in samples:
        if res.samples >= max_samples:
            break
        r = check_sample(opinfo, sample, dtype, kind, backend_name)
        if r is not None and r.startswith("skip"):
            reasons.append(r)
            continue
        res.samples += 1
        if r is None:
            res.passed += 1
        else:
            reasons.append(r)
    if res.samples == 0:
        res.reason = reasons[0] if reasons else "skip: no samples"
        return res
    fails = [r for r in reasons if not r.startswith("skip")]
    res.status = "pass" if not fails else "fail"
    res.reason = fails[0] if fails else ""
    _reset()
    return res


def select_ops(names=None):
    ops = []
    for o in op_db():
        full = o.name + ("." + o.variant_test_name if o.variant_test_name else "")
        if names is None or o.name in names or full in names:
            ops.append(o)
    return ops


def supported_dtypes(opinfo, wanted):
    have = opinfo.supported_dtypes("cpu")
    return [d for d in wanted if d in have]
