"""Small programs through capture (backend eager, fullgraph=True) compared against eager."""
from __future__ import annotations

import collections
import dataclasses
import math
import operator
import warnings
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember import capture

from .helpers import check

x3 = torch.randn(3)
x44 = torch.randn(4, 4)


def test_add_one_graph_one_node_no_recompile():
    def f(x):
        return x + 1
    check(f, x3, ops=[1])


def test_torch_functions_and_methods():
    def f(x, y):
        a = torch.relu(x @ y).sum(dim=0, keepdim=True)
        return F.softmax(a.view(-1), dim=0), x.transpose(0, 1).contiguous().mean()
    check(f, x44, x44.clone())


def test_constants_fold():
    def f(x):
        n = len([1, 2, 3]) * 2 + int("3") + max(1, 5) + math.floor(2.5)
        return x * n
    check(f, x3, ops=[1])


def test_shapes_are_constants():
    def f(x):
        b, n = x.shape
        return x.reshape(b * n) / x.size(-1) + x.dim() + x.numel()
    check(f, x44)


def test_inlined_user_function_and_closure():
    k = 3.0

    def helper(a, b=2):
        return a * b + k
    def f(x):
        return helper(x) + helper(x, b=4)
    check(f, x3)


def test_lambda_defaults_and_comprehension():
    def f(x):
        g = lambda t, s=2: t * s  # noqa: E731
        return sum([g(x, i) for i in range(3)]) + g(x)
    check(f, x3)


def test_generator_inlined():
    def gen(x):
        for i in range(3):
            yield x + i
    def f(x):
        return [t * 2 for t in gen(x)]
    check(f, x3)


def test_loop_unroll_and_walrus():
    def f(x):
        out = x
        for i in (1, 2, 3):
            if (j := i * 2) > 2:
                out = out + j
        return out
    check(f, x3)


def test_slices_and_slice_assignment():
    def f(x):
        y = x.clone()
        y[1:3, ::2] = 0
        y[0] = y[0] + 1
        lst = [1, 2, 3, 4]
        lst[1:3] = [9]
        return y[..., None, 1:], x[:, -1], lst
    check(f, x44)


def test_is_none_and_optional_args():
    def f(x, mask=None, scale=None):
        if mask is not None:
            x = x * mask
        if scale is None:
            scale = 2.0
        return x * scale
    check(f, x3)
    check(f, x3, mask=torch.ones(3), graphs=2, recompiles=1)


def test_fstring_and_str_methods():
    def f(x):
        name = f"layer_{2}:{3.5:.1f}"
        if name.startswith("layer") and "_2" in name:
            return x + len(name)
        return x
    check(f, x3)


def test_match_statement():
    def f(x, mode):
        match mode:
            case "double":
                return x * 2
            case ("add", n):
                return x + n
            case _:
                return x
    check(f, x3, "double")
    ember.reset()
    check(f, x3, ("add", 3))


def test_zero_arg_super_and_properties():
    class Base(nn.Module):
        def forward(self, x):
            return x + 1

    class Child(Base):
        @property
        def factor(self):
            return 3

        def forward(self, x):
            return super().forward(x) * self.factor
    m = Child()
    check(m, x3)


def test_module_list_dict_sequential():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
            self.seq = nn.Sequential(nn.ReLU(), nn.Linear(4, 4))

        def forward(self, x):
            for layer in self.layers[:2]:
                x = layer(x)
            x = self.layers[-1](x) + len(self.layers)
            x = self.seq(x)
            return {k: h(x) for k, h in self.heads.items()}, self.seq[1](x)
    check(M(), x44)


