"""``python -m nvdispatch calibrate``: measure the CPU executor's calibration for this machine and keep it in the
user cache directory (``NVDISPATCH_CACHE_DIR`` chooses another; ``""`` keeps nothing). Calibrates the problem
classes earlier processes ran uncalibrated, then a standard set (see :func:`nvdispatch.calibration.calibrate`)."""

from __future__ import annotations

import argparse

from .calibration import calibrate

HELP = "measure the CPU executor's calibration for this machine and keep it"
DESCRIPTION = (
    "Measure the CPU executor's calibration for this machine (which engine fuses each class of matmul epilog "
    "fastest, when the FFT's threads pay off) and keep it in the user cache directory (NVDISPATCH_CACHE_DIR "
    "chooses another; '' keeps nothing). Calibrates the problem classes earlier processes ran uncalibrated, "
    "then a standard set."
)


def _dimension(text: str) -> int:
    """argparse type of one --shape entry: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a smaller standard set: float32, bias and RELU epilogs")
    parser.add_argument(
        "--shape",
        type=_dimension,
        nargs=3,
        action="append",
        metavar=("M", "K", "N"),
        help="calibrate this product (x M x K, w K x N) instead of the standard set; may be repeated",
    )
    parser.add_argument("--no-fft", action="store_true", help="leave the FFT threads threshold as it is")


def run(args: argparse.Namespace) -> int:
    try:
        from tqdm import tqdm
    except ImportError:  # (the [bench] extra) a line per stage instead of a bar
        tqdm = None

    def progress(iterable, description, total):
        if tqdm is not None:
            return tqdm(iterable, desc=description, total=total, leave=False)
        print(f"{description}: {total} to measure ...", flush=True)
        return iterable

    print(calibrate(args.shape, fft=not args.no_fft, quick=args.quick, progress=progress))
    return 0
