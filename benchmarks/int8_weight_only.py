"""Issue 28: torchao int8 weight-only MLP (Int8WeightOnlyConfig), inference: eager vs ember vs
torch.compile, paired alternating rounds in one process, 1 thread. The quantized weights are
tensor subclasses (aot/subclass.py flattens them at the graph boundary).
Run from the repo root: python benchmarks/int8_weight_only.py [batch ...]"""
import statistics
import sys
import warnings

from _timing import paired, prepare, ratio_stats

prepare()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from ember import capture  # noqa: E402

warnings.simplefilter("ignore")
torch.set_num_threads(1)
from torchao.quantization import Int8WeightOnlyConfig, quantize_  # noqa: E402


def model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).eval()
    quantize_(m, Int8WeightOnlyConfig())
    return m


for batch in [int(b) for b in sys.argv[1:]] or [1, 16, 128]:
    x = torch.randn(batch, 1024)
    eager, emb, ind = model(), model(), model()
    ember.compile(emb)
    ind.compile()
    with torch.no_grad():
        want = eager(x)
        err_e = (emb(x) - want).abs().max().item()
        err_i = (ind(x) - want).abs().max().item()
        st = capture.stats()
        s, reps = paired({"eager": eager, "ember": emb, "torch.compile": ind}, (x,), rounds=15)
    me = {k: statistics.median(v) * 1e3 for k, v in s.items()}
    r_e, r_i = ratio_stats(s["eager"], s["ember"]), ratio_stats(s["torch.compile"], s["ember"])
    print(f"batch {batch}: eager {me['eager']:.3f} ms, ember {me['ember']:.3f} ms, "
          f"torch.compile {me['torch.compile']:.3f} ms (medians of 15 rounds x {reps}); "
          f"ember vs eager {r_e['median']:.2f}x [p25 {r_e['p25']:.2f}, p75 {r_e['p75']:.2f}], "
          f"vs torch.compile {r_i['median']:.2f}x [p25 {r_i['p25']:.2f}, p75 {r_i['p75']:.2f}]; "
          f"max err ember {err_e:.2e}, torch.compile {err_i:.2e}; ember graphs {st.get('graphs')}"
          f", breaks {st.get('graph_breaks', 0)}", flush=True)
    ember.reset()
