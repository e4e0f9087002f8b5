"""Layout planning (ember/backends/layout.py): inference convs run channels-last on oneDNN;
outputs come back in the layout eager returns; training graphs keep their values and grads."""
import copy
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import ember

TOL = dict(atol=1e-4, rtol=1e-4)
GRAD_TOL = dict(atol=1e-3, rtol=1e-4)    # a conv bias before training-mode BN: its grad is
                                         # ~0 by cancellation, noise ~1e-4 x the other grads
FORMATS = [torch.contiguous_format, torch.channels_last]


def count(name):
    return ember.stats()["counts"].get(name, 0)


class Block(nn.Module):
    """conv+BN+act, depthwise conv, pooling, interpolation, cat, a channel shuffle, residual."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(16, 8, 1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = F.relu(self.bn(self.stem(x)))
        z = F.hardswish(self.dw(y))
        p = F.interpolate(F.max_pool2d(z, 2), scale_factor=2, mode="nearest")
        c = torch.cat([y, p], 1)
        n, ch, h, w = c.shape
        c = c.view(n, 2, ch // 2, h, w).transpose(1, 2).contiguous().view(n, ch, h, w)
        y = torch.sigmoid(self.pw(c)) * y + y
        return self.head(y), y.mean((2, 3))


def run(m, x, train):
    if not train:
        with torch.no_grad():
            return m(x), None
    x = x.detach().requires_grad_()
    outs = m(x)
    sum(o.float().pow(2).sum() for o in outs).backward()
    return outs, x.grad


def layout(t):
    """Strides where they matter (a size-1 dim's stride is arbitrary)."""
    return [st for sz, st in zip(t.shape, t.stride()) if sz != 1]


def compare(m, ref, x, train):
    outs, gx = run(m, x, train)
    want, want_gx = run(ref, x, train)
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w, **TOL)
        assert layout(o) == layout(w), (o.stride(), w.stride())
    if train:
        torch.testing.assert_close(gx, want_gx, **GRAD_TOL)
        assert layout(gx) == layout(want_gx)
        for (name, a), b in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **GRAD_TOL, msg=name)
            assert layout(a.grad) == layout(b.grad), name


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_output_layout_matches_eager(fmt, train):
    torch.manual_seed(0)
    ref = Block().train(train)
    # the channel shuffle's .contiguous() keeps the cost rules from choosing channels-last
    # (test_*_cost_rule_keeps_a_channel_shuffle_nchw); forced here, to check the NHWC paths
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=fmt)
    compare(m, ref, x, train)
    compare(m, ref, x, train)
    assert count("channels_last_graphs") == 1
    assert count("graphs") == 1 and count("fallbacks") == 0


def test_training_cost_rule_keeps_a_channel_shuffle_nchw():
    torch.manual_seed(0)
    ref = Block().train()
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(2, 3, 16, 16), True)
    assert count("channels_last_graphs") == 0 and count("graphs") == 1


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
def test_inference_cost_rule_keeps_a_channel_shuffle_nchw(fmt):
    """A `.contiguous()` between convs (ShuffleNet's channel shuffle) makes the region NCHW and
    the next conv converts it back: such an inference graph stays in the captured layout
    (shufflenet_v2 b8: 1.22x eager channels-last, 1.43x NCHW); values and output layouts are
    eager's for both input layouts."""
    torch.manual_seed(0)
    ref = Block().eval()
    compare(ember.compile(copy.deepcopy(ref)), ref,
            torch.randn(2, 3, 16, 16).contiguous(memory_format=fmt), False)
    assert count("channels_last_graphs") == 0 and count("graphs") == 1


