"""attend::AttentionSpec fields from Python: the C++ table drives the keywords."""

import pytest
import torch

import attend
from attend.torch import flash_attn_func, scaled_dot_product_attention as sdpa
from conftest import math_attention, randn

# A value other than the default for each kind; fields whose valid values depend
# on others get theirs here (f32 dq/out needs a bf16 problem).
SAMPLES = {"int": 3, "uint": 7, "real": 0.25, "layout": "bhsd", "softmax_type": "off_by_one", "kv_scale": "per_head"}
SPECIAL = {"dtype": ("f64", {}), "dq_dtype": ("f32", {"dtype": "bf16"}), "out_dtype": ("f32", {"dtype": "bf16"}),
           "kv_dtype": ("i8", {"dtype": "bf16"}), "kv_scale": ("per_token", {"kv_dtype": "fp8_e4m3"})}


def test_every_table_field_is_a_keyword_of_the_spec_builder():
    fields = attend.spec_fields()
    assert [f.name for f in fields][:3] == ["batch", "seqlen_q", "seqlen_kv"]
    defaults = attend.spec()
    assert list(defaults) == [f.name for f in fields]
    for f in fields:
        assert f.help and defaults[f.name] == f.default, f.name
        value, extra = SPECIAL.get(f.name, (not f.default if f.kind == "bool" else SAMPLES.get(f.kind), {}))
        built = attend.spec(**extra, **{f.name: value})
        assert built[f.name] == value and built[f.name] != f.default, f.name
    # The fields the old hand-written binding lacked reach describe() and selection.
    e = attend.explain(mode="inference", dtype="bf16", seqlen_q=4, seqlen_kv=8, out_dtype="f32", q_offset=2,
                       kv_offset=1, dq_dtype="f32")
    assert "out=f32" in e.data["problem"]


def test_unknown_or_malformed_fields_are_errors_naming_them():
    with pytest.raises(attend.InvalidArgumentError, match="seqlen_qq") as e:
        attend.spec(seqlen_qq=3)
    assert e.value.field == "seqlen_qq"
    with pytest.raises(attend.InvalidArgumentError, match="dtype") as e:
        attend.spec(out_dtype="f31")
    with pytest.raises(attend.InvalidArgumentError) as e:
        attend.spec(batch="many")
    assert e.value.field == "batch"
    with pytest.raises(attend.InvalidArgumentError) as e:
        attend.spec(causal=None)
    assert e.value.field == "causal"
    q, k, v = randn(1, 8, 2, 16), randn(1, 8, 2, 16, seed=1), randn(1, 8, 2, 16, seed=2)
    with pytest.raises(attend.InvalidArgumentError, match="q_ofset"):
        flash_attn_func(q, k, v, q_ofset=1)
    with pytest.raises(attend.InvalidArgumentError, match="batch=4"):  # the tensors decide it
        flash_attn_func(q, k, v, batch=4)
    with pytest.raises(attend.InvalidArgumentError, match="bogus"):
        sdpa(q[:0], k[:0], v[:0], bogus=1)


def test_a_seed_takes_every_uint64_and_one_past_it_is_named_out_of_range():
    assert attend.spec(dropout_seed=2 ** 64 - 1)["dropout_seed"] == 2 ** 64 - 1
    with pytest.raises(attend.InvalidArgumentError, match="does not fit in uint64") as e:
        attend.spec(dropout_seed=2 ** 64)
    assert e.value.field == "dropout_seed" and e.value.value == str(2 ** 64)
    with pytest.raises(attend.InvalidArgumentError, match="non-negative") as e:
        attend.spec(dropout_seed=-1)
    assert e.value.field == "dropout_seed"
    with pytest.raises(attend.InvalidArgumentError, match="does not fit in int64") as e:
        attend.spec(batch=2 ** 63)
    assert e.value.field == "batch"


