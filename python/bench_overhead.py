#!/usr/bin/env python3
"""attend.torch's per-call cost on small problems, against PyTorch's SDPA.

A decode step in a generate loop is a stream of attention calls of a few
queries over a few hundred keys, where the Python around the kernel can cost
more than the kernel. This measures, in one run and one process:

  attend   attend.torch.scaled_dot_product_attention (bhsd tensors) or
           flash_attn_func (bshd tensors), the call a model makes;
  native   the same problem through a prepared attend plan with outputs
           allocated in advance: the kernels and the C++ runtime, no Python
           adapter (the floor the adapter adds to);
  sdpa     torch.nn.functional.scaled_dot_product_attention on the same data
           in its bhsd layout (torch's own CPU kernels);

as microseconds per call, forward only (under torch.no_grad: inference) and
forward+backward (inputs require grad), f32 and bf16. ratio = attend / sdpa
(<= 1.5 is issue 29's goal). Timing: rounds of back-to-back calls, attend's and
SDPA's rounds interleaved so that load from other processes hits both; each
side's best round is reported (noise only ever adds time).

    ATTEND_NUM_THREADS=1 PYTHONPATH=build/python \\
        scripts/python-venv.sh torch2 python/bench_overhead.py [--rounds N] [--json FILE]

torch's thread count is set to attend's (ATTEND_NUM_THREADS, else
OMP_NUM_THREADS, else the CPU count). Needs torch >= 2.0 (F.scaled_dot_product_attention).
"""

import argparse
import json
import os
import sys
import time

# This file sits next to the *source* package python/attend, which has no
# compiled _C: drop its directory so that PYTHONPATH's built package is imported.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attend  # noqa: E402
import attend.torch as at  # noqa: E402
from attend import _arrays  # noqa: E402  (descriptors for the native floor)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
B, H, D = 1, 8, 64
SHAPES = ((1, 128), (1, 256), (16, 256))  # (queries, keys)


def per_call(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def compare(fns, rounds, round_s=0.002):
    """Best seconds per call of each of `fns`, their rounds interleaved."""
    calls = []
    for fn in fns:
        for _ in range(3):  # warm-up: allocator, caches, selection
            fn()
        calls.append(max(1, int(round_s / max(per_call(fn, 3), 1e-7))))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], per_call(fn, calls[i]))
    return best


def native_runner(sq, sk, dtype, backward):
    """The native floor: a plan run on preallocated outputs and gradients."""
    mode = "training" if backward else "inference"
    plan = attend.select(mode, batch=B, seqlen_q=sq, seqlen_kv=sk, heads_q=H, heads_kv=H, head_dim_qk=D,
                         head_dim_v=D, dtype=dtype, layout="bhsd")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, s, D, generator=g).to(DTYPES[dtype]) for s in (sq, sk, sk))
    out, lse, dout = torch.empty_like(q), torch.empty(B, H, sq), torch.randn(B, H, sq, D).to(DTYPES[dtype])
    grads = dict(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
    keep = [q, k, v, out, lse, dout, grads]
    descs, _ = _arrays.describe_all(dict(q=q, k=k, v=v))
    gd, _ = _arrays.describe_all(grads)
    od, ld, dd = (_arrays.describe(t, n)[0] for t, n in ((out, "out"), (lse, "lse"), (dout, "dout")))
    native = plan._plan

    def run():
        native.forward(descs, od, ld)
        if backward:
            native.backward(descs, od, ld, dd, gd)

    run.keep = keep
    return run, f"{plan.backend}:{plan.variant}"


def case(api, sq, sk, dtype, backward, rounds):
    g = torch.Generator().manual_seed(0)
    bhsd = [torch.randn(B, H, s, D, generator=g).to(DTYPES[dtype]) for s in (sq, sk, sk)]
    bshd = [t.transpose(1, 2).contiguous() for t in bhsd]
    mine = [t.clone().requires_grad_(backward) for t in (bhsd if api == "sdpa" else bshd)]
    theirs = [t.clone().requires_grad_(backward) for t in bhsd]
    grad_out = torch.randn(mine[0].shape[:-1] + (D,), generator=g).to(DTYPES[dtype])
    grad_bhsd = grad_out if api == "sdpa" else grad_out.transpose(1, 2).contiguous()
    fn = at.scaled_dot_product_attention if api == "sdpa" else at.flash_attn_func

    def call(f, tensors, grad):
        if not backward:
            def run():
                with torch.no_grad():
                    f(*tensors)
            return run

        def run():
            for t in tensors:
                t.grad = None
            f(*tensors).backward(grad)
        return run

    native, plan = native_runner(sq, sk, dtype, backward)
    t_attend, t_native, t_sdpa = compare([call(fn, mine, grad_out), native, call(F.scaled_dot_product_attention,
                                                                                  theirs, grad_bhsd)], rounds)
    return dict(api=api, seqlen_q=sq, seqlen_kv=sk, dtype=dtype, passes="fwd+bwd" if backward else "fwd",
                plan=plan, attend_us=t_attend * 1e6, native_us=t_native * 1e6, sdpa_us=t_sdpa * 1e6,
                ratio=t_attend / t_sdpa)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds per row")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"torch {torch.__version__} has no F.scaled_dot_product_attention (torch >= 2.0 needed)")
    threads = int(os.environ.get("ATTEND_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, threads {threads} (torch and attend), "
          f"B={B} H={H} D={D}, best of {args.rounds} interleaved rounds")
    print(f"{'api':5} {'pass':7} {'dtype':5} {'Sq':>3} {'Sk':>4} {'attend us':>10} {'native us':>10} "
          f"{'sdpa us':>9} {'ratio':>6}  plan")
    rows = []
    for backward in (False, True):
        for dtype in DTYPES:
            for sq, sk in SHAPES:
                for api in ("sdpa", "flash"):
                    r = case(api, sq, sk, dtype, backward, args.rounds)
                    rows.append(r)
                    print(f"{api:5} {r['passes']:7} {dtype:5} {sq:>3} {sk:>4} {r['attend_us']:>10.1f} "
                          f"{r['native_us']:>10.1f} {r['sdpa_us']:>9.1f} {r['ratio']:>6.2f}  {r['plan']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(format="attend-bench-overhead/1", torch=torch.__version__, threads=threads, rows=rows),
                      f, indent=1)


if __name__ == "__main__":
    main()
