"""The cuBLASLt plan's direct call (the hot path of repeated calls and of ``Matmul.execute``) gives what its
``execute`` gives, on Torch and CuPy operands; and forms it cannot take leave it unset. GPU only."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from tests.gpu_matmul.test_gpu_matmul import to_dev
from tests.matmul.matmul_reference import epilog_reference

pytestmark = pytest.mark.gpu

CASES = [  # (a shape, b shape, transpose b?, epilog)
    ((48, 32), (32, 40), False, None),
    ((48, 32), (32, 40), False, "RELU_BIAS"),
    ((48, 32), (40, 32), True, "GELU_BIAS"),
    ((3, 48, 32), (32, 40), False, "BIAS"),
    ((33, 17), (17, 9), False, "RELU_BIAS"),  # odd sizes: leading dimensions not 16-byte multiples
]


@pytest.mark.parametrize("fw", ["torch", "cupy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}{'T' if c[2] else ''}-{c[3]}")
def test_direct_call_matches_execute_and_the_reference(fw, case):
    pytest.importorskip(fw)
    ashape, bshape, bt, epilog = case
    rng = np.random.default_rng(3)
    a_np = rng.standard_normal(ashape).astype(np.float32)
    b_np = rng.standard_normal(bshape).astype(np.float32)
    n = bshape[0] if bt else bshape[1]
    bias_np = rng.standard_normal(n).astype(np.float32)
    a, b, bias = to_dev(a_np, fw, "float32"), to_dev(b_np, fw, "float32"), to_dev(bias_np, fw, "float32")
    if bt:
        b, b_np = b.T, b_np.T
    inputs = {"bias": bias} if epilog else None
    want, _ = epilog_reference(epilog or "DEFAULT", a_np.astype(np.float64) @ b_np, {"bias": bias_np} if epilog else {})
    with nvdispatch.set_backend("cuda", only=True):
        got = [nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs) for _ in range(3)]  # plan, then direct
        mm = nvdispatch.Matmul(a, b).plan(epilog=epilog, epilog_inputs=inputs)
        got += [mm.execute(), mm.execute()]
        plan = mm._plan
        assert type(plan).__name__ == "LtMatmulPlan"
        assert plan.direct is not None or len(ashape) > 2  # 2-D operands read in place: the direct call exists
        ops = {"a": a, "b": b, "alpha": 1, "beta": None, **(inputs or {})}
        got.append(plan.execute(ops))
        if plan.direct is not None:
            got.append(plan.direct(a, b, *(inputs or {}).values()))
        mm.free()
    for r in got:
        assert type(r) is type(a)
        np.testing.assert_allclose(_host(r, fw), want, rtol=1e-4, atol=1e-4)


def test_a_misaligned_operand_takes_another_algorithm_on_the_direct_call():
    torch = pytest.importorskip("torch")
    a_full = torch.randn(65, 32, device="cuda")
    b = torch.randn(32, 40, device="cuda")
    bias = torch.randn(40, device="cuda")
    aligned, shifted = a_full[:64], a_full[1:]  # same shape and strides; the second starts 128 B in
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(aligned, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        mm.reset_operands(a=shifted)
        r = mm.execute()
        mm.free()
    torch.testing.assert_close(r, torch.relu(shifted @ b + bias), rtol=1e-4, atol=1e-4)


def test_forms_beyond_the_direct_call_leave_it_unset():
    torch = pytest.importorskip("torch")
    a = torch.randn(32, 16, device="cuda")
    b = torch.randn(16, 24, device="cuda")
    c = torch.randn(32, 24, device="cuda")
    with nvdispatch.set_backend("cuda", only=True):
        with_c = nvdispatch.Matmul(a, b, c, beta=0.5).plan()
        aux = nvdispatch.Matmul(a, b).plan(epilog="RELU_AUX")
        assert with_c._plan.direct is None and aux._plan.direct is None
        r, extra = aux.execute()
        torch.testing.assert_close(with_c.execute(), a @ b + 0.5 * c, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(r, torch.relu(a @ b), rtol=1e-4, atol=1e-4)


def _host(x, fw):
    return x.cpu().numpy() if fw == "torch" else x.get()
