"""A zero-size backward call that carries cuBLASLt's packed ReLU bit mask (what a CUDA RELU_AUX returns) runs.

cuBLASLt takes no empty matrices, so on CUDA the cuda executor leaves an empty-result call to the framework's
executor, which takes masks as booleans only: an empty result reads no mask element, so it now takes the bits too
(the GPU run of FusedMLP on a zero-size batch with relu_backward="drelu" failed with NoExecutorError). Here on the
CPU, the same decision, checked against NumPy: the result empty of the right shape and dtype, the bias gradient
zeros. A K == 0 call has a non-empty result whose mask matters: the cuda executor keeps it (its inplace plan
unpacks the bits).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from nvdispatch import linalg
from nvdispatch._epilog import declined_mask_format
from nvdispatch.executors.cuda_matmul import _bits_read

torch = pytest.importorskip("torch")

# (a's shape, the bit mask's shape: cuBLASLt's uint8 (cols, ld_bits // 8), in either orientation)
CASES = [((0, 32), (128, 0)), ((0, 32), (0, 16)), ((2, 0, 32), (2, 128, 0))]


@pytest.mark.parametrize("epilog", ["DRELU", "DRELU_BGRAD"])
@pytest.mark.parametrize("a_shape,bits_shape", CASES)
def test_an_empty_result_takes_the_bit_mask(epilog, a_shape, bits_shape):
    a = torch.randn(*a_shape)
    b = torch.randn(32, 128)
    got = linalg.matmul(a, b, epilog=epilog, epilog_inputs={"relu_aux": torch.empty(bits_shape, dtype=torch.uint8)})
    want = np.matmul(a.numpy(), b.numpy())  # empty
    d, aux = got if epilog == "DRELU_BGRAD" else (got, None)
    assert d.shape == want.shape and d.dtype == torch.float32
    if aux is not None:
        ((name, db),) = aux.items()
        assert name == "drelu_bgrad" and db.dtype == torch.float32
        np.testing.assert_array_equal(db.numpy(), np.zeros((*a_shape[:-2], 128), np.float32))


def test_numpy_takes_the_bit_mask_of_an_empty_result():
    d, aux = linalg.matmul(np.zeros((0, 32), np.float32), np.ones((32, 128), np.float32), epilog="DRELU_BGRAD",
                           epilog_inputs={"relu_aux": np.zeros((128, 0), np.uint8)})  # fmt: skip
    assert d.shape == (0, 128) and d.dtype == np.float32
    np.testing.assert_array_equal(aux["drelu_bgrad"], np.zeros(128, np.float32))


def _problem(result_shape, mask_dtype):
    return SimpleNamespace(result_shape=result_shape, inputs=(("relu_aux", SimpleNamespace(dtype=mask_dtype)),))


def test_the_decision():
    # an empty result: the boolean-mask executors take the bits, so the cuda executor leaves it to them
    assert declined_mask_format(_problem((0, 128), "uint8"), "Torch") is None
    assert not _bits_read(_problem((0, 128), "uint8"))
    # K == 0, a non-empty result: the bits are read; only the cuda executor unpacks them
    assert declined_mask_format(_problem((4, 128), "uint8"), "Torch") is not None
    assert _bits_read(_problem((4, 128), "uint8"))
    assert not _bits_read(_problem((4, 128), "bool"))