def shifted_causal_bias(sq, sk, q_offset, kv_offset):
    """attend's causal mask of a partial problem: key j is kept for row i when
    kv_offset + j <= q_offset + i + sk - sq (bottom-right aligned, global positions)."""
    i = torch.arange(sq).unsqueeze(1) + q_offset + sk - sq
    j = torch.arange(sk).unsqueeze(0) + kv_offset
    return torch.zeros(sq, sk).masked_fill(j > i, float("-inf"))


@pytest.mark.parametrize("q_offset,kv_offset", [(0, 0), (5, 0), (0, 6), (9, 4)])
def test_offsets_shift_the_causal_mask_as_in_cpp(q_offset, kv_offset):
    sq, sk = 12, 20
    q, k, v = randn(2, sq, 2, 16, seed=3), randn(2, sk, 2, 16, seed=4), randn(2, sk, 2, 16, seed=5)
    got = flash_attn_func(q, k, v, causal=True, q_offset=q_offset, kv_offset=kv_offset)
    bias = shifted_causal_bias(sq, sk, q_offset, kv_offset)
    want = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=bias).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if q_offset == kv_offset == 0:
        assert torch.equal(got, flash_attn_func(q, k, v, causal=True))


def test_key_chunks_with_offsets_merge_by_lse_into_the_whole_causal_problem():
    s, c = 24, 10
    q, k, v = randn(1, s, 2, 16, seed=6), randn(1, s, 2, 16, seed=7), randn(1, s, 2, 16, seed=8)
    whole, lse_whole, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    # Row i of the whole problem sits at position i. With keys [a, b) as a chunk
    # (kv_offset = a), bottom-right alignment puts row i at q_offset + i + (b - a) - s,
    # which is i for q_offset = s - b + a.
    parts = []
    for a, b in ((0, c), (c, s)):
        o, lse, _ = flash_attn_func(q, k[:, a:b], v[:, a:b], causal=True, return_attn_probs=True,
                                    q_offset=s - b + a, kv_offset=a)
        parts.append((o, lse))
    (o1, l1), (o2, l2) = parts
    lse = torch.logaddexp(l1, l2)  # (B, H, S); rows that see no key of a chunk have lse -inf there
    w1 = torch.exp(l1 - lse).transpose(1, 2).unsqueeze(-1)
    w2 = torch.exp(l2 - lse).transpose(1, 2).unsqueeze(-1)
    torch.testing.assert_close(w1 * o1 + w2 * o2, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_whole, rtol=1e-5, atol=1e-5)


def test_out_dtype_f32_keeps_a_bf16_partial_unrounded():
    q, k, v = (randn(1, 16, 2, 32, seed=s, dtype=torch.bfloat16) for s in (9, 10, 11))
    out = flash_attn_func(q, k, v, causal=True, out_dtype="f32")
    assert out.dtype == torch.float32
    rounded = flash_attn_func(q, k, v, causal=True)
    assert rounded.dtype == torch.bfloat16
    torch.testing.assert_close(out.to(torch.bfloat16), rounded, rtol=0, atol=1e-2)


def test_accumulate_grads_through_autograd_gives_the_plain_gradients():
    q, k, v = (randn(1, 16, 2, 16, seed=s).requires_grad_() for s in (12, 13, 14))
    flash_attn_func(q, k, v, causal=True, accumulate_grads=True).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    flash_attn_func(q, k, v, causal=True).sum().backward()
    for a, t in zip(got, (q, k, v)):
        torch.testing.assert_close(a, t.grad, rtol=0, atol=0)


def test_sdpa_passes_spec_fields_and_rejects_offsets_with_top_left_causal_of_unequal_lengths():
    q, k, v = randn(1, 2, 8, 16, seed=15), randn(1, 2, 12, 16, seed=16), randn(1, 2, 12, 16, seed=17)
    out = sdpa(q, k, v, q_offset=3, kv_offset=3)  # no mask: offsets change nothing
    torch.testing.assert_close(out, sdpa(q, k, v), rtol=0, atol=0)
    with pytest.raises(attend.UnsupportedError, match="q_offset"):
        sdpa(q, k, v, is_causal=True, q_offset=3)
    with pytest.raises(attend.InvalidArgumentError, match="causal"):
        sdpa(q, k, v, causal=True)
