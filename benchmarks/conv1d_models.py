"""Eager vs ember at inference on small conv1d models (docs/design/088): wav2vec2's positional
conv embedding (HF module, broad-suite sizes), a dilated TCN, a Conformer convolution module
and a Mamba-style causal depthwise conv block. Thread CPU time, 1 thread, alternating rounds,
median eager/ember ratio and its per-round range. For a before/after A/B run it alternately
with PYTHONPATH on each tree (EMBER_SPEED_CHECK=0 to time ember's own plan):

    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/conv1d_models.py tcn conformer
"""
import argparse
import copy
import os
import statistics as st
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ember


class TCN(nn.Module):
    """4 residual blocks of two dilated causal-padded k3 convs (64 channels), ReLU."""

    def __init__(self, c=64, levels=4):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(c, c, 3, padding=2 ** (i // 2), dilation=2 ** (i // 2))
                                   for i in range(2 * levels))

    def forward(self, x):
        for i in range(0, len(self.convs), 2):
            x = F.relu(self.convs[i + 1](F.relu(self.convs[i](x))) + x)
        return x


class ConformerConv(nn.Module):
    """LayerNorm, pointwise conv + GLU, depthwise k31, BatchNorm, SiLU, pointwise conv."""

    def __init__(self, c=256):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.pw1 = nn.Conv1d(c, 2 * c, 1)
        self.dw = nn.Conv1d(c, c, 31, padding=15, groups=c)
        self.bn = nn.BatchNorm1d(c)
        self.pw2 = nn.Conv1d(c, c, 1)

    def forward(self, x):                      # [N, L, C]
        y = F.glu(self.pw1(self.ln(x).transpose(1, 2)), dim=1)
        y = self.pw2(F.silu(self.bn(self.dw(y))))
        return x + y.transpose(1, 2)


class MambaConv(nn.Module):
    """in-projection, causal depthwise k4 conv, SiLU, gate, out-projection."""

    def __init__(self, c=384, e=2):
        super().__init__()
        self.inp = nn.Linear(c, 2 * e * c)
        self.conv = nn.Conv1d(e * c, e * c, 4, padding=3, groups=e * c)
        self.out = nn.Linear(e * c, c)

    def forward(self, x):                      # [N, L, C]
        u, z = self.inp(x).chunk(2, -1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :x.shape[1]]).transpose(1, 2)
        return self.out(u * F.silu(z))


def positional():
    import transformers
    cfg = transformers.Wav2Vec2Config(hidden_size=384)
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2PositionalConvEmbedding
    return Wav2Vec2PositionalConvEmbedding(cfg), torch.randn(2, 49, 384)


MODELS = {"w2v_pos": positional,
          "tcn": lambda: (TCN(), torch.randn(4, 64, 1000)),
          "conformer": lambda: (ConformerConv(), torch.randn(4, 500, 256)),
          "mamba_conv": lambda: (MambaConv(), torch.randn(2, 256, 384))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tag", default=os.environ.get("TAG", ""))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name in a.models:
        torch.manual_seed(0)
        m, x = MODELS[name]()
        m.eval()
        eager, comp = copy.deepcopy(m), ember.compile(copy.deepcopy(m))
        with torch.no_grad():
            err = (comp(x) - eager(x)).abs().max().item()
            times = {"eager": [], "ember": []}
            for r in range(a.reps):
                for k in ("eager", "ember") if r % 2 == 0 else ("ember", "eager"):
                    t = time.thread_time()
                    for _ in range(3):
                        (eager if k == "eager" else comp)(x)
                    times[k].append((time.thread_time() - t) / 3)
        rat = sorted(e / c for e, c in zip(times["eager"], times["ember"]))
        print("%s %s eager %.3f ember %.3f ms, eager/ember median %.3f [%.3f, %.3f], max err "
              "%.1e, load %.1f" % (a.tag, name, st.median(times["eager"]) * 1e3,
                                   st.median(times["ember"]) * 1e3, st.median(rat), rat[0],
                                   rat[-1], err, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
