"""The MLP training step of ``compiled_mlp_bench.py`` written by hand: no autograd, every gradient product an
explicit call (issue #31's "the same step written by hand on the fused epilogs").

Three versions of one step (forward, ``loss = out.float().square().mean()``, backward; the gradients of every weight
and bias, none for the input), each runnable eagerly or through ``torch.compile(fullgraph=True)`` (under
``mode="reduce-overhead"`` the whole step, backward included, is then one CUDA graph: no autograd node is left
outside the compiled program):

* ``nvdispatch``: each layer's forward one ``nvdispatch.matmul`` with the bias and activation fused (``RELU_BIAS``,
  ``GELU_AUX_BIAS`` keeping the pre-activation, ``BIAS`` for the last layer); backward per layer one ``BGRADA``
  product (weight gradient ``dz^T @ h`` in Linear's ``(out, in)`` layout and bias gradient in one call) and, for
  the layer below, ``dz @ W`` with ``DGELU`` fused (GELU) or masked by the saved output (ReLU: cuBLASLt's DRELU
  runs as a separate epilogue kernel on Hopper, the mask costs less; FusedMLP's default for the same reason);
* ``nvdispatch-sums``: the same, but each bias gradient a Torch sum over the batch beside a plain weight-gradient
  GEMM (instead of ``BGRADA``: on Hopper cuBLASLt computes a ``BGRAD`` epilogue in a kernel of its own after the
  GEMM, where in a compiled program inductor can fold the sum into the pass that produces the gradient);
* ``torch``: the same step in plain Torch ops (``F.linear``, ``torch.mm``, ``sum``, ``aten.gelu_backward``), the
  by-hand reference.

``make_step(torch, model, which, mode)`` returns a ``step(x) -> loss`` that leaves each parameter's gradient in
``.grad``, as the autograd steps of the benchmark do. ``model`` is a FusedMLP (its ``weights``/``biases`` are used).
"""

from __future__ import annotations

VERSIONS = ("nvdispatch", "nvdispatch-sums", "torch")


def _nvdispatch_train(torch, weights, biases, activation: str, sums: bool = False):
    import nvdispatch

    last = len(weights) - 1

    def train(x):
        hs, pre, h = [x], [], x
        for i, (w, b) in enumerate(zip(weights, biases)):
            if i == last:
                out = nvdispatch.matmul(h, w.mT, epilog="BIAS", epilog_inputs={"bias": b})
            elif activation == "relu":
                h = nvdispatch.matmul(h, w.mT, epilog="RELU_BIAS", epilog_inputs={"bias": b})
                hs.append(h)
            else:
                h, aux = nvdispatch.matmul(h, w.mT, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": b})
                hs.append(h)
                pre.append(aux["gelu_aux"])
        loss, dz = _loss_and_gradient(out)
        grads_w, grads_b = [None] * len(weights), [None] * len(weights)
        for i in range(last, -1, -1):
            if sums:
                grads_w[i], grads_b[i] = nvdispatch.matmul(dz.mT, hs[i]), dz.sum(0)
            else:
                grads_w[i], summed = nvdispatch.matmul(dz.mT, hs[i], epilog="BGRADA")
                grads_b[i] = summed["bgrada"]
            if i:
                if activation == "relu":
                    dz = torch.where(hs[i] > 0, nvdispatch.matmul(dz, weights[i]), 0)
                else:
                    dz = nvdispatch.matmul(dz, weights[i], epilog="DGELU", epilog_inputs={"gelu_aux": pre[i - 1]})
        return loss, grads_w, grads_b

    return train


def _torch_train(torch, weights, biases, activation: str):
    import torch.nn.functional as F

    last = len(weights) - 1

    def train(x):
        hs, pre, h = [x], [], x
        for i, (w, b) in enumerate(zip(weights, biases)):
            z = F.linear(h, w, b)
            if i == last:
                out = z
            else:
                h = torch.relu(z) if activation == "relu" else F.gelu(z, approximate="tanh")
                hs.append(h)
                pre.append(z)
        loss, dz = _loss_and_gradient(out)
        grads_w, grads_b = [None] * len(weights), [None] * len(weights)
        for i in range(last, -1, -1):
            grads_w[i] = torch.mm(dz.mT, hs[i])
            grads_b[i] = dz.sum(0)
            if i:
                below = torch.mm(dz, weights[i])
                if activation == "relu":
                    dz = torch.where(hs[i] > 0, below, 0)
                else:
                    dz = torch.ops.aten.gelu_backward(below, pre[i - 1], approximate="tanh")
        return loss, grads_w, grads_b

    return train


def _loss_and_gradient(out):
    """``mean(out.float()²)`` and its gradient with respect to ``out``, in ``out``'s dtype (what autograd's
    ``MeanBackward``/``PowBackward``/``ToCopyBackward`` compute for the benchmark's loss)."""
    wide = out.float()
    return wide.square().mean(), (wide * (2.0 / wide.numel())).to(out.dtype)


def make_step(torch, model, which: str, mode: str | None):
    """``step(x) -> loss`` of ``model`` (a FusedMLP) by hand: ``which`` in :data:`VERSIONS`; ``mode`` None eagerly,
    else ``torch.compile``'s mode (``"default"`` or ``"reduce-overhead"``), ``fullgraph=True``."""
    if which not in VERSIONS:
        raise ValueError(f"which: expected one of {VERSIONS}, got {which!r}")
    weights, biases = list(model.weights), list(model.biases)
    if which == "torch":
        train = _torch_train(torch, weights, biases, model.activation)
    else:
        train = _nvdispatch_train(torch, weights, biases, model.activation, sums=which == "nvdispatch-sums")
    fn = train if mode is None else torch.compile(train, fullgraph=True, mode=None if mode == "default" else mode)
    graphs = mode == "reduce-overhead"

    def step(x):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            loss, grads_w, grads_b = fn(x)
        for p, g in zip(weights + biases, grads_w + grads_b):
            p.grad = g if g.dtype == p.dtype else g.to(p.dtype)
        return loss

    return step
