"""Tiny transformers models whose forward logs and warns the way HF code does (logger.warning_once,
logger.info, warnings.warn, a loss `.item()` for the log line): compiled without fullgraph they
break, and outputs, printed/logged text and every gradient must match eager."""
from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch

import ember

transformers = pytest.importorskip("transformers")
hf_logging = transformers.utils.logging
logger = hf_logging.get_logger("tests.hf_breaks")


class ChattyBert(transformers.BertForMaskedLM):
    def forward(self, input_ids, labels=None):
        logger.warning_once("ChattyBert: computing the masked-LM loss")
        out = super().forward(input_ids=input_ids, labels=labels)
        logger.info("loss %.4f", out.loss.item())
        if input_ids.shape[1] > 8:
            warnings.warn("long sequence", FutureWarning)
        return out


class ChattyGPT2(torch.nn.Module):
    """An HF model inside a user module that prints between the model and the loss."""

    def __init__(self, cfg):
        super().__init__()
        self.lm = transformers.GPT2LMHeadModel(cfg)

    def forward(self, input_ids):
        logits = self.lm(input_ids=input_ids).logits
        print("logits", tuple(logits.shape))
        shift = logits[:, :-1].reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(shift, input_ids[:, 1:].reshape(-1))


def _ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 100, (2, 12), generator=g)


def _bert():
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return ChattyBert(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return ChattyGPT2(cfg)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def hf_log():
    h = Records()
    lg = logging.getLogger("tests.hf_breaks")
    old = lg.level
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    hf_logging.get_logger("tests.hf_breaks").warning_once.cache_clear()
    yield h
    lg.removeHandler(h)
    lg.setLevel(old)


def _backward_and_compare(got_loss, exp_loss, m, ref):
    """Backward through both losses; every parameter's grad matches eager; grads zeroed."""
    got_loss.backward()
    exp_loss.backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=name)
    m.zero_grad()
    ref.zero_grad()


def test_bert_with_hf_logging_breaks_and_trains(hf_log):
    torch.manual_seed(0)
    model = _bert()
    ref = copy.deepcopy(model)
    ember.compile(model, backend="aot_eager")
    ids = _ids()
    for step in range(2):
        n0 = len(hf_log.messages)
        with pytest.warns(FutureWarning, match="long sequence"):
            exp = ref(ids, labels=ids)
        n1 = len(hf_log.messages)
        with pytest.warns(FutureWarning, match="long sequence"):
            got = model(ids, labels=ids)
        loss_line = f"loss {exp.loss.item():.4f}"
        assert hf_log.messages[n0:n1][-1:] == [loss_line], hf_log.messages
        assert hf_log.messages[n1:] == [loss_line], hf_log.messages
        assert type(got) is type(exp)
        torch.testing.assert_close(got.logits, exp.logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.loss, exp.loss, rtol=1e-4, atol=1e-5)
        _backward_and_compare(got.loss, exp.loss, model, ref)
    # warning_once logs once in the whole process, eager and compiled together
    assert hf_log.messages.count("ChattyBert: computing the masked-LM loss") == 1, hf_log.messages
    assert sum(m.startswith("loss ") for m in hf_log.messages) == 4, hf_log.messages
    assert ember.stats()["counts"].get("fallbacks", 0) == 0, ember.stats()
    assert ember.stats()["counts"].get("recompiles", 0) == 0, ember.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = ember.explain(_bert(), ids, labels=ids)
    assert e.break_count == len(e.breaks) >= 2, str(e)
    assert any("item" in b.reason for b in e.breaks), str(e)
    assert e.graph_count >= 1 and max(e.ops_per_graph) > 50, e.ops_per_graph


def test_gpt2_inside_user_module_that_prints(capsys):
    torch.manual_seed(0)
    model = _gpt2()
    ref = copy.deepcopy(model)
    ember.compile(model, backend="aot_eager")
    ids = _ids()
    for _ in range(2):
        capsys.readouterr()
        exp = ref(ids)
        out_eager = capsys.readouterr().out
        got = model(ids)
        assert capsys.readouterr().out == out_eager == "logits (2, 12, 100)\n"
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)
        _backward_and_compare(got, exp, model, ref)
    assert ember.stats()["counts"].get("fallbacks", 0) == 0, ember.stats()
    assert ember.stats()["counts"].get("recompiles", 0) == 0, ember.stats()
    e = ember.explain(_gpt2(), ids)
    assert (e.graph_count, e.break_count) == (2, 1), str(e)


