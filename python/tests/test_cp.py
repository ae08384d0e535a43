"""Context parallelism over torch.distributed (attend.parallel): 2 and 4 gloo
ranks spawned with torch.multiprocessing, each running flash_attn_func or
DotProductAttention with cp_group on its rows; forward out and the
distributed backward's dq/dk/dv, gathered, must equal the single-process
attend result (itself checked against autograd elsewhere) and the float64
math oracle. Plus the planning layer as Python sees it (no processes)."""

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attend
import attend.parallel as par
import attend.torch as at
from attend.module import DotProductAttention

from conftest import math_attention

# (name, heads_q, heads_kv, causal, strategy, api)
CASES = [
    ("plain", 4, 4, False, "ring", "flash"),
    ("causal_balanced", 4, 4, True, "ring", "flash"),
    ("gqa_causal", 4, 2, True, "ring", "module"),
    ("gqa_a2a", 8, 4, False, "a2a", "flash"),
    ("causal_a2a", 4, 4, True, "a2a", "module"),
    ("sbhd_causal_auto", 4, 4, True, "auto", "module_sbhd"),
    ("alibi_window", 4, 4, False, "ring", "flash_alibi_window"),
    ("sinks_causal_ring", 4, 2, True, "ring", "flash_sinks"),
    ("sinks_a2a", 4, 4, False, "a2a", "flash_sinks"),
    ("sinks_window_ring", 4, 4, False, "ring", "flash_sinks_window"),
    ("off_by_one_causal", 4, 4, True, "auto", "module_off_by_one"),
]
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
SINKS = torch.tensor([0.3, -1.0, 1.5, 0.0])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _whole(case, size):
    _, h, hk, causal, _, _ = case
    g = torch.Generator().manual_seed(7)
    seq = 8 * size  # 2*size chunks of 4 rows when causal
    q = torch.randn(2, seq, h, 16, generator=g)
    k = torch.randn(2, seq, hk, 16, generator=g)
    v = torch.randn(2, seq, hk, 16, generator=g)
    dout = torch.randn(2, seq, h, 16, generator=g)
    return q, k, v, dout


