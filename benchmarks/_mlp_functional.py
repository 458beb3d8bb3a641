"""The MLP training step of ``compiled_mlp_bench.py`` as a function of the parameters: ``torch.func.grad_and_value``
over ``torch.func.functional_call(model, params, x)`` and the benchmark's loss, compiled whole with
``torch.compile(fullgraph=True)`` (the functional training step of JAX and functorch users).

The backward is traced into the compiled program with the forward (no autograd node outside it), so under
``mode="reduce-overhead"`` the whole step is one CUDA graph, for any model: the plain Torch one and FusedMLP (whose
layers then run as ``nvdispatch`` matmul operators with their backward epilogs) alike.

``make_step(torch, model, mode)`` returns a ``step(x) -> loss`` that leaves each parameter's gradient in ``.grad``,
as the autograd steps of the benchmark do.
"""

from __future__ import annotations


def make_step(torch, model, mode: str | None):
    """``step(x) -> loss`` of ``model``: eagerly (``mode`` None) or through ``torch.compile``'s ``mode``
    (``"default"`` or ``"reduce-overhead"``), ``fullgraph=True``."""
    from torch.func import functional_call, grad_and_value

    params = dict(model.named_parameters())
    detached = {name: p.detach() for name, p in params.items()}

    def loss_of(values, x):
        return functional_call(model, values, (x,)).float().square().mean()

    train = grad_and_value(loss_of)
    fn = train if mode is None else torch.compile(train, fullgraph=True, mode=None if mode == "default" else mode)
    graphs = mode == "reduce-overhead"

    def step(x):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        grads, loss = fn(detached, x)
        for name, p in params.items():
            p.grad = grads[name]
        return loss

    return step
