"""DotProductAttention: a TransformerEngine-style attention module on attend.

Follows transformer_engine.pytorch.DotProductAttention's constructor and
forward arguments for the features attend has: qkv_format 'sbhd' | 'bshd' |
'thd', GQA (num_gqa_groups), different qk/v head dims (kv_channels=(qk, v)),
attn_mask_type ('no_mask', 'causal', 'causal_bottom_right', 'padding',
'padding_causal', 'padding_causal_bottom_right', 'arbitrary'; TE masks are
True where a position is *excluded*), sliding windows, post-scale bias, ALiBi
attention dropout and attention sinks (softmax_type 'vanilla', 'off-by-one' or
'learnable'; learnable sink logits are the module's ``softmax_offset``
parameter, (H) float32, zero-initialised, as in TE). The output has the heads merged, as in TE:
(sq, b, h*dv) for sbhd, (b, sq, h*dv) for bshd, (t, h*dv) for thd.

``module.training`` and ``torch.is_grad_enabled()`` decide the mode: a module in
training mode (with grad on) selects a backend with forward *and* backward;
outside training it selects for inference unless an input requires grad (a
backward may still follow). Dropout applies only in training mode.
"""

import math

import torch

from . import _autograd, _masks
from .errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError, _raise
from ._torch_inputs import autocast as _autocast, no_meta as _no_meta, one_device as _one_device
from ._index import int32_index

_MASK_TYPES = ("no_mask", "causal", "causal_bottom_right", "padding", "padding_causal",
               "padding_causal_bottom_right", "arbitrary")


def alibi_slopes_for(heads, device=None):
    """The standard ALiBi slopes (Press et al.): 2^(-8i/H) for i = 1..H, with the
    interleaved extension when H is not a power of two; on `device` (the CPU by default)."""
    def powers(n):
        start = 2 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    p = 2 ** math.floor(math.log2(heads))
    slopes = powers(p) if p == heads else powers(p) + powers(2 * p)[0::2][:heads - p]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


