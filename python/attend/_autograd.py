"""The one autograd Function every attend.torch entry point goes through.

Callers describe the problem as a dict of attend::AttentionSpec fields and hand
over tensors already arranged in that spec's layout; everything API-specific
(transposes, key slicing, mask-to-bias conversion) happens outside, in ordinary
differentiable torch ops, so autograd handles it.
"""

import torch

from . import _C


def draw_dropout_seed():
    """The dropout seed of one call: 62 random bits from torch's default CPU
    generator, so ``torch.manual_seed`` makes runs reproducible. Drawn once per
    call with dropout_p > 0; the same seed is kept for backward."""
    return int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())


def mode_for(tensors, training=None):
    """'training' when a backward may follow: grad mode is on and any input needs
    a gradient (or the caller insists, e.g. a module in training mode)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return "training" if (needs_grad or (training and torch.is_grad_enabled())) else "inference"


class _Attend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, mode, record, q, k, v, bias, slopes, cu_q, cu_kv):
        out, lse, call = _C.forward(spec, mode, q, k, v, bias, slopes, cu_q, cu_kv)
        # Holds the attend::Context (selection, spec with the dropout seed, out and
        # LSE) and the input views it reads: backward runs on the same backend.
        ctx.call = call
        # Saved only so that autograd's version counters catch in-place edits of
        # the inputs or the output between forward and backward.
        ctx.save_for_backward(q, k, v, out)
        ctx.mark_non_differentiable(lse)
        record.append(call.selection)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        ctx.saved_tensors  # noqa: B018  (raises if an input was modified in place)
        dq, dk, dv, dbias = ctx.call.backward(dout)
        return None, None, None, dq, dk, dv, dbias, None, None, None


def run(spec, q, k, v, bias=None, slopes=None, cu_q=None, cu_kv=None, training=None, record=None):
    """Runs attention; returns (out, lse). `record`, a list, receives the call's
    native Selection (.backend, .mode, .explain(), .to_json())."""
    record = [] if record is None else record
    mode = mode_for((q, k, v, bias), training)
    needs_graph = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias))
    if not needs_graph:
        out, lse, call = _C.forward(spec, mode, q, k, v, bias, slopes, cu_q, cu_kv)
        record.append(call.selection)
        return out, lse
    return _Attend.apply(spec, mode, record, q, k, v, bias, slopes, cu_q, cu_kv)


_last = []  # the native Selection of the most recent forward in this process


def last_explanation():
    from .policy import Explanation
    if not _last:
        return None
    return Explanation(_last[-1].explain(), _last[-1].to_json())


class Problem:
    """A call mapped onto attend: spec fields, tensors in the spec's layout, and
    how to turn attend's output back into the caller's convention."""

    def __init__(self, spec, q, k, v, bias=None, slopes=None, cu_q=None, cu_kv=None, restore=lambda o: o):
        self.spec, self.q, self.k, self.v = spec, q, k, v
        self.bias, self.slopes, self.cu_q, self.cu_kv = bias, slopes, cu_q, cu_kv
        self.restore = restore

    def tensors(self):
        return (self.q, self.k, self.v, self.bias)

    def run(self, training=None):
        """(output in the caller's convention, LSE)."""
        record = []
        out, lse = run(self.spec, self.q, self.k, self.v, self.bias, self.slopes, self.cu_q, self.cu_kv,
                       training=training, record=record)
        _last[:] = record
        return self.restore(out), lse

    def explain(self, mode=None, training=None):
        return evaluate(self.spec, self.tensors(), mode, training)


def evaluate(spec, tensors, mode=None, training=None):
    """The Explanation a call with these tensors would get (mode derived as run() does)."""
    from .policy import Explanation
    table, js = _C.evaluate(spec, mode or mode_for(tensors, training))
    return Explanation(table, js)
