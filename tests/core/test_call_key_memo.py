"""Plan handles remembered behind a guard (nvdispatch._call_key_memo): the memo itself with a stand-in guard and a
plan cache of its own, and the Torch guard through the matmul and fft routes, whose results must be those of the
signature path whatever changes between calls (dtype, shape, strides, views, autograd state, device)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg
from nvdispatch._adapters import call_key_classes, register_adapter
from nvdispatch._adapters.torch import TorchAdapter
from nvdispatch._call_key_memo import CallKeyMemo
from nvdispatch._plan_cache import PlanCache


@pytest.fixture(autouse=True, params=["compiled front", "python route"])
def _clean(request, monkeypatch):
    # the routes' tests run on matmul's compiled memo hit (where it is built) and on the Python route alone
    if request.param == "compiled front" and linalg._front is linalg._route:
        pytest.skip("the compiled front is not built here")
    if request.param == "python route":
        monkeypatch.setattr(linalg, "_front", linalg._route)
    nvdispatch.plan_cache.clear()
    yield
    nvdispatch.plan_cache.clear()


# -- the memo ------------------------------------------------------------------------------------------------
def _value_guard(*arrays):
    """A stand-in guard: arrays pass when they equal the ones it was built from."""
    seen = tuple(arrays)
    return lambda *xs: xs == seen


class _Plan:
    needs_release = False

    def __init__(self, name):
        self.name = name

    def release(self):
        pass


def _cache(*names, maxsize=64):
    cache = PlanCache(maxsize=maxsize)
    for name in names:
        cache.put(name, _Plan(name))
    return cache


def _find(memo, cache, form, *arrays):
    """What the routes do: the plan of the first handle whose guard the arrays pass (None: stale or none)."""
    for check, entry, epoch in memo.handles.get(form, ()):
        if check(*arrays):
            plan = cache.acquire_handle(entry, epoch)
            return None if plan is None else plan.name
    return None


def test_the_memo_finds_a_plan_only_behind_its_guard():
    cache, memo = _cache("k12"), CallKeyMemo(_value_guard)
    memo.remember("f", (1, 2), cache.handle("k12"))
    hits = cache.hits
    assert _find(memo, cache, "f", 1, 2) == "k12" and cache.hits == hits + 1
    assert _find(memo, cache, "f", 1, 3) is None
    assert _find(memo, cache, "g", 1, 2) is None  # another form
    memo.remember("f", (5,), cache.handle("not cached"))  # no handle: nothing to remember
    assert _find(memo, cache, "f", 5) is None and len(memo.handles["f"]) == 1


def test_the_memo_keeps_the_newest_handles_of_a_form():
    names = [f"k{i}" for i in range(CallKeyMemo.per_form + 2)]
    cache, memo = _cache(*names), CallKeyMemo(_value_guard)
    for i, name in enumerate(names):
        memo.remember("f", (i,), cache.handle(name))
    kept = [entry.plan.name for _, entry, _ in memo.handles["f"]]
    assert kept == names[:1:-1]  # newest first
    assert _find(memo, cache, "f", 0) is None and _find(memo, cache, "f", len(names) - 1) == names[-1]


@pytest.mark.parametrize("how", ["evicted", "cleared", "forgotten"])
def test_a_handle_goes_stale_when_the_cache_drops_its_key(how):
    cache, memo = _cache("call key", maxsize=1), CallKeyMemo(_value_guard)
    plan = cache.get("call key")
    cache.put("plan key", plan)  # one plan under two keys, as the routes keep them
    memo.remember("f", (1,), cache.handle("call key"))
    assert _find(memo, cache, "f", 1) == "call key"
    if how == "evicted":
        cache.put("other", _Plan("other"))
    elif how == "cleared":
        cache.clear()
    else:  # Matmul.autotune chose another plan: the call must choose again
        cache.forget_keys_but(plan, "plan key")
        assert cache.contains("plan key")
    assert _find(memo, cache, "f", 1) is None
    cache.put("call key", plan)  # planned again: the form learns the new handle, the stale one goes
    memo.remember("f", (1,), cache.handle("call key"))
    assert _find(memo, cache, "f", 1) == "call key" and len(memo.handles["f"]) == 1


def test_a_form_whose_arrays_keep_changing_stops_building_guards():
    built = []

    def guard(*arrays):
        built.append(arrays)
        return _value_guard(*arrays)

    cache, memo = _cache("k"), CallKeyMemo(guard)
    for i in range(memo.builds_per_form + 10):
        memo.remember("f", (i,), cache.handle("k"))
    assert len(built) == memo.builds_per_form
    memo.remember("other", (0,), cache.handle("k"))  # other forms are not affected
    assert len(built) == memo.builds_per_form + 1


def test_no_guard_no_handle_and_too_many_forms_start_afresh():
    cache = _cache("k")
    memo = CallKeyMemo(lambda *arrays: None)  # the adapter cannot guard these arrays
    memo.remember("f", (1,), cache.handle("k"))
    assert memo.handles == {}
    memo = CallKeyMemo(_value_guard)
    for i in range(memo.max_forms):
        memo.remember(("f", i), (i,), cache.handle("k"))
    assert len(memo.handles) == memo.max_forms
    memo.remember("one more", (0,), cache.handle("k"))
    assert list(memo.handles) == ["one more"]


# -- the Torch guard -----------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")


def _guard(*tensors):
    check = TorchAdapter.guard(*tensors)
    assert check is not None, "Torch's tensor guard is not available in this Torch"
    return check


def test_the_torch_guard_tells_apart_what_plans_depend_on():
    x = torch.ones(4, 6)
    check = _guard(x)
    assert check(torch.zeros(4, 6))  # same metadata, other data
    others = [
        torch.ones(4, 6, dtype=torch.float64),
        torch.ones(6, 4),
        torch.ones(4, 7)[:, :6],  # same shape, other strides
        torch.ones(6, 4).t(),
        torch.ones(4, 6, device="meta"),
        torch.ones(4, 6, requires_grad=True),
        torch.nn.Parameter(torch.ones(4, 6)),
    ]
    for other in others:
        assert not check(other), other
    z = torch.ones(3, dtype=torch.complex64)
    assert not _guard(z)(z.conj())  # a lazily conjugated view: results differ, so must plans


def test_the_torch_guard_of_tensors_that_require_grad_checks_grad_mode_too():
    # their signature holds grad mode (whether autograd records the call), which Torch's guard does not see
    w = torch.ones(2, requires_grad=True)
    check = _guard(torch.ones(2), w)
    assert check(torch.zeros(2), w)
    assert not check(torch.zeros(2), torch.ones(2))  # requires_grad differs
    with torch.no_grad():
        assert not check(torch.zeros(2), w)
        check_off = _guard(torch.ones(2), w)
        assert check_off(torch.ones(2), w)
    assert not check_off(torch.ones(2), w)


def test_the_guard_keeps_no_tensor_alive():
    import gc
    import weakref

    x = torch.ones(8)
    ref = weakref.ref(x)
    check = _guard(x)
    del x
    gc.collect()
    assert ref() is None and check(torch.zeros(8))


# -- through the routes ----------------------------------------------------------------------------------------
def _memo():
    return call_key_classes[torch.Tensor].memo


def _relu_bias(a, b, bias):
    return np.maximum(a.numpy() @ b.numpy() + bias.numpy(), 0)


def _handles(kind, epilog=None):
    """The live handles the Torch memo keeps for forms starting with ``kind`` (and of ``epilog``, if given)."""
    return [
        (e, epoch)
        for form, recs in _memo().handles.items()
        if form[0] == kind and (epilog is None or form[1] == epilog)
        for _, e, epoch in recs
        if e.epoch == epoch
    ]


def test_a_repeated_matmul_finds_its_signature_keys_plan_behind_the_guard():
    a, b, bias = torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)
    for _ in range(3):
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        np.testing.assert_allclose(got.numpy(), _relu_bias(a, b, bias), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nvdispatch.matmul(a, b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)
    sig = call_key_classes[torch.Tensor].signature
    handles = _handles(torch.Tensor)
    keys = [key for key in nvdispatch.plan_cache._keys if key[0][0] is torch.Tensor]  # the signature path's
    assert sorted(len(key) for key in keys) == [3, 4]
    assert all(key[1:3] == (sig(a), sig(b)) for key in keys) and len(handles) == 2
    by_entry = lambda handle: id(handle[0])  # noqa: E731
    assert sorted(handles, key=by_entry) == sorted(map(nvdispatch.plan_cache.handle, keys), key=by_entry)
    hits = nvdispatch.plan_cache.hits
    nvdispatch.matmul(a, b)
    assert nvdispatch.plan_cache.hits == hits + 1  # a hit by handle counts as any hit


def test_parameters_beside_tensors_are_remembered_behind_the_guard_in_each_grad_mode():
    w, bias = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(4))
    x = torch.randn(5, 3)
    want = np.maximum(x.numpy() @ w.detach().numpy() + bias.detach().numpy(), 0)
    for _ in range(3):
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                got = nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
            assert (got.grad_fn is not None) is grad
            np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    # each grad mode has its handle: a recorded call's plan runs the nvdispatch::matmul operator's formula around
    # the plan of the call unrecorded (integrations.torch_recorded)
    assert len(_handles((torch.Tensor, torch.nn.Parameter, torch.nn.Parameter), "RELU_BIAS")) == 2
    hits = nvdispatch.plan_cache.hits
    nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert nvdispatch.plan_cache.hits == hits + 1


def test_parameters_and_plain_tensors_of_the_same_metadata_alternate_without_mixing_up():
    # same dtype, shape and strides: only the class and requires_grad tell them apart, and so must the route
    w, bias = torch.randn(3, 4), torch.randn(4)
    pw, pbias = torch.nn.Parameter(w.clone()), torch.nn.Parameter(bias.clone())
    x = torch.randn(5, 3)
    want = np.maximum(x.numpy() @ w.numpy() + bias.numpy(), 0)
    for _ in range(3):
        for weight, b, recorded in ((w, bias, False), (pw, pbias, True), (pw, bias, True), (w, pbias, True)):
            got = nvdispatch.matmul(x, weight, epilog="RELU_BIAS", epilog_inputs={"bias": b})
            assert (got.grad_fn is not None) is recorded
            np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)
            got = nvdispatch.matmul(x, weight)
            assert (got.grad_fn is not None) is (weight is pw)


@pytest.mark.parametrize("grad", [False, True])
def test_calls_changing_their_operands_between_calls_get_their_own_results(grad):
    rng = np.random.default_rng(0)

    def t(*shape, dtype=torch.float32):
        return torch.from_numpy(rng.standard_normal(shape)).to(dtype)

    a, b, bias = t(6, 4), t(4, 5), t(5)
    variants = [
        (a, b, bias),
        (a.double(), b.double(), bias.double()),
        (t(4, 6).t(), b, bias),  # a transposed view: other strides
        (a, t(5, 4).t(), bias),
        (t(7, 4), b, bias),
        (a[::2], b, bias),
        (a, b, t(5)),
        (a.requires_grad_(grad), b, bias),
    ]
    for _ in range(3):  # the third round runs on remembered keys
        for x, y, z in variants:
            got = nvdispatch.matmul(x, y, epilog="RELU_BIAS", epilog_inputs={"bias": z})
            assert got.dtype == x.dtype and got.shape == (x.shape[0], y.shape[1])
            np.testing.assert_allclose(got.detach().numpy(), _relu_bias(x.detach(), y, z), rtol=1e-5, atol=1e-6)
            got = nvdispatch.matmul(x, y)
            np.testing.assert_allclose(got.detach().numpy(), x.detach().numpy() @ y.numpy(), rtol=1e-5, atol=1e-6)
    if grad:  # the autograd path still records: its key keeps grad mode
        out = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        out.sum().backward()
        assert a.grad is not None
        with torch.no_grad():
            assert not nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).requires_grad


def test_a_repeated_fft_finds_its_plan_behind_the_guard():
    x = torch.randn(16, dtype=torch.complex64)
    y = torch.randn(32, dtype=torch.complex64)[::2]  # same shape, other strides
    for _ in range(3):
        for v in (x, y, x.to(torch.complex128)):
            np.testing.assert_allclose(nvdispatch.fft.fft(v).numpy(), np.fft.fft(v.numpy()), rtol=1e-5, atol=1e-5)
    assert len(_handles("fft")) == 3


def test_an_adapter_change_forgets_remembered_handles():
    a = torch.ones(2, 2)
    for _ in range(3):
        nvdispatch.matmul(a, a)
    assert _memo().handles
    register_adapter(TorchAdapter())  # the same framework again: keys must be read afresh
    assert torch.Tensor not in call_key_classes
    np.testing.assert_allclose(nvdispatch.matmul(a, a).numpy(), np.full((2, 2), 2.0))


def test_a_hit_through_the_memo_is_logged(caplog):
    a = torch.ones(2, 2)
    for _ in range(2):
        nvdispatch.matmul(a, a)
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        nvdispatch.matmul(a, a)
    assert "matmul: plan cache hit (call key)" in caplog.text


def test_unhashable_arguments_still_get_their_typed_error():
    a = torch.ones(2, 2)
    for _ in range(2):
        nvdispatch.matmul(a, a)
    with pytest.raises(nvdispatch.errors.InvalidArgumentError):
        linalg.matmul(a, a, epilog=["RELU"])
    with pytest.raises((nvdispatch.errors.InvalidArgumentError, TypeError)):
        nvdispatch.fft.fft(torch.ones(4, dtype=torch.complex64), n=[4])


@pytest.mark.gpu
def test_cuda_tensors_get_their_own_keys_and_results():
    rng = np.random.default_rng(1)
    host = [torch.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((16, 16), (16, 16), (16,))]
    cuda = [x.cuda() for x in host]
    assert not _guard(*host)(*cuda) and not _guard(*cuda)(*host)
    want = _relu_bias(*host)
    for _ in range(3):
        for a, b, bias in (host, cuda, (cuda[0], cuda[1].t(), cuda[2])):
            got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
            assert got.device == a.device
            ref = want if b.stride() == (16, 1) else _relu_bias(host[0], host[1].t(), host[2])
            np.testing.assert_allclose(got.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
            x = a.to(torch.complex64)
            np.testing.assert_allclose(
                nvdispatch.fft.fft(x).cpu().numpy(), np.fft.fft(x.cpu().numpy()), rtol=1e-4, atol=1e-4
            )


def test_threads_calling_with_shapes_of_their_own_get_their_own_results():
    import threading

    rng = np.random.default_rng(2)
    shapes = [(m, 8, n) for m in (3, 5, 9) for n in (4, 7)]  # more than a form keeps: keys keep changing
    operands = [
        tuple(torch.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((m, k), (k, n), (n,)))
        for m, k, n in shapes
    ]
    errors = []

    def work(offset):
        try:
            for i in range(60):
                a, b, bias = operands[(i + offset) % len(operands)]
                got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                np.testing.assert_allclose(got.numpy(), _relu_bias(a, b, bias), rtol=1e-5, atol=1e-5)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("op", ["matmul", "rfft"])
def test_a_meta_tensor_never_finds_a_cpu_tensors_route(op):
    """A meta tensor's device index is -1, as a CPU tensor's: its call key must still differ, or the CPU call's
    cached route would serve it. Meta calls get the operators' meta kernels (a meta result), before and after."""
    torch = pytest.importorskip("torch")
    cpu = torch.ones(4, 8)
    meta = torch.empty(4, 8, device="meta")

    def call(x):
        return nvdispatch.matmul(x, x.mT) if op == "matmul" else nvdispatch.fft.rfft(x)

    assert call(meta).is_meta
    for _ in range(3):  # the CPU call's route, cached and then served by its key (and the memo's guard)
        got = call(cpu)
        assert not got.is_meta
    want = np.ones((4, 4)) * 8 if op == "matmul" else np.fft.rfft(np.ones((4, 8)))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    again = call(meta)
    assert again.is_meta and again.shape == got.shape and again.dtype == got.dtype
