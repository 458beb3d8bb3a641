"""``python -m nvdispatch``: report what this machine offers and run a fused linear layer on it.

Prints the frameworks, executors and GPUs found, then runs ``relu(x @ w + bias)`` as one nvdispatch call
on every available framework/device, checks it against NumPy and prints the plan that was chosen.
``python -m nvdispatch calibrate`` measures the CPU executor's calibration for this machine and keeps it.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
import time

import numpy as np

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import BUILTIN, builtin


def _gpus() -> list[str]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    if lib.cuInit(0) != 0:
        return []
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    names = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        buf = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(buf, 256, dev)
        names.append(f"cuda:{i} {buf.value.decode()}")
    return names


def _version(module: str) -> str | None:
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return None
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not fatal
        return f"broken ({type(exc).__name__})"
    return getattr(mod, "__version__", "installed")


def _executor_status(name: str) -> str:
    ex = builtin(name)
    if ex is None:
        return "not in this build"
    why = getattr(ex, "unavailable", lambda: None)()
    return "available" if why is None else f"unavailable: {why}"


def _operands(framework: str, device: str, m: int, k: int, n: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    want = np.maximum(x @ w + bias, 0)
    if framework == "numpy":
        return (x, w, bias), want
    if framework == "torch":
        import torch

        return tuple(torch.from_numpy(v).to(device) for v in (x, w, bias)), want
    if framework == "dask":  # NumPy chunks, 2 x 2 blocks; the small bias is broadcast as it is
        import dask.array as da

        return (da.from_array(x, chunks=(-(-m // 2), -(-k // 2))), da.from_array(w, chunks=(-(-k // 2), -(-n // 2))),
                bias), want
    import cupy

    return tuple(cupy.asarray(v) for v in (x, w, bias)), want


def _to_numpy(r):
    if isinstance(r, np.ndarray):
        return r
    if hasattr(r, "dask"):  # a Dask array: compute it here (synchronous scheduler)
        return np.asarray(r.compute(scheduler="sync"))
    if hasattr(r, "get"):
        return r.get()
    return r.detach().cpu().numpy()


#: module -> the extra that installs it (shown next to a framework that is missing)
_EXTRA = {"scipy": "scipy", "torch": "torch", "cupy": "cupy", "cuda.bindings": "cuda", "numba": "numba"}


def _dimension(text: str) -> int:
    """argparse type of one --shape entry: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nvdispatch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"nvdispatch {nvdispatch.__version__}")
    parser.add_argument(
        "--shape",
        type=_dimension,
        nargs=3,
        default=(512, 256, 128),
        metavar=("M", "K", "N"),
        help="sizes of the demo product: x is M x K, w is K x N, bias has N entries (default: 512 256 128)",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="{calibrate}")
    _calibrate_parser(commands)
    return parser


# -- python -m nvdispatch calibrate ------------------------------------------------------------------------
def _calibrate_parser(commands) -> None:
    from .executors.cpu_calibration_store import ENV

    about = "measure the CPU executor's calibration for this machine and keep it in the user cache directory"
    sub = commands.add_parser(
        "calibrate",
        help=about,
        description=f"{about[0].upper()}{about[1:]} ({ENV} chooses another directory; '' keeps nothing). "
        "Calibrates the problem classes earlier processes ran uncalibrated, then a standard set.",
    )
    sub.add_argument("--quick", action="store_true", help="a smaller standard set: float32, bias and RELU epilogs")
    sub.add_argument(
        "--shape",
        type=_dimension,
        nargs=3,
        action="append",
        metavar=("M", "K", "N"),
        help="calibrate this product (x M x K, w K x N) instead of the standard set; may be repeated",
    )
    sub.add_argument("--no-fft", action="store_true", help="leave the FFT threads threshold as it is")


def _calibrate(args) -> int:
    try:
        from tqdm import tqdm
    except ImportError:  # (the [bench] extra) a line per stage instead of a bar
        tqdm = None

    def progress(iterable, description, total):
        if tqdm is not None:
            return tqdm(iterable, desc=description, total=total, leave=False)
        print(f"{description}: {total} to measure ...", flush=True)
        return iterable

    from .calibration import calibrate

    report = calibrate(args.shape, fft=not args.no_fft, quick=args.quick, progress=progress)
    print(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the demo; ``argv`` as on the command line (``None``: ``sys.argv[1:]``). Returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "calibrate":
        return _calibrate(args)
    m, k, n = args.shape

    print(f"nvdispatch {nvdispatch.__version__} on Python {sys.version.split()[0]}")
    print("\nframeworks:")
    versions = {
        mod: _version(mod)
        for mod in ("numpy", "scipy", "torch", "cupy", "cuda.bindings", "numba", "dask", "distributed", "dask_cuda")
    }
    for mod, ver in versions.items():
        missing = f"not installed (pip install 'nvdispatch[{_EXTRA[mod]}]')" if mod in _EXTRA else "not installed"
        print(f"  {mod:14s} {ver or missing}")
    gpus = _gpus()
    print("\nGPUs:", ", ".join(gpus) if gpus else "none found")
    print("\nexecutors:")
    for name in BUILTIN:
        print(f"  {name:6s} {_executor_status(name)}")

    runs = [("numpy", "cpu")]
    if versions["torch"]:
        runs.append(("torch", "cpu"))
        if gpus:
            runs.append(("torch", "cuda"))
    if versions["cupy"] and gpus:
        runs.append(("cupy", "cuda"))
    if versions["dask"]:
        runs.append(("dask", "cpu"))
    else:
        print("\ndask: not installed (pip install 'nvdispatch[dask]' for Dask arrays)")

    print(f"\nfused linear layer relu(x @ w + bias), x {m}x{k}, w {k}x{n}, bias ({n},), float32:")
    failures = 0
    for framework, device in runs:
        try:
            (x, w, bias), want = _operands(framework, device, m, k, n)
            kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
            plan = nvdispatch.explain(x, w, **kwargs)
            nvdispatch.matmul(x, w, **kwargs)
            t0 = time.perf_counter()
            got = nvdispatch.matmul(x, w, **kwargs)
            got = _to_numpy(got)
            elapsed = time.perf_counter() - t0
            err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
            ok = err < 1e-2  # loose enough for TF32 on GPUs
            failures += not ok
            verdict = "ok" if ok else "WRONG"
            print(f"\n  [{framework} on {device}] {verdict}  max rel. error {err:.1e}  {elapsed * 1e3:.2f} ms")
            for line in str(plan).splitlines():
                print("    " + line)
        except Exception as exc:  # noqa: BLE001 - the demo reports every path it tries
            failures += 1
            print(f"\n  [{framework} on {device}] failed: {type(exc).__name__}: {exc}")
    print(f"\nplan cache: {nvdispatch.plan_cache.stats()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
