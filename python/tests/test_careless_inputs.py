"""What a careless caller can do wrong (issue 36): packed batches with trailing
padding, KV-cache appends that do not fit, index tensors outside int32, zero
queries, malformed arguments. Each must give a defined result or an attend
error naming the field, and a refused call must change nothing."""

import math

import numpy as np
import pytest
import torch

import attend
import attend.torch as at
from attend.errors import AttendError, InvalidArgumentError, ShapeMismatchError
from conftest import math_attention, randn


def _fill_allocator_with_nans():
    """Freed blocks full of NaN, so that an output nobody writes reads as NaN
    (the allocator hands the same memory out again)."""
    for n in (1 << 8, 1 << 12, 1 << 16):
        blocks = [torch.full((n,), float("nan")) for _ in range(8)]
        del blocks


def _error(fn, cls, field):
    with pytest.raises(cls) as e:
        fn()
    assert e.value.field == field, (e.value.field, str(e.value))
    return e.value


# --- row 1: rows of a packed batch outside every sequence ------------------------------

H, D = 2, 16


def _packed_step(x, cu, max_len):
    """One training step through a Linear into varlen attention: the weight
    gradient, and the attention output of the rows the sequences cover."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 3 * H * D)
    q, k, v = proj(x).view(x.shape[0], 3, H, D).unbind(1)
    _fill_allocator_with_nans()
    out = at.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)
    real = int(cu[-1])
    out[:real].sum().backward()
    return out, proj.weight.grad


def test_padded_batch_training_step_equals_the_unpadded_one_bit_for_bit():
    torch.manual_seed(1)
    x = torch.randn(10, 8)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out_pad, w_pad = _packed_step(x, cu, 5)
    out_real, w_real = _packed_step(x[:8], cu, 5)
    assert torch.equal(out_pad[:8], out_real)
    assert torch.equal(out_pad[8:], torch.zeros(2, H, D))  # defined: 0, never the allocator's NaN
    # The padding rows' gradients are exact zeros, so the weight gradient sums
    # the same terms plus zeros: equal to the unpadded one (and finite).
    assert torch.isfinite(w_pad).all()
    assert torch.equal(w_pad, w_real)


def test_padding_rows_get_zero_gradients_and_minus_inf_lse():
    q, k, v = (randn(7, H, D, seed=s).requires_grad_(True) for s in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    _fill_allocator_with_nans()
    out, lse, _ = at.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, return_attn_probs=True)
    assert torch.equal(out[5:], torch.zeros(2, H, D))
    assert torch.isneginf(lse[:, 5:]).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad[5:], torch.zeros(2, H, D))
        assert torch.isfinite(t.grad).all()


# --- row 3: flash_attn_with_kvcache validates before it writes --------------------------

def _cache(b=2, s=8, hk=2, d=16, dtype=torch.float32):
    return randn(b, s, hk, d, seed=20).to(dtype), randn(b, s, hk, d, seed=21).to(dtype)


def _bits(t):
    return t.clone().view(torch.int32 if t.element_size() == 4 else torch.int16)


def _refused_leaves_cache(call, cls, field, kc, vc):
    before = (_bits(kc), _bits(vc))
    e = _error(call, cls, field)
    assert torch.equal(_bits(kc), before[0]) and torch.equal(_bits(vc), before[1])
    return e


def test_kvcache_refused_call_leaves_the_cache_bit_for_bit_unchanged():
    kc, vc = _cache()
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    q24 = randn(2, 1, 4, 24, seed=3)  # head dim 24 against a cache of 16
    _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q24, kc, vc, k=k, v=v, cache_seqlens=3),
                          ShapeMismatchError, "k_cache.shape[3]", kc, vc)
    q = randn(2, 1, 4, 16, seed=4)
    # Appending past the capacity (8 tokens per sequence).
    _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=8),
                          InvalidArgumentError, "cache_seqlens[0]", kc, vc)


@pytest.mark.parametrize("what,field,cls", [
    ("batch", "k.shape[0]", ShapeMismatchError),
    ("heads", "k.shape[2]", ShapeMismatchError),
    ("head_dim", "k.shape[3]", ShapeMismatchError),
    ("dtype", "k.dtype", InvalidArgumentError),
    ("int_dtype", "k.dtype", InvalidArgumentError),
    ("v_len", "v.shape[1]", ShapeMismatchError),
])
def test_kvcache_appends_of_another_shape_or_dtype_are_refused_by_name(what, field, cls):
    kc, vc = _cache()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    k = {"batch": k[:1], "heads": k[:, :, :1], "head_dim": k[..., :8], "dtype": k.double(),
         "int_dtype": k.long()}.get(what, k)
    v = randn(2, 2, 2, 16, seed=2) if what == "v_len" else v
    _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=3), cls, field,
                          kc, vc)


def test_kvcache_bad_index_inputs_are_attend_errors_naming_the_field():
    kc, vc = _cache()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    run = at.flash_attn_with_kvcache
    _refused_leaves_cache(lambda: run(q, kc, vc, k=k.numpy(), v=v, cache_seqlens=3), InvalidArgumentError, "k",
                          kc, vc)
    _refused_leaves_cache(lambda: run(q, kc, vc, k=k, v=v, cache_seqlens=torch.tensor([-1, 2], dtype=torch.int32)),
                          InvalidArgumentError, "cache_seqlens[0]", kc, vc)
    _refused_leaves_cache(lambda: run(q, kc, vc, k=k, v=v, cache_seqlens=-2), InvalidArgumentError,
                          "cache_seqlens[0]", kc, vc)
    _refused_leaves_cache(lambda: run(q, kc, vc, k=k, v=v, cache_seqlens=3,
                                      cache_batch_idx=torch.tensor([1], dtype=torch.int32)),
                          ShapeMismatchError, "cache_batch_idx.shape[0]", kc, vc)
    _refused_leaves_cache(lambda: run(q, kc, vc, k=k, v=v, cache_seqlens=3,
                                      cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)),
                          InvalidArgumentError, "cache_batch_idx[1]", kc, vc)
    _refused_leaves_cache(lambda: run(q, kc[:1], vc[:1], k=k, v=v, cache_seqlens=3), ShapeMismatchError,
                          "k_cache.shape[0]", kc, vc)


def test_kvcache_valid_append_writes_and_attends_like_the_math():
    kc, vc = _cache()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 2, 2, 16, seed=1), randn(2, 2, 2, 16, seed=2)
    lens = torch.tensor([3, 5], dtype=torch.int64)  # int64 in range: narrowed after the check
    out = at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=lens, causal=True)
    for b, n in enumerate((3, 5)):
        assert torch.equal(kc[b, n:n + 2], k[b]) and torch.equal(vc[b, n:n + 2], v[b])
        ref = math_attention(q[b:b + 1].transpose(1, 2), kc[b:b + 1, :n + 2].transpose(1, 2),
                             vc[b:b + 1, :n + 2].transpose(1, 2)).transpose(1, 2)
        assert (out[b:b + 1] - ref).abs().max().item() < 1e-5


# --- issue 41 row 4: appends that would overwrite one another -----------------------------

def test_kvcache_append_through_a_repeated_cache_batch_idx_is_refused_and_changes_nothing():
    kc, vc = _cache(b=3)
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    idx, lens = torch.tensor([1, 1], dtype=torch.int32), torch.tensor([2, 2], dtype=torch.int32)
    e = _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=lens,
                                                                 cache_batch_idx=idx),
                              InvalidArgumentError, "cache_batch_idx", kc, vc)
    assert e.value == "1" and "positions 0 and 1" in str(e), str(e)
    # Only reading one row twice is legitimate, and so is appending to distinct rows.
    out = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=idx)
    for b in range(2):
        ref = math_attention(q[b:b + 1].transpose(1, 2), kc[1:2, :2].transpose(1, 2),
                             vc[1:2, :2].transpose(1, 2)).transpose(1, 2)
        assert (out[b:b + 1] - ref).abs().max().item() < 1e-5
    at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=lens, cache_batch_idx=torch.tensor([2, 0]))
    assert torch.equal(kc[2, 2], k[0, 0]) and torch.equal(kc[0, 2], k[1, 0])


def _pages(n=4, page=2):
    return randn(n, page, 2, 16, seed=22), randn(n, page, 2, 16, seed=23)


def test_kvcache_paged_appends_to_one_page_slot_are_refused_naming_both_tokens():
    kc, vc = _pages()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    table = torch.tensor([[0, 1], [2, 1]], dtype=torch.int32)  # both third tokens: page 1 slot 0
    e = _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=2,
                                                                 block_table=table),
                              InvalidArgumentError, "block_table", kc, vc)
    assert e.value == "page 1 slot 0" and "sequence 0 token 2 and sequence 1 token 2" in str(e), str(e)


def test_kvcache_paged_append_into_another_sequences_prefix_is_refused():
    kc, vc = _pages()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    table = torch.tensor([[0, 1], [0, 2]], dtype=torch.int32)  # page 0: a prefix both read
    lens = torch.tensor([1, 3], dtype=torch.int32)  # sequence 0's token 1 would land in sequence 1's prefix
    e = _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=lens,
                                                                 block_table=table),
                              InvalidArgumentError, "block_table", kc, vc)
    assert e.value == "page 0 slot 1", str(e)


def test_kvcache_paged_append_after_a_shared_prefix_writes_each_sequences_own_page():
    kc, vc = _pages()
    prefix_k, prefix_v = kc[0].clone(), vc[0].clone()
    q = randn(2, 1, 4, 16, seed=4)
    k, v = randn(2, 1, 2, 16, seed=1), randn(2, 1, 2, 16, seed=2)
    table = torch.tensor([[0, 1], [0, 2]], dtype=torch.int32)
    out = at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=2, block_table=table)
    assert torch.equal(kc[0], prefix_k) and torch.equal(vc[0], prefix_v)
    assert torch.equal(kc[1, 0], k[0, 0]) and torch.equal(kc[2, 0], k[1, 0])
    for b in range(2):
        keys = torch.cat([kc[0], kc[table[b, 1], :1]]).unsqueeze(0)
        vals = torch.cat([vc[0], vc[table[b, 1], :1]]).unsqueeze(0)
        ref = math_attention(q[b:b + 1].transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2)).transpose(1, 2)
        assert (out[b:b + 1] - ref).abs().max().item() < 1e-5


# --- row 4: index tensors outside int32 ---------------------------------------------------

BIG = 2 ** 32


def test_int64_cu_seqlens_outside_int32_are_refused_not_wrapped():
    q = randn(13, 2, 16, seed=0)
    cu = torch.tensor([0, 3, BIG + 10], dtype=torch.int64)
    e = _error(lambda: at.flash_attn_varlen_func(q, q, q, cu, cu, 10, 10), InvalidArgumentError, "cu_seqlens_q[2]")
    assert str(BIG + 10) in str(e)
    ok = torch.tensor([0, 3, 10], dtype=torch.int64)
    assert torch.equal(at.flash_attn_varlen_func(q, q, q, ok, ok, 7, 7),
                       at.flash_attn_varlen_func(q, q, q, ok.int(), ok.int(), 7, 7))


def test_int64_cu_seqlens_of_the_module_are_range_checked():
    m = at.DotProductAttention(2, 16, qkv_format="thd")
    q = randn(13, 2, 16, seed=0)
    cu = torch.tensor([0, 3, BIG + 10], dtype=torch.int64)
    _error(lambda: m(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu), InvalidArgumentError, "cu_seqlens_q[2]")


@pytest.mark.parametrize("name", ["block_table", "cache_seqlens", "cache_batch_idx", "cache_leftpad"])
def test_int64_kvcache_index_tensors_outside_int32_are_refused(name):
    kc, vc = _cache(b=4, s=8)
    q = randn(2, 1, 4, 16, seed=4)
    kw = dict(cache_seqlens=torch.tensor([3, 4]))
    if name == "block_table":
        kw["block_table"] = torch.tensor([[0], [BIG + 3]])
        field = "block_table[1]"
    elif name == "cache_seqlens":
        kw["cache_seqlens"] = torch.tensor([3, BIG + 1])
        field = "cache_seqlens[1]"
    elif name == "cache_batch_idx":
        kw["cache_batch_idx"] = torch.tensor([0, BIG + 1])
        field = "cache_batch_idx[1]"
    else:
        kw["cache_leftpad"] = torch.tensor([0, -BIG])
        field = "cache_leftpad[1]"
    _refused_leaves_cache(lambda: at.flash_attn_with_kvcache(q, kc, vc, k=randn(2, 1, 2, 16, seed=1),
                                                             v=randn(2, 1, 2, 16, seed=2), **kw),
                          InvalidArgumentError, field, kc, vc)


# --- row 6: zero queries -------------------------------------------------------------------

def test_zero_queries_backward_gives_empty_dq_and_zero_dk_dv():
    q = torch.randn(1, 0, 2, 32, requires_grad=True)
    k = torch.randn(1, 5, 2, 32, requires_grad=True)
    at.flash_attn_func(q, k, k).sum().backward()
    assert q.grad.shape == q.shape
    assert torch.equal(k.grad, torch.zeros_like(k))
    qs = torch.randn(1, 2, 0, 32, requires_grad=True)
    ks = torch.randn(1, 2, 5, 32, requires_grad=True)
    at.scaled_dot_product_attention(qs, ks, ks).sum().backward()
    assert torch.equal(ks.grad, torch.zeros_like(ks))


# --- row 7: malformed arguments are attend errors naming the field -----------------------

def test_window_size_that_is_not_a_pair_names_window_size():
    q = randn(1, 4, 2, 16, seed=0)
    for bad in ((1,), (1, 2, 3), "ab", 5):
        _error(lambda: at.flash_attn_func(q, q, q, window_size=bad), InvalidArgumentError, "window_size")


def test_softcap_none_means_no_softcap_and_a_string_names_softcap():
    q = randn(1, 4, 2, 16, seed=0)
    assert torch.equal(at.flash_attn_func(q, q, q, softcap=None), at.flash_attn_func(q, q, q, softcap=0.0))
    _error(lambda: at.flash_attn_func(q, q, q, softcap="big"), InvalidArgumentError, "softcap")


def test_dropout_mask_negative_sizes_name_the_size():
    _error(lambda: at.dropout_mask(1, 0.1, -1, 2, 3, 3), InvalidArgumentError, "batch")
    _error(lambda: at.dropout_mask(1, 0.1, 1, 2, -3, 3), InvalidArgumentError, "seqlen_q")
    assert at.dropout_mask(1, 0.1, 0, 2, 3, 3).shape == (0, 2, 3, 3)


def test_dropout_p_one_is_refused_with_the_native_message():
    q = randn(1, 4, 2, 16, seed=0)
    e = _error(lambda: at.flash_attn_func(q, q, q, dropout_p=1.0), InvalidArgumentError, "dropout_p")
    with pytest.raises(InvalidArgumentError) as native:
        attend.forward(q.numpy(), q.numpy(), q.numpy(), dropout_p=1.0, dropout_seed=1)
    assert "[0, 1)" in str(e) and "[0, 1)" in str(native.value)


def test_tune_cache_that_is_a_directory_is_an_error_naming_tune_cache(tmp_path):
    try:
        _error(lambda: attend.set_policy(select="autotune", tune_cache=str(tmp_path)), InvalidArgumentError,
               "tune_cache")
    finally:
        attend.reset_policy()


def test_kvcache_attend_refuses_fields_that_contradict_the_cache():
    cache = attend.KVCache(batch=2, heads_kv=2, head_dim_qk=16, max_seqlen=32, page_size=8)
    k = np.random.default_rng(0).standard_normal((2, 5, 2, 16)).astype(np.float32)
    cache.append(k, k)
    q = np.random.default_rng(1).standard_normal((2, 1, 4, 16)).astype(np.float32)
    for field, value in (("seqlen_kv", 99), ("heads_kv", 1), ("batch", 3)):
        _error(lambda: cache.attend(q, **{field: value}), InvalidArgumentError, field)
    out, _ = cache.attend(q, seqlen_kv=5, heads_kv=2)  # agreeing values are fine
    assert out.shape == (2, 1, 4, 16)


def test_max_seqlen_below_a_real_length_is_refused_in_training_as_in_inference():
    q = randn(8, 2, 16, seed=0)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(AttendError):
            at.flash_attn_varlen_func(q, q, q, cu, cu, 4, 5)
    qg = q.clone().requires_grad_(True)
    _error(lambda: at.flash_attn_varlen_func(qg, qg, qg, cu, cu, 4, 5), InvalidArgumentError, "max_seqlen_q")
    _error(lambda: at.flash_attn_varlen_func(qg, qg, qg, cu, cu, 5, 4), InvalidArgumentError, "max_seqlen_k")


# --- row 8: accuracy over very many keys (README, "Very long key sequences") -------------

@pytest.mark.parametrize("backend", ["flash", "decode"])
def test_identical_keys_accuracy_at_2_pow_20_keys_is_what_the_readme_says(backend):
    # Every key and value row the same (stride-0 views, no memory): the exact
    # output is the value row. The README's measured relative error at 2^20
    # keys is 1.1e-6 (flash) and 1.7e-6 (decode), with their two-level sums;
    # this holds them within 5e-6 (one accumulator gave 6.5e-5 and 7.5e-5).
    torch.manual_seed(0)
    d, n = 16, 1 << 20
    q, k1, v1 = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    with attend.policy(force=backend):
        out, lse = attend.forward(q, k1.expand(1, n, 1, d), v1.expand(1, n, 1, d))
    rel = (out.double() - v1.double()).abs().max().item() / v1.abs().max().item()
    assert rel <= 5e-6, rel
    exact_lse = (q.double() * k1.double()).sum().item() * d ** -0.5 + 20 * math.log(2)
    assert abs(lse.item() - exact_lse) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["flash", "decode"])
def test_long_rows_whose_max_keeps_rising_match_the_f64_math(backend, dtype):
    # 40,000 keys: flash folds its level-1 output and row sums into the
    # second level every 64 key blocks (4 folds), decode every 16 blocks of a
    # 640-key split (2 per split). The logits rise by ~16 along the keys, so
    # the running max moves after the folds and the level-2 sums must take the
    # rescale they were owed; missing it would weigh the early keys e^16 too
    # much. Reference: float64 math on the same (rounded) inputs.
    d, n, sq = 32, 40_000, 2 if backend == "flash" else 1
    q = randn(1, sq, 1, d, seed=1)
    u = q[0, 0, 0] / q[0, 0, 0].norm()
    ramp = torch.linspace(0.0, 16.0 * d ** 0.5 / q[0, 0, 0].norm().item(), n)
    k = randn(1, n, 1, d, seed=2) + ramp[None, :, None, None] * u
    v = randn(1, n, 1, d, seed=3)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with attend.policy(force=backend):
        out, lse = attend.forward(q, k, v)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * d ** -0.5
    ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.double())
    # Relative to the output's own size (~0.05: an average of 40,000 random
    # rows); measured 2e-6 (f32) and 2.3e-3 (bf16, the output's own rounding).
    rel = (out.double() - ref).abs().max().item() / ref.abs().max().item()
    assert rel <= (2e-5 if dtype == torch.float32 else 1e-2), rel
    ref_lse = torch.logsumexp(s, dim=-1)
    assert (lse.double() - ref_lse.reshape(lse.shape)).abs().max().item() <= 1e-4
