#!/usr/bin/env python3
"""attend against PyTorch 2.x's CPU scaled_dot_product_attention, head to head.

Same process, same tensors, same thread count (torch.set_num_threads to
attend's), f32 and bf16, forward (inference, under torch.no_grad) and
forward+backward, causal and not. PyTorch's CPU SDPA runs its fused flash
kernel when q/k/v head dims are equal; for (192, 128) it falls back to its
math path (the row says which). ratio = torch time / attend time (> 1: attend
is faster); GFLOP/s use attend's FLOP count (visible pairs: causal halves it)
for both sides.

    scripts/python-venv.sh torch2 python/bench_sdpa.py [--quick] [--json FILE]
    scripts/python-venv.sh torch2 python/bench_sdpa.py --scaling --json sdpa-scaling.json

--scaling measures f32 non-causal forward and forward+backward at S = 512 ...
8192 with B*S fixed (the data bench/plot.py draws next to `attend bench
--seqlens ... --tokens N --json`). Needs PYTHONPATH=build/python (the
in-tree package) or an installed attend.
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
from attend.torch import scaled_dot_product_attention as attend_sdpa  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


# The inference table of issue 34 (B=1 H=16; forward and forward+backward) and
# one layer of Qwen2-0.5B at a 12k prompt (GQA 14/2, D=64, causal):
# (batch, heads, kv heads, seqlen, D, Dv, causal, dtype).
INFERENCE = [(1, 16, 16, s, d, d, c, "bf16") for s, d in ((1024, 64), (1024, 128), (4096, 128)) for c in (False, True)]
INFERENCE += [(1, 16, 16, s, 128, 128, False, "f32") for s in (1024, 4096)]
INFERENCE += [(1, 14, 2, 12288, 64, 64, True, "bf16")]


def flops(b, h, s, d, dv, causal, backward):
    pairs = b * (s * (s + 1) // 2 if causal else s * s)
    fwd = 2 * (d + dv) * pairs * h
    return fwd + (2 * (3 * d + 2 * dv) * pairs * h if backward else 0)


def best_of(fn, min_time, min_reps):
    fn()  # warm-up: thread pools, allocator, page faults
    times, spent = [], 0.0
    while len(times) < min_reps or spent < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return min(times)


def run_case(attn, q, k, v, g, causal, backward):
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if not backward:
        with torch.no_grad():
            attn(q, k, v, is_causal=causal, **gqa)
        return
    for t in (q, k, v):
        t.grad = None
    attn(q, k, v, is_causal=causal, **gqa).backward(g)


def torch_path(q, k, v):
    """Which CPU kernel torch's SDPA takes for these tensors: flash needs equal head dims."""
    return "flash" if q.shape[-1] == k.shape[-1] == v.shape[-1] else "math"


