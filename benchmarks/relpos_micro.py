"""Eager vs ember (vs torch.compile with --torch) on the row kernels of design 074:

- relpos_KHxKW: decomposed relative-position attention softmax (timm MViTv2's cal_rel_pos):
  softmax(attn.view(.., qh, qw, kh, kw) + rel_h[..., None] + rel_w[..., None, :]) over the
  kh*kw keys: a row reduction whose loads read rel_h at v // kw and rel_w at v % kw, twice per
  row (the max pass and the exp/sum pass);
- gelumean_C: gelu of a channels-last [B, C, H, W] tensor stored, and its mean over (H, W)
  (GCViT's MBConv squeeze-excite input): a reduction with a pointwise store in the same stage.

1 thread, CPU time of this thread per call, paired alternating rounds (benchmarks/_timing.py).

    EMBER_SPEED_CHECK=0 python benchmarks/relpos_micro.py [--only REGEX] [--rounds 7] [--torch]
"""
import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tstride_micro  # noqa: E402  (its timing loop)


def relpos_case(b, h, q, k):
    (qh, qw), (kh, kw) = q, k

    def relpos(attn, rh, rw):
        a = attn.view(b, h, qh, qw, kh, kw) + rh[..., None] + rw[..., None, :]
        return a.view(b, h, qh * qw, kh * kw).softmax(-1)
    args = (torch.randn(b, h, qh * qw, kh * kw), torch.randn(b, h, qh, qw, kh),
            torch.randn(b, h, qh, qw, kw))
    return f"relpos_{kh}x{kw}", relpos, args


def gelumean(x):
    y = F.gelu(x)
    return y, y.mean((2, 3), keepdim=True)


def cases():
    yield relpos_case(4, 1, (56, 56), (7, 7))
    yield relpos_case(4, 2, (28, 28), (14, 14))
    yield relpos_case(4, 1, (28, 28), (28, 28))
    yield relpos_case(4, 2, (14, 14), (13, 11))
    for c, hw in ((64, 56), (128, 28), (96, 27)):
        x = torch.randn(4, c, hw, hw).to(memory_format=torch.channels_last)
        yield f"gelumean_{c}", gelumean, (x,)


if __name__ == "__main__":
    tstride_micro.main(cases, width=14)
