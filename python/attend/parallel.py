"""Context parallelism on torch.distributed: one attention problem split by
sequence across the ranks of a process group (gloo on CPU, NCCL on GPUs).

The plan is attend's own (attend::parallel::plan, the same the MPI engine and
``attend select --cp N`` use): strategy verdicts, which rows each rank holds,
and for the ring every step's blocks with their specs. This module is only the
transport and the autograd glue:

- ring: K/V chunks travel round the ring (isend/irecv posted before a step's
  blocks are computed, so the transfer overlaps the compute); each block is an
  attend partial (global q_offset/kv_offset, f32 out) merged through its LSE
  with ``attend.merge``; backward accumulates dQ locally while each K/V's
  dK/dV accumulator travels one step behind it (sent on after the step that
  added to it, arriving during the next step's blocks), home after the last.
- a2a (Ulysses): an all-to-all turns "my rows of every head" into "every row
  of my heads", attention runs on whole sequences, a second one turns the
  results back, each one packed ``dist.all_to_all_single`` (NCCL, MPI, and
  gloo on torch 1.13 and 2.x; gloo on 1.13 lacks the list form
  ``dist.all_to_all``); a backend without it gets the same exchange as
  pairwise isend/irecv (equal traffic: each peer receives its block once).

Sharding: rank r passes the rows ``local_chunks(...)`` names, in that order
(``shard`` cuts them from a whole tensor, ``unshard`` gathers them back). A
causal problem is cut into 2*size chunks and rank r holds chunks r and
2*size-1-r (balanced load); anything else into ``size`` contiguous chunks.

    out = attend.torch.flash_attn_func(q_local, k_local, v_local, causal=True, cp_group=group)
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C, _core
from .errors import InvalidArgumentError, UnsupportedError, _raise
from ._torch_inputs import one_device

STRATEGIES = ("auto", "ring", "a2a")


def _group_size_rank(group) -> Tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _global_rank(group, rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)  # torch 1.13


def plan(spec: Dict[str, Any], mode: str = "training", *, size: int, rank: int, strategy: str = "auto",
         balance_causal: bool = True, strict: bool = True) -> Dict[str, Any]:
    """The context-parallel plan of one rank for the whole problem ``spec``
    (attend spec fields; seqlen_q = seqlen_kv = the whole sequence) as a dict:
    strategy (None when nothing fits and strict=False), verdicts (per strategy:
    accepted, reasons, backend), chunks (per rank: (index, offset, rows) in
    local row order), chunk_rows, balanced, local_spec, a2a_spec (a2a), steps
    (ring: kv_owner, send_to, recv_from and blocks with their forward/backward
    specs) and explain (the strategy table). strict=True raises
    UnsupportedError with that table when the requested strategy cannot run."""
    if strategy not in STRATEGIES:
        _raise(InvalidArgumentError, "cp_strategy", strategy, "expected auto, ring or a2a")
    return _C.cp_plan(spec, mode, int(size), int(rank), strategy, bool(balance_causal), bool(strict))


def local_chunks(seqlen: int, size: int, rank: int, causal: bool = False) -> List[Tuple[int, int, int]]:
    """(chunk index, global offset, rows) of the chunks ``rank`` holds, in local row order."""
    s = dict(batch=1, seqlen_q=seqlen, seqlen_kv=seqlen, heads_q=1, heads_kv=1, head_dim_qk=8, head_dim_v=8,
             causal=bool(causal))
    p = plan(s, "inference", size=size, rank=rank, strategy="ring", strict=False)
    if seqlen % (size * (2 if p["balanced"] else 1)):
        _raise(InvalidArgumentError, "seqlen", seqlen,
               f"must divide into {size * (2 if p['balanced'] else 1)} chunks for cp={size}")
    return [tuple(c) for c in p["chunks"][rank]]


def shard(x: torch.Tensor, group=None, *, causal: bool = False, dim: int = 1) -> torch.Tensor:
    """This rank's rows (dimension ``dim``) of a whole tensor, in the CP layout."""
    size, rank = _group_size_rank(group)
    parts = [x.narrow(dim, off, rows) for _, off, rows in local_chunks(x.shape[dim], size, rank, causal)]
    return torch.cat(parts, dim).contiguous()


def unshard(x: torch.Tensor, group=None, *, causal: bool = False, dim: int = 1) -> torch.Tensor:
    """The whole tensor from every rank's rows (an all_gather; not differentiable)."""
    size, rank = _group_size_rank(group)
    dtype = x.dtype
    # gloo on torch 1.13 cannot all_gather bf16; f32 holds bf16/f16 exactly.
    x = x.contiguous() if dtype not in (torch.bfloat16, torch.float16) else x.float()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    whole = torch.empty(x.shape[:dim] + (x.shape[dim] * size,) + x.shape[dim + 1:], dtype=dtype)
    for r, part in enumerate(parts):
        row = 0
        for _, off, rows in local_chunks(whole.shape[dim], size, r, causal):
            whole.narrow(dim, off, rows).copy_(part.narrow(dim, row, rows))
            row += rows
    return whole


