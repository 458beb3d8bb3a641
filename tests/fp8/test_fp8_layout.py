"""How FP8 problems are described to cuBLASLt (pure arithmetic, no GPU): the TN layout rules, copies,
padding, orientation; and where autotuned algorithms are recorded."""

from __future__ import annotations

import pytest

from nvdispatch._cuda import lt_autotune
from nvdispatch._cuda.lt_fp8_layout import fp8_layout
from nvdispatch._epilog import spec_of
from nvdispatch._fp8 import build_fp8_problem
from nvdispatch._matmul_problem import as_options
from nvdispatch._route import detect_all, placement

torch = pytest.importorskip("torch")
F8 = torch.float8_e4m3fn


def problem(a, b, epilog=None, bias=None, result_type=None, c=None):
    inputs = {"bias": bias} if bias is not None else {}
    infos = detect_all({"a": a, "b": b, "c": c, **inputs})
    fw, dev = placement(infos)
    opts = as_options({"result_type": result_type} if result_type else None)
    return build_fp8_problem(fw, dev, infos, spec_of(epilog), opts, 1, None, tuple(inputs), None)


def test_row_major_a_and_column_major_b_are_read_in_place():
    a = torch.zeros(64, 32, dtype=F8)
    b = torch.zeros(48, 32, dtype=F8).t()  # (32, 48) column-major: torch._scaled_mm's layout
    s = fp8_layout(problem(a, b))
    assert (s.a_copy, s.b_copy, s.lda, s.ldb) == (False, False, 32, 32)
    assert (s.orientation, s.m_lt, s.n_lt, s.ldd) == ("row", 48, 64, 48)
    assert s.notes == ()


def test_a_c_ordered_b_is_transposed_and_odd_k_is_padded():
    a = torch.zeros(17, 24, dtype=F8)
    b = torch.zeros(24, 40, dtype=F8)
    s = fp8_layout(problem(a, b, result_type="bfloat16"))
    assert s.b_copy and s.ldb == 32 and s.a_copy and s.lda == 32
    assert any("TN layout" in n for n in s.notes)
    assert s.ldd == 40  # 40 bf16 = 80 bytes: aligned
    assert s.k == 32 and any("zero-padded to 32" in n for n in s.notes)  # K = 24 -> 32 for the FP8 kernels


def test_odd_k_copies_even_operands_cublaslt_could_read_in_place():
    a = torch.zeros(64, 48, dtype=F8)[:, :20]  # rows 48 apart (16-byte multiple) but K = 20
    b = torch.zeros(40, 48, dtype=F8)[:, :20].t()
    s = fp8_layout(problem(a, b))
    assert (s.k, s.a_copy, s.b_copy, s.lda, s.ldb) == (32, True, True, 32, 32)


def test_fp8_results_pad_to_16_bytes_and_batches_stride():
    a = torch.zeros(3, 20, 32, dtype=F8)
    b = torch.zeros(3, 36, 32, dtype=F8).transpose(-1, -2)
    s = fp8_layout(problem(a, b))
    assert (s.a_copy, s.b_copy, s.batch) == (False, False, 3)
    assert (s.a_batch_stride, s.b_batch_stride) == (20 * 32, 36 * 32)
    assert s.ldd == 48 and any("strided view" in n for n in s.notes)


def test_bias_along_m_takes_the_column_orientation_and_c_companion_buffer():
    a = torch.zeros(32, 32, dtype=F8)
    b = torch.zeros(32, 32, dtype=F8)
    bias = torch.zeros(32, 1, dtype=torch.bfloat16)
    c = torch.zeros(32, 32, dtype=torch.bfloat16)
    s = fp8_layout(problem(a, b, "BIAS", bias, result_type="float8_e4m3fn", c=c))
    assert s.orientation == "col" and s.m_lt == 32
    assert s.c_mode == "separate"  # an e4m3 result with a bf16 c: cuBLASLt reads C apart from D
    s = fp8_layout(problem(a, b, "GELU_AUX_BIAS", torch.zeros(32, dtype=torch.bfloat16), result_type="bfloat16"))
    assert (s.aux, s.aux_dtype, s.aux_ld) == ("gelu", "bfloat16", 32)


def test_tuning_records_are_keyed_by_machine(monkeypatch):
    env_a = {"gpu": "NVIDIA H200", "cc": "9.0", "driver": 13000, "cublaslt": 130100}
    env_b = dict(env_a, driver=12080)
    p = problem(torch.zeros(32, 32, dtype=F8), torch.zeros(32, 32, dtype=F8))

    class FakePlan:
        device_index, strategy, problem = 0, "native", p

    monkeypatch.setattr(lt_autotune, "environment", lambda index: env_a)
    key_a = lt_autotune.tuning_key(FakePlan)
    monkeypatch.setattr(lt_autotune, "environment", lambda index: env_b)
    key_b = lt_autotune.tuning_key(FakePlan)
    assert key_a != key_b and "H200" in repr(key_a) and "driver 13000" in repr(key_a)
    choice = {"env": env_a, "data": [1] * 8, "ws": 0}
    assert lt_autotune._usable(choice, env_a) and not lt_autotune._usable(choice, env_b)


def test_misaligned_names_the_pointers_fp8_kernels_cannot_read():
    from nvdispatch._cuda.lt_fp8_layout import FP8_ALIGNMENT, misaligned

    assert FP8_ALIGNMENT == 16
    scales = torch.tensor([0.5, 2.0, 4.0, 8.0, 1.0])  # a per-sample scale is 4 bytes from its neighbour
    base = scales.data_ptr()
    got = misaligned({f"scale{i}": scales[i].data_ptr() - base for i in range(5)})
    assert got == ("scale1", "scale2", "scale3")  # bytes 0 and 16 are aligned
    assert misaligned({"a": 256, "b": 48, "d": 0}) == () and misaligned({"b": 8, "a": 1}) == ("b", "a")


def test_realign_copies_an_operand_whatever_its_layout_and_keeps_the_other():
    a = torch.zeros(32, 80, dtype=F8)[:, 1:65]  # rows 80 bytes apart: a layout read in place...
    b = torch.zeros(48, 80, dtype=F8)[:, :64].t()
    p = problem(a, b)
    s = fp8_layout(p)
    assert (s.a_copy, s.b_copy, s.lda, s.ldb) == (False, False, 80, 80)
    s = fp8_layout(p, realign=("a",))  # ...at a pointer 1 byte into its storage: copied, leading dimension 64
    assert (s.a_copy, s.b_copy, s.lda, s.ldb) == (True, False, 64, 80)
    assert any("copy a: its pointer is not 16-byte aligned" in n for n in s.notes)
    s = fp8_layout(p, realign=("a", "b"))
    assert (s.a_copy, s.b_copy, s.lda, s.ldb) == (True, True, 64, 64)
    batched = problem(torch.zeros(3, 32, 80, dtype=F8)[..., 16:80], b)
    s = fp8_layout(batched, realign=("a",))
    assert (s.a_copy, s.lda, s.a_batch_stride, s.batch) == (True, 64, 32 * 64, 3)
