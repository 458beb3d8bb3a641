"""One error tree: every exception nvdispatch raises on purpose is an NvdispatchError, keeps the builtin base a
user would catch, and pickles with all its fields."""

from __future__ import annotations

import pickle

import pytest

from nvdispatch import errors
from nvdispatch.device import errors as device_errors


def _examples():
    """One instance of every error class, with every optional field set."""
    out = []
    for name in errors.__all__:
        cls = getattr(errors, name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or issubclass(cls, Warning):
            continue
        if issubclass(cls, errors.CudaLibraryError):
            out.append(cls("cublasLtMatmul", 15, hint="try another layout"))
        elif cls is errors.NoExecutorError:
            out.append(cls("executor", "one that takes it", "none", "see declined", declined=(("numpy", "no"),)))
        else:
            out.append(cls("a", "a matrix", "a 0-d array", hint="promote it first"))
    out.append(device_errors.DeviceConfigurationError("elements_per_thread", [2, 4, 8], 3))
    out.append(device_errors.UnsupportedConfigurationError("size", "a power of 2", 12))
    out.append(device_errors.DeviceLaunchError("tid=[0, 0, 0]: block_dim: expected x == 64, got blockDim.x = 32"))
    assert {type(e).__name__ for e in out} >= set(device_errors.__all__)  # every class, library and device
    return out


@pytest.mark.parametrize("error", _examples(), ids=lambda e: type(e).__name__)
def test_every_error_pickles_with_all_fields(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)
    assert isinstance(back, errors.NvdispatchError)


def test_fields_survive_pickling_by_name():
    e = pickle.loads(pickle.dumps(errors.NoExecutorError("x", "y", "z", "a hint", declined=[("torch", "absent")])))
    assert e.hint == "a hint" and e.declined == (("torch", "absent"),) and "a hint" in str(e)
    lib = pickle.loads(pickle.dumps(errors.CublasLtError("cublasLtMatmul", 15)))
    assert (lib.call, lib.status, lib.status_name) == ("cublasLtMatmul", 15, "CUBLAS_STATUS_NOT_SUPPORTED")
    dev = pickle.loads(pickle.dumps(device_errors.DeviceConfigurationError("size", [1, 2], 3)))
    assert dev.got == 3 and dev.expected == "one of 1, 2" and dev.argument == "size"


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (errors.InvalidArgumentError, ValueError),
        (errors.ShapeMismatchError, ValueError),
        (errors.EpilogInputError, ValueError),
        (errors.UnsupportedDtypeError, TypeError),
        (errors.UnsupportedOperandError, TypeError),
        (errors.MixedOperandsError, TypeError),
        (errors.BackendError, RuntimeError),
        (errors.UnknownBackendError, ValueError),
        (errors.PlanStateError, RuntimeError),
        (errors.CudaLibraryError, RuntimeError),
        (errors.CudaRuntimeError, RuntimeError),
        (errors.CublasLtError, RuntimeError),
        (errors.CufftError, RuntimeError),
        (device_errors.DeviceConfigurationError, ValueError),
        (device_errors.UnsupportedConfigurationError, ValueError),
        (device_errors.DeviceLaunchError, ValueError),
    ],
)
def test_one_tree_keeping_the_builtin_bases(cls, builtin):
    assert issubclass(cls, errors.NvdispatchError) and issubclass(cls, builtin)


def test_the_gpu_modules_raise_errors_of_the_tree():
    from nvdispatch._cuda import cublaslt, cufft

    assert cublaslt.CublasLtError is errors.CublasLtError
    with pytest.raises(errors.CublasLtError, match="CUBLAS_STATUS_INVALID_VALUE"):
        cublaslt.check(7, "cublasLtMatmulDescCreate")
    with pytest.raises(errors.CufftError, match="cufftCreate failed: CUFFT_ALLOC_FAILED"):
        cufft.check(2, "cufftCreate")


def test_a_non_array_is_refused_with_a_typed_error():
    from nvdispatch._cuda.arrays import view

    with pytest.raises(errors.UnsupportedOperandError, match="device array"):
        view(object(), "cuda_array_interface")


def test_the_tunings_warning_is_a_user_warning_not_an_error():
    assert issubclass(errors.TuningsWarning, UserWarning)
    assert not issubclass(errors.TuningsWarning, errors.NvdispatchError)