def test_inference_cost_rule_weighs_the_shuffled_elements():
    """A small `.contiguous()` between convs (under INFER_MAX_SHUFFLED_PER_ACTIVATION of the
    conv activations: coat_lite's token-to-image permute) keeps the graph channels-last."""
    def f(w1, w2, w3, x):
        y = torch.conv2d(torch.conv2d(x, w1, padding=1), w2, padding=1)
        t = y[:, :, :2].permute(0, 1, 3, 2).contiguous()      # 1/8 of y, read by a conv
        return torch.conv2d(y, w3, padding=1), torch.conv2d(t, w3)
    w1, w2, w3, x = (torch.randn(8, 3, 3, 3), torch.randn(8, 8, 3, 3), torch.randn(8, 8, 1, 1),
                     torch.randn(2, 3, 16, 16))
    with torch.no_grad():
        for got, want in zip(ember.compile(f)(w1, w2, w3, x), f(w1, w2, w3, x)):
            torch.testing.assert_close(got, want, **TOL)
            assert layout(got) == layout(want)
    assert count("channels_last_graphs") == 1


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
def test_inference_cost_rule_weights_dominate(fmt):
    """An inference graph not frozen whose conv weights outweigh its activations stays in the
    captured layout (oneDNN would reorder each plain weight on every channels-last call: wide_resnet50_2
    at batch 1); frozen, its weights are reordered once and it runs channels-last. Values
    and output layouts are eager's either way."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                        nn.Conv2d(64, 32, 1)).eval()
    x = torch.randn(1, 64, 4, 4).contiguous(memory_format=fmt)  # 2048 activations, 38912 weights
    compare(ember.compile(copy.deepcopy(ref), options={"freeze": False}), ref, x, False)
    assert count("channels_last_graphs") == 0 and count("graphs") == 1
    compare(ember.compile(copy.deepcopy(ref).requires_grad_(False)), ref, x, False)
    assert count("channels_last_graphs") == 1 and count("frozen_graphs") == 1


def test_inference_cost_rule_ignores_a_contiguous_after_the_last_conv():
    """A `.contiguous()` that no conv reads (a patch embedding, then attention) does not count:
    the graph still runs its conv channels-last. (A channels-last input: an NCHW one would be
    converted at the boundary, over INFER_MAX_BOUNDARY_PER_ACTIVATION.)"""
    def f(w, x):
        y = torch.conv2d(x, w, stride=4)
        return y.flatten(2).transpose(1, 2).contiguous().softmax(-1)
    w = torch.randn(8, 3, 4, 4)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f)(w, x), f(w, x), **TOL)
    assert count("channels_last_graphs") == 1


def test_training_cost_rule_takes_a_conv_stack_channels_last():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
                        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                        nn.Hardswish(), nn.MaxPool2d(2), nn.Conv2d(8, 4, 1)).train()
    m = ember.compile(copy.deepcopy(ref))
    for fmt in FORMATS:
        compare(m, ref, torch.randn(2, 3, 12, 12).contiguous(memory_format=fmt), True)
    assert count("channels_last_graphs") >= 1 and count("fallbacks") == 0


def test_layout_option_off():
    torch.manual_seed(0)
    ref = Block().eval()
    m = ember.compile(copy.deepcopy(ref), options={"layout": "contiguous"})
    compare(m, ref, torch.randn(2, 3, 16, 16), False)
    assert count("channels_last_graphs") == 0


def test_layout_sensitive_graph_kept():
    def f(w, x):
        y = torch.conv2d(x, w, padding=1)
        return y.as_strided((2, 4), (1, 2))        # reads storage: eager's layout only
    w, x = torch.randn(4, 3, 3, 3), torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f)(w, x), f(w, x), **TOL)
    assert count("channels_last_graphs") == 0


def test_layout_sensitive_aten_overload_kept():
    """The op written as an OpOverload (`torch.ops.aten.as_strided.default`, Inductor's
    test_conv_with_as_strided): a channels-last conv made every element wrong."""
    def f(w, x):
        y = torch.ops.aten.constant_pad_nd.default(torch.conv2d(x, w), [1, 1, 1, 1], 0.0)
        return torch.ops.aten.as_strided.default(y, [2, 4, 3], [36, 1, 6]).clone()
    w, x = torch.randn(4, 3, 1, 1), torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f)(w, x), f(w, x), **TOL)
        torch.testing.assert_close(torch.compile(f, backend=ember.backend)(w, x), f(w, x), **TOL)
    assert count("channels_last_graphs") == 0


def random_net(rng: random.Random) -> nn.Module:
    layers, c = [], 3
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(["conv", "conv", "dw", "bn", "pool", "avg", "act"])
        if kind == "conv":
            out, k = rng.choice([4, 8, 12]), rng.choice([1, 3, 5])
            layers.append(nn.Conv2d(c, out, k, stride=rng.choice([1, 2]), padding=k // 2,
                                    bias=rng.random() < 0.5))
            c = out
        elif kind == "dw":
            layers.append(nn.Conv2d(c, c, 3, padding=1, groups=c))
        elif kind == "bn":
            layers.append(nn.BatchNorm2d(c))
        elif kind == "pool":
            layers.append(nn.MaxPool2d(2, ceil_mode=rng.random() < 0.5))
        elif kind == "avg":
            layers.append(nn.AvgPool2d(3, stride=1, padding=1))
        else:
            layers.append(rng.choice([nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.Hardswish(),
                                      nn.Sigmoid(), nn.Tanh()]))
    layers.insert(0, nn.Conv2d(3, 3, 1))
    return nn.Sequential(*layers)


@pytest.mark.parametrize("seed", [*range(3), *(pytest.param(s, marks=pytest.mark.slow)
                                                for s in range(3, 12))])
def test_fuzz_conv_bn_pool(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ref = random_net(rng).eval()
    for mod in ref.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
    frozen = copy.deepcopy(ref).requires_grad_(False)
    for fmt in FORMATS:
        x = torch.randn(2, 3, 13, 16).contiguous(memory_format=fmt)
        for m in (ember.compile(copy.deepcopy(ref)), ember.compile(copy.deepcopy(frozen))):
            compare(m, ref, x, False)
        compare(ember.compile(copy.deepcopy(ref).train()), copy.deepcopy(ref).train(), x, True)
    assert count("fallbacks") == 0


def test_nhwc_value_reduced_in_the_same_kernel():
    """ResNet's tail: conv → BN → + residual → relu → mean over H, W. The pointwise part is
    stored channels-last and read by the reduction of the same kernel: its per-row scratch
    array must not be indexed with the channels-last strides (schedule/memory.py; it wrote
    C x H x W floats into an H x W array and crashed)."""
    torch.manual_seed(0)

    class Tail(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(64)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)) + x).mean((2, 3))

    ref = Tail().eval()
    # 4096 activations for 36864 weights: the cost rule would keep it NCHW; forced
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    compare(m, ref, torch.randn(4, 64, 4, 4), False)
    assert count("channels_last_graphs") == 1


def test_training_cost_rule_weights_dominate():
    """A training graph whose conv weights outweigh its activations stays NCHW (the weight
    gradients would come back channels-last and be copied into the parameters' layout);
    options layout=channels_last overrides the rule and keeps values, grads and layouts."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()).train()
    x = torch.randn(1, 64, 3, 3)                 # 576 activations per conv, 36864 weights
    compare(ember.compile(copy.deepcopy(ref)), ref, x, True)
    assert count("channels_last_graphs") == 0 and count("graphs") == 1
    ref = copy.deepcopy(ref)             # grads accumulate in lockstep with the next model's
    ref.zero_grad(set_to_none=True)
    forced = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    compare(forced, ref, x, True)
    compare(forced, ref, x, True)
    assert count("channels_last_graphs") == 1 and count("fallbacks") == 0


def test_layout_option_values_are_checked():
    with pytest.raises(ValueError, match="auto, channels_last, contiguous"):
        ember.compile(nn.Conv2d(3, 3, 1), options={"layout": "nhwc"})


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
def test_group_norm_in_both_layouts(fmt):
    """GroupNorm's statistics are reduced per channel, then per group, in the input's own
    layout (decomp/norms.py): values, grads and output layouts equal eager's, inference and
    training, NCHW and channels-last (UNet blocks: conv -> GroupNorm -> SiLU -> conv)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU(),
                        nn.Conv2d(16, 8, 3, padding=1), nn.GroupNorm(2, 8))
    x = torch.randn(2, 3, 9, 7).contiguous(memory_format=fmt)
    compare(ember.compile(copy.deepcopy(ref)), ref, x, False)
    ref.zero_grad(set_to_none=True)
    train = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    compare(train, ref, x, True)
    assert count("fallbacks") == 0


FOLLOWERS = {
    "reflect_pad": lambda t: F.pad(t * 2, (1, 2, 1, 0), mode="reflect"),
    "replicate_pad": lambda t: F.pad(t * 2, (1, 1, 2, 1), mode="replicate"),
    "pixel_shuffle": lambda t: F.pixel_shuffle(t * 2, 2),
    "group_norm": lambda t: F.group_norm(t * 2, 4),
}


@pytest.mark.parametrize("name", FOLLOWERS)
@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
def test_ops_whose_cpu_kernel_follows_a_channels_last_input(name, fmt):
    """Their meta kernels say contiguous; the CPU kernels return channels-last for a
    channels-last input (aot/tracer.py _CPU_FOLLOWS_INPUT, decomp): outputs' strides, values
    and input grads equal eager's without a conv in the graph."""
    f = FOLLOWERS[name]
    x = torch.randn(2, 16, 6, 5).contiguous(memory_format=fmt)
    with torch.no_grad():
        got, want = ember.compile(f)(x), f(x)
    torch.testing.assert_close(got, want, **TOL)
    assert layout(got) == layout(want), (got.stride(), want.stride())
    xr, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = ember.compile(f)(xr), f(xe)
    assert layout(got) == layout(want)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(xr.grad, xe.grad, **TOL)


# ---- residual adds fused into the conv (layout._fuse_residual_adds) ------------------------
class Residual(nn.Module):
    """conv -> BN -> + residual -> relu in the written forms: `out += identity` (torchvision),
    `out + identity`, `identity + out`, torch.add; and an in-place relu after it."""

    def __init__(self, form, c=16):
        super().__init__()
        self.form = form
        self.conv = nn.Conv2d(c, c, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        identity = x * 0.5
        out = self.bn(self.conv(x))
        if self.form == "iadd":
            out += identity
            return F.relu(out, inplace=True)
        if self.form == "radd":
            return torch.relu(identity + out)
        if self.form == "torch_add":
            return F.relu6(torch.add(out, identity))
        return F.relu(out + identity)


#: the residual-add tests compile one-conv NCHW graphs, which the inference boundary rule keeps
#: NCHW (INFER_MAX_BOUNDARY_PER_ACTIVATION): their subject, the oneDNN fusion, is forced
CL = {"layout": "channels_last"}


def bn_stats(m):
    for mod in m.modules():                # non-trivial statistics: a wrong fold shows
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.weight.data.uniform_(0.5, 1.5)
    return m.eval()


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("form", ["iadd", "add", "radd", "torch_add"])
def test_residual_add_fused_into_the_conv(form, fmt):
    """One oneDNN op computes act(conv(x) + other): values within 1e-4 of eager (the BN fold
    changes rounding), eager's output layout for NCHW and channels_last inputs, not frozen
    and frozen."""
    torch.manual_seed(0)
    ref = bn_stats(Residual(form))
    x = torch.randn(2, 16, 6, 5).contiguous(memory_format=fmt)
    compare(ember.compile(copy.deepcopy(ref), options={"freeze": False, **CL}), ref, x, False)
    assert count("residual_adds_fused") == 1 and count("batchnorm_folded_per_call") == 1
    compare(ember.compile(copy.deepcopy(ref).requires_grad_(False), options=CL), ref, x, False)
    assert count("residual_adds_fused") == 2 and count("frozen_graphs") == 1
    assert count("fallbacks") == 0


def test_residual_add_other_used_again():
    """The fused op reads `other` and never writes it: `other` read after the add (also after
    an in-place `out += other`), and a graph input as `other`, keep their values."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 1)

    def f(x, o):
        h = o * 2
        a = conv(x)
        a += h
        b = conv(x) + o
        return F.relu(a), b, h.sum((2, 3)), o * 3

    x, o = torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5)
    o0 = o.clone()
    with torch.no_grad():
        got, want = ember.compile(f, options=CL)(x, o), f(x, o)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
        assert layout(g) == layout(w)
    assert torch.equal(o, o0)
    assert count("residual_adds_fused") == 2


def test_residual_add_not_fused_across_a_write():
    """The fused op runs where the add was: a tensor the conv read, written in place between
    the conv and the add, keeps the conv unfused (it read the old values)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 1)

    def f(x):
        h = x * 2
        y = conv(h)
        h.relu_()
        return y + h

    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f, options=CL)(x), f(x), **TOL)
    assert count("residual_adds_fused") == 0 and count("channels_last_graphs") == 1


