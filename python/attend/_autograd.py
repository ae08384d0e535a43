"""The one autograd path every attend.torch entry point goes through.

Callers describe the problem as a dict of attend::AttentionSpec fields and hand
over tensors already arranged in that spec's layout; everything API-specific
(transposes, key slicing, mask-to-bias conversion) happens outside, in ordinary
differentiable torch ops, so autograd handles it.

Two implementations of the same op:
- torch >= 2.4: ``torch.library.custom_op`` ops ``attend::attention_forward`` /
  ``attend::attention_backward`` with fake (meta) kernels and registered
  autograd, so torch.compile traces through without graph breaks. The spec
  travels as a string (``key=value;...``) the native field table parses.
  Backward is the context-free one (from out and LSE). Forward returns, as a
  third output, a one-element int64 tensor naming the (backend, variant) it ran
  on; backward takes it and runs there, forced, whatever the policy says by
  then (forward's choice wins: a backend disabled after forward still runs
  the backward of a call it began). A tensor, not a string argument, so that
  compiled graphs carry the choice made when the op runs, not at trace time.
- older torch (1.13 ...): a ``torch.autograd.Function`` that keeps forward's
  native context, so backward runs on the plan forward chose.

Eager calls of the common plain kind (see fast_call) take neither: a native
spec parsed once per signature, and for training a lean autograd.Function
whose backward runs from the saved tensors on forward's plan.
"""

import math
import torch

from . import _C, _arrays
from .errors import InvalidArgumentError, UnsupportedError, _raise
from ._torch_inputs import one_device, refuse_transforms, transforming

_TORCH_DTYPE = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
                "i32": torch.int32}
_NAMES = ("q", "k", "v", "bias", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_kv", "sinks")

_last = []  # the native Call of the most recent forward in this process (its .selection)

# "backend:variant" plans forward ran on, interned: the ops pass an index.
_PLANS = []
_PLAN_INDEX = {}


def _plan_id(selection):
    name = f"{selection.backend}:{selection.variant}"
    if name not in _PLAN_INDEX:
        _PLAN_INDEX[name] = len(_PLANS)
        _PLANS.append(name)
    return _PLAN_INDEX[name]


def _plan_name(plan):
    i = int(plan.reshape(-1)[0].item())
    if not 0 <= i < len(_PLANS):
        _raise(UnsupportedError, "plan", i, "not a plan this process's forward chose")
    return _PLANS[i]


def draw_dropout_seed():
    """The dropout seed of one call: 62 random bits from torch's default CPU
    generator, so ``torch.manual_seed`` makes runs reproducible. Drawn once per
    call with dropout_p > 0; the same seed is kept for backward."""
    if transforming():
        # One seed per call: vmapped elements would share one mask (and
        # .item() of a batched draw is no number).
        _raise(UnsupportedError, "dropout_p", "> 0", "attention dropout under torch.func transforms is not "
               "supported: call per batch element, or without dropout")
    return int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())


