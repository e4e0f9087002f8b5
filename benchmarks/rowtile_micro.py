"""Eager vs ember vs torch.compile on row reductions (RMSNorm over channels) whose fused inputs are
read transposed w.r.t. the reduced dim, or through v // 64 and v % 64 (HF Mamba2's gated
RMSNorm after its chunked scan: the depthwise conv1d output is [B, C, L], the scan's output a
head-split [B, H, L, 64]). Inference (no_grad) or forward+backward, 1 thread, CPU time of this
thread per call, paired alternating rounds (benchmarks/_timing.py); design 055.

    EMBER_SPEED_CHECK=0 python benchmarks/rowtile_micro.py [CASE ...] [--train] [--no-inductor]
"""
import argparse
import copy
import os
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402

B, L, C, HD = 2, 128, 512, 64


class GatedRMS(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(C) + 0.5)

    def forward(self, x, gate):
        x = x * F.silu(gate)
        return self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


class ConvRMS(nn.Module):
    """transposed: Linear -> depthwise conv1d over [B, C, L] -> transpose back -> silu -> RMS."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 2 * C)
        self.conv = nn.Conv1d(C, C, 4, groups=C, padding=3)
        self.norm = GatedRMS()

    def forward(self, u):
        x, gate = self.proj(u).split(C, -1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :L].transpose(1, 2))
        return self.norm(x, gate)


class HeadRMS(nn.Module):
    """divmod: a head-split [B, H, L, 64] result merged to [B, L, H*64], scaled per head (D[h]),
    gated RMS over the channels: indices 4096*(c // 64) + c % 64 along the reduced dim."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, C)
        self.d = nn.Parameter(torch.rand(C // HD))
        self.norm = GatedRMS()

    def forward(self, u, y):
        gate = self.proj(u)
        h = (y * self.d.view(1, -1, 1, 1)).permute(0, 2, 1, 3).reshape(B, L, C)
        return self.norm(h, gate)


class MambaRMS(nn.Module):
    """both: Mamba2's scan output (head-split, * exp of a per-(head, token) decay) plus D times
    the conv's silu output (transposed), gated RMS."""

    def __init__(self):
        super().__init__()
        self.conv_rms = ConvRMS()
        self.d = nn.Parameter(torch.rand(C // HD))

    def forward(self, u, y, decay):
        m = self.conv_rms
        x, gate = m.proj(u).split(C, -1)
        x = F.silu(m.conv(x.transpose(1, 2))[..., :L].transpose(1, 2))
        scan = (y * decay.exp().unsqueeze(-1)).permute(0, 2, 1, 3).reshape(B, L, C)
        h = scan + (x.view(B, L, -1, HD) * self.d.view(-1, 1)).reshape(B, L, C)
        return m.norm(h, gate)


CASES = {"transposed": ConvRMS, "divmod": HeadRMS, "both": MambaRMS}


def inputs(case):
    u = torch.randn(B, L, 256)
    if case == "transposed":
        return (u,)
    y = torch.randn(B, C // HD, L, HD)
    return (u, y) if case == "divmod" else (u, y, -torch.rand(B, C // HD, L))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for case in a.cases:
        torch.manual_seed(0)
        model = CASES[case]()
        args = inputs(case)
        fns = {"eager": model, "ember": ember.compile(copy.deepcopy(model))}
        if not a.no_inductor:
            fns["inductor"] = torch.compile(copy.deepcopy(model))

        def step(fn):
            if a.train:
                fn(*args).sum().backward()
            else:
                with torch.no_grad():
                    return fn(*args)
        for f in fns.values():
            step(f)
        if not a.train:
            torch.testing.assert_close(step(fns["ember"]), step(model), atol=1e-4, rtol=1e-4)
        calls = {k: (lambda f=f: step(f)) for k, f in fns.items()}
        samples, reps = _timing.paired(calls, rounds=a.rounds)
        med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
        line = f"{os.environ.get('TAG', '')} {case} {'train' if a.train else 'infer'}: " + \
            ", ".join(f"{k} {v:.0f} us" for k, v in med.items())
        for k in fns:
            if k != "eager":
                s = _timing.ratio_stats(samples["eager"], samples[k])
                line += f"; eager/{k} {s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}]"
        print(line + f"; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