def test_residual_add_cost_rule():
    """A conv summing more than FUSE_ADD_MAX_REDUCTION products per output keeps its add in a
    kernel (the binary post-op slows such convs: docs/design/024)."""
    torch.manual_seed(0)
    ref = bn_stats(Residual("add", c=160))
    compare(ember.compile(copy.deepcopy(ref), options={"freeze": False, **CL}), ref,
            torch.randn(1, 160, 16, 16), False)
    assert count("residual_adds_fused") == 0 and count("batchnorm_folded_per_call") == 1


def test_folded_spatial_weight_written_channels_last():
    """BatchNorm folded on each call into a 3x3 conv whose weight outweighs its output (deep
    ResNet layers): folded anyway, since the fold writes the weight in the channels-last
    layout oneDNN would otherwise copy it into on every call: the compiled call copies
    nothing."""
    torch.manual_seed(0)
    ref = bn_stats(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(64), nn.ReLU()))
    # forced: the layout cost rule keeps a graph this weight-heavy NCHW
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last", "freeze": False})
    x = torch.randn(1, 64, 4, 4)                 # 1024 outputs, 36864 weights
    compare(m, ref, x, False)
    assert count("batchnorm_folded_per_call") == 1
    with torch.no_grad(), torch.profiler.profile() as prof:
        m(x)
    copies = [e.name for e in prof.events() if e.name in ("aten::copy_", "aten::clone")]
    assert copies == []


