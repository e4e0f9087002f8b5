"""Every aten op in the graphs the aot tracer produces for the model suite (training: forward
and backward graphs) is a primitive: the decomposition table covers the model suite."""
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.aot import aot_compile
from ember.decomp import PRIMS, get_decompositions


class RecordingBackend:
    def __init__(self):
        self.ops = set()

    def _record(self, gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem:
                self.ops.add(node.target)
        return gm.forward

    def __call__(self, gm, example_inputs):
        return aot_compile(gm, example_inputs, fw_compiler=self._record, bw_compiler=self._record,
                           decompositions=get_decompositions())


def _graph_ops(model, inputs, loss_fn):
    backend = RecordingBackend()
    run = torch.compile(model, backend=backend, dynamic=False)
    loss_fn(run(*inputs)).backward()
    return backend.ops


def _assert_prims(ops):
    assert ops, "nothing was traced"
    extra = sorted(str(op) for op in ops if op not in PRIMS)
    assert not extra, f"ops in traced graphs that are neither PRIMS nor decomposed: {extra}"


def test_mlp_layernorm_gelu_dropout_graphs():
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.1),
                          nn.Linear(32, 10))
    t = torch.randint(0, 10, (8,))
    _assert_prims(_graph_ops(model, [torch.randn(8, 16)],
                             lambda o: F.cross_entropy(o, t) + o.softmax(-1).mean()))


def test_gpt2_graphs():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 100, (2, 8))
    _assert_prims(_graph_ops(model, [ids], lambda o: F.cross_entropy(o.logits.view(-1, 100), ids.view(-1))))


@pytest.mark.slow
def test_resnet18_graphs():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    t = torch.tensor([1, 2])
    _assert_prims(_graph_ops(model, [torch.randn(2, 3, 32, 32)], lambda o: F.cross_entropy(o, t)))


@pytest.mark.slow
def test_bert_graphs():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32)
    model = transformers.BertForSequenceClassification(cfg)
    ids = torch.randint(0, 100, (2, 8))
    _assert_prims(_graph_ops(model, [ids], lambda o: o.logits.sum()))
