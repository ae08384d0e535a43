"""attend on any arrays (numpy, DLPack exporters, torch tensors without autograd).

Every function takes the attend::AttentionSpec fields as keywords by their C++
names (attend.spec_fields()); what the arrays show (sizes, dtype, has_bias,
alibi, paged K/V) is filled in from them, and a field given explicitly wins.
Outputs are new arrays of the inputs' library.
"""

from typing import Any, Dict, Optional, Sequence, Tuple

from . import _C, _arrays
from .errors import InvalidArgumentError, ShapeMismatchError, _raise

# A numpy array, a torch tensor, or any object exporting DLPack; results are
# arrays of the same library.
ArrayLike = Any

# Where batch, sequence and heads sit in a dense layout's 4 dims.
_DENSE = {"bshd": (0, 1, 2), "bhsd": (0, 2, 1), "sbhd": (1, 0, 2)}
_INPUTS = ("bias", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_kv", "block_table", "cache_seqlens", "cache_leftpad",
           "sinks", "k_scale", "v_scale")
_KV8 = ("i8", "fp8_e4m3", "fp8_e5m2")


def _dims(t, name, n):
    if len(t.shape) != n:
        _raise(ShapeMismatchError, f"{name}.dim", len(t.shape), f"expected {n} dimensions for this layout")
    return tuple(int(s) for s in t.shape)


def infer_spec(q, k, v, fields, tensors):
    """The spec fields the arrays show, overridden by `fields`."""
    layout = fields.get("layout", "bshd")
    s = dict(dtype=_arrays.dtype_name(q, "q"), layout=layout)
    if layout == "thd":
        tq, h, d = _dims(q, "q", 3)
        tk, hk, _ = _dims(k, "k", 3)
        s.update(total_q=tq, total_kv=tk, heads_q=h, heads_kv=hk, head_dim_qk=d, head_dim_v=int(v.shape[-1]))
        cq, ck = tensors.get("cu_seqlens_q"), tensors.get("cu_seqlens_kv")
        if cq is not None and ck is not None:
            cq, ck = _arrays.to_list(cq), _arrays.to_list(ck)
            s.update(batch=max(len(cq) - 1, 0),
                     seqlen_q=max([b - a for a, b in zip(cq, cq[1:])] + [0]),
                     seqlen_kv=max([b - a for a, b in zip(ck, ck[1:])] + [0]))
    elif layout in _DENSE:
        bi, si, hi = _DENSE[layout]
        qs = _dims(q, "q", 4)
        s.update(batch=qs[bi], seqlen_q=qs[si], heads_q=qs[hi], head_dim_qk=qs[3], head_dim_v=int(v.shape[-1]))
        if tensors.get("block_table") is not None:  # k, v: (pages, page_size, heads_kv, dim) pools
            ks = _dims(k, "k", 4)
            lens = _arrays.to_list(tensors["cache_seqlens"]) if tensors.get("cache_seqlens") is not None else []
            pads = _arrays.to_list(tensors["cache_leftpad"]) if tensors.get("cache_leftpad") is not None else []
            keys = [n - (pads[i] if i < len(pads) else 0) for i, n in enumerate(lens)]
            s.update(kv_page_size=ks[1], heads_kv=ks[2], seqlen_kv=max(keys + [1]),
                     kv_leftpad=tensors.get("cache_leftpad") is not None)
        else:
            ks = _dims(k, "k", 4)
            s.update(seqlen_kv=ks[si], heads_kv=ks[hi])
    else:
        _raise(InvalidArgumentError, "layout", layout, "expected bshd, bhsd, sbhd or thd")
    if tensors.get("bias") is not None:
        s["has_bias"] = True
    if tensors.get("alibi_slopes") is not None:
        s["alibi"] = True
    if tensors.get("sinks") is not None:
        s["softmax_type"] = "learnable"
    kv = _arrays.dtype_name(k, "k")
    if kv in _KV8:
        # 8-bit codes: q's dtype is the problem's. The scale layout is not
        # read off the shapes (thd's per_token and per_head scales are both
        # 2-D): kv_scale= says it.
        s["kv_dtype"] = kv
    s.update(fields)
    return s