def test_residual_add_into_a_conv_output_read_by_an_earlier_fusion():
    """y is `other` of a fused add, then written in place (`y += t`): the fused op must read y
    before that write, so y's own add stays unfused (the fused node takes the add's place in
    the order: it was taken for the last reader, and y's `+=` fused ahead of it)."""
    torch.manual_seed(0)
    c1, c2 = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)

    def f(x, t):
        y0 = c2(x)
        y = c1(x)
        z = y0 + y
        y += t
        return z, y

    x, t = torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        got, want = ember.compile(f, options=CL)(x, t), f(x, t)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    assert count("residual_adds_fused") == 1 and count("fallbacks") == 0


class _Recorder(TorchDispatchMode):
    """The aten calls made outside ember's kernels (externs, autograd's own copies)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


class ResidualTail(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x, r):
        return F.relu(self.bn(self.conv(x)) + r)


def test_training_gradients_leave_in_their_values_layouts():
    """A channels-last training graph with NCHW inputs (requiring grad) and an NCHW output:
    the output's tangent is converted to channels-last on entry to the backward (so the conv
    backward gets one layout, grad_output like its input), and each input's gradient leaves
    the graph in that input's layout (autograd copies none at accumulation; before, the
    tangent stayed NCHW through the BN backward and x, r and the weight were copied)."""
    torch.manual_seed(0)
    ref = ResidualTail().train()
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    x, r = torch.randn(2, 8, 10, 10), torch.randn(2, 8, 10, 10)
    g = torch.randn(2, 8, 10, 10)
    for _ in range(2):
        xs = [t.clone().requires_grad_() for t in (x, r)]
        xe = [t.clone().requires_grad_() for t in (x, r)]
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out, want = m(*xs), ref(*xe)
        torch.testing.assert_close(out, want, **TOL)
        assert layout(out) == layout(want)
        with _Recorder() as rec:
            out.backward(g)
        want.backward(g)
        for a, b in zip(xs + list(m.parameters()), xe + list(ref.parameters())):
            torch.testing.assert_close(a.grad, b.grad, **GRAD_TOL)
            assert layout(a.grad) == layout(b.grad)
        conv_bw = [a for f, a in rec.calls if f is torch.ops.aten.convolution_backward.default]
        assert len(conv_bw) == 1
        assert all(t.is_contiguous(memory_format=torch.channels_last) for t in conv_bw[0][:2])
        assert not [f for f, _ in rec.calls if f is torch.ops.aten.copy_.default]
    assert count("channels_last_graphs") == 1 and count("fallbacks") == 0


class DenseTail(nn.Module):
    """A DenseNet block's end: the last conv's output is read only by the concat, so its
    gradient is one channel slice of the concat's (BatchNorm backward) gradient."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.c1 = nn.Conv2d(16, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(24)
        self.c2 = nn.Conv2d(24, 8, 1, bias=False)

    def forward(self, x):
        h = self.c0(x)
        z = torch.cat([h, self.c1(F.relu(h))], 1)
        return self.c2(F.relu(self.bn(z))).mean((2, 3))


