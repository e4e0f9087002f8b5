import torch, time, statistics as st, os
torch.set_num_threads(1)
def t(f, n=10, r=7):
    f(); out=[]
    for _ in range(r):
        c=time.thread_time()
        for _ in range(n): f()
        out.append((time.thread_time()-c)/n*1e3)
    return st.median(out)
for M,K,N in [(512,768,768),(512,768,3072),(512,3072,768),(394,384,1152),(1500,384,384)]:
    x=torch.randn(M,K); w=torch.randn(N,K); b=torch.randn(N)
    a=t(lambda: torch.addmm(b,x,w.t()))
    try:
        c=t(lambda: torch.ops.mkldnn._linear_pointwise(x,w,b,"none",[],""))
    except Exception as e: c=float('nan'); print(e)
    g=torch.randn(M,N)
    wg=t(lambda: torch.mm(g.t(),x))
    print(M,K,N,"addmm(MKL) %.2f  onednn linear %.2f  wgrad mm %.2f  GFLOPs mkl %.0f onednn %.0f"%(a,c,wg,2*M*K*N/a/1e6,2*M*K*N/c/1e6), "load %.1f"%os.getloadavg()[0])

# --- backward orientations (second script, same timer) ---
L=torch.ops.mkldnn._linear_pointwise
for M,K,N in [(512,768,3072),(512,3072,768)]:
    x=torch.randn(M,K); w=torch.randn(N,K); g=torch.randn(M,N)
    wt=w.t()  # [K,N] strided
    ig_mkl=t(lambda: torch.mm(g,w))
    ig_dnn=t(lambda: L(g,wt,None,"none",[],""))
    wg_mkl=t(lambda: torch.mm(g.t(),x))
    wg_dnn=t(lambda: L(g.t(),x.t(),None,"none",[],""))
    print(M,K,N,"igrad mkl %.2f dnn %.2f | wgrad mkl %.2f dnn %.2f"%(ig_mkl,ig_dnn,wg_mkl,wg_dnn),"load %.1f"%os.getloadavg()[0])
    print(" check", (L(g,wt,None,"none",[],"")-g@w).abs().max().item(), (L(g.t(),x.t(),None,"none",[],"")-g.t()@x).abs().max().item())
