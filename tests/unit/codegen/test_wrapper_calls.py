"""The wrapper's per-call savings (codegen/wrapper.py): mutated inputs written in place, functional
index_put run in place, kept views of parameters, torch.mm for mm.out. Each checks values (and the
caller's mutated tensors) against eager, and that the generated text took the cheap path."""
import copy
import re

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.backends.ember import compile_aten_graph
from ember.decomp import get_decompositions


def _cache_step(cache, count, kv, pos, q):
    """A static KV cache step (HF's StaticLayer.update + attention scores)."""
    count.add_(1)
    cache.index_copy_(2, pos, kv)
    return (q @ cache.transpose(-1, -2)).softmax(-1) @ cache


def _compiled_copied_back(fn, args):
    """compile_aten_graph of fn's aten graph, called as aot's inference runtime calls it: the
    outputs after fn's own are copied into the mutated inputs."""
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    mutated = gm.meta["mutated_inputs"]
    gm.meta["copied_back"] = mutated
    run = compile_aten_graph(gm, list(args))

    def call(*a):
        outs = run(*a)
        n = len(outs) - len(mutated)
        for i, new in zip(mutated, outs[n:]):
            a[i].copy_(new)
        return outs[:n]
    return call, run.ember_wrapper


def _cache_args(seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(1, 2, 16, 8, generator=g)
    return [cache, torch.zeros((), dtype=torch.int64), torch.randn(1, 2, 1, 8, generator=g),
            torch.tensor([5]), torch.randn(1, 2, 1, 8, generator=g)]


def test_static_cache_update_is_written_into_the_callers_cache():
    args = _cache_args()
    run, text = _compiled_copied_back(_cache_step, args)
    assert "index_put_" in text and text.count("written in place") == 2, text
    ref = [a.clone() for a in args]
    cache_ptr = args[0].data_ptr()
    for step in range(3):
        args[3].fill_(3 + step)
        ref[3].fill_(3 + step)
        got = run(*args)[0]
        want = _cache_step(*ref)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(args[0], ref[0], rtol=0, atol=0)   # the caller's cache
        assert args[1].item() == ref[1].item() == step + 1
    assert args[0].data_ptr() == cache_ptr


def test_copy_of_the_updated_cache_onto_itself_is_skipped():
    """The cache's new value is index_put's result, already in the cache's memory: the kernel
    that would copy it there is not run."""
    def f(cache, kv, pos, w):
        cache.index_copy_(2, pos, kv)
        return cache @ w
    args = [torch.randn(1, 2, 16, 8), torch.randn(1, 2, 1, 8), torch.tensor([7]), torch.randn(8, 4)]
    ref = [a.clone() for a in args]
    run, text = _compiled_copied_back(f, args)
    assert "skipped: it copies" in text and "index_put_" in text, text
    torch.testing.assert_close(run(*args)[0], f(*ref))
    torch.testing.assert_close(args[0], ref[0], rtol=0, atol=0)


def test_cache_read_after_the_update_is_not_clobbered():
    """The old cache is read after the index_put (a copy taken before the write, computed
    where it is used): the destination is still live there, so index_put keeps its copy."""
    def f(cache, kv, pos, w):
        old = cache * 1
        cache.index_copy_(2, pos, kv)
        return cache @ w, (old @ w).exp()
    args = [torch.randn(1, 2, 16, 8), torch.randn(1, 2, 1, 8), torch.tensor([3]), torch.randn(8, 4)]
    ref = [a.clone() for a in args]
    run, text = _compiled_copied_back(f, args)
    for got, want in zip(run(*args), f(*ref)):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(args[0], ref[0], rtol=0, atol=0)


def test_returned_index_put_result_does_not_alias_the_mutated_input():
    """y = index_put(x) is returned and x is overwritten afterwards: y must keep its value
    (running the index_put in x's memory would let the copy-back change y)."""
    def f(x, v, i, z):
        y = torch.index_put(x, (i,), v)
        x.copy_(z)
        return y
    x, v, i, z = torch.randn(8, 4), torch.randn(2, 4), torch.tensor([1, 6]), torch.randn(8, 4)
    want = f(x.clone(), v, i, z)
    run, text = _compiled_copied_back(f, [x, v, i, z])
    got = run(x, v, i, z)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(x, z, rtol=0, atol=0)


def test_without_copy_back_inputs_are_never_written():
    """A graph compiled without gm.meta["copied_back"] (trace_aten's own callers) leaves its
    inputs alone: their new values are only outputs."""
    args = _cache_args()
    before = [a.clone() for a in args]
    gm = trace_aten(_cache_step, args, decompositions=get_decompositions())
    run = compile_aten_graph(gm, list(args))
    assert "written in place" not in run.ember_wrapper
    run(*args)
    for a, b in zip(args, before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_parameter_views_are_kept_and_follow_the_parameter():
    lin = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(1, 8)
    f = lambda inp, w: (torch.nn.functional.linear(inp, w).relu(),)  # noqa: E731
    gm = trace_aten(f, (x, lin.weight.detach()), decompositions=get_decompositions())
    run = compile_aten_graph(gm, [x, lin.weight.detach()])
    text = run.ember_wrapper
    assert "_view(_views, 0, arg1" in text and "torch.mm(" in text, text
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(x, lin.weight)[0], f(x, lin.weight)[0])
        lin.weight.mul_(-2)                               # in place: the kept view sees it
        torch.testing.assert_close(run(x, lin.weight)[0], f(x, lin.weight)[0])
        lin.weight.data = torch.randn(4, 8)               # new storage: a new view
        torch.testing.assert_close(run(x, lin.weight)[0], f(x, lin.weight)[0])
        other = torch.nn.Parameter(torch.randn(4, 8))     # another parameter
        torch.testing.assert_close(run(x, other)[0], f(x, other)[0])
        plain = torch.randn(4, 8)                         # not a parameter: not kept
        torch.testing.assert_close(run(x, plain)[0], f(x, plain)[0])


class _StaticCacheLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16, bias=False)
        self.kv = torch.nn.Linear(16, 16, bias=False)
        self.register_buffer("cache", torch.zeros(1, 2, 12, 8))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x, pos):
        q, kv = self.q(x).view(1, 2, 1, 8), self.kv(x).view(1, 2, 1, 8)
        self.count.add_(1)
        self.cache.index_copy_(2, pos, kv)
        att = (q @ self.cache.transpose(-1, -2)).softmax(-1) @ self.cache
        return att.reshape(1, 16)