def test_training_conv_backward_gets_a_channels_last_grad_output_from_a_slice():
    """A conv whose gradient is a channel slice of a channels-last gradient (the slice's meta
    is neither layout) gets it stored channels-last like its input; before, it was stored NCHW
    (densenet121: 4 mixed-layout calls a step). Values and grads are eager's."""
    torch.manual_seed(0)
    ref = DenseTail().train()
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    x = torch.randn(2, 3, 12, 12)
    for _ in range(2):
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out, want = m(x), ref(x)
        torch.testing.assert_close(out, want, **TOL)
        with _Recorder() as rec:
            out.sum().backward()
        want.sum().backward()
        for a, b in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **GRAD_TOL)
        conv_bw = [a for f, a in rec.calls if f is torch.ops.aten.convolution_backward.default]
        assert len(conv_bw) == 3
        for grad_out, inp, *_ in conv_bw:
            if inp.shape[1] > 3:            # c0's input: 3 channels, either layout
                assert grad_out.is_contiguous(memory_format=torch.channels_last)
                assert inp.is_contiguous(memory_format=torch.channels_last)
    assert count("channels_last_graphs") == 1 and count("fallbacks") == 0


@pytest.mark.parametrize("depth", [1, 4])
def test_training_cost_rule_weighs_the_boundary_conversions(depth):
    """A training graph of a few convs between an NCHW input (requiring grad) and an NCHW
    output stays NCHW: converting the input, its gradient, the output and its tangent costs
    more than channels-last saves (op sweep's conv3x3_bn_relu, b8: 0.90x eager channels-last,
    1.08x NCHW). A deeper stack (under TRAIN_MAX_BOUNDARY_PER_ACTIVATION) runs channels-last;
    values and grads are eager's either way."""
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(8), nn.ReLU()) for _ in range(depth)])
    ref.train()
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(2, 8, 16, 16), True)
    assert count("channels_last_graphs") == (depth > 1) and count("graphs") == 1


