"""A cuBLASLt plan's direct call compiled (src/nvdispatch/_hotpath_lt.c, ``make_lt_direct``), run here against
probes of cuBLASLt's shapes that record their arguments (no GPU needed): which pointers reach
``cublasLtMatmul`` in which order, when the descriptor's bias pointer is set, and which calls go to the plan's
Python direct call instead. On the GPU, ``tests/gpu_matmul/test_gpu_matmul.py`` runs it against Torch."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from nvdispatch._compiled import hotpath

hp = hotpath()
pytestmark = pytest.mark.skipif(hp is None, reason="the extension is not built here")

HANDLE, DESC, LA, LB, LC, LD, ALGO, ONE, ZERO = 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009
BIAS_ATTR = 8


class FakeTensor:
    """What the direct call reads of a Torch tensor: ``data_ptr()`` and ``new_empty(shape, dtype=...)``."""

    next_ptr = 1 << 20

    def __init__(self, ptr=None, shape=None, dtype=None):
        if ptr is None:
            ptr = FakeTensor.next_ptr
            FakeTensor.next_ptr += 512
        self.ptr, self.shape, self.dtype = ptr, shape, dtype

    def data_ptr(self):
        return self.ptr

    def new_empty(self, shape, *, dtype=None):
        return FakeTensor(shape=shape, dtype=dtype)


class Fallback:
    """The plan's Python direct call, recording that it ran."""

    def __init__(self):
        self.calls = []

    def direct(self, a, b, bias=None):
        self.calls.append((a, b, bias))
        return "python"


def _check(status, what):
    raise RuntimeError(f"{what} failed with status {status}")


def _direct(bias=True, a_first=False, stream=None, handle=HANDLE, fallback=None, keep=(), in_attr=None,
            extra=None, out_attr=-1, workspace=None, ws_size=0, is_capturing=0):
    in_attr = (BIAS_ATTR if bias else -1) if in_attr is None else in_attr
    ints = (
        hp.LT_LAUNCH_PROBE, hp.LT_SET_ATTRIBUTE_PROBE, handle, DESC, LA, LB, LC, LD, ALGO, ONE, ZERO,
        int(a_first), in_attr, out_attr, ws_size, is_capturing,
    )
    fallback = fallback or Fallback()
    fn = hp.make_lt_direct(ints, keep, "new_empty", ((4, 6),), {"dtype": "float32"}, extra, workspace, stream,
                           _check, weakref.WeakMethod(fallback.direct))
    return fn, fallback


def _record():
    calls, count, attr, attr_count = hp.probe_record()
    return calls, count, attr, attr_count


def test_one_launch_with_the_operands_in_cublaslts_order_and_the_result_allocated_like_a():
    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    for a_first in (False, True):
        direct, fb = _direct(a_first=a_first, stream=lambda: 77)
        _, count0, _, _ = _record()
        out = direct(a, b, bias)
        calls, count, attr, _ = _record()
        assert count == count0 + 1 and not fb.calls
        assert (out.shape, out.dtype) == ((4, 6), "float32")
        A, B = (a.ptr, b.ptr) if a_first else (b.ptr, a.ptr)  # row orientation: D^T = B^T A^T
        assert calls == (HANDLE, DESC, ONE, A, LA, B, LB, ZERO, out.ptr, LC, out.ptr, LD, ALGO, 0, 0, 77)
        assert attr == (DESC, BIAS_ATTR, bias.ptr)


def test_the_bias_pointer_is_set_when_it_changes_only():
    direct, _ = _direct()
    a, b, bias1, bias2 = FakeTensor(), FakeTensor(), FakeTensor(), FakeTensor()
    *_, n0 = _record()
    direct(a, b, bias1)
    direct(a, b, bias1)
    assert _record()[3] == n0 + 1
    direct(a, b, bias2)
    assert _record()[2][2] == bias2.ptr and _record()[3] == n0 + 2
    direct(a, b, bias1)
    assert _record()[2][2] == bias1.ptr and _record()[3] == n0 + 3


def test_without_a_bias_epilogue_no_pointer_is_set_and_the_default_stream_is_zero():
    direct, fb = _direct(bias=False)
    *_, n0 = _record()
    a, b = FakeTensor(), FakeTensor()
    out = direct(a, b)
    calls, _, _, n1 = _record()
    assert n1 == n0 and calls[15] == 0 and calls[8] == out.ptr
    assert direct(a, b, None) is not None and not fb.calls  # bias=None is no bias


