"""Every tensor argument of a torch entry point is on one device (issue 41):
a meta tensor among CPU ones used to send the call to the op's fake kernel,
which returned uninitialised CPU memory (and gradients), and CPU tensors among
meta ones a meta result. Mixed devices are an attend error naming the argument
and both devices; all-meta calls give meta results where the output follows
from shapes alone, and an error naming the tensor where values are read."""

import pytest
import torch

import attend
import attend.torch as at
from attend.errors import InvalidArgumentError, UnsupportedError
from attend.module import DotProductAttention
from conftest import randn

META = torch.device("meta")


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device=META, dtype=dtype)


def _mixed(fn, field, other):
    with pytest.raises(InvalidArgumentError) as e:
        fn()
    assert e.value.field == field, str(e.value)
    assert "meta" in str(e.value) and "cpu" in str(e.value) and other in str(e.value), str(e.value)


@pytest.mark.parametrize("grad", [False, True])
def test_flash_attn_func_refuses_meta_among_cpu_tensors(grad):
    q = randn(1, 4, 2, 8).requires_grad_(grad)
    m = meta(1, 4, 2, 8)
    _mixed(lambda: at.flash_attn_func(q, m, m), "k.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_func(m, q, q), "k.device", "q is on meta")
    _mixed(lambda: at.flash_attn_func(q, q, m), "v.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_func(q, q, q, alibi_slopes=meta(2)), "alibi_slopes.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_func(q, q, q, sinks=meta(2)), "sinks.device", "query is on cpu")
    _mixed(lambda: at.flash_attn_kvpacked_func(q, meta(1, 4, 2, 2, 8)), "k.device", "q is on cpu")


@pytest.mark.parametrize("grad", [False, True])
def test_sdpa_refuses_mixed_devices(grad):
    q = randn(1, 2, 4, 8).requires_grad_(grad)
    m = meta(1, 2, 4, 8)
    _mixed(lambda: at.scaled_dot_product_attention(q, m, m), "key.device", "query is on cpu")
    _mixed(lambda: at.scaled_dot_product_attention(m, q, q), "key.device", "query is on meta")
    _mixed(lambda: at.scaled_dot_product_attention(q, q, q, attn_mask=meta(4, 4)), "attn_mask.device",
           "query is on cpu")
    _mixed(lambda: at.scaled_dot_product_attention(q, q, q, sinks=meta(2)), "sinks.device", "query is on cpu")
    _mixed(lambda: at.explain(q, m, m), "key.device", "query is on cpu")


def test_varlen_refuses_mixed_devices():
    q = randn(6, 2, 8)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    _mixed(lambda: at.flash_attn_varlen_func(q, meta(6, 2, 8), q, cu, cu, 4, 4), "k.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_varlen_func(q, q, q, cu.to(META), cu, 4, 4), "cu_seqlens_q.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_varlen_func(q, q, q, cu, cu.to(META), 4, 4), "cu_seqlens_k.device", "q is on cpu")


def test_kvcache_refuses_mixed_devices_and_meta():
    q, cache = randn(1, 1, 2, 8), torch.zeros(1, 8, 2, 8)
    _mixed(lambda: at.flash_attn_with_kvcache(q, meta(1, 8, 2, 8), cache), "k_cache.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=torch.tensor([3], device=META)),
           "cache_seqlens.device", "q is on cpu")
    _mixed(lambda: at.flash_attn_with_kvcache(q, cache, cache, k=meta(1, 1, 2, 8), v=meta(1, 1, 2, 8),
                                              cache_seqlens=3), "k.device", "q is on cpu")
    assert not cache.any()  # a refused call wrote nothing
    with pytest.raises(UnsupportedError) as e:
        at.flash_attn_with_kvcache(meta(1, 1, 2, 8), meta(1, 8, 2, 8), meta(1, 8, 2, 8))
    assert e.value.field == "q.device" and "meta" in str(e.value)


def test_module_refuses_mixed_devices():
    m = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask")
    q = randn(1, 4, 2, 8)
    _mixed(lambda: m(q, meta(1, 4, 2, 8), q), "key_layer.device", "query_layer is on cpu")
    _mixed(lambda: m(q, q, q, core_attention_bias_type="post_scale_bias", core_attention_bias=meta(1, 2, 4, 4)),
           "core_attention_bias.device", "query_layer is on cpu")
    sinks = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask", softmax_type="learnable").to(META)
    _mixed(lambda: sinks(q, q, q), "softmax_offset.device", "query_layer is on cpu")


def test_all_meta_calls_give_meta_results_where_shapes_decide():
    if not at.HAS_TORCH_LIBRARY_OPS:
        pytest.skip("meta tensors meet the torch.library op's fake kernel (torch >= 2.4)")
    q = meta(1, 4, 2, 8).requires_grad_(True)
    out = at.flash_attn_func(q, q, q, causal=True)
    assert out.device == META and out.shape == (1, 4, 2, 8)
    out.sum().backward()
    assert q.grad.device == META and q.grad.shape == q.shape
    out = at.scaled_dot_product_attention(meta(1, 2, 4, 8), meta(1, 2, 4, 8), meta(1, 2, 4, 8), is_causal=True)
    assert out.device == META and out.shape == (1, 2, 4, 8)
    cu = torch.tensor([0, 2, 6], device=META)  # int64: its range is not checked (no values)
    out = at.flash_attn_varlen_func(meta(6, 2, 8), meta(6, 2, 8), meta(6, 2, 8), cu, cu, 4, 4)
    assert out.device == META and out.shape == (6, 2, 8)
    module = DotProductAttention(4, 8, qkv_format="bshd", attn_mask_type="causal").to(META)
    out = module(meta(1, 4, 4, 8), meta(1, 6, 4, 8), meta(1, 6, 4, 8), core_attention_bias_type="alibi")
    assert out.device == META and out.shape == (1, 4, 32)  # its default ALiBi table on q's device


def test_module_thd_reading_cu_seqlens_refuses_meta():
    module = DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=META)
    with pytest.raises(UnsupportedError) as e:
        module(meta(6, 2, 8), meta(6, 2, 8), meta(6, 2, 8), cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert e.value.field == "cu_seqlens_q.device"


def test_transformers_entry_names_its_arguments():
    pytest.importorskip("transformers")
    from attend.integrations import transformers as tr
    q = randn(1, 2, 4, 8)
    with pytest.raises(InvalidArgumentError) as e:
        tr.attention_forward(torch.nn.Module(), q, meta(1, 2, 4, 8), q, None)
    assert e.value.field == "key.device"
