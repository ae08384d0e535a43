"""flash's f32 backward on long gradient sums, at FlashAttention's strict rule.

dK and dV of one key sum over every query row of its GQA/MQA group (group *
seqlen_q rows). The rule is FlashAttention's own: attend's error against a
float64 run <= 3 x the error of the same math in f32 (PyTorch's matmuls, as
FlashAttention's attention_ref with upcast=False) + 1e-5 absolute. A single
sequential f32 chain over n rows loses about sqrt(n) eps more than the blocked
sums of a GEMM; the first failure found was B=3, Sq=257, Sk=1, heads 4/1,
D=16/512 (dV the sum of 1,028 dO rows).
"""

import pytest
import torch

from attend.torch import flash_attn_func
from conftest import assert_strict, grad_ratios, math_attention, randn



def strict_ratios(b, sq, sk, hq, hk, dqk, dv, causal, seed):
    q, k, v = randn(b, sq, hq, dqk, seed=seed), randn(b, sk, hk, dqk, seed=seed + 1), randn(b, sk, hk, dv, seed=seed + 2)
    dout = randn(b, sq, hq, dv, seed=seed + 3)
    bias = None
    if causal:  # bottom-right aligned
        i = torch.arange(sq).unsqueeze(1) + sk - sq
        bias = torch.zeros(sq, sk).masked_fill(torch.arange(sk).unsqueeze(0) > i, float("-inf"))

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        return torch.autograd.grad(fn(*leaves), leaves, dout.to(leaves[0].dtype))

    def math(upcast):
        def run(q, k, v):
            t = lambda x: x.transpose(1, 2)  # noqa: E731
            return t(math_attention(t(q), t(k), t(v), bias=bias, upcast=upcast))
        return run

    got = grads(lambda q, k, v: flash_attn_func(q, k, v, causal=causal))
    ref, naive = grads(math(True)), grads(math(False))
    return grad_ratios(got, ref, naive)


def test_mqa_single_key_dv_sum_of_1028_rows_meets_strict_rule():
    assert_strict(strict_ratios(3, 257, 1, 4, 1, 16, 512, False, seed=7))


@pytest.mark.parametrize("group", [1, 4, 16])
@pytest.mark.parametrize("rows", [512, 4096], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dv", [64, 512], ids=lambda d: f"dv{d}")
@pytest.mark.parametrize("sk", [1, 19], ids=lambda s: f"sk{s}")
def test_group_rows_dv_sweep_meets_strict_rule(group, rows, dv, sk):
    """rows = query rows per kv head (group * seqlen_q), up to 4,096."""
    assert_strict(strict_ratios(1, rows // group, sk, group, 1, 32, dv, sk > 1 and group == 4, seed=group + rows + dv + sk))