@pytest.mark.parametrize("depth", [1, 4])
def test_inference_cost_rule_weighs_the_boundary_conversions(depth):
    """An inference graph of one conv between an NCHW input and an NCHW output stays NCHW:
    converting both costs more than channels-last saves (op sweep's dwconv_bn_relu6, b8, Zen 4:
    0.72x eager channels-last, 1.20x NCHW; docs/design/067). A deeper stack (under
    INFER_MAX_BOUNDARY_PER_ACTIVATION) runs channels-last; values are eager's either way,
    frozen or not."""
    torch.manual_seed(0)
    ref = bn_stats(nn.Sequential(*[nn.Sequential(
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        for _ in range(depth)]))
    x = torch.randn(2, 8, 16, 16)
    compare(ember.compile(copy.deepcopy(ref), options={"freeze": False}), ref, x, False)
    assert count("channels_last_graphs") == (depth > 1) and count("graphs") == 1
    compare(ember.compile(copy.deepcopy(ref).requires_grad_(False)), ref, x, False)
    assert count("channels_last_graphs") == 2 * (depth > 1) and count("frozen_graphs") == 1


def test_training_input_written_in_place_before_a_channels_last_conv():
    """A graph input requiring grad (a non-leaf) written in place, then read by a conv: its
    uses go through the gradient-layout node; values and the gradient reaching the leaf are
    eager's."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, 3, 3, requires_grad=True)

    def f(x):
        x.mul_(2)
        return F.conv2d(x, w, padding=1)
    a = torch.randn(2, 8, 10, 10, requires_grad=True)
    got, want = ember.compile(f, options={"layout": "channels_last"})(a * 1), f(a * 1)
    torch.testing.assert_close(got, want, **TOL)
    assert layout(got) == layout(want)
    (ga,) = torch.autograd.grad(got.sum(), a)
    (wa,) = torch.autograd.grad(want.sum(), a)
    torch.testing.assert_close(ga, wa, **GRAD_TOL)
    assert count("channels_last_graphs") == 1 and count("fallbacks") == 0


def test_training_cost_rule_takes_comparable_activations_and_weights_channels_last():
    """Conv activations 1.56x the conv weights: at or above TRAIN_MIN_ACTIVATIONS_PER_WEIGHT
    (1; it was 2, which kept resnext50 and poolformer NCHW: 1.07x / 1.04x eager against 1.18x /
    1.30x channels-last), so the training graph runs channels-last; values and grads eager's."""
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(16), nn.ReLU()) for _ in range(4)])
    ref.train()
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(1, 16, 15, 15), True)
    assert count("channels_last_graphs") == 1 and count("graphs") == 1


class StdConv(nn.Conv2d):
    """A weight-standardized conv (timm's ScaledStdConv2d, NFNets): the conv weight is computed
    from the parameter on every call (scaled by fan-in**-0.5, as there)."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         training=True, momentum=0., eps=1e-5).reshape_as(self.weight)
        return F.conv2d(x, w * self.weight[0].numel() ** -0.5, self.bias, padding=1)


@pytest.mark.parametrize("std", [False, True], ids=["plain", "standardized"])
def test_training_cost_rule_counts_only_weights_read_from_parameters(std):
    """Conv activations 0.25x the conv weights: plain weights keep the training graph NCHW
    (each channels-last weight gradient would be copied into its parameter's layout), while
    standardized weights, written channels-last by the kernel that computes them and whose
    gradients that kernel's backward reads, do not count: the graph runs channels-last
    (eca_nfnet_l0 b2 training, activations 0.89x its weights: 1.28x eager channels-last vs
    1.19x NCHW). Values and grads eager's either way."""
    torch.manual_seed(0)
    conv = StdConv if std else nn.Conv2d
    ref = nn.Sequential(*[nn.Sequential(conv(32, 32, 3, padding=1), nn.SiLU())
                          for _ in range(3)]).train()
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(1, 32, 6, 6), True)
    assert count("channels_last_graphs") == int(std) and count("graphs") == 1