def _split(kwargs):
    tensors = {n: _arrays.adopt(kwargs.pop(n)) for n in _INPUTS if n in kwargs}
    return tensors, kwargs


def _alloc(spec, role, like, zeros=False):
    shape, dtype = _C.expected(spec, role)
    return _arrays.empty(like, shape, dtype, zeros)


def forward(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, mode: str = "inference",
            **kwargs: Any) -> Tuple[Any, Any]:
    """Attention forward: returns (out, lse). ``q``, ``k``, ``v`` in the spec's
    layout (``layout=``, bshd by default); further inputs by keyword (bias,
    alibi_slopes, cu_seqlens_q/kv for thd, block_table/cache_seqlens/cache_leftpad
    for paged K/V pools, sinks (H) f32 learnable sink logits); any spec field by
    keyword, e.g. ``attend.forward(q, k, v, causal=True, out_dtype="f32", q_offset=128)``.
    Its backward (attend.backward) selects again under the policy then in force;
    ``backend=`` pins it, and attend.select() plans run both passes on one choice."""
    q, k, v = (_arrays.adopt(x) for x in (q, k, v))
    tensors, fields = _split(kwargs)
    spec = infer_spec(q, k, v, fields, tensors)
    descs, keep = _arrays.describe_all(dict(q=q, k=k, v=v, **tensors))
    out, lse = _alloc(spec, "out", q), _alloc(spec, "lse", q)
    _C.forward(spec, mode, descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0])
    del keep
    return out, lse


def _grads(spec, q, bias, zeros):
    roles = ("dq", "dk", "dv") + (("dsinks",) if spec.get("softmax_type") == "learnable" else ())
    grads = {r: _alloc(spec, r, q, zeros) for r in roles}
    if spec.get("bias_requires_grad"):
        grads["dbias"] = _arrays.empty(q, tuple(bias.shape), spec["dtype"], zeros)
    return grads


def backward(q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike, dout: ArrayLike,
             *, backend: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
    """Backward from forward's out and lse (no forward context needed): returns
    a dict with dq, dk, dv (dbias with bias_requires_grad=True, dsinks with
    sinks). Takes the same keywords as forward; dq_dtype="f32" gives an
    unrounded dq for bf16/f16. ``backend`` ("name" or "name:variant", e.g.
    forward's attend.torch.last_selection()) runs it there, forced, whatever the
    policy disables; without it the policy in force selects."""
    q, k, v = (_arrays.adopt(x) for x in (q, k, v))
    tensors, fields = _split(kwargs)
    spec = infer_spec(q, k, v, fields, tensors)
    grads = _grads(spec, q, tensors.get("bias"), bool(spec.get("accumulate_grads")))
    descs, keep = _arrays.describe_all(dict(q=q, k=k, v=v, **tensors))
    gd, gkeep = _arrays.describe_all(grads)
    _C.backward(spec, descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0],
                _arrays.describe(dout, "dout")[0], gd, backend or "")
    del keep, gkeep
    return grads


def merge(parts: Sequence[Tuple[ArrayLike, ArrayLike]], *, layout: str = "bshd", out_dtype: Optional[str] = None,
          **fields: Any) -> Tuple[Any, Any]:
    """Exact combination of partial results [(out, lse), ...] over disjoint key
    sets (split-KV, ring steps): returns (out, lse). out_dtype defaults to the
    parts' dtype."""
    if not parts:
        _raise(InvalidArgumentError, "parts", "[]", "need at least one (out, lse) part")
    parts = [(_arrays.adopt(o), _arrays.adopt(l)) for o, l in parts]
    o0 = parts[0][0]
    if layout == "thd":
        t, h, d = _dims(o0, "parts[0].out", 3)
        s = dict(layout="thd", total_q=t, heads_q=h, heads_kv=h, head_dim_v=d, seqlen_q=1,
                 batch=max(int(fields.pop("batch", 1)), 1))
    elif layout in _DENSE:
        bi, si, hi = _DENSE[layout]
        sh = _dims(o0, "parts[0].out", 4)
        s = dict(layout=layout, batch=sh[bi], seqlen_q=sh[si], heads_q=sh[hi], heads_kv=sh[hi], head_dim_v=sh[3])
    else:
        _raise(InvalidArgumentError, "layout", layout, "expected bshd, bhsd, sbhd or thd")
    s["dtype"] = _arrays.dtype_name(o0, "parts[0].out")
    s.update(fields)
    descs, keep = [], []
    for i, (o, l) in enumerate(parts):
        do, ko = _arrays.describe(o, f"parts[{i}].out")
        dl, kl = _arrays.describe(l, f"parts[{i}].lse")
        descs.append((do, dl))
        keep += [ko, kl]
    out = _arrays.empty(o0, tuple(o0.shape), out_dtype or s["dtype"])
    lse = _alloc(s, "lse", o0)
    _C.merge(s, descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0])
    return out, lse


