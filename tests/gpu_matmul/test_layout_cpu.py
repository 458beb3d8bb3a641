"""CPU-side checks of the pure pieces of the GPU matmul path (no GPU, no cuda-bindings needed)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch._cuda import lt_layout as L


@pytest.mark.parametrize(
    "rows, cols, srow, scol, expected",
    [
        (4, 3, 1, 4, (L.OP_N, 4, 3, 4)),  # column-major
        (4, 3, 1, 8, (L.OP_N, 4, 3, 8)),  # column-major, padded ld
        (4, 3, 3, 1, (L.OP_T, 3, 4, 3)),  # row-major: transposed column-major
        (4, 3, 5, 1, (L.OP_T, 3, 4, 5)),
        (4, 3, 2, 2, None),  # neither
        (4, 3, 1, 2, None),  # overlapping columns
        (4, 1, 1, 0, (L.OP_N, 4, 1, 4)),
        (1, 5, 0, 1, (L.OP_T, 5, 1, 5)),
    ],
)
def test_matrix_layout(rows, cols, srow, scol, expected):
    assert L.matrix_layout(rows, cols, srow, scol) == expected


def _strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def test_matrix_layout_reads_the_right_elements():
    """Emulate cuBLASLt's reading of the memory with the layout and compare with the logical matrix."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 10))
    for view in (base[:, :7], base[:, :7].T, base[::1, 2:9].T, np.asfortranarray(base)[:, :4]):
        r, c = view.shape
        sr, sc = _strides(view)
        op, mr, mc, ld = L.matrix_layout(r, c, sr, sc)
        flat = np.lib.stride_tricks.as_strided(view, (mc, ld), (ld * 8, 8))  # columns of length ld
        mem = flat[:, :mr].T  # the column-major mr x mc matrix
        got = mem if op == L.OP_N else mem.T
        np.testing.assert_array_equal(got, view)


@pytest.mark.parametrize(
    "shape, strides, batch, expected",
    [
        ((3,), (12,), (3,), 12),
        ((), (), (3,), 0),
        ((1,), (99,), (3,), 0),
        ((2, 3), (36, 12), (2, 3), 12),
        ((2, 1), (12, 0), (2, 3), None),  # broadcast along the inner batch dim only
        ((1, 3), (0, 12), (2, 3), None),
        ((2, 3), (12, 24), (2, 3), None),  # batch dims in the wrong order
        ((4, 1, 3), (3, 3, 1), (4, 1, 3), 1),
    ],
)
def test_collapse_batch(shape, strides, batch, expected):
    assert L.collapse_batch(shape, strides, batch) == expected


def test_aux_leading_dimensions():
    assert L.relu_aux_ld_bits(1) == 128 and L.relu_aux_ld_bits(128) == 128 and L.relu_aux_ld_bits(129) == 256
    assert L.gelu_aux_ld(1) == 8 and L.gelu_aux_ld(16) == 16 and L.gelu_aux_ld(17) == 24


def _problem(a, b, epilog=None, inputs=None, c=None, options=None):
    from nvdispatch._epilog import spec_of
    from nvdispatch._matmul_problem import as_options, build_problem
    from nvdispatch._route import detect_all, placement

    inputs = inputs or {}
    infos = detect_all({"a": a, "b": b, "c": c, **inputs})
    fw, dev = placement(infos)
    return build_problem(fw, dev, infos, spec_of(epilog), as_options(options), 1, None, tuple(inputs))


def test_setup_row_orientation_is_a_free_transpose():
    from nvdispatch._cuda.lt_setup import setup

    a, b = np.ones((2, 5, 3), np.float32), np.ones((3, 4), np.float32)
    p = _problem(a, b, "RELU_BIAS", {"bias": np.ones(4, np.float32)})
    s = setup(p, "row")
    # D^T (4 x 5) = B^T (4 x 3) A^T (3 x 5): both read without copies, A batched, B broadcast
    assert (s.m_lt, s.n_lt, s.k, s.batch) == (4, 5, 3, 2)
    assert s.lt_a.source == "b" and not s.lt_a.copy and s.lt_a.op == L.OP_N and s.lt_a.batch_stride == 0
    assert s.lt_b.source == "a" and not s.lt_b.copy and s.lt_b.op == L.OP_N and s.lt_b.batch_stride == 15
    assert s.bias_batch_stride == 0 and not s.bias_copy


def test_setup_bias_along_m_and_bgrad_mapping():
    from nvdispatch._cuda.lt_setup import orientations, setup

    a, b = np.ones((5, 3), np.float32), np.ones((3, 4), np.float32)
    p = _problem(a, b, "BIAS", {"bias": np.ones((5, 1), np.float32)})
    assert orientations(p) == ("col",)
    s = setup(p, "col")
    assert (s.m_lt, s.n_lt) == (5, 4) and s.lt_a.op == L.OP_T and s.lt_b.op == L.OP_T
    # our BGRADA (a summed over K) is cuBLASLt's BGRADB in the row orientation and BGRADA in the col one
    p = _problem(a, b, "BGRADA")
    assert setup(p, "row").epilogue == 512 and setup(p, "col").epilogue == 256
    assert setup(p, "row").bgrad_len == 5 == setup(p, "col").bgrad_len


