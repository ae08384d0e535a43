"""Selection through the binding: modes, explain(), policy, and errors as Python exceptions."""

import json

import pytest
import torch

import attend
import attend.torch as at
from attend.torch import scaled_dot_product_attention as sdpa
from conftest import randn


def tensors(d=16, dv=16, sq=24, sk=24, dtype=torch.float32):
    return randn(1, 2, sq, d, dtype=dtype), randn(1, 2, sk, d, seed=1, dtype=dtype), \
        randn(1, 2, sk, dv, seed=2, dtype=dtype)


def test_explain_shows_training_when_grad_is_needed_and_inference_otherwise():
    q, k, v = tensors()
    e = at.explain(q, k, v)
    assert e.mode == "inference" and all(b["backward"] is None for b in e.data["backends"])
    q.requires_grad_()
    e = at.explain(q, k, v, is_causal=True)
    assert e.mode == "training" and e.verdicts["flash"]["backward"]["supported"]
    assert "mode:    training (needs forward + backward)" in str(e)
    with torch.no_grad():
        assert at.explain(q, k, v).mode == "inference"
    assert at.explain(q, k, v, mode="inference").mode == "inference"
    sdpa(q, k, v)
    assert at.last_selection().mode == "training" and at.last_selection().selected == e.selected


def test_explain_other_apis_and_the_spec_level_form():
    q, k, v = (t.transpose(1, 2) for t in tensors())
    e = at.explain(q, k, v, api="flash_attn", causal=True, mode="training")
    assert e.selected == "flash" and "bshd causal" in e.data["problem"]
    e = attend.explain(batch=2, seqlen_q=64, seqlen_kv=64, heads_q=4, heads_kv=4, head_dim_qk=192, head_dim_v=128,
                       mode="training")
    assert e.selected == "flash"
    assert json.loads(json.dumps(e.data))["backends"]
    with pytest.raises(attend.InvalidArgumentError, match="head_dim_gq"):
        attend.explain(head_dim_gq=3)


def test_unsupported_dtype_raises_with_a_dtype_reason_not_an_upcast():
    # bf16/f16 are computed (test_half_precision.py); int tensors are not attention inputs.
    q, k, v = (t.to(torch.int16) for t in tensors())
    with pytest.raises(attend.InvalidArgumentError) as e:
        sdpa(q, k, v)
    assert "dtype" in str(e.value)


def test_bf16_and_f16_are_selected_without_upcast_and_keep_their_dtype():
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = tensors(dtype=dtype)
        out = sdpa(q, k, v)
        assert out.dtype == dtype
        e = at.explain(q, k, v)
        assert e.selected is not None and f" {'bf16' if dtype == torch.bfloat16 else 'f16'} " in e.data["problem"]


def test_policy_force_and_disable_mirror_the_environment(restore_policy):
    q, k, v = tensors()
    attend.set_policy(force="reference")
    assert attend.get_policy()["force"] == "reference"
    out_ref = sdpa(q, k, v)
    assert at.last_selection().selected == "reference"
    attend.set_policy(disable="reference,decode")
    out_flash = sdpa(q, k, v)
    assert at.last_selection().selected == "flash"
    torch.testing.assert_close(out_flash, out_ref, rtol=1e-5, atol=1e-5)
    with attend.policy(force="reference"):
        sdpa(q, k, v)
        assert at.last_selection().selected == "reference"
    assert attend.get_policy()["disable"] == ["reference", "decode"]
    with pytest.raises(attend.InvalidArgumentError, match="no registered backend"):
        attend.set_policy(force="flsh")
    attend.reset_policy()
    assert attend.get_policy()["force"] is None


def test_forced_backend_that_cannot_train_raises_with_its_reasons(restore_policy):
    q, k, v = tensors(d=640)
    q.requires_grad_()
    attend.set_policy(force="flash")
    with pytest.raises(attend.UnsupportedError) as e:
        sdpa(q, k, v)
    assert "head_dim_qk=640" in str(e.value) and e.value.field == "force"
    attend.set_policy()
    out = sdpa(q, k, v)  # falls back to reference, and says why flash was rejected
    assert at.last_selection().selected == "reference"
    assert ("forward", "head_dim_qk") in {(p, c) for p, c, _ in at.last_selection().reasons("flash")}
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_errors_are_exceptions_not_crashes():
    q, k, v = tensors()
    with pytest.raises(attend.InvalidArgumentError, match="int64"):
        sdpa(q.long(), k.long(), v.long())
    with pytest.raises(attend.ShapeMismatchError):
        at.flash_attn_func(q, k[:, :1], v)  # 2 query heads vs a kv head count that does not divide
    with pytest.raises(attend.InvalidArgumentError):
        at.flash_attn_func(q, k, v, dropout_p=1.5)
    with pytest.raises(attend.InvalidArgumentError, match="v.dtype"):
        at.flash_attn_func(q, k, v.double())
    assert issubclass(attend.ShapeMismatchError, ValueError)
    assert issubclass(attend.UnsupportedError, attend.AttendError)


def test_empty_batch_and_empty_keys():
    q, k, v = randn(0, 2, 5, 8), randn(0, 2, 5, 8), randn(0, 2, 5, 4)
    assert sdpa(q, k, v).shape == (0, 2, 5, 4)
    q, k, v = randn(1, 2, 5, 8), randn(1, 2, 0, 8), randn(1, 2, 0, 4)
    assert torch.all(sdpa(q, k, v) == 0)
