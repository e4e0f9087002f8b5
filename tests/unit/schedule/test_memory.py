"""Wrapper memory behaviour: buffers are freed at last use and reused by size/dtype."""
import torch

from lower.helpers import compile_fn


def test_buffers_are_reused_and_freed():
    torch.manual_seed(0)
    x = torch.randn(32, 32)
    w = torch.randn(32, 32) * 0.2

    def f(t, m):
        a = (t @ m).relu()
        b = (a @ m).relu()
        c = (b @ m).relu()
        return (c @ m).sum()
    run, stats = compile_fn(f, x, w)
    torch.testing.assert_close(run(x, w)[0], f(x, w), rtol=1e-3, atol=1e-3)
    assert stats["externs"] == 4


def test_wrapper_text_has_reuse_and_del():
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    gm = trace_aten(lambda t, m: ((((t @ m).relu() @ m).relu() @ m).relu() @ m,),
                    (x, w), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x, w])
    text = fn.ember_wrapper
    assert "# reuse" in text
    assert "empty_strided" in text


def test_pointwise_after_extern_writes_in_place():
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    torch.manual_seed(0)
    x, w = torch.randn(16, 16) * 0.1, torch.randn(16, 16) * 0.1
    f = lambda t, m: ((((t @ m).exp() @ m).relu() + 1) @ m).sin()  # noqa: E731
    gm = trace_aten(f, (x, w), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x, w])
    assert "# in place" in fn.ember_wrapper
    torch.testing.assert_close(fn(x, w)[0], f(x, w), rtol=1e-4, atol=1e-3)


def test_freed_buffer_nothing_reuses_is_deleted_when_it_dies():
    """relu(2x) is realized for the matmul and dies there; no later buffer has its size, so
    it must be released right after the matmul, not held until the graph returns."""
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    x, w = torch.randn(16, 8), torch.randn(8, 4)
    f = lambda t, m: (((t * 2).relu() @ m).sin().sum(),)  # noqa: E731
    gm = trace_aten(f, (x, w), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x, w])
    lines = [ln.strip() for ln in fn.ember_wrapper.splitlines()]
    first = next(ln.split(" = ")[0] for ln in lines if "empty_strided((16, 8)" in ln)
    mm = next(i for i, ln in enumerate(lines) if "mm" in ln and first in ln.split("(", 1)[-1])
    assert lines[mm + 1] == f"del {first}", lines
    torch.testing.assert_close(fn(x, w)[0], f(x, w)[0])


def test_conv_on_channels_last_input_keeps_the_kernels_layout():
    """ConvNeXt permutes around a LayerNorm, so its convs read channels-last inputs and the CPU
    kernel returns channels-last outputs (the meta kernel says contiguous): the wrapper expects
    the real layout instead of copying every conv output; values equal eager."""
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(2, 8, 6, 6), torch.randn(8, 1, 3, 3), torch.randn(16, 8, 1, 1)

    def f(t, a, b):
        y = torch.nn.functional.layer_norm(t.permute(0, 2, 3, 1), (8,)).permute(0, 3, 1, 2)
        y = torch.nn.functional.conv2d(y, a, padding=1, groups=8)
        return (torch.nn.functional.conv2d(y.relu(), b) * 2,)
    gm = trace_aten(f, (x, w1, w2), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x, w1, w2])
    assert "stride() != (288, 1, 48, 8)" in fn.ember_wrapper, fn.ember_wrapper
    torch.testing.assert_close(fn(x, w1, w2)[0], f(x, w1, w2)[0], rtol=1e-4, atol=1e-4)


def test_layout_check_ignores_strides_of_size_one_dims():
    """An extern's result is copied only when a dim with more than one element is laid out
    differently: a 1x1 conv's weight gradient (320, 1, 320, 320) is the same memory as
    (320, 1, 1, 1)."""
    import types

    from ember.codegen.common import IndentedBuffer
    from ember.codegen.wrapper import WrapperCodegen
    w = WrapperCodegen.__new__(WrapperCodegen)
    w.code = IndentedBuffer()
    w._fix_layout(types.SimpleNamespace(name="g", size=(1280, 320, 1, 1), stride=(320, 1, 1, 1)))
    ns = {"empty_strided": torch.empty_strided}
    check = w.code.getvalue()
    for g, copied in ((torch.empty_strided((1280, 320, 1, 1), (320, 1, 320, 320)), False),
                      (torch.empty(320, 1280, 1, 1).transpose(0, 1), True)):
        ns["g"] = g
        exec(check, ns)
        assert (ns["g"] is not g) == copied, check


