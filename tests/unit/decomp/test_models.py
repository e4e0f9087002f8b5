"""Training steps of small models with every aten op decomposed (ember.testing.DecompMode):
float64 results match eager, and every op that finally runs is in PRIMS."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.testing.decomp_mode import DecompMode

tree_leaves = torch.utils._pytree.tree_leaves


def _train_step(model, inputs, loss_fn, make_opt):
    opt = make_opt(model.parameters())
    loss = loss_fn(model(*inputs))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return [loss.detach(), grads, [p.detach().clone() for p in model.parameters()],
            [b.clone() for b in model.buffers()]]


def check_model(model, inputs, loss_fn, make_opt):
    torch.manual_seed(0)
    model = model.double()
    inputs = [i.double() if i.is_floating_point() else i for i in inputs]
    twin = copy.deepcopy(model)
    ref = _train_step(model, inputs, loss_fn, make_opt)
    mode = DecompMode()
    with mode:
        got = _train_step(twin, inputs, loss_fn, make_opt)
    for r, g in zip(tree_leaves(ref), tree_leaves(got)):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-8)  # float64; batch-norm on 1x1 maps is ill-conditioned
    assert not mode.non_prims(), sorted(map(str, mode.non_prims()))
    assert not mode.declined, mode.declined
    return mode


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.0),
                         nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 10))


@pytest.mark.parametrize("opt", ["sgd", "adamw", "adamw_foreach", "adam_foreach"])
def test_mlp_layernorm_gelu(opt):
    x, t = torch.randn(8, 16), torch.randint(0, 10, (8,))
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adamw": lambda p: torch.optim.AdamW(p, foreach=False),
            "adamw_foreach": lambda p: torch.optim.AdamW(p, foreach=True),
            "adam_foreach": lambda p: torch.optim.Adam(p, foreach=True, weight_decay=0.01)}[opt]
    mode = check_model(_mlp(), [x], lambda o: F.cross_entropy(o, t, label_smoothing=0.1)
                       + o.softmax(-1).pow(2).mean(), make)
    assert torch.ops.aten.native_layer_norm_backward.default in mode.decomposed


def test_resnet18_train():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    t = torch.tensor([1, 2])
    mode = check_model(model, [torch.randn(2, 3, 32, 32)], lambda o: F.cross_entropy(o, t),
                       lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True))
    assert torch.ops.aten.native_batch_norm_backward.default in mode.decomposed


def test_bert_train():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg)
    ids = torch.randint(0, 100, (2, 16))
    check_model(model, [ids], lambda o: o.logits.sum(), lambda p: torch.optim.AdamW(p, foreach=True))


def test_gpt2_train():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 100, (2, 16))
    check_model(model, [ids], lambda o: F.cross_entropy(o.logits.view(-1, 100), ids.view(-1)),
                lambda p: torch.optim.AdamW(p, foreach=True))


def test_dropout_statistics_and_mask_consistency():
    x = torch.ones(20000, dtype=torch.float64, requires_grad=True)
    with DecompMode() as mode:
        y = F.dropout(x, 0.3, training=True)
        y.sum().backward()
    keep = (y != 0)
    assert abs(keep.double().mean().item() - 0.7) < 0.02
    torch.testing.assert_close(y[keep], torch.full_like(y[keep], 1 / 0.7))
    torch.testing.assert_close(x.grad, keep.double() / 0.7)
    assert not mode.non_prims(), mode.non_prims()