def test_shared_submodule_and_training_flag():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.0)

        def forward(self, x):
            y = self.lin(self.lin(x))
            if self.training:
                y = y + 1
            return self.drop(y)
    m = M()
    check(m, x44)
    e = capture.explain(M(), x44)
    assert len(e.graphs) == 1
    # the shared linear's parameters appear once
    names = [n.name for n in e.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(names) == 3, names
    m.eval()
    torch.testing.assert_close(m(x44), m.forward(x44))
    assert capture.stats()["recompiles"] == 1


def test_two_instances_share_code_without_recompile():
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    ca = ember.compile(a, backend="eager", fullgraph=True)
    cb = ember.compile(b, backend="eager", fullgraph=True)
    for _ in range(3):
        torch.testing.assert_close(ca(x44), a.forward(x44))
        torch.testing.assert_close(cb(x44), b.forward(x44))
    assert capture.stats().get("graphs") == 1
    assert capture.stats().get("recompiles", 0) == 0


def test_inplace_on_input_and_identity():
    def f(x):
        x.add_(1)
        x.mul_(2)
        return x
    check(f, x3.clone())


def test_batchnorm_buffers_update():
    m = nn.BatchNorm1d(4)
    m.train()
    ref = nn.BatchNorm1d(4)
    ref.load_state_dict(m.state_dict())
    ember.compile(m, backend="eager", fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(m(x44), ref(x44))
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    assert m.num_batches_tracked.item() == ref.num_batches_tracked.item() == 2
    assert capture.stats()["graphs"] == 1


def test_list_append_on_callers_list():
    def f(x, acc):
        acc.append(x * 2)
        acc.append(3)
        return x + 1
    check(f, x3, [])


def test_dict_mutation_on_callers_dict():
    def f(x, d):
        d["y"] = x + 1
        d.pop("z")
        return d["a"] * x
    check(f, x3, {"a": 2, "z": 1})


def test_attribute_write_on_argument_object():
    class Box:
        pass

    def f(x, box):
        box.value = x * 2
        box.count = box.count + 1
        return x
    b = Box()
    b.count = 0
    cf = ember.compile(f, backend="eager", fullgraph=True)
    out = cf(x3, b)
    assert out is x3
    torch.testing.assert_close(b.value, x3 * 2)
    assert b.count == 1
    cf(x3, b)
    assert b.count == 2


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    aux: torch.Tensor | None = None
    n: int = 0


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def test_new_dataclass_and_namedtuple_outputs():
    def f(x):
        o = Out(x * 2, n=3)
        o.aux = o.logits + 1
        p = Pair(x, x + 1)
        return o, p, p.b
    check(f, x3)


def test_ordered_dict_subclass_output():
    class MyOut(collections.OrderedDict):
        pass

    def f(x):
        d = collections.OrderedDict()
        d["a"] = x + 1
        return d
    check(f, x3)


def test_no_grad_enable_grad_set_grad_enabled():
    def f(x):
        with torch.no_grad():
            y = x * 2
            with torch.enable_grad():
                z = x * 3
        with torch.set_grad_enabled(False):
            w = x + 1
        return y, z, w, torch.is_grad_enabled()
    x = torch.randn(3, requires_grad=True)
    cf = ember.compile(f, backend="eager", fullgraph=True)
    got, exp = cf(x), f(x)
    for g, e in zip(got[:3], exp[:3]):
        assert g.requires_grad == e.requires_grad
        torch.testing.assert_close(g, e)
    assert got[3] is True and torch.is_grad_enabled()


def test_inference_mode_and_autocast_inside():
    def f(x):
        with torch.inference_mode():
            y = x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = torch.mm(x, x)
        return y, z
    cf = ember.compile(f, backend="eager", fullgraph=True)
    g, e = cf(x44), f(x44)
    torch.testing.assert_close(g[0], e[0])
    assert g[1].dtype == e[1].dtype == torch.bfloat16
    torch.testing.assert_close(g[1], e[1])
    gm = capture.explain(f, x44).graphs[0]
    mm = next(n for n in gm.graph.nodes if n.target is torch.mm)
    assert mm.meta["example_value"].dtype == torch.bfloat16      # autocast seen at trace time
    with torch.autocast("cpu", dtype=torch.bfloat16):             # outer autocast is guarded
        assert cf(x44)[1].dtype == torch.bfloat16
    assert capture.stats()["recompiles"] == 1


def test_outer_grad_mode_is_guarded():
    def f(x):
        return x * 2
    x = torch.randn(3, requires_grad=True)
    cf = ember.compile(f, backend="eager", fullgraph=True)
    assert cf(x).requires_grad
    with torch.no_grad():
        assert not cf(x).requires_grad
    assert capture.stats()["recompiles"] == 1


def test_shape_change_recompiles():
    def f(x):
        return x.sum(0)
    cf = ember.compile(f, backend="eager", fullgraph=True)
    cf(torch.randn(3, 4))
    cf(torch.randn(5, 4))
    cf(torch.randn(3, 4))
    assert capture.stats()["graphs"] == 2 and capture.stats()["recompiles"] == 1


def test_global_float_rebinding_recompiles():
    g = globals()
    g["SCALE"] = 2.0

    def f(x):
        return x * SCALE  # noqa: F821
    cf = ember.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(cf(x3), x3 * 2)
    g["SCALE"] = 5.0
    torch.testing.assert_close(cf(x3), x3 * 5)
    assert capture.stats()["recompiles"] == 1


def test_global_tensor_rebinding_is_an_input():
    g = globals()
    g["BIAS"] = torch.ones(3)

    def f(x):
        return x + BIAS  # noqa: F821
    cf = ember.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(cf(x3), x3 + 1)
    g["BIAS"] = torch.full((3,), 7.0)
    torch.testing.assert_close(cf(x3), x3 + 7)
    assert capture.stats()["graphs"] == 1 and capture.stats().get("recompiles", 0) == 0


def test_recompile_limit_then_eager_with_warning():
    def f(x, n):
        return x + n
    # dynamic=False: an int that changes would otherwise become a size symbol (automatic dynamic)
    cf = ember.compile(f, backend="eager", fullgraph=True, recompile_limit=3, dynamic=False)
    for n in range(3):
        cf(x3, n)
    with pytest.warns(UserWarning, match="recompile limit"):
        torch.testing.assert_close(cf(x3, 10), x3 + 10)
    assert capture.stats()["graphs"] == 3


def test_unsupported_raises_with_location_under_fullgraph():
    def f(x):
        if x.sum() > 0:
            return x
        return -x
    cf = ember.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported, match=r"test_programs.py:\d+: branching on a tensor"):
        cf(x3)


def test_print_breaks_the_graph_instead_of_falling_back(capsys):
    def f(x):
        print("side effect")
        return x + 1
    cf = ember.compile(f, backend="eager")
    torch.testing.assert_close(cf(x3), x3 + 1)
    torch.testing.assert_close(cf(x3), x3 + 1)
    assert capsys.readouterr().out == "side effect\n" * 2
    s = capture.stats()
    assert s["graph_breaks"] == 1 and s["graphs"] == 1 and s.get("fallbacks", 0) == 0


def test_unresumable_frame_runs_eagerly_once_warned():
    def gen(x):
        yield x + 1
    cf = ember.compile(gen, backend="eager")
    with pytest.warns(UserWarning, match="runs eagerly"):
        torch.testing.assert_close(list(cf(x3))[0], x3 + 1)
    torch.testing.assert_close(list(cf(x3))[0], x3 + 1)
    assert capture.stats()["fallbacks"] == 1


def test_data_dependent_item_is_unsupported():
    def f(x):
        return x * x.sum().item()
    with pytest.raises(ember.Unsupported, match="item"):
        ember.compile(f, backend="eager", fullgraph=True)(x3)


def test_kwargs_varargs_and_star_call():
    def inner(*args, scale=1.0, **kw):
        return sum(args) * scale + kw.get("bias", 0)
    def f(x, *rest, **kw):
        return inner(x, *rest, scale=2.0, **kw)
    check(f, x3, x3, bias=1.0)


def test_tuple_unpack_star_and_zip_enumerate():
    def f(x):
        a, *b, c = (x, x + 1, x + 2, x + 3)
        out = []
        for i, (p, q) in enumerate(zip(b, [c, c])):
            out.append(p * q + i)
        return out
    check(f, x3)


def test_zip_strict_one_graph_and_its_errors():
    """zip(strict=True) (torch.nn.RNNBase._update_flat_weights, which timm's Sequencer runs):
    equal lengths trace as zip; unequal lengths raise eager's ValueError, caught in the trace."""
    def f(x, ws):
        out = x
        for w, k in zip(ws, (1.0, 2.0), strict=True):
            out = out * w + k
        return out

    check(f, x3, [x3, x3 + 1])

    def g(x, *lists):         # each call a new cache (reset): one graph each
        try:
            return [x * len(t) for t in zip(*lists, strict=True)]
        except ValueError as e:
            return [x * len(str(e)), str(e)]

    for lists in (([1], [1, 2]), ([1, 2], [1]), ([1], [1], [1, 2]), ([1, 2], [1, 2], [1]),
                  ([1, 2], [1, 2], [1, 2])):
        ember.reset()
        check(g, x3, *lists)


def test_isinstance_and_type_checks():
    def f(x, y):
        if isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
            return x * y
        return x
    check(f, x3, 2)


def test_tensor_compare_and_where():
    def f(x):
        return torch.where(x > 0, x, torch.zeros_like(x)), (x == x).all()
    check(f, x3)


def test_factory_functions_in_graph():
    def f(x):
        pos = torch.arange(x.shape[0], device=x.device)
        return x + pos + torch.ones(3, dtype=x.dtype) + torch.tensor([1.0, 2.0, 3.0])
    check(f, x3)


def test_multi_output_ops():
    def f(x):
        v, i = torch.max(x, dim=1)
        r = x.max(dim=0)
        a, b = x.chunk(2, dim=0)
        return v, i, r.values, r.indices, a + b, x.split(1)
    check(f, x44)


def test_return_input_and_constant_and_no_graph():
    def f(x, n):
        return x, n, None
    check(f, x3, 4, graphs=0)


def test_augmented_assign_and_math_builtins():
    def f(x):
        y = x
        y += 1
        y *= 2
        return y, abs(-3), round(2.6), divmod(7, 2), -x, ~torch.tensor([1, 2])
    check(f, x3)


def test_operator_module_and_min_max():
    def f(x, y):
        return operator.add(x, y), operator.mul(x, 2), min(3, 4), max([1, 9, 2])
    check(f, x3, x3)


def test_class_attribute_rebinding_recompiles():
    class K:
        factor = 2

    def f(x):
        return x * K.factor
    cf = ember.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(cf(x3), x3 * 2)
    K.factor = 5
    torch.testing.assert_close(cf(x3), x3 * 5)


def test_method_on_user_object_and_class_attribute():
    class Scaler:
        factor = 3

        def __init__(self, bias):
            self.bias = bias

        def apply(self, x):
            return x * self.factor + self.bias

    def f(x):
        return Scaler(2).apply(x)
    check(f, x3)


def test_argument_object_attribute_read_guard():
    class Cfg:
        def __init__(self, n):
            self.n = n

    def f(x, cfg):
        return x * cfg.n
    cf = ember.compile(f, backend="eager", fullgraph=True)
    c = Cfg(2)
    torch.testing.assert_close(cf(x3, c), x3 * 2)
    c.n = 3
    torch.testing.assert_close(cf(x3, c), x3 * 3)
    assert capture.stats()["recompiles"] == 1


def test_module_parameter_replacement_seen():
    m = nn.Linear(4, 4)
    ember.compile(m, backend="eager", fullgraph=True)
    m(x44)
    with torch.no_grad():
        m.weight = nn.Parameter(torch.zeros(4, 4))
    torch.testing.assert_close(m(x44), m.bias.expand(4, 4))
    assert capture.stats().get("recompiles", 0) == 0


def test_module_forward_hook_is_traced():
    m = nn.Linear(4, 4)
    calls = []
    m.register_forward_hook(lambda mod, i, o: calls.append(1))
    ember.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(m(x44), m.forward(x44))
    assert calls == [1]
    assert capture.stats()["graphs"] == 1 and capture.stats().get("fallbacks", 0) == 0


def test_submodule_legacy_backward_hook_is_unsupported_under_fullgraph():
    """register_backward_hook (not full) is not traced; full ones are (test_backward_hooks.py)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)
    m = M()
    m.lin.register_backward_hook(lambda mod, gi, go: None)
    ember.compile(m, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported, match="non-full backward hook"):
        m(x44)


def test_nested_functions_closures_modified_in_trace():
    def f(x):
        acc = []

        def push(v):
            acc.append(v)
        for i in range(2):
            push(x * i)
        return acc
    check(f, x3)


def test_dict_comprehension_set_and_sorted():
    def f(x):
        d = {k: x * v for k, v in sorted({"b": 2, "a": 1}.items())}
        s = {1, 2} | {3}
        return d, len(s)
    check(f, x3)


def test_training_step_grads_match():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 1))
    ref = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 1))
    ref.load_state_dict(m.state_dict())
    ember.compile(m, backend="eager", fullgraph=True)
    m(x44).sum().backward()
    ref(x44).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_number_iadd_tensor_and_module_children_memo_set():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            acc = 0
            for child in self.children():       # Module.children keeps a set() memo
                acc += child(x)
            return acc
    check(M(), x3)


def test_try_except_in_traced_code():
    def lookup(d, k):
        try:
            return d[k]
        except KeyError:
            return 10
        finally:
            pass

    def f(x):
        try:
            y = x.missing_attr
        except AttributeError:
            y = x * 2
        return y + lookup({"a": 1}, "b") + lookup({"a": 1}, "a")
    check(f, x3)


def test_disable_inside_is_unsupported_and_allow_in_graph_is_one_node():
    @ember.disable
    def eager_only(t):
        return t + 1

    def f(x):
        return eager_only(x) * 2
    with pytest.raises(ember.Unsupported, match="ember.disable"):
        ember.compile(f, backend="eager", fullgraph=True)(x3)

    @ember.allow_in_graph
    def opaque(t):
        return t.sin() + t.cos()

    def g(x):
        return opaque(x) * 2
    ember.reset()
    check(g, x3, ops=[2])


def test_mutated_input_sharing_memory_with_another_input_is_never_wrong():
    def f(a, b):
        a.add_(1)
        return b * 2
    cf = ember.compile(f, backend="aot_eager")
    a, b = torch.zeros(4), torch.ones(4)
    torch.testing.assert_close(cf(a, b), torch.full((4,), 2.0))     # apart: compiled
    assert capture.stats()["graphs"] == 1
    base = torch.zeros(4)
    with pytest.warns(UserWarning, match="shares memory with another input"):
        got = cf(base, base.view(2, 2))                              # aliased: guard fails
    torch.testing.assert_close(got, torch.full((2, 2), 2.0))
    torch.testing.assert_close(base, torch.ones(4))


def test_one_list_reached_through_two_arguments_stays_one_list():
    def f(lst, d):
        lst.append(lst[0] + 1)
        return len(d["l"]), d["l"][-1] * 2
    x = torch.ones(2)
    lst = [x]
    n, y = ember.compile(f, backend="eager")(lst, {"l": lst})
    assert n == 2 and len(lst) == 2
    torch.testing.assert_close(y, x * 4)


def test_storage_pointers_shared_between_alias_guards_still_catch_every_alias():
    """Three mutated inputs: their NO_ALIAS guards share the storage pointers they read (one
    lookup per input, guards.py), so the later guards test pointers an earlier one bound.
    An alias caught by either kind of reference makes the entry miss (never a wrong value)."""
    def f(a, b, c, d):
        a.add_(1)
        b.mul_(2)
        c.sub_(1)
        return d * 3
    cf = ember.compile(f, backend="aot_eager")
    args = [torch.zeros(4), torch.ones(4), torch.full((4,), 5.0), torch.ones(4)]
    torch.testing.assert_close(cf(*args), torch.full((4,), 3.0))
    assert capture.stats()["graphs"] == 1
    for alias in ((0, 3), (1, 3), (2, 0), (2, 1)):          # d = a, d = b, c = a, c = b
        got = [torch.zeros(4), torch.ones(4), torch.full((4,), 5.0), torch.ones(4)]
        got[alias[0]] = got[alias[1]].view(2, 2).view(4)
        want = [t.clone() for t in got]
        want[alias[0]] = want[alias[1]].view(4)
        with warnings.catch_warnings(record=True) as seen:   # warned once per reason
            warnings.simplefilter("always")
            out = cf(*got)
        assert alias != (0, 3) or any("shares memory" in str(w.message) for w in seen)
        torch.testing.assert_close(out, f(*want))
        for g_, w_ in zip(got, want):
            torch.testing.assert_close(g_, w_)
    assert capture.stats()["graphs"] == 1                    # each aliased call ran eagerly