def test_setup_copies_what_cublaslt_cannot_read():
    from nvdispatch._cuda.lt_setup import setup

    a = np.ones((6, 8), np.float32)[:, ::2]  # non-unit strides on both axes
    b = np.ones((4, 3), np.float64)  # other dtype: cast
    p = _problem(a, b)
    s = setup(p, "row")
    assert s.lt_b.source == "a" and s.lt_b.copy  # a: strided and float32 -> float64
    assert s.lt_a.source == "b" and not s.lt_a.copy


def test_bit_mask_format_matches_numpy_packbits():
    """The bit order the xp helpers use (bit j%8 of byte j//8, rows padded to 128 bits)."""
    rng = np.random.default_rng(1)
    mask = rng.random((3, 5, 37)) > 0.5
    ld = L.relu_aux_ld_bits(37)
    padded = np.zeros((3, 5, ld), bool)
    padded[..., :37] = mask
    bits = np.packbits(padded, axis=-1, bitorder="little")
    assert bits.shape == (3, 5, ld // 8)
    back = np.unpackbits(bits, axis=-1, bitorder="little")[..., :37].astype(bool)
    np.testing.assert_array_equal(back, mask)


def test_torch_bit_mask_helpers_roundtrip_on_cpu():
    torch = pytest.importorskip("torch")
    from nvdispatch._cuda.xp import Xp

    xp = Xp("torch")
    rng = np.random.default_rng(2)
    mask = rng.random((2, 4, 37)) > 0.5
    bits = xp.pack_mask(torch.from_numpy(mask), 128)
    padded = np.zeros((2, 4, 128), bool)
    padded[..., :37] = mask
    np.testing.assert_array_equal(bits.numpy(), np.packbits(padded, axis=-1, bitorder="little"))
    np.testing.assert_array_equal(xp.unpack_mask(bits, 37).numpy(), mask)


def test_gpu_executors_decline_politely_here():
    """Without a GPU (CI) the cuda/cupy executors decline with a reason; NumPy still runs the call."""
    from nvdispatch._cuda import runtime

    if runtime.unavailable() is None:
        pytest.skip("a GPU is present")
    from nvdispatch.executors import builtin

    reason = builtin("cuda").unavailable()
    assert reason in ("no CUDA device",) or "cuda-bindings is not installed" in reason
    a = np.ones((3, 2), np.float32)
    with nvdispatch.set_backend("cuda", only=True):
        with pytest.raises(nvdispatch.errors.NoExecutorError, match="cuda"):
            nvdispatch.matmul(a, a.T)


def test_stream_pointer_normalisation():
    from nvdispatch._cuda.streams import stream_pointer

    class Proto:
        def __cuda_stream__(self):
            return (0, 1234)

    assert stream_pointer(77) == 77
    assert stream_pointer(Proto()) == 1234
    assert stream_pointer(None, "cuda_array_interface") == 0
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="stream"):
        stream_pointer("fast")


def test_which_products_the_cuda_executor_leaves_to_torch_and_cupy(monkeypatch):
    """Plain products go to the framework's own matmul (CuPy's only without a compute type, which cupy.matmul
    cannot apply); small fused-bias products only to Torch (CuPy has no fused op)."""
    import dataclasses

    from nvdispatch._adapters.base import Device
    from nvdispatch._cuda import cublaslt
    from nvdispatch.executors import cuda_matmul, cupy_matmul
    from nvdispatch.linalg import _prepare

    monkeypatch.setattr(cublaslt, "unavailable", lambda: None)  # as on a GPU machine: decline's own reasons show
    from nvdispatch._cuda import xp

    monkeypatch.setattr(xp, "namespace_for", lambda framework: framework)  # each framework's own device helpers
    a = np.ones((16, 16), np.float32)
    bias = np.ones(16, np.float32)

    from nvdispatch._memory import CUDA, CUPY_ARRAY, TORCH_TENSOR

    memory = {"torch": frozenset({TORCH_TENSOR, CUDA}), "cupy": frozenset({CUPY_ARRAY, CUDA})}

    def on_gpu(framework, **call):
        args = {"epilog": None, "epilog_inputs": None, "options": None} | call
        problem = _prepare(a, a, None, 1, None, args["epilog"], args["epilog_inputs"], args["options"], None).problem
        return dataclasses.replace(problem, framework=framework, device=Device("cuda", 0), memory=memory[framework])

    relu_bias = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    tf32 = {"options": {"compute_type": "COMPUTE_32F_FAST_TF32"}}
    for framework in ("torch", "cupy"):
        assert cuda_matmul.decline(on_gpu(framework)).startswith(f"plain matmul: {framework}'s own matmul")
    monkeypatch.setattr(cuda_matmul, "hotpath", lambda: None)  # no compiled direct call: Torch's op costs less
    assert cuda_matmul.decline(on_gpu("torch", **relu_bias)).startswith("host-bound (16x16x16)")
    monkeypatch.setattr(cuda_matmul, "hotpath", lambda: object())  # compiled: our plan costs less
    assert cuda_matmul.decline(on_gpu("torch", **relu_bias)) is None
    assert cuda_matmul.decline(on_gpu("cupy", **relu_bias)) is None
    assert cuda_matmul.decline(on_gpu("cupy", **tf32)) is None  # cuBLASLt applies the compute type
    assert cupy_matmul.plain_product(on_gpu("cupy")) and not cupy_matmul.plain_product(on_gpu("cupy", **tf32))
    assert cupy_matmul.strategies(on_gpu("cupy"))[0] == "plain"
    assert "plain" not in cupy_matmul.strategies(on_gpu("cupy", **relu_bias))