def mode_for(tensors, training=None):
    """'training' when a backward may follow: grad mode is on and any input needs
    a gradient (or the caller insists, e.g. a module in training mode)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return "training" if (needs_grad or (training and torch.is_grad_enabled())) else "inference"


def _expected(spec, role):
    shape, dtype = _C.expected(spec, role)
    return tuple(shape), _TORCH_DTYPE[dtype]


def _native_forward(spec, mode, tensors):
    """(out, lse, call, keep): runs the native forward into fresh torch tensors."""
    descs, keep = _arrays.describe_all(tensors)
    out_shape, out_dtype = _expected(spec, "out")
    lse_shape, lse_dtype = _expected(spec, "lse")
    out, lse = torch.empty(out_shape, dtype=out_dtype), torch.empty(lse_shape, dtype=lse_dtype)
    call = _C.forward(spec, mode, descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0])
    _last[:] = [call]
    return out, lse, call, keep


def _learnable(spec):
    return str(spec.get("softmax_type")) == "learnable"


def _grad_buffers(spec, bias):
    zeros = bool(spec.get("accumulate_grads")) and str(spec.get("accumulate_grads")).lower() != "false"
    make = torch.zeros if zeros else torch.empty
    grads = {}
    for r in ("dq", "dk", "dv") + (("dsinks",) if _learnable(spec) else ()):
        shape, dtype = _expected(spec, r)
        grads[r] = make(shape, dtype=dtype)
    if bias is not None and str(spec.get("bias_requires_grad")).lower() == "true":
        grads["dbias"] = make(tuple(bias.shape), dtype=bias.dtype)
    return grads


def _saved(ctx, q, k, v, out, lse):
    """Saves what backward reads (autograd's version counters then catch in-place
    edits between the passes) and returns forward's outputs, the LSE marked
    non-differentiable."""
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)
    return out, lse


def _no_double_backward():
    """Raises when a backward runs with grad mode on (create_graph=True): attend's
    backward is not itself differentiable."""
    if torch.is_grad_enabled():
        _raise(UnsupportedError, "create_graph", True,
               "attend's backward is not differentiable: double backward (create_graph=True through attend "
               "attention) is not supported")


class _Attend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, mode, q, k, v, bias, slopes, cu_q, cu_kv, sinks):
        out, lse, call, keep = _native_forward(spec, mode,
                                               dict(zip(_NAMES, (q, k, v, bias, slopes, cu_q, cu_kv, sinks))))
        # The context (plan, spec with the dropout seed, out and LSE) and the
        # memory it views: backward runs on the same backend.
        ctx.call, ctx.keep, ctx.spec, ctx.bias = call, keep, spec, bias
        # Saved only for the version counters (the native context reads the
        # memory itself, LSE included).
        return _saved(ctx, q, k, v, out, lse)

    @staticmethod
    def backward(ctx, dout, _dlse):
        _no_double_backward()
        ctx.saved_tensors  # noqa: B018  (raises if an input was modified in place)
        grads = _grad_buffers(ctx.spec, ctx.bias)
        gd, gkeep = _arrays.describe_all(grads)
        d, dkeep = _arrays.describe(dout, "dout")
        ctx.call.backward(d, gd)
        return (None, None, grads["dq"], grads["dk"], grads["dv"], grads.get("dbias"), None, None, None,
                grads.get("dsinks"))


# --- torch.library ops (torch >= 2.4) ----------------------------------------------------

# Under torch.compile with dynamic shapes a field computed from sizes (the
# causal flag and window of a top-left mask rewrite) is a SymBool or SymInt,
# which prints as "True" or as an expression; and inside a trace even
# `bool(x) is True` is False for one. The text is taken by the field's kind:
# a bool through a branch, a number through int()/float(). Both make dynamo
# guard on the value, so a shape that changes it recompiles instead of
# reusing the old text. (The kinds are read at import: a trace cannot call
# into the extension.)
_KINDS = {row["name"]: row["kind"] for row in _C.spec_fields()}
_NUMBERS = {"int": int, "uint": int, "real": float}


def spec_text(spec):
    """A spec dict as the string the ops carry: 'name=value;...' in the native
    field table's text form (bool true/false, None empty)."""
    parts = []
    for name, value in spec.items():
        kind = _KINDS.get(name)
        if value is None:
            text = ""
        elif isinstance(value, str):
            text = value
        elif kind == "bool" or value is True or value is False:
            text = "true" if value else "false"
        elif kind in ("int", "uint") and isinstance(value, float) and not (math.isfinite(value)
                                                                          and value == int(value)):
            # Not an integer: passed as written, so the native parse refuses it
            # by name (int() would truncate 2.5 to 2, silently, in a trace).
            text = f"{value}"
        else:
            number = _NUMBERS.get(kind)
            # (str() of a float cannot be traced by dynamo; f-strings can)
            text = f"{number(value) if number is not None else value}"
        parts.append(name + "=" + text)
    return ";".join(parts)