class SqueezeExcite(nn.Module):
    """A conv, then squeeze-excite: its two convs run on the pooled (N, C, 1, 1) vector."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)

    def forward(self, x):
        y = F.relu(self.conv(x))
        w = torch.sigmoid(self.fc2(F.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return y * w


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_convs_on_a_pooled_vector_stay_aten_convs(fmt, train):
    """Only the 3x3 conv runs on oneDNN's fused op: the squeeze-excite convs on the 1x1
    pooled vector stay aten convs (oneDNN's fixed per-call cost is several times theirs)."""
    torch.manual_seed(0)
    ref = SqueezeExcite().train(train)
    m = ember.compile(copy.deepcopy(ref), options={"layout": "channels_last"})
    x = torch.randn(2, 3, 12, 12).contiguous(memory_format=fmt)
    compare(m, ref, x, train)
    if not train:
        with torch.no_grad(), torch.profiler.profile() as prof:
            m(x)
        fused = [e for e in prof.events() if e.name == "mkldnn::_convolution_pointwise"]
        assert len(fused) == 1, [e.name for e in prof.events()]
    compare(m, ref, x, train)
    assert count("channels_last_graphs") == 1
    assert count("graphs") == 1 and count("fallbacks") == 0


class DropPathBlock(nn.Module):
    """A residual block whose graph makes tensors: torchvision's StochasticDepth mask
    (`torch.empty(..., device=x.device).bernoulli_(keep)`; keep=1, so the values are
    deterministic) and a scale built on the default device."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.bn(self.c0(x)))
        keep = torch.empty([h.shape[0], 1, 1, 1], dtype=h.dtype, device=h.device).bernoulli_(1.0)
        scale = torch.full((1, 16, 1, 1), 0.5)
        return (h + self.c1(h) * keep * scale).mean((2, 3))


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_graph_that_makes_tensors_is_planned(train):
    """The layout plan's meta run makes the graph's own tensors on meta: before, a CPU
    `torch.empty(device=cpu)` met the meta activations, the run failed and the graph kept its
    captured layout (convnext_tiny, efficientnet_b0 and edgenext training stayed NCHW, and
    convnext's first depthwise conv backward read a NCHW input with a channels-last grad)."""
    torch.manual_seed(0)
    ref = DropPathBlock().train(train)
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(2, 3, 16, 16), train)
    assert count("channels_last_graphs") == 1
    assert count("graphs") == 1 and count("fallbacks") == 0


DEVICE_MOVES = {
    "to_device": lambda h: h.to(h.device),
    "to_name_dtype": lambda h: h.to("cpu", torch.float32),
    "to_device_kw": lambda h: h.to(device=torch.device("cpu"), dtype=h.dtype),
    "tensor_to": lambda h: torch.Tensor.to(h, "cpu"),
    "type": lambda h: h.type("torch.FloatTensor"),
}


class MovedBlock(nn.Module):
    """Two convs with a device move of the activation between them (wav2vec2 writes
    `x.to(x.device)`), captured as `torch.Tensor.to(h, device, ...)`."""

    def __init__(self, move):
        super().__init__()
        self.c0 = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1)
        self.move = move

    def forward(self, x):
        return self.c1(F.relu(self.move(self.c0(x)))).mean((2, 3))


@pytest.mark.parametrize("move", sorted(DEVICE_MOVES))
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_graph_with_a_device_move_is_planned(move, train):
    """The layout plan's meta run keeps a device the graph names on meta: before, a positional
    device in `Tensor.to` copied out of a meta tensor, the run failed and the whole graph kept
    its captured layout, silently."""
    torch.manual_seed(0)
    ref = MovedBlock(DEVICE_MOVES[move]).train(train)
    compare(ember.compile(copy.deepcopy(ref)), ref, torch.randn(2, 3, 16, 16), train)
    assert count("channels_last_graphs") == 1
    assert count("graphs") == 1 and count("fallbacks") == 0


@pytest.mark.parametrize("move", ["cpu", "cuda", "to_index", "to_kw_index"])
def test_meta_run_keeps_device_moves_on_meta(move):
    """The meta run on a symbolically traced graph (call_method nodes): `x.cpu()`, `x.cuda()`
    and a device index (`x.to(0)`, `device=0`) stay on meta, and the conv after the move still
    reads the channels-last input's layout."""
    from ember.backends import layout as L
    calls = {"cpu": lambda h: h.cpu(), "cuda": lambda h: h.cuda(),
             "to_index": lambda h: h.to(0), "to_kw_index": lambda h: h.to(device=0)}

    class M(nn.Module):
        def forward(self, x, w):
            return F.conv2d(calls[move](x), w, None, 1, 1)

    gm = torch.fx.symbolic_trace(M())
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    got = L.eager_layouts(gm, [x, torch.randn(4, 8, 3, 3)])
    assert got is not None
    conv = next(n for n in gm.graph.nodes if n.target is F.conv2d)
    assert got[conv].device.type == "meta" and \
        got[conv].is_contiguous(memory_format=torch.channels_last)