# --- transport ------------------------------------------------------------------------------

_ALL_TO_ALL: Dict[int, bool] = {}  # per group: whether dist.all_to_all_single works


def _all_to_all(send: List[torch.Tensor], recv: List[torch.Tensor], group) -> None:
    """recv[j] = rank j's send[rank] (blocks of one shape). One packed
    dist.all_to_all_single where the backend has it: NCCL, MPI and gloo on
    torch 1.13 and 2.x (gloo on 1.13 lacks the list form, dist.all_to_all).
    Probed once per group (every rank gets the same answer); without it the
    same exchange runs as pairwise isend/irecv."""
    key = id(group)
    if _ALL_TO_ALL.get(key, True):
        packed_recv = torch.empty((len(recv),) + tuple(recv[0].shape), dtype=recv[0].dtype)
        try:
            dist.all_to_all_single(packed_recv, torch.stack(send), group=group)
            _ALL_TO_ALL[key] = True
            for j, r in enumerate(recv):
                r.copy_(packed_recv[j])
            return
        except RuntimeError:
            if key in _ALL_TO_ALL:
                raise
            _ALL_TO_ALL[key] = False
    size, rank = _group_size_rank(group)
    reqs = []
    for j in range(size):
        if j == rank:
            recv[j].copy_(send[j])
            continue
        reqs.append(dist.isend(send[j], _global_rank(group, j), group=group))
        reqs.append(dist.irecv(recv[j], _global_rank(group, j), group=group))
    for r in reqs:
        r.wait()


def _seq_to_heads(x: torch.Tensor, p, group) -> torch.Tensor:
    """local (B, L, Hx, D), every head -> (B, S, Hx/n, D): this rank's heads, every row."""
    n = p["size"]
    hl = x.shape[2] // n
    send = [x[:, :, j * hl:(j + 1) * hl].contiguous() for j in range(n)]
    recv = [torch.empty_like(send[0]) for _ in range(n)]
    _all_to_all(send, recv, group)
    whole = torch.empty((x.shape[0], x.shape[1] * n, hl, x.shape[3]), dtype=x.dtype)
    for i in range(n):
        row = 0
        for _, off, rows in p["chunks"][i]:
            whole[:, off:off + rows] = recv[i][:, row:row + rows]
            row += rows
    return whole


def _heads_to_seq(whole: torch.Tensor, p, group) -> torch.Tensor:
    """(B, S, Hx/n, D) of this rank's heads -> local (B, L, Hx, D): every head, my rows."""
    n = p["size"]
    send = [torch.cat([whole[:, off:off + rows] for _, off, rows in p["chunks"][i]], 1).contiguous()
            for i in range(n)]
    recv = [torch.empty_like(send[p["rank"]]) for _ in range(n)]
    _all_to_all(send, recv, group)
    return torch.cat(recv, 2)


def _lse_as_rows(lse):  # (B, H, S) <-> (B, S, H, 1), for the row exchanges
    return lse.transpose(1, 2).unsqueeze(-1)


def _rows_as_lse(x):
    return x.squeeze(-1).transpose(1, 2).contiguous()


def _slopes_slice(slopes, p, heads):
    if slopes is None:
        return None
    return slopes[..., p["rank"] * heads:(p["rank"] + 1) * heads].contiguous()


class _Ring:
    """The K/V (and in backward the dK/dV accumulators) of the step, and the
    posted exchange that brings the next."""

    def __init__(self, group, step, tensors, tag):
        self.next = [torch.empty_like(t) for t in tensors]
        send, recv = _global_rank(group, step["send_to"]), _global_rank(group, step["recv_from"])
        # Tags keep K/V apart from the dK/dV accumulators in flight at the same time.
        self.reqs = [dist.isend(t, send, group=group, tag=tag + i) for i, t in enumerate(tensors)]
        self.reqs += [dist.irecv(t, recv, group=group, tag=tag + i) for i, t in enumerate(self.next)]

    def wait(self):
        for r in self.reqs:
            r.wait()
        return self.next


_TAG_KV, _TAG_DKV = 11, 13


def _rows(t, i, c):
    return t[:, i * c:(i + 1) * c].contiguous()


def _sink_inputs(spec, sinks):
    """The learnable sink logits for a block whose spec carries them (the plan
    gives them to the blocks against key chunk 0 only: one partial per row)."""
    return {"sinks": sinks} if sinks is not None and spec.get("softmax_type") == "learnable" else {}


