"""What a newcomer meets first: ``from nvdispatch import *`` on a base install (no optional package importable),
and ``explain()`` at the REPL showing the readable report rather than a dataclass dump."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import nvdispatch
from conftest import NVDISPATCH_PATH

OPTIONAL = ("scipy", "torch", "cupy", "numba", "cuda", "jax", "dask", "distributed", "matplotlib", "tqdm")


def test_star_import_works_on_a_base_install():
    code = (
        "import sys; sys.modules.update({m: None for m in sys.argv[1:]})\n"
        "from nvdispatch import *\n"
        "import numpy as np\n"
        "assert (matmul(np.eye(2), np.ones((2, 2))) == 1).all() and fft.rfft(np.ones(4))[0] == 4\n"
        "print(sorted(k for k in dir() if not k.startswith('_') and k not in ('np', 'sys')))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([NVDISPATCH_PATH, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code, *OPTIONAL], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert eval(done.stdout) == sorted(nvdispatch.__all__)


def test_device_is_public_but_not_in_star_import():
    assert "device" not in nvdispatch.__all__
    pytest.importorskip("numba.cuda", reason="nvdispatch.device needs the [numba] extra")
    assert nvdispatch.device.__name__ == "nvdispatch.device"  # loaded on first use where numba is installed


def test_explain_repr_is_the_readable_report():
    report = nvdispatch.explain(np.ones((4, 3)), np.ones((3, 2)), epilog="RELU")
    assert repr(report) == str(report)
    assert repr(report).startswith("matmul on executor 'numpy', strategy ")
    assert "Explanation(" not in repr(report) and len(repr(report)) < 600
    fft_report = nvdispatch.explain(nvdispatch.fft.rfft, np.ones(64))
    assert repr(fft_report).startswith("rfft on executor ")
