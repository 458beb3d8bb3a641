"""Choose the executor SciPy-style, and plug in your own.

Shows set_backend (with coerce), skip_backend, explain() and a user-written executor that logs calls.

Needs: the base install (``pip install -e .``); the Torch part runs when ``nvdispatch[torch]`` is installed.
"""

from __future__ import annotations

import argparse

import numpy as np

import nvdispatch
from nvdispatch.executors import Executor


class LoggingExecutor(Executor):
    """Delegates to the NumPy executor and logs every call it takes."""

    name = "logging"

    def __init__(self):
        self.inner = nvdispatch.executors.builtin("numpy")
        self.log: list[str] = []

    def decline(self, op, problem, *, coerce=False):
        return self.inner.decline(op, problem, coerce=coerce)

    def strategies(self, op, problem):
        return self.inner.strategies(op, problem)

    def plan(self, op, problem, strategy, tuning=None):
        self.log.append(f"planned {op} {problem.m}x{problem.k}x{problem.n} with {strategy}")
        return self.inner.plan(op, problem, strategy, tuning)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    a = np.arange(12.0).reshape(3, 4)
    b = np.ones((4, 2))
    print(nvdispatch.explain(a, b, epilog="RELU"))

    logger = LoggingExecutor()
    with nvdispatch.set_backend(logger, only=True):
        r = nvdispatch.matmul(a, b, epilog="RELU")
    print(logger.log)
    assert logger.log and np.allclose(r, np.maximum(a @ b, 0))

    try:
        import torch
    except ImportError:
        torch = None
        print("Torch part skipped: it needs pip install 'nvdispatch[torch]'")
    if torch is not None:
        with nvdispatch.set_backend("torch", coerce=True):
            t = nvdispatch.matmul(a, b)
        print("coerced to", type(t).__module__, t.dtype)
        assert isinstance(t, torch.Tensor)