class DotProductAttention(torch.nn.Module):
    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                 qkv_format="sbhd", attn_mask_type="causal", window_size=None, softmax_scale=None,
                 deterministic=False, attention_type="self", layer_number=None, cp_group=None,
                 cp_strategy="auto", softmax_type="vanilla", **unsupported):
        super().__init__()
        # Context parallelism (attend.parallel): a torch.distributed group
        # sharing the sequence; inputs are this rank's rows in its layout.
        self.cp_group, self.cp_strategy = cp_group, cp_strategy
        if unsupported:
            # Parallelism and RNG-tracker options have no meaning on one CPU process.
            _raise(UnsupportedError, "DotProductAttention", ",".join(sorted(unsupported)),
                   "these TransformerEngine options are not supported by attend")
        self.num_attention_heads = int(num_attention_heads)
        self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v = (
            (int(kv_channels[0]), int(kv_channels[1])) if isinstance(kv_channels, (tuple, list))
            else (int(kv_channels), int(kv_channels)))
        self.num_gqa_groups = int(num_gqa_groups or num_attention_heads)
        if self.num_attention_heads % self.num_gqa_groups:
            _raise(InvalidArgumentError, "num_gqa_groups", self.num_gqa_groups,
                   f"must divide num_attention_heads={self.num_attention_heads}")
        self.attention_dropout = float(attention_dropout)
        if not 0.0 <= self.attention_dropout <= 1.0:
            _raise(InvalidArgumentError, "attention_dropout", attention_dropout,
                   "a dropout probability must lie in [0, 1]")
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.softmax_scale = softmax_scale if softmax_scale is not None else \
            1.0 / math.sqrt(self.hidden_size_per_attention_head_k)
        self.deterministic = bool(deterministic)
        self.attention_type = attention_type
        self.layer_number = layer_number
        # TE spells it 'off-by-one'; attend's spec field 'off_by_one'.
        self.softmax_type = str(softmax_type).replace("-", "_")
        if self.softmax_type not in ("vanilla", "off_by_one", "learnable"):
            _raise(InvalidArgumentError, "softmax_type", softmax_type, "expected 'vanilla', 'off-by-one' or 'learnable'")
        if self.softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(self.num_attention_heads, dtype=torch.float32))
        else:
            self.softmax_offset = None

    def extra_repr(self):
        return (f"heads={self.num_attention_heads}, gqa_groups={self.num_gqa_groups}, "
                f"kv_channels=({self.hidden_size_per_attention_head_k}, {self.hidden_size_per_attention_head_v}), "
                f"qkv_format={self.qkv_format}, attn_mask_type={self.attn_mask_type}, "
                f"dropout={self.attention_dropout}, softmax_type={self.softmax_type}")

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
                cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None,
                window_size=None, core_attention_bias_type="no_bias", core_attention_bias=None, alibi_slopes=None):
        problem = self._problem(query_layer, key_layer, value_layer, attention_mask, qkv_format, cu_seqlens_q,
                                cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size,
                                core_attention_bias_type, core_attention_bias, alibi_slopes)
        problem = problem.with_sinks(self.softmax_offset)
        if self.cp_group is not None:
            return self._run_cp(problem)
        return problem.run(training=self.training)[0]

    def set_context_parallel_group(self, cp_group, cp_strategy="auto"):
        """TransformerEngine's hook: later forwards split the sequence over cp_group (None: off)."""
        self.cp_group, self.cp_strategy = cp_group, cp_strategy

    def _run_cp(self, problem):
        from . import parallel
        s = problem.spec
        if s["layout"] not in ("bshd", "sbhd") or problem.bias is not None:
            _raise(UnsupportedError, "cp_group", "set", "context parallelism takes bshd/sbhd inputs without "
                   "masks or bias tensors (causal, windows and ALiBi are fine)")
        tensors = [problem.q, problem.k, problem.v]
        if s["layout"] == "sbhd":
            tensors = [t.transpose(0, 1) for t in tensors]
        out, _ = parallel.attention(*tensors, dict(s, layout="bshd"), self.cp_group, self.cp_strategy,
                                    problem.slopes, training=self.training, sinks=problem.sinks)
        if s["layout"] == "sbhd":
            out = out.transpose(0, 1)
        return problem.restore(out)

    def explain(self, query_layer, key_layer, value_layer, **kwargs):
        """The verdict table forward would get with these arguments (not run)."""
        problem = self._problem(query_layer, key_layer, value_layer, **kwargs).with_sinks(self.softmax_offset)
        return problem.explain(training=self.training)

    def _problem(self, q, k, v, attention_mask=None, qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                 max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                 core_attention_bias_type="no_bias", core_attention_bias=None, alibi_slopes=None):
        qm, km = attention_mask if isinstance(attention_mask, (tuple, list)) else (attention_mask, None)
        _one_device("DotProductAttention", query_layer=q, key_layer=k, value_layer=v, attention_mask=qm,
                    attention_mask_kv=km, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                    core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
                    softmax_offset=self.softmax_offset)
        q, k, v = _autocast(q, k, v)
        if core_attention_bias is not None:
            (core_attention_bias,) = _autocast(core_attention_bias)
        fmt = qkv_format or self.qkv_format
        mask_type = attn_mask_type or self.attn_mask_type
        if fmt not in ("sbhd", "bshd", "thd"):
            _raise(InvalidArgumentError, "qkv_format", fmt, "expected 'sbhd', 'bshd' or 'thd'")
        if mask_type not in _MASK_TYPES:
            _raise(InvalidArgumentError, "attn_mask_type", mask_type, f"expected one of {', '.join(_MASK_TYPES)}")
        dims = 3 if fmt == "thd" else 4
        for t, n, heads, dim in ((q, "query_layer", self.num_attention_heads, self.hidden_size_per_attention_head_k),
                                 (k, "key_layer", self.num_gqa_groups, self.hidden_size_per_attention_head_k),
                                 (v, "value_layer", self.num_gqa_groups, self.hidden_size_per_attention_head_v)):
            if t.dim() != dims or t.shape[-2] != heads or t.shape[-1] != dim:
                _raise(ShapeMismatchError, f"{n}.shape", tuple(t.shape),
                       f"expected {fmt} with {heads} heads of size {dim}")

        causal = "causal" in mask_type
        top_left = causal and not mask_type.endswith("bottom_right")
        window = window_size if window_size is not None else self.window_size
        left, right = _masks.window_sides(window)
        if causal:
            right = 0
        slopes = None
        if core_attention_bias_type == "alibi":
            slopes = alibi_slopes if alibi_slopes is not None else alibi_slopes_for(self.num_attention_heads, q.device)
        elif core_attention_bias_type not in ("no_bias", "post_scale_bias"):
            _raise(UnsupportedError, "core_attention_bias_type", core_attention_bias_type,
                   "attend supports no_bias, post_scale_bias and alibi")
        dropout = self.attention_dropout if self.training else 0.0
        spec = dict(heads_q=self.num_attention_heads, heads_kv=self.num_gqa_groups,
                    head_dim_qk=self.hidden_size_per_attention_head_k,
                    head_dim_v=self.hidden_size_per_attention_head_v, dtype=_masks.dtype_name(q, "query_layer"),
                    layout=fmt, scale=self.softmax_scale, alibi=slopes is not None,
                    deterministic=self.deterministic)
        if self.softmax_type == "off_by_one":
            spec["softmax_type"] = "off_by_one"  # learnable: with_sinks() sets it with the parameter
        if dropout > 0.0:
            spec.update(dropout_p=dropout, dropout_seed=_autograd.draw_dropout_seed())

        if fmt == "thd":
            return self._thd(spec, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, mask_type,
                             top_left, causal, left, right, core_attention_bias_type, slopes)

        seq_dim = 1 if fmt == "bshd" else 0
        batch, sq, sk = q.shape[1 - seq_dim], q.shape[seq_dim], k.shape[seq_dim]
        keep = None  # bool (b|1, 1|h, sq, sk), True where a score takes part
        if mask_type.startswith("padding") and attention_mask is not None:
            qm, km = attention_mask if isinstance(attention_mask, (tuple, list)) else (attention_mask, attention_mask)
            keep = ~(qm.reshape(batch, 1, sq, 1) | km.reshape(batch, 1, 1, sk))
        elif mask_type == "arbitrary":
            if attention_mask is None:
                _raise(InvalidArgumentError, "attention_mask", None, "attn_mask_type='arbitrary' needs a mask")
            if attention_mask.dim() not in (2, 4):
                _raise(ShapeMismatchError, "attention_mask.dim", attention_mask.dim(),
                       "an arbitrary mask is (sq, skv) or (b|1, h|1, sq, skv), True = excluded")
            keep = ~torch.broadcast_to(attention_mask, tuple(attention_mask.shape[:-2]) + (sq, sk))
            keep = keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape))
        if top_left and sq != sk:
            aligned = _masks.top_left_window(sq, sk, left, right)
            if aligned is None:  # not expressible bottom-right: an explicit mask
                w = _masks.window_keep(sq, sk, left, right, top_left=True, device=q.device).view(1, 1, sq, sk)
                keep = w if keep is None else keep & w
                causal, left, right = False, -1, -1
            else:
                keys, left, right = aligned
                causal = right == 0 and left == -1
                if keys < sk:
                    sl = (slice(None),) * seq_dim + (slice(0, keys),)
                    k, v, sk = k[sl], v[sl], keys
                    keep = keep[..., :keys] if keep is not None else None
                    if core_attention_bias is not None:
                        core_attention_bias = core_attention_bias[..., :keys]
        bias = _masks.bias_from_keep(keep, q.dtype) if keep is not None else None
        if core_attention_bias_type == "post_scale_bias" and core_attention_bias is not None:
            bias = core_attention_bias if bias is None else bias + core_attention_bias
        spec.update(batch=batch, seqlen_q=sq, seqlen_kv=sk, causal=causal, window_left=left, window_right=right,
                    has_bias=bias is not None,
                    bias_requires_grad=bias is not None and bias.requires_grad and torch.is_grad_enabled())
        return _autograd.Problem(spec, q, k, v, bias, slopes, restore=lambda o: o.flatten(-2))

    def _thd(self, spec, q, k, v, cu_q, cu_kv, max_q, max_kv, mask_type, top_left, causal, left, right, bias_type,
             slopes):
        if cu_q is None or cu_kv is None:
            _raise(InvalidArgumentError, "cu_seqlens_q", None, "qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv")
        if mask_type == "arbitrary" or bias_type == "post_scale_bias":
            _raise(UnsupportedError, "attn_mask_type", mask_type, "thd supports padding/causal masks, not "
                   "arbitrary masks or post-scale bias")
        if top_left or max_q is None or max_kv is None:
            _no_meta("DotProductAttention", "reads cu_seqlens for a top-left causal mask or a missing max_seqlen",
                     cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
        cu_q, cu_kv = int32_index(cu_q, "cu_seqlens_q", 1), int32_index(cu_kv, "cu_seqlens_kv", 1)
        if top_left and not torch.equal(cu_q, cu_kv):
            _raise(UnsupportedError, "attn_mask_type", mask_type, "top-left causal masks over thd sequences with "
                   "different q/kv lengths; use 'padding_causal_bottom_right'")
        lens_q, lens_kv = cu_q[1:] - cu_q[:-1], cu_kv[1:] - cu_kv[:-1]
        spec.update(batch=cu_q.numel() - 1, total_q=q.shape[0], total_kv=k.shape[0],
                    seqlen_q=int(max_q) if max_q is not None else int(lens_q.max()),
                    seqlen_kv=int(max_kv) if max_kv is not None else int(lens_kv.max()),
                    causal=causal, window_left=left, window_right=right)
        return _autograd.Problem(spec, q, k, v, None, slopes, cu_q, cu_kv, restore=lambda o: o.flatten(-2))
