"""Autotune from Python: set_policy/policy(select=..., tune_cache=...) are
checked at once, and the explanation shows the strategy and the measured times.
Every test uses a temporary cache file (never the user's)."""

import json

import pytest
import torch

import attend
import attend.torch as at
from conftest import randn


def test_autotune_times_plans_and_writes_the_given_cache(tmp_path, restore_policy):
    cache = tmp_path / "tune.json"
    q, k, v = (randn(1, 64, 2, 32, seed=s) for s in (1, 2, 3))
    with attend.policy(select="autotune", tune_cache=str(cache)):
        assert attend.get_policy()["select"] == "autotune"
        assert attend.get_policy()["tune_cache"] == str(cache)
        out = at.flash_attn_func(q, k, v, causal=True)
        e = at.last_selection()
    assert attend.get_policy()["select"] == "priority"  # restored on exit
    assert e.strategy == "autotune" and e.tuning
    times = e.seconds
    assert len(times) >= 2 and all(t > 0 for t in times.values())
    # The winner was timed; it need not be the minimum (a margin keeps
    # priority's pick against noise, docs/autotune.md).
    assert (e.selected, e.selected_variant) in times
    assert cache.exists() and json.loads(cache.read_text())
    # The tuned choice computes the same attention as the reference backend.
    with attend.policy(force="reference"):
        ref = at.flash_attn_func(q, k, v, causal=True)
    assert torch.allclose(out, ref, atol=1e-5)


def test_priority_explanation_has_no_times_and_lists_deferrals(restore_policy):
    e = attend.explain(batch=1, seqlen_q=1, seqlen_kv=64, heads_q=2, heads_kv=2, head_dim_qk=32, head_dim_v=32,
                       mode="inference")
    assert e.strategy == "priority" and e.seconds == {} and e.tuning is None
    assert all(isinstance(r, str) and r for r in e.deferred.values())
    assert all("seconds" in v and "deferred" in v for v in e.verdicts.values())


def test_bad_policy_values_fail_at_once_naming_the_keyword(restore_policy):
    before = attend.get_policy()
    with pytest.raises(attend.InvalidArgumentError, match="select"):
        attend.set_policy(select="fastest")
    with pytest.raises(attend.InvalidArgumentError, match="select"):
        with attend.policy(select="fastest"):
            pass
    assert attend.get_policy() == before
