"""Dynamic shapes (#12): symbolic sizes from capture to kernels.

Each test compiles through ember's own capture and the default "ember" backend (generated C++
kernels) unless it says otherwise, and asserts values (and grads) against eager plus the number
of compiles. Tolerances: fp32, rtol=atol=1e-5 for small MLPs, 1e-4 for transformer stacks.
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch

import ember
from ember.capture.entry import stats as capture_stats


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def compiles() -> int:
    return capture_stats().get("graphs", 0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        b, t = x.shape[0], x.shape[1]
        h = torch.nn.functional.gelu(self.ln(self.l1(x)))
        y = self.l2(h).softmax(-1)
        return y.reshape(b * t, -1).sum(0) / t


def _pair(cls):
    torch.manual_seed(0)
    m = cls()
    return m, copy.deepcopy(m)


def _train_step_matches(cm, m, ref, x, grad_rtol=1e-5, grad_atol=1e-5):
    """One forward+backward of the compiled module and of its eager copy: outputs, every
    parameter grad and every buffer equal; grads cleared after."""
    out, r = cm(x), ref(x)
    torch.testing.assert_close(out, r, rtol=grad_rtol, atol=1e-5)
    out.pow(2).sum().backward()
    r.pow(2).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=grad_rtol, atol=grad_atol)
    for p, q in zip(m.buffers(), ref.buffers()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    m.zero_grad()
    ref.zero_grad()


@pytest.mark.parametrize("sweep", [
    [(3, 7), (3, 16), (3, 33), (3, 64)],          # sequence lengths
    [(1, 16), (3, 16), (8, 16)],                  # batch sizes (1 is specialized first)
])
def test_mlp_train_sweep_compiles_at_most_twice(sweep):
    m, ref = _pair(MLP)
    cm = ember.compile(m)
    for b, t in sweep:
        _train_step_matches(cm, m, ref, torch.randn(b, t, 8))
    assert compiles() <= 2


def test_dynamic_graph_is_reused_with_parametric_kernels():
    """After the dimension goes dynamic, new sizes run the same compiled graph: no new compile,
    and the generated kernels take the sizes as arguments."""
    from ember.backends.ember import STATS
    m, ref = _pair(MLP)
    cm = ember.compile(m).eval()
    with torch.no_grad():
        for t in (5, 9):
            cm(torch.randn(2, t, 8))
        n_graphs, n_kernel_graphs = compiles(), len(STATS)
        for t in (12, 31, 100):
            x = torch.randn(2, t, 8)
            torch.testing.assert_close(cm(x), ref(x), rtol=1e-5, atol=1e-5)
    assert compiles() == n_graphs == 2
    assert len(STATS) == n_kernel_graphs


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=128,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg).eval()


def _bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100, max_position_embeddings=128,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg).eval()


@pytest.mark.parametrize("make", [_gpt2, _bert], ids=["gpt2", "bert"])
@pytest.mark.parametrize("sweep", [
    [(3, 7), (3, 16), (3, 33), (3, 64)],
    [(1, 16), (3, 16), (8, 16)],
], ids=["seq", "batch"])
def test_hf_sweep_compiles_at_most_twice(make, sweep):
    torch.manual_seed(0)
    m = make()
    ref = copy.deepcopy(m)
    cm = ember.compile(m)
    with torch.no_grad():
        for b, t in sweep:
            ids = torch.randint(0, 100, (b, t))
            torch.testing.assert_close(cm(input_ids=ids).last_hidden_state,
                                       ref(input_ids=ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    assert compiles() <= 2


def test_gpt2_both_dims_varying():
    torch.manual_seed(0)
    m = _gpt2()
    ref = copy.deepcopy(m)
    cm = ember.compile(m)
    with torch.no_grad():
        for b, t in [(3, 7), (3, 16), (8, 33), (8, 64), (3, 9)]:
            ids = torch.randint(0, 100, (b, t))
            torch.testing.assert_close(cm(input_ids=ids).last_hidden_state,
                                       ref(input_ids=ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    # static, then the sequence dim, then the batch dim; the last call reuses the last graph
    assert compiles() == 3


def test_shape_branch_recompiles_only_when_the_branch_changes():
    def f(x):
        if x.shape[1] > 10:
            return x.sum(1) * 2
        return x.sum(1) - 1
    cf = ember.compile(f)
    counts = []
    for t in (4, 6, 8, 12, 16, 30, 5):
        x = torch.randn(2, t)
        torch.testing.assert_close(cf(x), f(x))
        counts.append(compiles())
    # 4: static; 6: dim 1 dynamic (guard s <= 10); 8 reuses; 12: branch flips; 16, 30, 5 reuse
    assert counts == [1, 2, 2, 3, 3, 3, 3]


def test_size_one_broadcast_specializes_correctly():
    def f(x, y):
        return x * y + y.shape[1]
    cf = ember.compile(f, dynamic=True)
    for t in (5, 1, 7, 1, 3):
        x, y = torch.randn(4, 1, 3), torch.randn(4, t, 3)
        torch.testing.assert_close(cf(x, y), f(x, y))
        x, y = torch.randn(4, t, 3), torch.randn(4, 1, 3)
        torch.testing.assert_close(cf(x, y), f(x, y))


def test_dynamic_true_compiles_once_and_false_per_shape():
    def f(x):
        return torch.relu(x).cumsum(0)[-1] + x.mean()
    cf = ember.compile(f, dynamic=True)
    for n in (3, 5, 9, 17):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), f(x))
    assert compiles() == 1
    ember.reset()
    cf = ember.compile(f, dynamic=False)
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), f(x))
    assert compiles() == 3


def test_float_times_a_symbolic_size_is_a_graph_value():
    """`y * x.shape[-1]` with a float y is a SymFloat: the graph computes it from the size
    input (it was written into the graph as the text `1.0e-5*s1`: NameError at trace time;
    Inductor's test_div_softmax_symfloat)."""
    def f(x, y):
        return torch.softmax(x.div(y * x.shape[-1]), dim=-1) + x.mul(y * x.shape[-2])
    cf = ember.compile(f, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(1, n, n + 2)
        torch.testing.assert_close(cf(x, 1e-5), f(x, 1e-5))
    assert compiles() == 1


def test_symbolic_size_inside_a_slice_is_a_graph_value():
    """`table[:n]` and `table[:, :n]` with n = x.shape[0] symbolic: the slice's bound is a graph
    value (it was printed into the graph as the text `s0`: NameError at run time)."""
    table = torch.randn(16, 16)

    def f(x):
        n = x.shape[0]
        return x * table[:n, 0] + table[0, :n]
    cf = ember.compile(f, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), f(x))
    assert compiles() == 1


def test_mark_dynamic_first_compile_is_dynamic():
    def f(x):
        return (x * 2).softmax(-1)
    cf = ember.compile(f)
    x = torch.randn(3, 6)
    ember.mark_dynamic(x, 1)
    torch.testing.assert_close(cf(x), f(x))
    for n in (7, 11):
        y = torch.randn(3, n)
        torch.testing.assert_close(cf(y), f(y))
    assert compiles() == 1
    with pytest.raises(ValueError, match="out of range"):
        ember.mark_dynamic(x, 2)


def test_range_over_a_size_stays_static_and_guarded():
    def f(x):
        out = x[0]
        for i in range(x.shape[0]):
            out = out + x[i] * i
        return out
    cf = ember.compile(f)
    for n in (2, 3, 4, 3):
        x = torch.randn(n, 5)
        torch.testing.assert_close(cf(x), f(x))
    assert compiles() == 3       # one graph per loop length; the last call hits the n=3 entry


def test_shape_arithmetic_and_returned_sizes():
    def f(x):
        b, t, d = x.shape
        y = x.reshape(b, t // 2, 2 * d)
        return y.sum(-1), y.shape, x.size(1) // 2 + 1
    cf = ember.compile(f, dynamic=True)
    for t in (4, 10, 6):
        x = torch.randn(3, t, 5)
        out, shape, n = cf(x)
        ref_out, ref_shape, ref_n = f(x)
        torch.testing.assert_close(out, ref_out)
        assert shape == ref_shape and type(n) is int and n == ref_n
    assert compiles() == 1


def test_dynamic_graph_that_mutates_an_input_and_slices_from_the_end():
    """What a static-cache prefill does at a new prompt length: a dynamic graph (its size
    symbols are inputs too) that mutates an input and takes the last position (slice start -1
    of a symbolic length)."""
    def f(x, counter):
        counter.add_(x.shape[1])
        return x[:, -1:, :] * 2 + counter, x[:, 1:-1].sum(1)
    cf = ember.compile(f)
    counter, ref_counter = torch.zeros(()), torch.zeros(())
    for t in (5, 9, 12, 3):
        x = torch.randn(2, t, 4)
        got, want = cf(x, counter), f(x, ref_counter)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(counter, ref_counter)
    assert compiles() == 2


def test_recompile_log_says_which_dim_became_dynamic(monkeypatch, caplog):
    from ember.logging import get_logger
    monkeypatch.setenv("EMBER_LOGS", "recompiles")
    monkeypatch.setattr(get_logger("recompiles"), "propagate", True)
    cf = ember.compile(lambda x: x.sin() + 1)
    with caplog.at_level(logging.INFO, logger="ember"):
        cf(torch.randn(2, 3))
        cf(torch.randn(2, 9))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "dim 1: 3 → 9, now dynamic" in text


def test_aot_eager_training_with_dynamic_sizes():
    m, ref = _pair(MLP)
    cm = ember.compile(m, backend="aot_eager", dynamic=True)
    for b, t in [(2, 3), (4, 5)]:
        x = torch.randn(b, t, 8, requires_grad=True)
        xr = x.detach().clone().requires_grad_(True)
        cm(x).sum().backward()
        ref(xr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    assert compiles() == 1


def test_gpt2_lm_training_over_sequence_lengths():
    """Forward + backward of GPT2LMHeadModel (with its graph breaks) at four lengths: the loss
    and every parameter grad match eager, and each of the two frames (the model, and the loss
    function called in its rest after the break) compiles twice (static, then dynamic). The
    loss's backward takes the flattened tangent (3*(s1 - 1), V): its wrapper binds s1 from it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=128,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg)
    ref = copy.deepcopy(m)
    cm = ember.compile(m)
    for t in (7, 16, 33, 64):
        ids = torch.randint(0, 100, (3, t))
        loss, ref_loss = cm(input_ids=ids, labels=ids).loss, ref(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        loss.backward()
        ref_loss.backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
        m.zero_grad()
        ref.zero_grad()
    assert compiles() == 4


def test_size_int_live_across_a_graph_break_goes_dynamic(capsys):
    """`n = x.shape[1]` reaches the resume function after a print as a plain int local: after it
    changes once it is a size symbol there too, not one resume compile per length."""
    def f(x):
        n = x.shape[1]
        y = x.cos() * n
        print("n =", n)
        return y + n
    cf = ember.compile(f)
    seen = []
    for t in (3, 5, 9, 12, 40):
        x = torch.randn(2, t)
        torch.testing.assert_close(cf(x), f(x))
        seen.append(compiles())
    out = capsys.readouterr().out.splitlines()
    assert out == [f"n = {t}" for t in (3, 5, 9, 12, 40) for _ in range(2)]
    assert seen[2:] == [seen[1]] * 3          # after the second length: no more compiles


def test_int_argument_dynamic():
    def f(x, n):
        return x.reshape(n, -1).sum(0) * n
    cf = ember.compile(f)
    for n in (2, 4, 8, 16):
        x = torch.randn(16, 3)
        torch.testing.assert_close(cf(x, n), f(x, n))
    assert compiles() == 2


def test_user_backend_gets_static_graphs_unless_asked():
    """Automatic dynamic only for backends that compile symbolic graphs: a user callable could
    specialize on the example inputs, so by default it sees static graphs (one per shape)."""
    seen = []

    def backend(gm, example_inputs):
        seen.append([n.meta["example_value"] for n in gm.graph.find_nodes(op="placeholder")])
        return gm.forward

    def f(x):
        return x * 2
    cf = ember.compile(f, backend=backend)
    for n in (3, 5, 7):
        torch.testing.assert_close(cf(torch.ones(n)), torch.full((n,), 2.0))
    assert len(seen) == 3 and all(isinstance(v[0].shape[0], int) for v in seen)
    ember.reset()
    seen.clear()
    cf = ember.compile(f, backend=backend, dynamic=True)
    for n in (3, 5, 7):
        torch.testing.assert_close(cf(torch.ones(n)), torch.full((n,), 2.0))
    assert len(seen) == 1 and isinstance(seen[0][0].shape[0], torch.SymInt)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


def test_cnn_training_with_dynamic_batch():
    """BatchNorm in training mode over a symbolic batch (its mean divides by a size expression),
    conv/pool externs and the tangent layout: values, grads and running stats match eager."""
    m, ref = _pair(SmallCNN)
    cm = ember.compile(m)
    for b in (2, 4, 8, 3):
        _train_step_matches(cm, m, ref, torch.randn(b, 3, 8, 8), grad_rtol=1e-4, grad_atol=1e-4)
    assert compiles() == 2


def test_layouts_under_dynamic_true():
    """Transposed inputs stay dynamic in their own dim order; a size-1 dim whose stride the
    sizes do not give (as_strided) and an expanded (stride 0) input compile statically."""
    def f(x):
        return x * 2 + 1
    cf = ember.compile(f, dynamic=True)
    inputs = [torch.randn(6, 8).t(), torch.randn(5, 9).t(),
              torch.randn(40).as_strided((5, 1, 8), (8, 100, 1)),
              torch.randn(1, 8).expand(4, 8)]
    for x in inputs:
        torch.testing.assert_close(cf(x), f(x))
    assert compiles() == 3      # both transposes share one dynamic graph


def test_triton_kernels_take_sizes_as_parameters():
    """The Triton path (on CPU through Triton's interpreter, options={'cpu_codegen': 'triton'}):
    kernels take the size symbols as arguments, the launch grid is computed per call, reductions
    over a symbolic length loop; training over lengths compiles twice."""
    pytest.importorskip("triton")
    from ember.codegen.triton_launch import interpreting
    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py)")
    m, ref = _pair(MLP)
    cm = ember.compile(m, options={"cpu_codegen": "triton"})
    for t in (7, 16, 33):
        _train_step_matches(cm, m, ref, torch.randn(3, t, 8), grad_rtol=1e-4)
    assert compiles() == 2



@pytest.mark.slow
def test_hf_models_after_others_made_the_sequence_dynamic():
    """transformers' forward wrappers are code shared by every model: after two models of other
    sequence lengths, ALBERT's sequence dim is symbolic from its first compile. Its backward pads
    a gradient by (0, s - 1), whose bounds check the lowering decided with a Python comparison of
    sympy sizes (TypeError: cannot determine truth value of Relational: s1 > 1)."""
    transformers = pytest.importorskip("transformers")
    cfg = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
               vocab_size=512, max_position_embeddings=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
    models = [(transformers.BertModel(transformers.BertConfig(**cfg)), 16),
              (transformers.GPT2Model(transformers.GPT2Config(n_embd=64, n_layer=1, n_head=2,
                                                              vocab_size=512, n_positions=64, resid_pdrop=0.0,
                                                              embd_pdrop=0.0, attn_pdrop=0.0)), 24),
              (transformers.AlbertModel(transformers.AlbertConfig(embedding_size=32, **cfg)), 20)]
    for model, seq in models:
        torch.manual_seed(0)
        model.train()
        ref = copy.deepcopy(model)
        ids = torch.randint(4, 512, (2, seq))
        out = ember.compile(model)(input_ids=ids).last_hidden_state
        r = ref(input_ids=ids).last_hidden_state
        torch.testing.assert_close(out, r, rtol=1e-4, atol=1e-5)
        out.pow(2).mean().backward()
        r.pow(2).mean().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
    assert capture_stats().get("recompiles", 0) >= 1


@pytest.mark.parametrize("mode,pad,shapes", [
    ("replicate", (1, 2), [(1, 3), (2, 4, 7)]),
    ("reflect", (2, 1), [(1, 3), (2, 4, 7)]),
    ("circular", (1, 2, 2, 1), [(3, 3, 5, 5), (2, 3, 4, 6)]),
])
def test_pad_modes_backward_with_dynamic_sizes(mode, pad, shapes):
    """Pad backwards under dynamic=True: the lowering's bounds checks on symbolic pads
    (replicate), a hint with an unevaluated constant Max (reflect's clamps), and size nodes of
    multi-term products without meta["val"] (circular: KeyError 'val' when the partitioner saved
    one for the backward, or a size node placed after its user)."""
    def f(x):
        return torch.nn.functional.pad(x, pad, mode=mode) * 2
    cf = ember.compile(f, dynamic=True)
    for shape in shapes:
        x = torch.randn(shape, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, r = cf(x), f(x2)
        torch.testing.assert_close(out, r)
        cot = torch.randn_like(r)
        out.backward(cot)
        r.backward(cot)
        torch.testing.assert_close(x.grad, x2.grad)