def test_static_cache_module_end_to_end():
    torch.manual_seed(0)
    model = _StaticCacheLM()
    ref = copy.deepcopy(model)
    ember.compile(model)
    ptr = model.cache.data_ptr()
    before = ember.stats()["counts"].get("graphs", 0)
    with torch.no_grad():
        x = torch.randn(1, 16)
        for t in range(6):
            pos = torch.tensor([t])
            got, want = model(x, pos), ref(x, pos)
            torch.testing.assert_close(got, want)
            x = got
    torch.testing.assert_close(model.cache, ref.cache, rtol=0, atol=0)
    assert model.count.item() == ref.count.item() == 6
    assert model.cache.data_ptr() == ptr
    assert ember.stats()["counts"].get("graphs", 0) - before == 1     # no recompile per token


def test_kernel_output_is_allocated_in_the_shape_its_extern_reads():
    """A (1, 1, 16) kernel output read by mm as (1, 16) is allocated (1, 16): mm takes the
    tensor itself. Its other reader (bmm, as the whole (1, 1, 16)) gets a view, and the pooled
    memory reused later keeps the right layout for everyone."""
    def f(x, w, v):
        h = x.exp() * 2                        # (1, 1, 16), a kernel
        a = h @ w.t()                          # mm on h viewed as (1, 16)
        b = torch.bmm(h, v)                    # bmm on the whole h
        c = (a.relu() + 1).reshape(1, 1, 16) @ v
        return a, b, c
    args = (torch.randn(1, 1, 16), torch.randn(16, 16), torch.randn(1, 16, 4))
    gm = trace_aten(f, args, decompositions=get_decompositions())
    run = compile_aten_graph(gm, list(args))
    text = run.ember_wrapper
    first = next(ln for ln in text.splitlines() if "torch.mm(" in ln)
    assert first.split("torch.mm(")[1].startswith("buf"), text
    for got, want in zip(run(*args), f(*args)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_outputs_are_never_views_of_reshaped_buffers():
    """h is allocated in mm's (1, 16) shape; the last kernel could write its output into h's
    memory, but an output must be a tensor of its own (a view would refuse the caller's
    in-place ops in training): it gets a fresh buffer."""
    def f(x, w):
        h = x.exp() * 2
        a = h @ w.t()
        return a, h.sin() * a.view(1, 1, 16)
    args = (torch.randn(1, 1, 16), torch.randn(16, 16))
    gm = trace_aten(f, args, decompositions=get_decompositions())
    run = compile_aten_graph(gm, list(args))
    outs = run(*args)
    assert outs[1]._base is None, run.ember_wrapper    # (outs[0] views mm's (1, 16) result)
    for got, want in zip(outs, f(*args)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["index_add", "scatter_reduce"])
def test_scatter_into_a_dying_buffer_runs_in_place(op):
    """index_add / scatter_reduce into a fill: the fill dies at the extern, which then runs as
    index_add_ / scatter_reduce_ on it (the functional op cloned it first). A destination still
    read later keeps the functional op. (scatter_add / scatter with an index of the
    destination's size but at dim are Scatter kernels: test_cpp_scatter.py.)"""
    g = torch.Generator().manual_seed(0)
    src, idx = torch.randn(6, 40, generator=g), torch.randint(0, 50, (6, 40), generator=g)
    rows = torch.randint(0, 6, (5,), generator=g)

    def fn(s, i, r):
        z = torch.zeros(6, 50) + 0.5
        out = {"scatter_add": lambda: z.scatter_add(1, i, s),
               "scatter": lambda: z.scatter(1, i, s),
               "index_add": lambda: z.index_add(0, r, s[:5, :10].repeat(1, 5)),
               "scatter_reduce": lambda: z.scatter_reduce(1, i, s, "amax")}[op]()
        return out * 2
    args = [src, idx, rows]
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    run = compile_aten_graph(gm, list(args))
    torch.testing.assert_close(run(*args)[0], fn(*args))
    # index_add decomposes to index_put, whose rows lower to index_add (after an index kernel)
    dst = "buf1" if op == "index_add" else "buf0"
    assert re.search(rf"= aten_{op}__[a-z]+\({dst}, .*# in place", run.ember_wrapper), \
        run.ember_wrapper

    def keeps(s, i, r):
        z = torch.zeros(6, 50) + 0.5
        return z.scatter_reduce(1, i, s, "amax"), z * 3
    gm = trace_aten(keeps, args, decompositions=get_decompositions())
    run = compile_aten_graph(gm, list(args))
    for a, b in zip(run(*args), keeps(*args)):
        torch.testing.assert_close(a, b)


def test_unread_extern_outputs_get_no_layout_check():
    """A multi-output extern's outputs that nothing reads (embedding_bag's offset2bag, bag_size,
    max_indices in inference) are not stride-checked per call; a read one still is."""
    def bags(w, i, o):
        return torch.ops.aten._embedding_bag.default(w, i, o, False, 1)[0]

    def bags_and_sizes(w, i, o):
        out = torch.ops.aten._embedding_bag.default(w, i, o, False, 1)
        return out[0], out[2] * 2
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(50, 8, generator=g), torch.randint(0, 50, (37,), generator=g),
            torch.tensor([0, 5, 5, 20]))
    for fn, checked in ((bags, 1), (bags_and_sizes, 2)):
        gm = trace_aten(fn, args, decompositions=get_decompositions())
        run = compile_aten_graph(gm, list(args))
        text = run.ember_wrapper
        assert "_embedding_bag" in text, text
        assert text.count(".stride() != ") == checked, text
        want = fn(*args)
        got = run(*args)
        for a, b in zip(got, want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