def spec_from_text(text):
    return dict(p.split("=", 1) for p in text.split(";") if p)


# The size fields: the ops take them from the tensors (and cu_seqlens), not
# from the spec string, so that compiled graphs with dynamic shapes work.
_SIZE_FIELDS = ("batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "total_q",
                "total_kv")
# Where batch, sequence and heads sit in q for a dense layout.
_DENSE_DIMS = {"bshd": (0, 1, 2), "bhsd": (0, 2, 1), "sbhd": (1, 0, 2)}


def _op_spec(text, q, k, v, cu_q, cu_kv):
    """The full spec of an op call: its string plus the sizes its tensors show."""
    from ._core import infer_spec
    s = spec_from_text(text)
    sizes = infer_spec(q, k, v, {"layout": s.get("layout", "bshd")}, {"cu_seqlens_q": cu_q, "cu_seqlens_kv": cu_kv})
    s.update({f: sizes[f] for f in _SIZE_FIELDS if f in sizes})
    return s


def _has_custom_op():
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 4) and hasattr(torch, "library") and hasattr(torch.library, "custom_op")


HAS_OPS = _has_custom_op()

if HAS_OPS:
    from typing import List, Optional

    @torch.library.custom_op("attend::attention_forward", mutates_args=())
    def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                          alibi_slopes: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
                          cu_seqlens_kv: Optional[torch.Tensor], sinks: Optional[torch.Tensor], spec: str,
                          mode: str) -> List[torch.Tensor]:
        tensors = dict(zip(_NAMES, (q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_kv, sinks)))
        out, lse, call, _ = _native_forward(_op_spec(spec, q, k, v, cu_seqlens_q, cu_seqlens_kv), mode, tensors)
        return [out, lse, torch.tensor([_plan_id(call.selection)], dtype=torch.int64)]

    @attention_forward.register_fake
    def _(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_kv, sinks, spec, mode):
        s = spec_from_text(spec)
        out_dtype = _TORCH_DTYPE[s["out_dtype"]] if s.get("out_dtype") else q.dtype
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        layout = s.get("layout", "bshd")
        if layout == "thd":
            lse_shape = (q.shape[1], q.shape[0])
        else:
            b, sq, h = _DENSE_DIMS[layout]
            lse_shape = (q.shape[b], q.shape[h], q.shape[sq])
        return [q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype), q.new_empty(lse_shape, dtype=lse_dtype),
                q.new_empty((1,), dtype=torch.int64)]

    @torch.library.custom_op("attend::attention_backward", mutates_args=())
    def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                           cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_kv: Optional[torch.Tensor],
                           sinks: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor,
                           plan: torch.Tensor, spec: str) -> List[torch.Tensor]:
        s = _op_spec(spec, q, k, v, cu_seqlens_q, cu_seqlens_kv)
        grads = _grad_buffers(s, bias)
        descs, keep = _arrays.describe_all(dict(zip(_NAMES, (q, k, v, bias, alibi_slopes, cu_seqlens_q,
                                                                 cu_seqlens_kv, sinks))))
        gd, gkeep = _arrays.describe_all(grads)
        _C.backward(s, descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0],
                    _arrays.describe(dout, "dout")[0], gd, _plan_name(plan))
        return [grads["dq"], grads["dk"], grads["dv"], grads.get("dbias", q.new_empty(0)),
                grads.get("dsinks", q.new_empty(0))]

    @attention_backward.register_fake
    def _(dout, q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_kv, sinks, out, lse, plan, spec):
        s = spec_from_text(spec)
        dq_dtype = _TORCH_DTYPE[s["dq_dtype"]] if s.get("dq_dtype") else q.dtype
        has_dbias = bias is not None and s.get("bias_requires_grad") == "true"
        has_dsinks = sinks is not None and s.get("softmax_type") == "learnable"
        return [q.new_empty(q.shape, dtype=dq_dtype), k.new_empty(k.shape), v.new_empty(v.shape),
                bias.new_empty(bias.shape) if has_dbias else q.new_empty(0),
                sinks.new_empty(sinks.shape) if has_dsinks else q.new_empty(0)]

    def _setup(ctx, inputs, output):
        q, k, v, bias, slopes, cu_q, cu_kv, sinks, spec, _mode = inputs
        ctx.spec = spec
        ctx.has_bias = bias is not None
        ctx.has_sinks = sinks is not None
        ctx.save_for_backward(q, k, v, bias, slopes, cu_q, cu_kv, sinks, output[0], output[1], output[2])

    def _backward(ctx, grads):
        _no_double_backward()
        q, k, v, bias, slopes, cu_q, cu_kv, sinks, out, lse, plan = ctx.saved_tensors
        dq, dk, dv, dbias, dsinks = attention_backward(grads[0].contiguous(), q, k, v, bias, slopes, cu_q, cu_kv,
                                                       sinks, out, lse, plan, ctx.spec)
        return (dq, dk, dv, (dbias if ctx.has_bias and dbias.numel() else None), None, None, None,
                (dsinks if ctx.has_sinks and dsinks.numel() else None), None, None)

    attention_forward.register_autograd(_backward, setup_context=_setup)

    def _vmap_per_element(op):
        """A vmap rule that runs `op` once per mapped element and stacks the
        results: right for every layout and every argument mapped or not, at
        the cost of one call per element (the plan tensor too is per
        element, so a vmapped backward runs each on its forward's plan)."""
        def rule(info, in_dims, *args):
            results = []
            for i in range(info.batch_size):
                one = [a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]
                if op is attention_forward and one[-1] == "inference":
                    # A mapped tensor shows no requires_grad to run()'s
                    # choice of mode; its elements do.
                    one[-1] = mode_for([t for t in one if isinstance(t, torch.Tensor)])
                results.append(op(*one))
            outs = [torch.stack(r) for r in zip(*results)]
            return outs, [0] * len(outs)
        return rule

    HAS_VMAP = hasattr(torch.library, "register_vmap")
    if HAS_VMAP:
        torch.library.register_vmap("attend::attention_forward", _vmap_per_element(attention_forward))
        torch.library.register_vmap("attend::attention_backward", _vmap_per_element(attention_backward))