class Plan:
    """A selection made once and run many times (attend::Plan): ``attend.select(
    mode, **spec_fields)``. ``backend``, ``variant``, ``explain()``; ``forward``
    and ``backward`` take arrays as attend.forward/backward do, without selecting."""

    def __init__(self, mode: str = "inference", **fields: Any) -> None:
        self.spec = _C.spec_from_fields(fields)
        self._plan = _C.Plan(self.spec, mode)

    backend = property(lambda self: self._plan.backend)
    variant = property(lambda self: self._plan.variant)
    mode = property(lambda self: self._plan.mode)

    def explain(self) -> str:
        return self._plan.explain()

    def workspace_bytes(self, pass_: str = "forward") -> int:
        return self._plan.workspace_bytes(pass_)

    def forward(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, **tensors: ArrayLike) -> Tuple[Any, Any]:
        descs, keep = _arrays.describe_all(dict(q=q, k=k, v=v, **tensors))
        out, lse = _alloc(self.spec, "out", q), _alloc(self.spec, "lse", q)
        self._plan.forward(descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0])
        return out, lse

    def backward(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike, dout: ArrayLike,
                 **tensors: ArrayLike) -> Dict[str, Any]:
        grads = _grads(self.spec, q, tensors.get("bias"), bool(self.spec.get("accumulate_grads")))
        descs, keep = _arrays.describe_all(dict(q=q, k=k, v=v, **tensors))
        gd, gkeep = _arrays.describe_all(grads)
        self._plan.backward(descs, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0],
                            _arrays.describe(dout, "dout")[0], gd)
        return grads

    def __repr__(self):
        return f"<attend.Plan backend={self.backend!r} variant={self.variant!r} mode={self.mode!r}>"


def select(mode: str = "inference", **fields: Any) -> "Plan":
    """The Plan for a problem described by spec fields; raises UnsupportedError
    (with the verdict table) when nothing fits. attend.explain() never raises."""
    return Plan(mode, **fields)