def test_all_size_one_buffer_layout_check_is_valid_python():
    import types

    from ember.codegen.common import IndentedBuffer
    from ember.codegen.wrapper import WrapperCodegen
    w = WrapperCodegen.__new__(WrapperCodegen)
    w.code = IndentedBuffer()
    w._fix_layout(types.SimpleNamespace(name="g", size=(1, 1, 1), stride=(1, 1, 1)))
    g = torch.empty_strided((1, 1, 1), (7, 3, 5))
    ns = {"empty_strided": torch.empty_strided, "g": g}
    exec(w.code.getvalue(), ns)
    assert ns["g"] is g


def test_an_extern_view_keeps_its_base_alive():
    """view_as_complex (an extern: kernels are real-only) returns a view of a kernel's output;
    the base was freed at the extern and its memory reused by the next kernel's output while
    the view was still read (by an extern after it): a WRONG VALUE. The base now lives as long
    as the view (schedule/memory.py), also when the view reaches the graph's outputs. (Complex
    arithmetic compiles to kernels on real pairs since #27: an FFT keeps the view an extern.)"""
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph

    def f(a, z):
        c = torch.view_as_complex((a * 2).reshape(-1, 2))
        w = (a + 1).sin() * 3
        y = torch.view_as_real(torch.fft.fft(c) * z).flatten() + w
        return y, torch.view_as_real(torch.fft.ifft(c) * z).flatten() * y
    a, z = torch.randn(1024), torch.randn(512, dtype=torch.complex64)
    run, _ = compile_fn(f, a, z)
    for got, want in zip(run(a, z), f(a, z)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    gm = trace_aten(f, (a, z), decompositions=get_decompositions())
    text = compile_aten_graph(gm, [a, z]).ember_wrapper
    view, rest = text.split(" = aten_view_as_complex_default(")
    # the base as a view, or allocated in the extern's shape already (codegen/wrapper.py)
    view, base = view.split()[-1], rest.removeprefix("as_strided(").split(",")[0].split(")")[0]
    reuse = text.find(f"= {base}  # reuse")
    assert reuse == -1 or reuse > text.rindex(f"({view}, "), text


def test_per_row_scalars_read_by_later_stages_are_not_stored():
    # an inference LayerNorm's mean and rstd (one value per row, read by the normalize loop of
    # the same kernel) are C++ scalars: the kernel writes only the output and the wrapper
    # allocates only it (they were stored row by row and freed unread, docs/design/089)
    from ember.aot import trace_aten
    from ember.decomp import get_decompositions
    from ember.backends.ember import compile_aten_graph
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 512, 768) * 3 + 1, torch.randn(768), torch.randn(768)

    def f(t, w, b):
        return (torch.nn.functional.layer_norm(t, (768,), w, b, 1e-5),)
    gm = trace_aten(f, (x, w, b), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x, w, b])
    assert fn.ember_stats["kernels"] == 1
    assert fn.ember_wrapper.count("empty_strided(") == 1, fn.ember_wrapper
    torch.testing.assert_close(fn(x, w, b)[0], f(x, w, b)[0], rtol=1e-5, atol=1e-5)
    # a row scalar that leaves the kernel (a graph output) is still stored
    gm = trace_aten(lambda t: torch.ops.aten.native_layer_norm(t, (768,), None, None, 1e-5),
                    (x,), decompositions=get_decompositions())
    fn = compile_aten_graph(gm, [x])
    outs = fn(x)
    for got, want in zip(outs, torch.ops.aten.native_layer_norm(x, (768,), None, None, 1e-5)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert fn.ember_wrapper.count("empty_strided(") == 3, fn.ember_wrapper
