import torch, time, copy, os, sys
torch.set_num_threads(1)
import torch.nn.functional as F
import ember
class M(torch.nn.Module):
    def forward(s, x): return F.adaptive_avg_pool2d(x, 1).flatten(1)
class E(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.w = torch.nn.Parameter(torch.randn(1000, 8))
    def forward(s, i, o): return F.embedding_bag(i, s.w, o, mode="mean")
x = torch.randn(2, 8, 3, 3)
m = M(); c = ember.compile(copy.deepcopy(m))
e = E(); ce = ember.compile(copy.deepcopy(e)); i = torch.randint(0,1000,(16,)); o = torch.arange(0,16,4)
mode = sys.argv[1] if len(sys.argv) > 1 else "infer"
ctx = torch.no_grad() if mode == "infer" else torch.enable_grad()
if mode == "train": x.requires_grad_()
with ctx:
    c(x); ce(i,o)
    for _ in range(3):
        ts={}
        for k,f,a in (("eager",m,(x,)),("ember",c,(x,)),("ebag_eager",e,(i,o)),("ebag_ember",ce,(i,o))):
            t0=time.thread_time()
            for _ in range(3000): f(*a)
            ts[k]=round((time.thread_time()-t0)/3000*1e6,2)
        print(ts)
    if os.environ.get("PROF"):
        import cProfile, pstats
        cProfile.run(os.environ.get("PROF_STMT", "for _ in range(20000): c(x)"), "/tmp/sw7/prof.out")
        pstats.Stats("/tmp/sw7/prof.out").sort_stats("tottime").print_stats(25)
