"""Tiny models and the 3-step training loop shared by the distributed tests."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, unused: bool = False):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)
        self.unused = nn.Linear(4, 4) if unused else None   # for find_unused_parameters

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.relu(self.c3(x))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def cnn_batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=32, vocab_size=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg)


def gpt2_batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    ids = torch.randint(0, 128, (2, 16), generator=g)
    return ids, ids


def cnn_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def gpt2_loss(model, batch):
    ids, labels = batch
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


def train(model, loss_fn, batch_fn, rank: int, steps: int = 3, lr: float = 0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, batch_fn(rank, step)).backward()
        opt.step()
    return model


def assert_same_params(a: nn.Module, b: nn.Module, atol=1e-5, rtol=1e-4):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for k in pa:
        x, y = pa[k].detach(), pb[k].detach()
        if hasattr(x, "full_tensor"):
            x, y = x.full_tensor(), y.full_tensor()
        torch.testing.assert_close(x, y, atol=atol, rtol=rtol, msg=lambda m: f"{k}: {m}")
