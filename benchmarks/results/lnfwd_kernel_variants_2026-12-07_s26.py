"""Hand-edited LayerNorm kernel variants vs eager, kernel alone (ctypes), paired rounds."""
import os, sys, re, json, glob, tempfile, statistics, time
sys.path.insert(0, "/work/wt-lnfwd/benchmarks"); sys.path.insert(0, "/work/wt-lnfwd")
import _timing
_timing.prepare()
os.environ["EMBER_SPEED_CHECK"] = "0"
import torch, torch.nn.functional as F, ember, ctypes
from ember.runtime.build import build
torch.set_num_threads(1)
shape = tuple(int(v) for v in sys.argv[1].split(","))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
N = shape[-1]; R = 1
for s in shape[:-1]: R *= s
x = torch.randn(*shape); w = torch.randn(N); b = torch.randn(N)
fn = lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5)
f = ember.compile(fn)
with torch.no_grad(): f(x, w, b)
(path,) = glob.glob(os.path.join(os.environ["EMBER_CACHE_DIR"], "graphs", "*", "*.json"))
src = json.loads(json.load(open(path))["payload"])["source"]
head, body = src[:src.index('extern "C" void kernel0')], src[src.index('extern "C" void kernel0'):]
open("/tmp/lnfwd/k_%d.cpp" % N, "w").write(body)
V = {"v0": body}
V["v1"] = re.sub(r"\n *buf[23]\[\(v1 \+ \(\d+ \* v0\)\)\] = tmp\d+;", "", body)
STATS_START = body.index("double acc0 = 0.0;")
STATS_END = body.index("float tmp", body.index("acc1 += acc1_l[0];"))
NORM = body[body.index("#pragma omp simd", STATS_END):]
K = int(os.environ.get("K", "16"))
two_pass = f"""
            const float* row = arg0 + (v1 * {N} + v0 * {N * shape[1]});
            alignas(64) double s_l[32];
            for (int64_t j = 0; j < 32; ++j) s_l[j] = 0.0;
            for (int64_t lb = 0; lb < {N}; lb += 32) {{
                #pragma omp simd
                for (int64_t v2 = lb; v2 < lb + 32; ++v2) s_l[v2 - lb] += static_cast<double>(row[v2]);
            }}
            for (int64_t j = 0; j < 16; ++j) s_l[j] += s_l[j + 16];
            for (int64_t j = 0; j < 8; ++j) s_l[j] += s_l[j + 8];
            for (int64_t j = 0; j < 4; ++j) s_l[j] += s_l[j + 4];
            for (int64_t j = 0; j < 2; ++j) s_l[j] += s_l[j + 2];
            double S = s_l[0] + s_l[1];
            double mean = S / {float(N)};
            float tmp28 = static_cast<float>(mean);
            alignas(64) double q_l[16];
            for (int64_t j = 0; j < 16; ++j) q_l[j] = 0.0;
            for (int64_t cb = 0; cb < {N}; cb += {16 * K}) {{
                alignas(64) float f_l[64];
                for (int64_t j = 0; j < 64; ++j) f_l[j] = 0.0f;
                for (int64_t lb = cb; lb < cb + {16 * K}; lb += 64) {{
                    #pragma omp simd
                    for (int64_t v2 = lb; v2 < lb + 64; ++v2) {{ float d = row[v2] - tmp28; f_l[v2 - lb] += d * d; }}
                }}
                #pragma omp simd
                for (int64_t j = 0; j < 16; ++j) q_l[j] += static_cast<double>(f_l[j]) + static_cast<double>(f_l[j + 16]) + (static_cast<double>(f_l[j + 32]) + static_cast<double>(f_l[j + 48]));
            }}
            for (int64_t j = 0; j < 8; ++j) q_l[j] += q_l[j + 8];
            for (int64_t j = 0; j < 4; ++j) q_l[j] += q_l[j + 4];
            for (int64_t j = 0; j < 2; ++j) q_l[j] += q_l[j + 2];
            double Q = q_l[0] + q_l[1];
            double dm = mean - static_cast<double>(tmp28);
            double var = Q / {float(N)} - dm * dm;
            var = var < 0.0 ? 0.0 : var;
            float tmp36 = ember::rsqrt(static_cast<float>(var) + 1e-05f);
            """
V["v2"] = V["v1"][:V["v1"].index("double acc0 = 0.0;")] + two_pass + NORM
# all float one pass (lower bound; imprecise)
flt = two_pass.replace("double s_l", "float s_l").replace("s_l[j] = 0.0", "s_l[j] = 0.0f").replace("s_l[v2 - lb] += static_cast<double>(row[v2])", "s_l[v2 - lb] += row[v2]")
v2d = two_pass[:two_pass.index("alignas(64) double q_l[16];")] + f"""
            alignas(64) double q_l[32];
            for (int64_t j = 0; j < 32; ++j) q_l[j] = 0.0;
            for (int64_t lb = 0; lb < {N}; lb += 32) {{
                #pragma omp simd
                for (int64_t v2 = lb; v2 < lb + 32; ++v2) {{ double d = static_cast<double>(row[v2]) - mean; q_l[v2 - lb] += d * d; }}
            }}
            for (int64_t j = 0; j < 16; ++j) q_l[j] += q_l[j + 16];
            for (int64_t j = 0; j < 8; ++j) q_l[j] += q_l[j + 8];
            for (int64_t j = 0; j < 4; ++j) q_l[j] += q_l[j + 4];
            for (int64_t j = 0; j < 2; ++j) q_l[j] += q_l[j + 2];
            double Q = q_l[0] + q_l[1];
            double var = Q / {float(N)};
            float tmp36 = ember::rsqrt(static_cast<float>(var) + 1e-05f);
            """
V["v2d"] = V["v1"][:V["v1"].index("double acc0 = 0.0;")] + v2d + NORM
V["v3f"] = V["v1"][:V["v1"].index("double acc0 = 0.0;")] + flt + NORM
V["v5nostat"] = V["v1"][:V["v1"].index("double acc0 = 0.0;")] + "float tmp28 = 0.0f, tmp36 = 1.0f;\n" + NORM
libs = {}
V = {k: V[k] for k in ("v1", "v2", "v5nostat")} if os.environ.get("FEW") else V
for k, v in V.items():
    lib = ctypes.CDLL(str(build(head + v)))
    fn_ = lib.kernel0; fn_.argtypes = [ctypes.c_void_p] * 6; fn_.restype = None
    libs[k] = fn_
mean_b = torch.empty(R); rstd_b = torch.empty(R); out = torch.empty(*shape)
ref = fn(x, w, b)
fns = {"eager": lambda: fn(x, w, b)}
for k, kf in libs.items():
    kf(x.data_ptr(), mean_b.data_ptr(), rstd_b.data_ptr(), w.data_ptr(), b.data_ptr(), out.data_ptr())
    if k != "v5nostat":
        print(k, "max err vs eager", (out - ref).abs().max().item())
    fns[k] = (lambda kf=kf: kf(x.data_ptr(), mean_b.data_ptr(), rstd_b.data_ptr(), w.data_ptr(), b.data_ptr(), out.data_ptr()))
s, reps = _timing.paired(fns, (), rounds)
med = {k: statistics.median(v) * 1e3 for k, v in s.items()}
print(shape, "K", K, "reps", reps, os.getloadavg()[0])
for k in s:
    r = _timing.ratio_stats(s["eager"], s[k])
    print(f"  {k}: {med[k]:.3f} ms  eager/{k} {r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}]")
