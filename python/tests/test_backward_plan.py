"""Backward runs on the (backend, variant) its forward chose, whatever the
policy says by the time backward runs: forward's choice wins, even over a
backend disabled in between (both torch paths and the numpy API)."""

import pytest
import torch

import attend
import attend.torch as at
from conftest import randn


def _grads(policy_after=None, **forward_policy):
    q, k, v = (randn(1, 9, 2, 16, seed=s).requires_grad_(True) for s in (1, 2, 3))
    with attend.policy(**forward_policy):
        out = at.flash_attn_func(q, k, v, causal=True, deterministic=True)
        chosen = at.last_selection()
    with attend.policy(**(policy_after or forward_policy)):
        grads = torch.autograd.grad(out, (q, k, v), randn(1, 9, 2, 16, seed=4))
    return chosen, grads


def test_policy_change_between_forward_and_backward_cannot_move_backward(restore_policy):
    chosen, on_flash = _grads(force="flash")
    assert chosen.selected == "flash"
    _, on_reference = _grads(force="reference")
    # The two backends round differently: bitwise equality below says which one ran.
    assert any(not torch.equal(a, b) for a, b in zip(on_flash, on_reference))
    for after in (dict(force="reference"), dict(disable="flash")):
        _, pinned = _grads(after, force="flash")
        for a, b in zip(pinned, on_flash):
            assert torch.equal(a, b), f"backward left forward's backend under {after}"
    # And the other way round: forward on reference, backward's policy forces flash.
    _, pinned = _grads(dict(force="flash"), force="reference")
    for a, b in zip(pinned, on_reference):
        assert torch.equal(a, b)


def test_numpy_backward_pins_the_named_backend(restore_policy):
    q, k, v = (randn(1, 9, 2, 16, seed=s).numpy() for s in (1, 2, 3))
    d = randn(1, 9, 2, 16, seed=4).numpy()
    with attend.policy(force="reference"):
        out, lse = attend.forward(q, k, v, causal=True)
        ref = attend.backward(q, k, v, out, lse, d, causal=True)
    with attend.policy(force="flash"):
        pinned = attend.backward(q, k, v, out, lse, d, causal=True, backend="reference")
        flash = attend.backward(q, k, v, out, lse, d, causal=True, deterministic=True)
    assert all((pinned[n] == ref[n]).all() for n in ("dq", "dk", "dv"))
    assert any((flash[n] != ref[n]).any() for n in ("dq", "dk", "dv"))
    with pytest.raises(attend.InvalidArgumentError, match="nosuch"):
        attend.backward(q, k, v, out, lse, d, causal=True, backend="nosuch")