else:
    HAS_VMAP = False


def _direct(tensors, differentiable):
    """Whether a call may skip the torch.library op and call the native forward
    itself: nothing for autograd to record, no graph being traced, and plain
    CPU tensors (meta tensors, FakeTensors and other subclasses must meet the
    op's fake kernel).
    The op's dispatch costs ~100 us a call on a 2-core machine, ten times the
    native call of a decode step."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in differentiable):
        return False
    if HAS_OPS and torch.compiler.is_compiling():
        return False
    if transforming():
        return False
    return all(t is None or (type(t) is torch.Tensor and t.device.type == "cpu") for t in tensors)


def run(spec, q, k, v, bias=None, slopes=None, cu_q=None, cu_kv=None, training=None, sinks=None):
    """Runs attention; returns (out, lse)."""
    mode = mode_for((q, k, v, bias, sinks), training)
    tensors = (q, k, v, bias, slopes, cu_q, cu_kv, sinks)
    # The entry points check their arguments under their own names; this
    # catches what they derive (a default ALiBi table, a mask), which must
    # never take a mixed call to the op's fake kernel either.
    one_device("attend", **dict(zip(_NAMES, tensors)))
    refuse_transforms("attend.torch", HAS_VMAP)
    if _direct(tensors, (q, k, v, bias, sinks)):
        out, lse, _, _ = _native_forward(spec, mode, dict(zip(_NAMES, tensors)))
        return out, lse
    if HAS_OPS:
        text = spec_text({f: x for f, x in spec.items() if f not in _SIZE_FIELDS})
        out, lse, _plan = attention_forward(q, k, v, bias, slopes, cu_q, cu_kv, sinks, text, mode)
        return out, lse
    return _Attend.apply(spec, mode, q, k, v, bias, slopes, cu_q, cu_kv, sinks)


# --- the eager fast path -----------------------------------------------------------------
#
# A decode step is a stream of calls whose kernel takes a few microseconds,
# so the general path's Python (a Problem, a spec dict parsed field by field,
# a descriptor per tensor through generic checks, an LSE nobody reads, and for
# training the torch.library op's dispatch) cost several times the kernel.
# Entry points send plain calls here first: CPU tensors of one dtype that
# attend reads in place, with no mask, dropout, sinks or spec fields, outside
# torch.compile and autocast. The spec of such a call depends on its sizes
# only through the size fields, so it is parsed once per signature (the entry
# point's flags and the dtype) into a native SizedSpec that reads the sizes
# from the tensors, as the ops do; the runtime still selects on every call
# (its own cache), under the policy in force.
#
# Training calls take an autograd.Function rather than the op: the op exists
# so that torch.compile can trace attend, and its eager dispatch costs ~10x a
# small problem's kernels. Like the op it saves its tensors with
# save_for_backward (saved-tensor hooks apply) and runs backward from them on
# the (backend, variant) forward chose.

_SIZED = {}  # signature -> _C.SizedSpec
_SIZED_LIMIT = 256  # signatures are flag combinations: a process meets few; bound it anyway
_DTYPE_NAMES = {t: n for n, t in _TORCH_DTYPE.items() if t.is_floating_point}  # the element types
_STRIDED = torch.strided


def _in_place(t, dtype):
    """t's descriptor when attend can read it as it is (CPU, strided, no negative
    bit, a contiguous last dimension), else None (the general path copies)."""
    if not t.is_cpu or t.layout is not _STRIDED or t.is_neg():
        return None
    shape, strides = t.shape, t.stride()
    if strides[-1] != 1 and shape[-1] > 1:
        return None
    return t.data_ptr(), dtype, shape, strides


def _out(q, v, dtype, name):
    # Dense layouts put the value head dim last in out as in v.
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=dtype)
    return out, (out.data_ptr(), name, out.shape, out.stride())


class _SizedAttend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sized, name, lse_shape, q, k, v, dq, dk, dv):
        out, dout = _out(q, v, q.dtype, name)
        lse_name = "f64" if name == "f64" else "f32"  # the LSE is f32 but for f64 problems
        lse = torch.empty(lse_shape, dtype=_TORCH_DTYPE[lse_name])
        call = sized.forward("training", dq, dk, dv, dout, (lse.data_ptr(), lse_name, lse.shape, lse.stride()))
        _last[:] = [call]
        ctx.sized, ctx.call = sized, call
        return _saved(ctx, q, k, v, out, lse)

    @staticmethod
    def backward(ctx, dout, _dlse):
        _no_double_backward()
        saved = ctx.saved_tensors  # raises if one was modified in place since forward
        # Hooks may hand back other tensors than forward saw (moved, copied):
        # describe them afresh, in place where attend can read them so.
        descs, keep = [], []
        for t, n in zip(saved + (dout,), ("q", "k", "v", "out", "lse", "dout")):
            dtype = _DTYPE_NAMES.get(t.dtype)
            d = _in_place(t, dtype) if dtype else None
            if d is None:
                d, owner = _arrays.describe(t, n)
                keep.append(owner)
            descs.append(d)
        name = descs[0][1]
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in saved[:3]]
        ctx.sized.backward(ctx.call, *descs, *(_in_place(g, name) for g in grads))
        del keep
        return (None, None, None) + tuple(grads) + (None, None, None)


def fast_call(signature, spec_of, q, k, v, seq_dim):
    """The output of a plain call, or None when the call needs the general
    path. The caller has checked that q, k and v are exactly torch.Tensor,
    4-D, and consistent in the ways its own general path checks (so that
    path's errors stay its own); `signature` holds every argument the spec
    depends on besides sizes and dtype, `spec_of()` returns the general path's
    spec for this call (used once per signature), and `seq_dim` is where the
    sequence sits in q (the heads at 3 - seq_dim)."""
    dtype = q.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None or k.dtype is not dtype or v.dtype is not dtype:
        return None
    dq, dk, dv = _in_place(q, name), _in_place(k, name), _in_place(v, name)
    if dq is None or dk is None or dv is None:
        return None
    key = signature + (name,)
    sized = _SIZED.get(key)
    if sized is None:
        if len(_SIZED) >= _SIZED_LIMIT:
            _SIZED.clear()
        sized = _SIZED[key] = _C.SizedSpec({f: x for f, x in spec_of().items() if f not in _SIZE_FIELDS})
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        s = q.shape
        return _SizedAttend.apply(sized, name, (s[0], s[3 - seq_dim], s[seq_dim]), q, k, v, dq, dk, dv)[0]
    out, dout = _out(q, v, dtype, name)
    # The LSE is attend's own buffer: these callers return out only.
    _last[:] = [sized.forward("inference", dq, dk, dv, dout, None)]
    return out


def sinks_for(sinks, q):
    """Sink logits in the dtype attend reads them: float64 for float64 problems,
    else float32 (a differentiable cast, so a bf16 parameter still gets its
    gradient)."""
    if not isinstance(sinks, torch.Tensor):
        _raise(InvalidArgumentError, "sinks", type(sinks).__name__, "expected a (H_q) float tensor")
    want = torch.float64 if q.dtype == torch.float64 else torch.float32
    return sinks if sinks.dtype == want else sinks.to(want)


def last_explanation():
    from .policy import Explanation
    if not _last:
        return None
    selection = _last[-1].selection
    return Explanation(selection.explain(), selection.to_json())


class Problem:
    """A call mapped onto attend: spec fields, tensors in the spec's layout, and
    how to turn attend's output back into the caller's convention."""

    def __init__(self, spec, q, k, v, bias=None, slopes=None, cu_q=None, cu_kv=None, restore=lambda o: o,
                 sinks=None):
        self.spec, self.q, self.k, self.v = spec, q, k, v
        self.bias, self.slopes, self.cu_q, self.cu_kv = bias, slopes, cu_q, cu_kv
        self.restore = restore
        self.sinks = sinks
        self.k_scale = self.v_scale = None  # an 8-bit K/V's scales (torch.py)

    def tensors(self):
        return (self.q, self.k, self.v, self.bias, self.sinks)

    def with_sinks(self, sinks):
        """This problem with learnable sink logits `sinks` (H_q): softmax_type learnable."""
        if sinks is not None:
            if isinstance(sinks, torch.Tensor) and sinks.device != self.q.device:
                _raise(InvalidArgumentError, "sinks.device", sinks.device, f"the query is on {self.q.device}: the "
                       "sink logits must be on the query's device (attend moves nothing between devices)")
            given = self.spec.get("softmax_type")
            if given not in (None, "learnable"):
                _raise(InvalidArgumentError, "softmax_type", given, "sinks= gives learnable sink logits: "
                       "pass softmax_type='learnable' or no softmax_type")
            self.sinks = sinks_for(sinks, self.q)
            self.spec = dict(self.spec, softmax_type="learnable")
        return self

    def run(self, training=None):
        """(output in the caller's convention, LSE)."""
        out, lse = run(self.spec, self.q, self.k, self.v, self.bias, self.slopes, self.cu_q, self.cu_kv,
                       training=training, sinks=self.sinks)
        return self.restore(out), lse

    def explain(self, mode=None, training=None):
        return evaluate(self.spec, self.tensors(), mode, training)


def evaluate(spec, tensors, mode=None, training=None):
    """The Explanation a call with these tensors would get (mode derived as run() does)."""
    from .policy import Explanation
    table, js = _C.evaluate(spec, mode or mode_for(tensors, training))
    return Explanation(table, js)