def _ring_forward(p, q, k, v, slopes, sinks, group):
    c, n = p["chunk_rows"], p["size"]
    nq = len(p["chunks"][p["rank"]])
    acc: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * nq
    kv = [k.contiguous(), v.contiguous()]
    extra = {} if slopes is None else {"alibi_slopes": slopes}
    for step in p["steps"]:
        ring = _Ring(group, step, kv, _TAG_KV) if step["index"] + 1 < n else None
        for b in step["blocks"]:
            if b["mask"] == "skip":
                continue
            part = _core.forward(_rows(q, b["q_chunk"], c), _rows(kv[0], b["kv_chunk"], c),
                                 _rows(kv[1], b["kv_chunk"], c), **extra, **_sink_inputs(b["forward_spec"], sinks),
                                 **b["forward_spec"])
            i = b["q_chunk"]
            acc[i] = part if acc[i] is None else _core.merge([acc[i], part])
        if ring is not None:
            kv = ring.wait()
    ls = p["local_spec"]
    out_f = torch.cat([a[0] for a in acc], 1)
    lse = torch.cat([a[1] for a in acc], 2)
    out_dtype = _C.expected(ls, "out")[1]
    out, lse = _core.merge([(out_f, lse)], out_dtype=out_dtype)  # the one rounding
    return out, lse


def _ring_backward(p, q, k, v, out, lse, dout, slopes, sinks, group):
    c, n = p["chunk_rows"], p["size"]
    half = q.dtype in (torch.bfloat16, torch.float16)
    acc_dtype = torch.float32 if q.dtype != torch.float64 else torch.float64
    dq = torch.zeros(q.shape, dtype=acc_dtype)
    held = [k.contiguous(), v.contiguous()]
    extra = {} if slopes is None else {"alibi_slopes": slopes}
    dsinks = None if sinks is None else torch.zeros(sinks.shape, dtype=torch.float64)
    pending = None  # the accumulators of this step's K/V, on their way from the previous rank
    for step in p["steps"]:
        ring = _Ring(group, step, held, _TAG_KV) if step["index"] + 1 < n else None
        dk_step, dv_step = torch.zeros(k.shape, dtype=acc_dtype), torch.zeros(v.shape, dtype=acc_dtype)
        for b in step["blocks"]:
            if b["mask"] == "skip":
                continue
            qi, ki = b["q_chunk"], b["kv_chunk"]
            fields = dict(b["backward_spec"])
            if half:
                fields["dq_dtype"] = "f32"
            g = _core.backward(_rows(q, qi, c), _rows(held[0], ki, c), _rows(held[1], ki, c), _rows(out, qi, c),
                               lse[:, :, qi * c:(qi + 1) * c].contiguous(), _rows(dout, qi, c), **extra,
                               **_sink_inputs(fields, sinks), **fields)
            dq[:, qi * c:(qi + 1) * c] += g["dq"]
            if "dsinks" in g:
                dsinks += g["dsinks"]
            dk_step[:, ki * c:(ki + 1) * c] += g["dk"]
            dv_step[:, ki * c:(ki + 1) * c] += g["dv"]
        # The accumulator of this K/V was sent by the previous rank after its
        # own step (one step behind the K/V), so it travelled during this
        # step's blocks; add to it and send it on. After the last step the
        # exchange brings every rank's own accumulator home.
        dkv = pending.wait() if pending is not None else [dk_step.new_zeros(k.shape), dv_step.new_zeros(v.shape)]
        dkv[0] += dk_step
        dkv[1] += dv_step
        pending = _Ring(group, step, dkv, _TAG_DKV)
        if ring is not None:
            held = ring.wait()
    dk, dv = pending.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), _sum_dsinks(dsinks, sinks, group)


def _sum_dsinks(dsinks, sinks, group):
    """Every rank's rows add to every head's sink gradient: an all_reduce."""
    if dsinks is None:
        return None
    dist.all_reduce(dsinks, group=group)
    return dsinks.to(sinks.dtype)


def _a2a_forward(p, q, k, v, slopes, sinks, group):
    s = p["a2a_spec"]
    qf, kf, vf = (_seq_to_heads(x.contiguous(), p, group) for x in (q, k, v))
    extra = {} if slopes is None else {"alibi_slopes": _slopes_slice(slopes, p, s["heads_q"])}
    extra.update(_sink_inputs(s, _slopes_slice(sinks, p, s["heads_q"])))
    of, lf = _core.forward(qf, kf, vf, **extra, **s)
    return _heads_to_seq(of, p, group), _rows_as_lse(_heads_to_seq(_lse_as_rows(lf).contiguous(), p, group))


