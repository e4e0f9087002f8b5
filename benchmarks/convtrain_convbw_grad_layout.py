"""conv backward (densenet's last 3x3 conv of a block, 128->32, b2) with a channels-last input:
grad_output NCHW vs channels-last; thread CPU time, alternating, medians."""
import time, statistics as st, torch
torch.set_num_threads(1)
CL = torch.channels_last
aten = torch.ops.aten
for hw in (56, 28, 14, 7):
    x = torch.randn(2, 128, hw, hw).contiguous(memory_format=CL)
    w = torch.randn(32, 128, 3, 3)
    g = torch.randn(2, 32, hw, hw)
    gcl = g.contiguous(memory_format=CL)
    f = lambda go: aten.convolution_backward(go, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    a = f(g); b = f(gcl)
    assert all(torch.allclose(p, q, atol=1e-3, rtol=1e-4) for p, q in zip(a[:2], b[:2]))
    t = {"nchw": [], "cl": []}
    for r in range(30):
        for k, go in ((("nchw", g), ("cl", gcl)) if r % 2 == 0 else (("cl", gcl), ("nchw", g))):
            c = time.thread_time(); f(go); t[k].append(time.thread_time() - c)
    rat = sorted(p / q for p, q in zip(t["nchw"], t["cl"]))
    print("%dx%d: grad_output NCHW %.2f ms, channels-last %.2f ms; ratio med %.2f [p10 %.2f p90 %.2f]" % (
        hw, hw, st.median(t["nchw"]) * 1e3, st.median(t["cl"]) * 1e3, st.median(rat), rat[3], rat[-4]))
