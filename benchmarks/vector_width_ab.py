"""vector_width_ab.py 256|512: eager/ember per op with the C++ kernels built for 256- or 512-bit vectors (-mprefer-vector-width); run both, separate EMBER_CACHE_DIRs, EMBER_SPEED_CHECK=0."""
import os, sys, time, statistics as st
import torch, torch.nn.functional as F
torch.set_num_threads(1)
from ember.runtime import build
if sys.argv[1] == "256" and "-mprefer-vector-width=512" in build.FLAGS:
    build.FLAGS.remove("-mprefer-vector-width=512")
if sys.argv[1] == "512" and "-mprefer-vector-width=512" not in build.FLAGS:
    build.FLAGS.append("-mprefer-vector-width=512")
import ember
def tm(f, *a, n=21):
    for _ in range(3): f(*a)
    ts = []
    for _ in range(n):
        t = time.thread_time(); f(*a); ts.append(time.thread_time() - t)
    return st.median(ts) * 1e3
cases = {
 "softmax": (lambda x: torch.softmax(x, -1), torch.randn(8, 12, 128, 128)),
 "layernorm": (lambda x: F.layer_norm(x, (768,)), torch.randn(8, 512, 768)),
 "gelu": (lambda x: F.gelu(x), torch.randn(8, 512, 3072)),
 "silu_mul": (lambda x: F.silu(x) * x, torch.randn(8, 512, 2048)),
 "bn_relu_cl": (lambda x: F.relu(F.batch_norm(x, None, None, training=True)), torch.randn(8, 64, 56, 56).contiguous(memory_format=torch.channels_last)),
 "sum_rows": (lambda x: x.sum(-1), torch.randn(4096, 1024)),
 "exp_add": (lambda x: torch.exp(x) + 1, torch.randn(8, 512, 1024)),
 "sum_cols": (lambda x: x.sum(0), torch.randn(4096, 1024)),
 "mean_hw": (lambda x: x.mean((2, 3)), torch.randn(8, 256, 56, 56)),
 "max_rows": (lambda x: x.amax(-1), torch.randn(4096, 1024)),
}
out = {}
with torch.no_grad():
    for k, (f, x) in cases.items():
        c = ember.compile(f)
        e = tm(f, x); m = tm(c, x); e2 = tm(f, x); m2 = tm(c, x)
        out[k] = round((e + e2) / (m + m2), 3)
print(sys.argv[1], out)
