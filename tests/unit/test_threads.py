"""8 threads calling one compiled model at once: results equal to eager, one compile, no deadlock."""
import threading

import torch

import ember


def test_concurrent_inference_compiles_once():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 4)).eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        ref = m(x)
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(1)
        return ember.get_backend("ember")(gm, example_inputs)

    ember.compile(m, backend=counting_backend)
    outs, errors = [None] * 8, []
    barrier = threading.Barrier(8)

    def worker(i):
        try:
            barrier.wait(timeout=30)
            with torch.no_grad():
                for _ in range(5):
                    outs[i] = m(x)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert errors == []
    assert len(compiles) == 1
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
