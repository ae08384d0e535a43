"""Benchmark of context parallelism over torch.distributed (gloo, CPU).

Spawns --cp ranks; each times the distributed forward+backward of its rows
(attend.parallel through flash_attn_func with cp_group) and, in the same
process, a compute-only baseline: the same ring blocks with no transport at
all (every block's K/V taken from a local copy of the whole tensor; its
partials merged, as the ring merges them). The ratio
cp / compute-only is the transport's cost not hidden behind compute (1.0 =
fully hidden). Slowest rank's times, best of --repeat.

    PYTHONPATH=build/python python3 python/bench_cp.py --cp 2 --seqlen 2048 --causal
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _compute_only(p, q, k_all, v_all, dout):
    from attend import _core
    c = p["chunk_rows"]
    acc = {}
    for step in p["steps"]:
        theirs = p["chunks"][step["kv_owner"]]
        for b in step["blocks"]:
            if b["mask"] == "skip":
                continue
            off = theirs[b["kv_chunk"]][1]
            qc = q[:, b["q_chunk"] * c:(b["q_chunk"] + 1) * c].contiguous()
            kc, vc = k_all[:, off:off + c].contiguous(), v_all[:, off:off + c].contiguous()
            o, l = _core.forward(qc, kc, vc, **b["forward_spec"])
            i = b["q_chunk"]
            acc[i] = (o, l) if i not in acc else _core.merge([acc[i], (o, l)])  # the merges the ring does too
            _core.backward(qc, kc, vc, o, l, dout[:, b["q_chunk"] * c:(b["q_chunk"] + 1) * c].contiguous(),
                           **b["backward_spec"])


def _worker(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.cp)
    import attend.parallel as par
    from attend.torch import flash_attn_func
    g = torch.Generator().manual_seed(1)
    shape = (1, args.seqlen, args.heads, args.dim)
    q_all, k_all, v_all, d_all = (torch.randn(shape, generator=g) for _ in range(4))
    q, k, v, dout = (par.shard(t, causal=args.causal) for t in (q_all, k_all, v_all, d_all))
    spec = dict(batch=1, seqlen_q=args.seqlen, seqlen_kv=args.seqlen, heads_q=args.heads, heads_kv=args.heads,
                head_dim_qk=args.dim, head_dim_v=args.dim, causal=args.causal)
    p = par.plan(spec, "training", size=args.cp, rank=rank, strategy="ring")

    def slowest(fn):
        best = float("inf")
        for _ in range(args.repeat):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            best = min(best, t.item())
        return best

    def cp_run():
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        flash_attn_func(ql, kl, vl, causal=args.causal, cp_group=dist.group.WORLD, cp_strategy="ring").backward(dout)

    t_cp = slowest(cp_run)
    t_compute = slowest(lambda: _compute_only(p, q, k_all, v_all, dout))
    if rank == 0:
        out.put((t_cp, t_compute))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(_worker, args=(args, port, q), nprocs=args.cp, join=True)
    t_cp, t_compute = q.get()
    print(f"cp={args.cp} S={args.seqlen} H={args.heads} D={args.dim} causal={args.causal} ring fwd+bwd: "
          f"{t_cp * 1e3:.1f} ms, compute-only {t_compute * 1e3:.1f} ms, ratio {t_cp / t_compute:.2f} "
          f"(slowest rank, best of {args.repeat})")


if __name__ == "__main__":
    main()