class KVCache:
    """A paged KV cache owned by attend (attend::KVCache), for inference.

    Pages hold (page_size, heads_kv, head_dim) tokens in ``dtype``; appends and
    reads are bounds-checked (a failed append changes nothing).

    ``kv_dtype`` ("i8", "fp8_e4m3", "fp8_e5m2") makes an 8-bit cache: appends
    take K/V in ``dtype`` and store codes, element = code * scale, with f32
    scales laid out as ``kv_scale`` says ("per_token", i8's default: one per
    token and kv head, from the row's largest |x|; "per_head", fp8's default:
    one per sequence and kv head; "per_tensor"). per_head and per_tensor
    scales are fixed by set_scales() or by the first non-zero append (twice
    its largest |x| over the code maximum; larger later values saturate).
    Appending inf or NaN to an 8-bit cache is refused by name."""

    def __init__(self, batch: int, heads_kv: int, head_dim_qk: int, max_seqlen: int, head_dim_v: Optional[int] = None,
                 page_size: int = 64, num_pages: int = 0, dtype: str = "f32", kv_dtype: Optional[str] = None,
                 kv_scale: Optional[str] = None) -> None:
        self._c = _C.KVCache(batch, heads_kv, head_dim_qk, head_dim_v or head_dim_qk, max_seqlen, page_size,
                             num_pages, dtype, kv_dtype, kv_scale)

    batch = property(lambda self: self._c.batch)
    page_size = property(lambda self: self._c.page_size)
    capacity = property(lambda self: self._c.capacity)
    free_pages = property(lambda self: self._c.free_pages)
    dtype = property(lambda self: self._c.dtype)
    kv_dtype = property(lambda self: self._c.kv_dtype, doc="The pages' dtype: dtype, or the 8-bit kv_dtype")
    kv_scale = property(lambda self: self._c.kv_scale, doc="The scale layout of an 8-bit cache ('none' otherwise)")

    def set_scales(self, seq: int, k_scale: Sequence[float], v_scale: Sequence[float]) -> None:
        """Fixes an 8-bit cache's scales before values arrive: per_head,
        heads_kv floats each for the empty sequence ``seq``; per_tensor, one
        each while every sequence is empty. Finite and > 0."""
        self._c.set_scales(seq, [float(x) for x in k_scale], [float(x) for x in v_scale])

    def k_scales(self) -> Any:
        """A copy of an 8-bit cache's K scales as a float32 numpy array
        (per_token (num_pages, page_size, heads_kv), per_head (batch, heads_kv),
        per_tensor (1,)); None for a cache without scales."""
        return _scales(self._c.k_scales())

    def v_scales(self) -> Any:
        """As k_scales, for V."""
        return _scales(self._c.v_scales())

    def length(self, seq: int) -> int:
        return self._c.length(seq)

    def leftpad(self, seq: int) -> int:
        return self._c.leftpad(seq)

    def set_leftpad(self, seq: int, tokens: int) -> None:
        self._c.set_leftpad(seq, tokens)

    def reset(self, seq: int) -> None:
        self._c.reset(seq)

    def append(self, k: ArrayLike, v: ArrayLike, counts: Optional[Sequence[int]] = None,
               seq: Optional[int] = None) -> None:
        """k (B, S_new, heads_kv, dqk), v likewise: appends counts[b] (default all)
        tokens to each sequence; with ``seq``, k (n, heads_kv, dqk) to that one."""
        (dk, kk), (dv, kv) = _arrays.describe(k, "k"), _arrays.describe(v, "v")
        if seq is not None:
            self._c.append_seq(seq, dk, dv)
        else:
            self._c.append(dk, dv, list(counts or []))

    def attend(self, q: ArrayLike, alibi_slopes: Optional[ArrayLike] = None, **fields: Any) -> Tuple[Any, Any]:
        """Attention of q (B, Sq, H, dqk; ``layout=`` bshd/bhsd/sbhd) over the
        cache: (out, lse). Masks align bottom-right to each sequence's keys."""
        q = _arrays.adopt(q)
        dq, kq = _arrays.describe(q, "q")
        ds, ks = _arrays.describe(alibi_slopes, "alibi_slopes")
        spec = self._c.problem_spec(dq, fields, ds)
        _no_contradiction(fields, spec)
        out, lse = _alloc(spec, "out", q), _alloc(spec, "lse", q)
        self._c.forward(dq, fields, ds, _arrays.describe(out, "out")[0], _arrays.describe(lse, "lse")[0])
        return out, lse


def _scales(raw):
    if raw is None:
        return None
    import numpy as np
    shape, values = raw
    return np.asarray(values, dtype=np.float32).reshape(shape)


# What q and the cache decide in KVCache.attend; a keyword naming one of them
# must agree, or the caller believes in a problem that is not the one run.
_CACHE_DECIDES = ("batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "dtype",
                  "kv_page_size", "kv_leftpad", "total_q", "total_kv", "kv_dtype", "kv_scale")


def _no_contradiction(fields, spec):
    for name in _CACHE_DECIDES:
        if name in fields:
            given = _C.spec_from_fields({name: fields[name]})[name]
            if given != spec[name]:
                _raise(InvalidArgumentError, name, fields[name],
                       f"the cache and q decide it: this call has {name}={spec[name]}")