def test_calls_it_does_not_serve_go_to_the_python_direct_call():
    direct, fb = _direct()
    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    _, count0, _, _ = _record()
    assert direct(FakeTensor(ptr=a.ptr + 16), b, bias) == "python"  # not 256-byte aligned: another algorithm
    assert direct(a, FakeTensor(ptr=b.ptr + 4), bias) == "python"
    assert direct(a, b) == "python"  # a bias epilogue without its bias: as the Python call does
    assert len(fb.calls) == 3 and _record()[1] == count0
    plain, fb2 = _direct(bias=False)
    assert plain(a, b, bias) == "python" and fb2.calls == [(a, b, bias)]


def test_a_result_not_aligned_goes_to_the_python_direct_call():
    class Odd(FakeTensor):
        def new_empty(self, shape, *, dtype=None):
            return FakeTensor(ptr=FakeTensor.next_ptr + 8)

    direct, fb = _direct()
    assert direct(Odd(), FakeTensor(), FakeTensor()) == "python" and len(fb.calls) == 1


def test_errors_are_typed_and_nothing_is_returned():
    direct, fb = _direct()
    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    with pytest.raises(TypeError, match="2 or 3 arguments"):
        direct(a)
    with pytest.raises(TypeError, match="2 or 3 arguments"):
        direct(a, b, bias, bias)
    failing, _ = _direct(handle=13)  # the probe fails a launch on handle 13 with status 13
    with pytest.raises(RuntimeError, match="cublasLtMatmul failed with status 13"):
        failing(a, b, bias)

    class NoPtr(FakeTensor):
        def data_ptr(self):
            raise ValueError("no storage")

    with pytest.raises(ValueError, match="no storage"):
        direct(NoPtr(), b, bias)

    def stream():
        raise KeyboardInterrupt

    interrupted, _ = _direct(stream=stream)
    with pytest.raises(KeyboardInterrupt):
        interrupted(a, b, bias)
    assert not fb.calls


def test_the_plan_gone_is_an_error_not_a_crash():
    fb = Fallback()
    direct = _direct(fallback=fb)[0]
    del fb
    gc.collect()
    with pytest.raises(RuntimeError, match="plan of this direct call is gone"):
        direct(FakeTensor(ptr=(1 << 20) + 16), FakeTensor(), FakeTensor())


def test_what_it_keeps_lives_as_long_as_it_does():
    class Owner:
        pass

    owner = Owner()
    gone = weakref.ref(owner)
    direct, _ = _direct(keep=(owner,))
    del owner
    gc.collect()
    assert gone() is not None
    del direct
    gc.collect()
    assert gone() is None


def test_calls_from_threads_each_launch_once():
    direct, fb = _direct()
    a, b = FakeTensor(), FakeTensor()
    biases = [FakeTensor() for _ in range(4)]
    _, count0, _, _ = _record()
    errors = []

    def work(i):
        try:
            for _ in range(200):
                direct(a, b, biases[i])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not fb.calls
    assert _record()[1] == count0 + 800


def test_make_lt_direct_checks_its_arguments():
    with pytest.raises(TypeError, match="16 ints"):
        hp.make_lt_direct((1, 2), (), "new_empty", (), {}, None, None, None, _check, None)
    ints = [hp.LT_MATMUL_PROBE, hp.LT_SET_ATTRIBUTE_PROBE, 0, DESC, LA, LB, LC, LD, ALGO, ONE, ZERO, 0, 8, -1, 0, 0]
    with pytest.raises(ValueError, match="int 2 is a null address"):
        hp.make_lt_direct(tuple(ints), (), "new_empty", (), {}, None, None, None, _check, None)
    with pytest.raises(TypeError):
        hp.make_lt_direct(tuple(ints), (), "new_empty", [], {}, None, None, None, _check, None)
    ints[2] = HANDLE
    with pytest.raises(TypeError):  # the maker is a method name
        hp.make_lt_direct(tuple(ints), (), None, (), {}, None, None, None, _check, None)
    extra = ("relu_aux", (), {}, None)
    bad = [
        (ints[:13] + [11, 0, 0], None, None),  # an extra output's attribute without the output
        (ints, extra, None),  # an extra output without its attribute
        (ints[:13] + [8, 0, 0], extra, None),  # both pointers on one attribute
        (ints[:14] + [1024, 0], None, None),  # a workspace need without a workspace function
        (ints, None, lambda stream: 0),  # a workspace function without a need
    ]
    for values, ext, ws in bad:
        with pytest.raises(ValueError, match="make_lt_direct"):
            hp.make_lt_direct(tuple(values), (), "new_empty", (), {}, ext, ws, None, _check, None)
    with pytest.raises(TypeError):  # extra: (name, args, kwargs, view)
        hp.make_lt_direct(tuple(ints[:13] + [11, 0, 0]), (), "new_empty", (), {}, ("x", [], {}, None), None, None,
                          _check, None)


# -- epilogues with an aux input, an extra output, a workspace ----------------------------------------------
AUX_ATTR = 11