class WideHead(nn.Module):
    """A segmentation head: a 3x3 conv from 1024 channels on 28-wide rows (channels-last
    pixels 4 KiB apart), BatchNorm, ReLU, then a 1x1 classifier; beside it a 3x3 conv from 960
    channels (not aliased)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1024, 256, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(256)
        self.cls = nn.Conv2d(256, 8, 1)
        self.other = nn.Conv2d(960, 256, 3, padding=1)

    def forward(self, x, y):
        return self.cls(F.relu(self.bn(self.conv(x)))), F.relu(self.other(y))


@pytest.mark.parametrize("fmt", FORMATS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "unfrozen"])
def test_l1_aliased_conv_runs_nchw(freeze, fmt):
    """The 3x3 conv whose channels-last input pixels are 4 KiB apart runs on oneDNN's NCHW
    (blocked) kernel, its BatchNorm folded and ReLU fused; the 1x1 conv after it and the
    960-channel conv stay channels-last (docs/design/079). A channels-last model and input
    too: outputs come back in their eager layouts."""
    torch.manual_seed(0)
    ref = bn_stats(WideHead()).to(memory_format=fmt)
    m = ember.compile(copy.deepcopy(ref), options={"freeze": freeze, **CL})
    x, y = (torch.randn(1, c, 2, 28).contiguous(memory_format=fmt) for c in (1024, 960))
    with torch.no_grad():
        for _ in range(2):
            outs, want = m(x, y), ref(x, y)
            for o, w in zip(outs, want):
                torch.testing.assert_close(o, w, **TOL)
                assert layout(o) == layout(w)
    assert count("convs_nchw_l1_aliased") == 1 and count("channels_last_graphs") == 1
    assert count("graphs") == 1 and count("fallbacks") == 0


@pytest.mark.parametrize("wfmt", FORMATS, ids=["nchw", "channels_last"])
def test_plan_feeds_the_l1_aliased_conv_nchw(wfmt):
    """The layout pass on a captured-form graph: the aliased conv reads `x.contiguous()` and
    its plain NCHW weight (a channels-last one made contiguous: oneDNN would take its
    channels-last kernel for it), the other conv `y.contiguous(channels_last)` and its packed
    weight."""
    from ember.backends import layout as L

    def f(x, y, w1, w2):
        return F.relu(F.conv2d(x, w1, None, 1, 1)), F.conv2d(y, w2, None, 1, 1)

    gm = torch.fx.symbolic_trace(f)
    vals = [torch.randn(1, 1024, 2, 28), torch.randn(1, 960, 2, 28),
            (torch.randn(256, 1024, 3, 3) * 0.01).contiguous(memory_format=wfmt),
            torch.randn(256, 960, 3, 3) * 0.01]
    env = dict(zip([n for n in gm.graph.nodes if n.op == "placeholder"], vals))
    for n in gm.graph.nodes:
        if n.op == "call_function":
            args = torch.fx.node.map_arg(n.args, env.get)
            env[n] = n.target(*args, **n.kwargs)
        if n in env:
            n.meta["example_value"] = env[n]
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert L.plan(gm, vals, {"layout": "channels_last"}, consts={ph[2], ph[3]})
    convs = {n.args[1] if n.args[1].op == "placeholder" else n.args[1].args[0]: n
             for n in gm.graph.nodes if n.target is L.CONV_POINTWISE}
    aliased, other = convs[ph[2]], convs[ph[3]]
    w = aliased.args[1]
    if wfmt == torch.channels_last:
        assert w.target == "contiguous" and w.kwargs == {}
        w = w.args[0]
    assert w is ph[2] and aliased.args[7] == "relu"
    assert aliased.args[0].target == "contiguous" and aliased.args[0].kwargs == {}
    assert other.args[1].target is L.REORDER
    assert other.args[0].kwargs == {"memory_format": torch.channels_last}
    outs = gm(*vals)
    torch.testing.assert_close(outs[0], f(*vals)[0], **TOL)
    torch.testing.assert_close(outs[1], f(*vals)[1], **TOL)


@pytest.mark.parametrize("shape, conv, aliased", [
    ((1, 1024, 28, 28), dict(kernel_size=3, padding=1), True),
    ((1, 2048, 8, 56), dict(kernel_size=3, padding=2, dilation=2), True),
    ((1, 1024, 4, 56), dict(kernel_size=3, padding=1, stride=2), True),
    ((1, 512, 4, 56), dict(kernel_size=3, padding=1, stride=2), True),     # 2 x 2 KiB
    ((1, 512, 4, 28), dict(kernel_size=3, padding=1), False),              # 2 KiB apart
    ((1, 384, 4, 56), dict(kernel_size=3, padding=1, stride=2), False),    # 2 x 1.5 KiB
    ((1, 1024, 28, 24), dict(kernel_size=3, padding=1), False),      # rows under 28 wide
    ((1, 1024, 28, 28), dict(kernel_size=1), False),                 # a 1x1 conv
    ((1, 1536, 28, 28), dict(kernel_size=3, padding=1), False),      # 6 KiB apart
    ((1, 1024, 28, 28), dict(kernel_size=3, padding=12, dilation=12), False),
    ((1, 1024, 28, 28), dict(kernel_size=3, padding=1, groups=2), False),
])
def test_l1_aliased_rule(shape, conv, aliased):
    from ember.backends.layout import l1_aliased
    c = nn.Conv2d(shape[1], 256, **conv)
    x = torch.empty(shape, device="meta")
    assert l1_aliased(x, c.weight, list(c.padding), list(c.stride), list(c.dilation),
                      c.groups) == aliased
    if all(len(set(getattr(c, k))) == 1 for k in ("padding", "stride", "dilation")):
        # one-element lists (`dilation=[2]`: PyTorch's test_convolution5) hold both dims
        assert l1_aliased(x, c.weight, [c.padding[0]], [c.stride[0]], [c.dilation[0]],
                          c.groups) == aliased
    c = nn.Conv2d(shape[1], 128, **conv)                              # few output channels
    assert not l1_aliased(x, c.weight, list(c.padding), list(c.stride), list(c.dilation),
                          c.groups)