def _worker(rank, size, port, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        results = {}
        for case in CASES:
            name, h, hk, causal, strategy, api = case
            q, k, v, dout = _whole(case, size)
            ql, kl, vl, dl = (par.shard(t, causal=causal).requires_grad_(t is not dout) for t in (q, k, v, dout))
            sinks = SINKS.clone().requires_grad_()
            if api.startswith("flash_sinks"):
                # The window hides every key of some ring blocks; the sink's block still runs.
                window = (2, 1) if api.endswith("window") else (-1, -1)
                out = at.flash_attn_func(ql, kl, vl, causal=causal, window_size=window, sinks=sinks,
                                         cp_group=dist.group.WORLD, cp_strategy=strategy)
            elif api == "module_off_by_one":
                m = DotProductAttention(h, 16, num_gqa_groups=hk, qkv_format="bshd", attn_mask_type="causal",
                                        softmax_type="off-by-one", cp_group=dist.group.WORLD, cp_strategy=strategy)
                out = m(ql, kl, vl).view(2, ql.shape[1], h, 16)
            elif api == "flash_alibi_window":
                out = at.flash_attn_func(ql, kl, vl, window_size=(5, 3), alibi_slopes=SLOPES,
                                         cp_group=dist.group.WORLD, cp_strategy=strategy)
            elif api == "flash":
                out = at.flash_attn_func(ql, kl, vl, causal=causal, cp_group=dist.group.WORLD, cp_strategy=strategy)
            elif api == "module":
                m = DotProductAttention(h, 16, num_gqa_groups=hk, qkv_format="bshd",
                                        attn_mask_type="causal" if causal else "no_mask",
                                        cp_group=dist.group.WORLD, cp_strategy=strategy)
                out = m(ql, kl, vl).view(2, ql.shape[1], h, 16)
            else:  # sbhd, the module's default format; the group set by TE's hook
                m = DotProductAttention(h, 16, num_gqa_groups=hk, attn_mask_type="causal" if causal else "no_mask")
                m.set_context_parallel_group(dist.group.WORLD, strategy)
                out = m(*(t.transpose(0, 1) for t in (ql, kl, vl))).transpose(0, 1).reshape(2, ql.shape[1], h, 16)
            out.backward(dl)
            results[name] = [par.unshard(t.detach(), causal=causal) for t in (out, ql.grad, kl.grad, vl.grad)]
            if api.startswith("flash_sinks"):
                results[name].append(sinks.grad)
        # Refused alike on every rank, before any exchange.
        q, k, v, _ = _whole(CASES[0], size)
        try:
            at.flash_attn_func(*(par.shard(t) for t in (q, k, v)), dropout_p=0.1, return_attn_probs=True,
                               cp_group=dist.group.WORLD)
            results["refusal"] = None
        except attend.UnsupportedError as e:
            results["refusal"] = (e.field, str(e))
        if rank == 0:
            torch.save(results, os.path.join(result_dir, f"cp{size}.pt"))
    finally:
        dist.destroy_process_group()


def _reference(case, size):
    q, k, v, dout = _whole(case, size)
    causal = case[3]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    seq = q.shape[1]
    bias = None
    sinks = SINKS.clone().requires_grad_()
    if case[5].startswith("flash_sinks"):
        window = (2, 1) if case[5].endswith("window") else (-1, -1)
        out = at.flash_attn_func(*leaves, causal=causal, window_size=window, sinks=sinks)
        out.backward(dout)
        return [out.detach()] + [t.grad for t in leaves] + [sinks.grad], None
    if case[5] == "module_off_by_one":
        out = at.flash_attn_func(*leaves, causal=True, softmax_type="off_by_one")
        out.backward(dout)
        return [out.detach()] + [t.grad for t in leaves], None
    if case[5] == "flash_alibi_window":
        out = at.flash_attn_func(*leaves, window_size=(5, 3), alibi_slopes=SLOPES)
        i, j = torch.arange(seq).view(-1, 1), torch.arange(seq).view(1, -1)
        bias = (-SLOPES.view(-1, 1, 1) * (j - i).abs()).masked_fill((j > i + 3) | (j < i - 5), float("-inf"))
    else:
        out = at.flash_attn_func(*leaves, causal=causal)
        if causal:
            bias = torch.full((seq, seq), float("-inf")).triu(1)
    out.backward(dout)
    oracle = math_attention(*(t.transpose(1, 2) for t in (q, k, v)), bias=bias).transpose(1, 2)
    return [out.detach()] + [t.grad for t in leaves], oracle


@pytest.mark.parametrize("size", [2, 4])
def test_cp_group_forward_and_backward_equal_the_single_process_run(size):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(size, _free_port(), d), nprocs=size, join=True)
        results = torch.load(os.path.join(d, f"cp{size}.pt"))
    assert results["refusal"] is not None and results["refusal"][0] == "return_attn_probs", results["refusal"]
    for case in CASES:
        want, oracle = _reference(case, size)
        got = results[case[0]]
        assert len(got) == len(want), case[0]
        for name, g, w in zip(("out", "dq", "dk", "dv", "dsinks"), got, want):
            err = (g - w).abs().max().item()
            assert err <= 2e-5, f"{case[0]} cp={size}: {name} differs from the single-process run by {err:.3e}"
        if oracle is not None:  # sinks: the single-process run is checked against autograd in test_sinks
            assert (got[0].double() - oracle.double()).abs().max().item() <= 1e-4, case[0]


def test_plan_exposes_verdicts_chunks_and_ring_blocks():
    spec = dict(batch=1, seqlen_q=64, seqlen_kv=64, heads_q=6, heads_kv=3, head_dim_qk=16, head_dim_v=16,
                causal=True)
    p = par.plan(spec, "training", size=4, rank=1)
    assert p["strategy"] == "ring" and p["balanced"] and p["chunk_rows"] == 8
    assert p["chunks"][1] == [(1, 8, 8), (6, 48, 8)]
    a2a = [v for v in p["verdicts"] if v["strategy"] == "a2a"][0]
    assert not a2a["accepted"] and any("heads_q=6 is not divisible by cp=4" in r for r in a2a["reasons"])
    blocks = [b for s in p["steps"] for b in s["blocks"]]
    assert len(blocks) == 4 * 4
    # every (query chunk, key chunk) pair once; skipped blocks carry no spec
    assert len({(b["q_offset"], b["kv_offset"]) for b in blocks}) == 16
    for b in blocks:
        if b["mask"] == "skip":
            assert "forward_spec" not in b
        else:
            f = b["forward_spec"]
            assert (f["q_offset"], f["kv_offset"], f["seqlen_q"]) == (b["q_offset"], b["kv_offset"], 8)
            assert str(b["backward_spec"]["accumulate_grads"]).lower() == "true"
    with pytest.raises(attend.UnsupportedError, match="heads_q=6"):
        par.plan(spec, "training", size=4, rank=0, strategy="a2a")
    with pytest.raises(attend.InvalidArgumentError):
        par.plan(spec, "training", size=4, rank=0, strategy="zigzag")