class Viewed:
    """What an extra output's view function gave: the buffer it saw."""

    def __init__(self, base):
        self.base = base


def test_an_extra_output_is_made_like_the_result_its_pointer_set_and_returned_by_name():
    extra = ("relu_aux", ((6, 2),), {"dtype": "uint8"}, None)
    direct, fb = _direct(extra=extra, out_attr=AUX_ATTR)
    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    out, outputs = direct(a, b, bias)
    calls, _, _, _ = _record()
    (name, aux), = outputs.items()
    assert name == "relu_aux" and (aux.shape, aux.dtype) == ((6, 2), "uint8") and (out.shape, out.dtype) == (
        (4, 6), "float32")
    assert calls[8] == calls[10] == out.ptr
    assert hp.probe_values()[BIAS_ATTR] == bias.ptr and hp.probe_values()[AUX_ATTR] == aux.ptr
    assert not fb.calls


def test_a_bias_gradient_output_takes_the_bias_pointer_and_is_seen_through_its_view():
    extra = ("bgradb", ((6,),), {"dtype": "float32"}, Viewed)
    direct, fb = _direct(bias=False, extra=extra, out_attr=BIAS_ATTR)
    out, outputs = direct(FakeTensor(), FakeTensor())
    g = outputs["bgradb"]
    assert type(g) is Viewed and g.base.shape == (6,) and hp.probe_values()[BIAS_ATTR] == g.base.ptr
    assert _record()[0][8] == out.ptr and not fb.calls


def test_an_aux_input_is_the_third_array_on_the_aux_pointer():
    direct, fb = _direct(in_attr=AUX_ATTR)
    a, b, mask = FakeTensor(), FakeTensor(), FakeTensor()
    out = direct(a, b, mask)
    assert hp.probe_values()[AUX_ATTR] == mask.ptr and _record()[0][10] == out.ptr and not fb.calls
    assert direct(a, b) == "python" and fb.calls == [(a, b, None)]  # its input missing: as Python does


def test_the_workspace_comes_from_the_plan_per_stream_or_the_call_goes_to_python():
    asked = []

    def workspace(stream):
        asked.append(stream)
        return None if stream == 99 else 0x40000

    direct, fb = _direct(stream=lambda: 5, workspace=workspace, ws_size=4096)
    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    direct(a, b, bias)
    calls = _record()[0]
    assert (calls[13], calls[14], calls[15]) == (0x40000, 4096, 5) and asked == [5] and not fb.calls
    capturing, fb2 = _direct(stream=lambda: 99, workspace=workspace, ws_size=4096)
    _, count0, _, _ = _record()
    assert capturing(a, b, bias) == "python" and len(fb2.calls) == 1 and _record()[1] == count0

    def broken(stream):
        raise OSError("no memory")

    failing, fb3 = _direct(workspace=broken, ws_size=4096)
    with pytest.raises(OSError, match="no memory"):
        failing(a, b, bias)
    assert not fb3.calls


def test_an_extra_output_that_fails_leaves_nothing_launched():
    class NoAux(FakeTensor):
        def new_empty(self, shape, *, dtype=None):
            if dtype == "uint8":
                raise MemoryError("out of memory")
            return FakeTensor(shape=shape, dtype=dtype)

    extra = ("relu_aux", ((6, 2),), {"dtype": "uint8"}, None)
    direct, fb = _direct(extra=extra, out_attr=AUX_ATTR)
    _, count0, _, _ = _record()
    with pytest.raises(MemoryError):
        direct(NoAux(), FakeTensor(), FakeTensor())
    assert _record()[1] == count0 and not fb.calls

    def bad_view(buf):
        raise ValueError("no view")

    viewed, _ = _direct(extra=("relu_aux", ((6, 2),), {"dtype": "uint8"}, bad_view), out_attr=AUX_ATTR)
    with pytest.raises(ValueError, match="no view"):
        viewed(FakeTensor(), FakeTensor(), FakeTensor())


def test_with_the_drivers_capture_query_a_captured_stream_goes_to_python_before_the_workspace_is_asked():
    asked = []

    def workspace(stream):
        asked.append(stream)
        return 0x40000

    a, b, bias = FakeTensor(), FakeTensor(), FakeTensor()
    for stream, compiled in ((5, True), (99, False), (98, False)):  # the probe: 99 captured, 98 an error
        direct, fb = _direct(stream=lambda s=stream: s, workspace=workspace, ws_size=4096,
                             is_capturing=hp.STREAM_IS_CAPTURING_PROBE)
        _, count0, _, _ = _record()
        result = direct(a, b, bias)
        assert (_record()[1] == count0 + 1) == compiled and (result == "python") == (not compiled)
        assert len(fb.calls) == (0 if compiled else 1)
    assert asked == [5]
