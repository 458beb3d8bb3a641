"""FFT with nvdispatch: the same code on NumPy (CPU, scipy.fft on all cores) and, when present, Torch/CuPy
on the GPU (cuFFT); a stateful FFT; and nvdispatch as a scipy.fft backend.

    python examples/fft_spectrum.py

Needs: the base install (``pip install -e .``; NumPy's pocketfft then does the CPU transforms); the scipy.fft
backend part needs ``pip install 'nvdispatch[scipy]'``, the GPU part ``nvdispatch[torch]`` and a GPU.
"""

from __future__ import annotations

import argparse

import numpy as np

import nvdispatch
import nvdispatch.fft as F


def dominant_frequency(signal, rate):
    """The strongest frequency (Hz) of each row of a real ``signal`` sampled at ``rate``."""
    spectrum = F.rfft(signal)
    freqs = F.rfftfreq(signal.shape[-1], d=1.0 / rate, device=getattr(signal, "device", None))
    power = abs(spectrum) ** 2
    idx = power.argmax(-1)
    return freqs[idx]


def main():
    rate, n = 1000.0, 2048
    t = np.arange(n) / rate
    sig = np.stack([np.sin(2 * np.pi * f * t) for f in (50.0, 120.0, 333.0)]).astype(np.float32)
    print("dominant (NumPy):", dominant_frequency(sig, rate))
    print(nvdispatch.explain(F.rfft, sig))

    # stateful: plan once, run both directions many times
    x = (np.random.default_rng(0).standard_normal((64, 256)) * (1 + 1j)).astype(np.complex64)
    with F.FFT(x, axes=(1,)) as fft:
        fft.plan()
        y = fft.execute()
        fft.reset_operand(y)  # same shape and dtype: the plans are reused
        back = fft.execute(direction="inverse")
    print("stateful round trip error:", float(np.max(np.abs(back - x))), y.dtype)

    # as a scipy.fft backend
    try:
        import scipy.fft
    except ImportError:
        print("scipy.fft backend part skipped: it needs pip install 'nvdispatch[scipy]'")
    else:
        with scipy.fft.set_backend(F):
            z = scipy.fft.fft2(x)
        print("scipy.fft backend:", z.dtype, float(np.max(np.abs(z - np.fft.fft2(x)))))

    try:
        import torch
    except ImportError:
        print("GPU part skipped: it needs pip install 'nvdispatch[torch]' and an NVIDIA GPU")
        return
    if not torch.cuda.is_available():
        print("GPU part skipped: Torch finds no CUDA GPU")
        return
    g = torch.from_numpy(sig).cuda()
    print("dominant (Torch CUDA):", dominant_frequency(g, rate).cpu().numpy())
    print(nvdispatch.explain(F.rfft, g))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
