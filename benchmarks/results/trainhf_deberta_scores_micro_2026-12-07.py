"""DeBERTa-v2 disentangled attention scores (broad-suite b_hf_deberta_v2 sizes: B 4, H 8, L 128,
span 2x256): scores = qk + gather(c2p, idx) / s + gather(p2c, idx').T / s, masked_fill, softmax;
forward only, and forward+backward (grad w.r.t. the three bmm outputs). eager vs ember vs
Inductor, thread CPU, 1 thread, paired alternating rounds, median ms."""
import time, statistics as st, torch, ember
torch.set_num_threads(1)
B, H, L, S = 4, 8, 128, 512
rel = torch.arange(L)[:, None] - torch.arange(L)[None, :]
c2p = torch.clamp(rel + S // 2, 0, S - 1).expand(B * H, L, L)
p2c = torch.clamp(-rel + S // 2, 0, S - 1).expand(B * H, L, L)
mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
def f(qk, cp, pc):
    s = qk + torch.gather(cp, -1, c2p) / 13.8 + torch.gather(pc, -1, p2c).transpose(-1, -2) / 13.8
    s = s.view(B, H, L, L).masked_fill(~mask, torch.finfo(torch.float32).min)
    return torch.softmax(s, -1)
def mk(rg):
    return [torch.randn(B * H, L, n, requires_grad=rg) for n in (L, S, S)]
g = torch.randn(B, H, L, L)
fns = {"eager": f, "ember": ember.compile(f), "torch": torch.compile(f)}
for mode in ("infer", "train"):
    xs = mk(mode == "train")
    def run(fn):
        if mode == "infer":
            with torch.no_grad():
                fn(*xs)
        else:
            fn(*xs).backward(g)
    for fn in fns.values():
        run(fn); run(fn)
    t = {k: [] for k in fns}
    for i in range(15):
        for k in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            c = time.thread_time(); run(fns[k]); t[k].append(time.thread_time() - c)
    med = {k: st.median(v) * 1e3 for k, v in t.items()}
    print(mode, {k: round(v, 2) for k, v in med.items()},
          "eager/ember %.2f eager/torch %.2f" % (med["eager"] / med["ember"], med["eager"] / med["torch"]))