def measure(b, h, s, d, dv, causal, dtype, backward, min_time, min_reps, hkv=None):
    gen = torch.Generator().manual_seed(0)
    hkv = hkv or h
    q = torch.randn(b, h, s, d, generator=gen).to(DTYPES[dtype]).requires_grad_()
    k = torch.randn(b, hkv, s, d, generator=gen).to(DTYPES[dtype]).requires_grad_()
    v = torch.randn(b, hkv, s, dv, generator=gen).to(DTYPES[dtype]).requires_grad_()
    g = torch.randn(b, h, s, dv, generator=gen).to(DTYPES[dtype])
    t_torch = best_of(lambda: run_case(F.scaled_dot_product_attention, q, k, v, g, causal, backward), min_time,
                      min_reps)
    t_attend = best_of(lambda: run_case(attend_sdpa, q, k, v, g, causal, backward), min_time, min_reps)
    n = flops(b, h, s, d, dv, causal, backward)
    return dict(batch=b, heads=h, heads_kv=hkv, seqlen=s, head_dim_qk=d, head_dim_v=dv, causal=causal, dtype=dtype,
                pass_="forward+backward" if backward else "forward", torch_ms=t_torch * 1e3,
                attend_ms=t_attend * 1e3, torch_gflops=n / t_torch / 1e9, attend_gflops=n / t_attend / 1e9,
                ratio=t_torch / t_attend, torch_kernel=torch_path(q, k, v),
                attend_backend=attend.torch.last_selection().selected)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, short timing (a smoke run)")
    ap.add_argument("--scaling", action="store_true", help="f32 non-causal S sweep for bench/plot.py")
    ap.add_argument("--tokens", type=int, default=8192, help="--scaling: B*S at every S (default 8192)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--inference", action="store_true",
                    help="issue 34's table: bf16/f32 forward first, B=1 H=16, and the GQA 14/2 S=12288 layer")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of timed calls per measurement")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"bench_sdpa: torch {torch.__version__} has no scaled_dot_product_attention (needs torch >= 2.0)")
    threads = int(os.environ.get("ATTEND_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    torch.set_num_threads(threads)
    h = args.heads
    if args.inference:
        cases = [(b, hh, s, d, dv, c, dt, hkv) for b, hh, hkv, s, d, dv, c, dt in INFERENCE]
    elif args.scaling:
        cases = [(args.tokens // s, h, s, 128, 128, False, "f32") for s in (512, 1024, 2048, 4096, 8192)
                 if args.tokens % s == 0]
    elif args.quick:
        cases = [(1, 4, 256, 64, 64, c, dt) for dt in DTYPES for c in (False, True)]
    else:
        shapes = [(4, h, 1024, 64, 64), (4, h, 1024, 128, 128), (1, h, 4096, 128, 128), (4, h, 1024, 192, 128)]
        cases = [(b, hh, s, d, dv, c, dt) for dt in DTYPES for b, hh, s, d, dv in shapes for c in (False, True)]
    min_time, min_reps = (0.05, 2) if args.quick else (args.min_time, 3)
    print(f"torch {torch.__version__}, threads {threads} (torch and attend), attend flash ISA {attend.flash_isa()}")
    cases = [c if len(c) == 8 else c + (None,) for c in cases]
    print(f"{'B':>2} {'H':>5} {'S':>5} {'D/Dv':>8} {'causal':>6} {'dtype':>5} {'pass':>16} {'torch ms':>10} "
          f"{'attend ms':>10} {'torch GF/s':>10} {'attend GF/s':>11} {'ratio':>6}  torch/attend kernels")
    rows = []
    for b, hh, s, d, dv, causal, dt, hkv in cases:
        for backward in (False, True):
            r = measure(b, hh, s, d, dv, causal, dt, backward, min_time, min_reps, hkv)
            rows.append(r)
            heads = f"{hh}/{hkv}" if hkv and hkv != hh else str(hh)
            print(f"{b:>2} {heads:>5} {s:>5} {f'{d}/{dv}':>8} {str(causal):>6} {dt:>5} {r['pass_']:>16} "
                  f"{r['torch_ms']:10.1f} {r['attend_ms']:10.1f} {r['torch_gflops']:10.1f} "
                  f"{r['attend_gflops']:11.1f} {r['ratio']:6.2f}  {r['torch_kernel']}/{r['attend_backend']}",
                  flush=True)
    worst = min(rows, key=lambda r: r["ratio"])
    geo = 1.0
    for r in rows:
        geo *= r["ratio"]
    print(f"attend vs torch SDPA: geometric mean {geo ** (1 / len(rows)):.2f}x, lowest {worst['ratio']:.2f}x "
          f"(S={worst['seqlen']} D={worst['head_dim_qk']}/{worst['head_dim_v']} causal={worst['causal']} "
          f"{worst['dtype']} {worst['pass_']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(format="attend-bench-sdpa/1", torch=torch.__version__, threads=threads,
                           rows=[{("pass" if k == "pass_" else k): v for k, v in r.items()} for r in rows]), f,
                      indent=1)


if __name__ == "__main__":
    main()