def _a2a_backward(p, q, k, v, out, lse, dout, slopes, sinks, group):
    s = p["a2a_spec"]
    qf, kf, vf, of, df = (_seq_to_heads(x.contiguous(), p, group) for x in (q, k, v, out, dout))
    lf = _rows_as_lse(_seq_to_heads(_lse_as_rows(lse).contiguous(), p, group))
    extra = {} if slopes is None else {"alibi_slopes": _slopes_slice(slopes, p, s["heads_q"])}
    extra.update(_sink_inputs(s, _slopes_slice(sinks, p, s["heads_q"])))
    g = _core.backward(qf, kf, vf, of, lf, df, **extra, **s)
    grads = tuple(_heads_to_seq(g[n], p, group).to(x.dtype) for n, x in (("dq", q), ("dk", k), ("dv", v)))
    dsinks = None
    if "dsinks" in g:  # this rank's heads; the others' slots stay 0 for the all_reduce
        h = s["heads_q"]
        dsinks = torch.zeros(sinks.shape, dtype=torch.float64)
        dsinks[p["rank"] * h:(p["rank"] + 1) * h] = g["dsinks"].double()
    return grads + (_sum_dsinks(dsinks, sinks, group),)


class _CpAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, group, q, k, v, slopes, sinks):
        run = _ring_forward if p["strategy"] == "ring" else _a2a_forward
        out, lse = run(p, q, k, v, slopes, sinks, group)
        ctx.p, ctx.group = p, group
        ctx.save_for_backward(q, k, v, out, lse, slopes, sinks)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, slopes, sinks = ctx.saved_tensors
        run = _ring_backward if ctx.p["strategy"] == "ring" else _a2a_backward
        dq, dk, dv, dsinks = run(ctx.p, q, k, v, out, lse, dout.contiguous(), slopes, sinks, ctx.group)
        return None, None, dq, dk, dv, None, dsinks


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: Dict[str, Any], group,
              strategy: str = "auto", alibi_slopes: Optional[torch.Tensor] = None,
              training: Optional[bool] = None, sinks: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Context-parallel attention of this rank's rows q, k, v (bshd, local
    rows in the CP layout) under ``spec`` (attend spec fields of the local
    call: batch, heads, dims, mask, ...; seqlen_q/kv are replaced by the whole
    sequence). Returns (out, lse) of this rank's rows; out is differentiable
    with respect to q, k, v and ``sinks`` (the distributed backward). ``sinks``
    (H) are the learnable sink logits of softmax_type="learnable", the same on
    every rank. Every rank of ``group`` must call it with the same spec."""
    size, rank = _group_size_rank(group)
    if strategy not in STRATEGIES:
        _raise(InvalidArgumentError, "cp_strategy", strategy, "expected auto, ring or a2a")
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if t.dim() != 4:
            _raise(InvalidArgumentError, f"{n}.dim", t.dim(), "context parallelism takes (B, S_local, H, D) tensors")
        if t.device.type != "cpu":
            _raise(UnsupportedError, f"{n}.device", str(t.device), "attend's kernels run on the CPU")
    one_device("attend.parallel.attention", q=q, k=k, v=v, alibi_slopes=alibi_slopes, sinks=sinks)
    if q.shape[1] != k.shape[1]:
        _raise(InvalidArgumentError, "seqlen", f"{q.shape[1]} != {k.shape[1]}",
               "context parallelism needs as many local query rows as key rows")
    whole = dict(spec, layout="bshd", seqlen_q=q.shape[1] * size, seqlen_kv=k.shape[1] * size)
    if (whole.get("softmax_type") == "learnable") != (sinks is not None):
        _raise(InvalidArgumentError, "sinks", "set" if sinks is not None else "missing",
               "learnable sink logits go with softmax_type='learnable', and only with it")
    if float(whole.get("dropout_p") or 0.0) > 0.0:
        # One mask for the whole problem: every rank must use rank 0's seed.
        seed = torch.tensor([int(whole.get("dropout_seed") or 0)], dtype=torch.int64)
        dist.broadcast(seed, _global_rank(group, 0), group=group)
        whole["dropout_seed"] = int(seed.item())
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    mode = "training" if needs_grad or (training and torch.is_grad_enabled()) else "inference"
    p = plan(whole, mode, size=size, rank=rank, strategy=strategy)
    expect = sum(rows for _, _, rows in p["chunks"][rank])
    if q.shape[1] != expect:
        _raise(InvalidArgumentError, "q.shape[1]", q.shape[1], f"rank {rank} holds {expect} rows")
    return _CpAttention.apply(p, group, q, k, v, alibi_slopes, sinks)