def test_plain_bert_mlm_with_labels_is_one_graph():
    """BertForMaskedLM builds CrossEntropyLoss() in forward under the can_return_tuple wrapper:
    the stateless loss module is built in the trace, so model and loss are one graph."""
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(_bert().config)
    ref = copy.deepcopy(model)
    ids = _ids()
    ember.compile(model, backend="aot_eager")
    for _ in range(2):
        got, exp = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
        torch.testing.assert_close(got.loss, exp.loss, rtol=1e-4, atol=1e-5)
        _backward_and_compare(got.loss, exp.loss, model, ref)
    assert ember.stats()["counts"].get("recompiles", 0) == 0, ember.stats()
    e = ember.explain(transformers.BertForMaskedLM(_bert().config), input_ids=ids, labels=ids)
    assert e.break_count == 0 and e.graph_count == 1, str(e)[:2000]
    assert max(e.ops_per_graph) > 50, e.ops_per_graph


def test_longformer_sizes_and_model_output_between_breaks():
    """LongformerModel: `torch.div(size, 2w, rounding_mode="trunc")` as a view size (was a failed
    graph in aot), the encoder's ModelOutput read after the `.item()` breaks (was the rest of
    forward eager). The two `is_global_attn = ....item()` breaks are the only ones."""
    from ember import capture
    torch.manual_seed(0)
    cfg = transformers.LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64,
                                        attention_window=8, max_position_embeddings=64)
    m = transformers.LongformerModel(cfg).eval()
    ref = copy.deepcopy(m)
    ids = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        expected = ref(input_ids=ids)
        got = ember.compile(m, backend="aot_eager")(input_ids=ids)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=1e-4, atol=1e-5)
    assert not [x for x in w if "runs eagerly" in str(x.message)], [str(x.message) for x in w]
    st = capture.stats()
    assert st.get("graph_breaks") == 2 and st.get("unsupported") == 2, st


@pytest.mark.parametrize("name", ["T5", "Bart"])
def test_encoder_decoder_with_its_cache_is_one_graph(name):
    """With the default use_cache=True, the decoder makes a cache whose config.get_text_config()
    deep-copies these legacy encoder-decoder configs: the copy runs at trace time (guarded), so
    the forward is one graph; the output and the returned cache's tensors equal eager's."""
    from ember import capture
    cfgs = {"T5": dict(num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=2,
                       d_kv=16, vocab_size=100),
            "Bart": dict(encoder_layers=1, decoder_layers=1, d_model=32, encoder_ffn_dim=64,
                         decoder_ffn_dim=64, encoder_attention_heads=2,
                         decoder_attention_heads=2, vocab_size=100, max_position_embeddings=64)}
    torch.manual_seed(0)
    model = getattr(transformers, name + "Model")(
        getattr(transformers, name + "Config")(**cfgs[name])).eval()
    assert model.config.use_cache
    compiled = ember.compile(copy.deepcopy(model))
    kw = dict(input_ids=torch.randint(4, 100, (2, 12)), decoder_input_ids=torch.randint(4, 100, (2, 6)))
    with torch.no_grad():
        got, want = compiled(**kw), model(**kw)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
    torch.testing.assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state)
    cache_got, cache_want = got.past_key_values, want.past_key_values
    assert type(cache_got) is type(cache_want)
    assert cache_got.get_seq_length() == cache_want.get_seq_length() == 6
    for part in ("self_attention_cache", "cross_attention_cache"):
        for lg, lw in zip(getattr(cache_got, part).layers, getattr(cache_want, part).layers):
            torch.testing.assert_close(lg.keys, lw.keys)
            torch.testing.assert_close(lg.values, lw.values)
    assert capture.stats()["graphs"] == 1
    assert capture.stats().get("graph_breaks", 0) == 0
