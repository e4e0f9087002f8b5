"""KV caches (issue 28): GPT-2 `generate()` with a compiled model, tiny config and random weights,
equals eager token for token, with HF's default DynamicCache (a cache that grows by torch.cat,
starting from a tensor made in the graph) and with `cache_implementation="static"` (index_copy_
into preallocated caches: input mutations); whole-model and per-block (regional) compiles; the
graph counts equal torch.compile's (measured with a counting backend in the same test); no aot
fallback (EMBER_STRICT=1 in tests turns one into an error)."""
from __future__ import annotations

import copy

import pytest
import torch

import ember
from ember import capture

transformers = pytest.importorskip("transformers")

GEN = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                  bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _ids():
    return torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(0))


def _fresh_dynamo():
    """Dynamo keeps automatic-dynamic state per code object for the whole process, and HF's
    deprecation wrapper (the compiled frame) is one code object shared by every model: without a
    reset, an earlier test's sizes make torch.compile's counts lower than a fresh process's."""
    torch._dynamo.reset()


def _torch_compile_graphs(model, regional, **kw) -> int:
    _fresh_dynamo()
    n = [0]

    def count(gm, example_inputs):
        n[0] += 1
        return gm.forward
    model = copy.deepcopy(model)
    for m in model.transformer.h if regional else [model]:
        m.compile(backend=count)
    with torch.no_grad():
        model.generate(_ids(), **GEN, **kw)
    return n[0]


# torch.compile's graph counts for these generate() calls (torch 2.14.1; re-measured by the slow
# test below): (cache, regional) -> graphs
PEER_GRAPHS = {("dynamic", False): 3, ("static", False): 2, ("dynamic", True): 6}


def _kw(cache):
    return {"cache_implementation": "static"} if cache == "static" else {}


@pytest.mark.parametrize("cache,regional", list(PEER_GRAPHS))
def test_gpt2_generate_equals_eager_in_torch_compiles_graph_count(cache, regional):
    model = _gpt2()
    with torch.no_grad():
        ref = model.generate(_ids(), **GEN, **_kw(cache))
    for m in model.transformer.h if regional else [model]:
        ember.compile(m, backend="aot_eager")
    with torch.no_grad():
        got = model.generate(_ids(), **GEN, **_kw(cache))
        again = model.generate(_ids(), **GEN, **_kw(cache))
    assert torch.equal(got, ref) and torch.equal(again, ref)
    st = capture.stats()
    assert st["graphs"] == PEER_GRAPHS[cache, regional], st
    assert st.get("fallbacks", 0) == 0 and st.get("unsupported", 0) == 0, st


@pytest.mark.slow
@pytest.mark.parametrize("cache,regional", list(PEER_GRAPHS))
def test_torch_compile_graph_counts(cache, regional):
    assert _torch_compile_graphs(_gpt2(), regional, **_kw(cache)) == PEER_GRAPHS[cache, regional]


def test_gpt2_training_step_with_use_cache_matches_eager_grads():
    model = _gpt2().train()
    ref = copy.deepcopy(model)
    ember.compile(model, backend="aot_eager", fullgraph=True)
    ids = _ids()

    def step(m):
        torch.manual_seed(1)                    # dropout: ember draws eager's masks
        out = m(ids, use_cache=True)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1),
                                                 ids[:, 1:].flatten())
        loss.backward()
        return loss, out.past_key_values
    (loss, cache), (loss_ref, cache_ref) = step(model), step(ref)
    torch.testing.assert_close(loss, loss_ref)
    for layer, layer_ref in zip(cache.layers, cache_ref.layers):
        torch.testing.assert_close(layer.keys, layer_ref.keys)
        torch.testing.assert_close(layer.values, layer_ref.values)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("fallbacks", 0) == 0, st


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(cfg).eval()


# prompts of generate() calls in a row: the same length twice (a static cache is reused and
# reset), then shorter and longer ones (the prompt dim goes dynamic)
PROMPTS = (5, 5, 3, 8)
# graph counts after each call above (Llama, torch 2.14.1): torch.compile's in a fresh Dynamo
# (re-measured by the slow test below) and ember's. Dynamic: both compile 3 graphs for the first
# generate (prefill, first decode step, decode with the cache length dynamic) and a dynamic
# prefill at the next new prompt length. Static: ember compiles no more than torch.compile.
# Pinned so that a recompile per token shows
PEER_GRAPHS_ROW = {"static": (2, 2, 3, 5), "dynamic": (3, 3, 4, 4)}
EMBER_GRAPHS_ROW = {"static": (2, 2, 3, 3), "dynamic": (3, 3, 4, 4)}


def _generate_in_a_row(model, cache, graphs):
    outs, counts = [], []
    with torch.no_grad():
        for n in PROMPTS:
            ids = torch.randint(2, 100, (1, n), generator=torch.Generator().manual_seed(n))
            outs.append(model.generate(ids, **GEN, min_new_tokens=6, **_kw(cache)))
            counts.append(graphs())
    return outs, tuple(counts)


@pytest.mark.parametrize("cache", ["static", pytest.param("dynamic", marks=pytest.mark.slow)])
def test_llama_generate_calls_in_a_row_equal_eager(cache, monkeypatch, tmp_path):
    """The kernel backend with the speed check on (it times a graph on its second call): the
    second generate() of a static cache read the position counter its timed calls had bumped
    and indexed out of bounds; a new prompt length then made the prefill graph dynamic, which
    failed to compile (a size symbol taken for a tensor in the no-alias check; a slice from the
    end of a symbolic length)."""
    monkeypatch.setenv("EMBER_SPEED_CHECK", "1")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))   # really timed, not a cached choice
    model = _llama()
    refs, _ = _generate_in_a_row(model, cache, lambda: 0)
    ember.compile(model)
    outs, counts = _generate_in_a_row(model, cache, lambda: capture.stats()["graphs"])
    for n, got, ref in zip(PROMPTS, outs, refs):
        assert torch.equal(got, ref), (n, got, ref)
    assert counts == EMBER_GRAPHS_ROW[cache], counts
    st = ember.stats()["counts"]
    assert st.get("fallbacks", 0) == 0 and st.get("eager_calls", 0) == 0, st


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_torch_compile_graph_counts_in_a_row(cache):
    _fresh_dynamo()
    n = [0]

    def count(gm, example_inputs):
        n[0] += 1
        return gm.forward
    model = _llama()
    model.compile(backend=count)
    _, counts = _generate_in_a_row(model, cache, lambda: n[0])
    assert counts == PEER_GRAPHS_ROW[cache]
