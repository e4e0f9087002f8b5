import torch, time
torch.set_num_threads(1)
import torch.nn.functional as F
x = torch.randn(8, 256, 1, 1); w = torch.randn(16, 256, 1, 1); b = torch.randn(16)
w2 = torch.randn(256, 16, 1, 1); b2 = torch.randn(256)
wl = w.to(memory_format=torch.channels_last)
op = torch.ops.mkldnn._convolution_pointwise.default
fs = {"F.conv2d+relu": lambda: F.relu(F.conv2d(x, w, b)),
      "mkldnn_relu": lambda: op(x, w, b, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""),
      "mkldnn_relu_wcl": lambda: op(x, wl, b, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""),
      "addmm+relu": lambda: torch.addmm(b, x.view(8, 256), w.view(16, 256).t()).relu_(),
      }
with torch.no_grad():
    best = {k: 1e9 for k in fs}
    for _ in range(10):
        for k, f in fs.items():
            t0 = time.thread_time()
            for _ in range(300): f()
            best[k] = min(best[k], (time.thread_time() - t0) / 300 * 1e6)
    print({k: round(v, 1) for k, v in best.items()})
wp = torch.ops.mkldnn._reorder_convolution_weight(w, [0, 0], [1, 1], [1, 1], 1, [8, 256, 1, 1])
xcl = x.contiguous(memory_format=torch.channels_last)
fs = {"F.conv2d+relu": lambda: F.relu(F.conv2d(x, w, b)),
      "mkldnn_packed": lambda: op(x, wp, b, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""),
      "mkldnn_packed_xcl": lambda: op(xcl, wp, b, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""),
      "big_F": lambda: F.relu(F.conv2d(xb, w, b)), "big_mkldnn_packed": lambda: op(xb, wpb, b, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""),
      }
xb = torch.randn(8, 256, 14, 14).contiguous(memory_format=torch.channels_last)
wpb = torch.ops.mkldnn._reorder_convolution_weight(w, [0, 0], [1, 1], [1, 1], 1, [8, 256, 14, 14])
with torch.no_grad():
    best = {k: 1e9 for k in fs}
    for _ in range(10):
        for k, f in fs.items():
            t0 = time.thread_time()
            for _ in range(300): f()
            best[k] = min(best[k], (time.thread_time() - t0) / 300 * 1e6)
    print({k: round(v, 1) for k, v in best.items()})
