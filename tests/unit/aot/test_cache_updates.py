"""aot functionalization of KV-cache updates: a cache that starts as a tensor made in the graph
(`torch.tensor([])`, HF's DynamicCache layers) grows by torch.cat, and a preallocated cache
(StaticCache) is written by index_copy_ / slice assignment; the graph computes eager's values and
the mutated inputs change as in eager."""
import torch

from ember.aot import aot_compile

from .helpers import GraphRecorder, check_aten_graph

aten = torch.ops.aten


def _dynamic_cache_step(k_new):
    # a layer starts as a tensor made in the graph (lift_fresh, which returns its argument
    # itself) and grows by cat; an uninitialized layer is returned as is
    empty = torch.tensor([])
    keys = torch.cat([torch.tensor([]), k_new], dim=-2)
    return keys * 2, keys, empty


def test_cat_into_cache_made_in_the_graph_with_grad():
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    rec = GraphRecorder()
    f = aot_compile(_dynamic_cache_step, [k], fw_compiler=rec.fw_compiler,
                    bw_compiler=rec.bw_compiler, decompositions={})
    k2 = k.detach().clone().requires_grad_()
    out, cache, empty = f(k2)
    ref_out, ref_cache, ref_empty = _dynamic_cache_step(k)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(cache, ref_cache)
    torch.testing.assert_close(empty, ref_empty)
    (out.sum() + cache.pow(2).sum()).backward()
    (ref_out.sum() + ref_cache.pow(2).sum()).backward()
    torch.testing.assert_close(k2.grad, k.grad)
    check_aten_graph(rec.fw[0])
    assert len(rec.fw) == 1


def _static_cache_step(cache_k, cache_v, k_new, v_new, pos):
    cache_k.index_copy_(2, pos, k_new)
    cache_v[:, :, pos] = v_new
    return torch.softmax(k_new @ cache_k.transpose(-1, -2), -1) @ cache_v


def test_static_cache_index_copy_and_slice_assignment():
    torch.manual_seed(0)
    ck, cv = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)
    kn, vn, pos = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.tensor([2, 3, 4])
    ref_in = [t.clone() for t in (ck, cv, kn, vn)] + [pos]
    our_in = [t.clone() for t in (ck, cv, kn, vn)] + [pos]
    ref = _static_cache_step(*ref_in)
    rec = GraphRecorder()
    out = aot_compile(_static_cache_step, our_in, fw_compiler=rec.fw_compiler,
                      bw_compiler=rec.bw_compiler, decompositions={})(*our_in)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(our_in[0], ref_in[0])     # the caches were written once
    torch.testing.assert_close(our_in[1], ref_in[1])
    counts = check_aten_graph(rec.fw[0])
    assert aten.index_copy.default in counts
