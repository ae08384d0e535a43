#!/usr/bin/env python3
"""PyTorch's CUDA scaled_dot_product_attention on its cuDNN and flash backends.

The same-shape baseline for bench/cuda_bench's cudnn rows: B=4, H=16,
S in {1024, 2048, 4096} (--quick: 1024), D in {64, 128}, bf16, causal and not,
forward (under torch.no_grad) and backward (the autograd backward alone, timed
after a retained forward). Timed with CUDA events: best and median of --reps
calls after --warmup; TFLOP/s from the best, counted as cuda_bench counts
(runtime/flops.h): visible (query, key) pairs x heads x (forward 4*D, backward
10*D), causal keeping (S+1)/(2S) of the pairs. Rows print in cuda_bench's
column order with backend torch-cudnn / torch-flash.

    python3 python/bench_sdpa_cuda.py [--quick] [--reps N] [--warmup N] [--json FILE]

Needs torch built with CUDA and a GPU; without them it says why and exits 77
(the device check script treats that as skipped, not failed). A backend that
PyTorch refuses for a shape prints a "skipped" row with its message.
"""

import argparse
import json
import sys


def visible_pairs(s, causal):
    return s * (s + 1) // 2 if causal else s * s


def flops(b, h, s, d, causal, backward):
    return b * h * visible_pairs(s, causal) * (10 if backward else 4) * d


def time_ms(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    n = len(times)
    median = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
    return times[0], median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S=1024 only")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"bench_sdpa_cuda: skipped: torch with torch.nn.attention is not importable ({e})")
        return 77
    if not torch.cuda.is_available():
        print(f"bench_sdpa_cuda: skipped: torch {torch.__version__} sees no CUDA device")
        return 77

    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print(f"timing: best and median of {args.reps} calls after {args.warmup} warm-up calls, CUDA events")
    backends = {"torch-cudnn": SDPBackend.CUDNN_ATTENTION, "torch-flash": SDPBackend.FLASH_ATTENTION}
    header = f"{'backend':<12} {'pass':<8}  {'dtype':<5} {'B':>2} {'H':>3} {'S':>5} {'D':>4}  {'causal':<6}  " \
             f"{'best_ms':>9}  {'median_ms':>9}  {'TFLOP/s':>8}"
    print(header)
    rows = []
    b, h = 4, 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d in (64, 128):
        for s in ((1024,) if args.quick else (1024, 2048, 4096)):
            for causal in (False, True):
                shape = (b, h, s, d)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                for name, kernel in backends.items():
                    prefix = f"{name:<12} %-8s  {'bf16':<5} {b:>2} {h:>3} {s:>5} {d:>4}  {'yes' if causal else 'no':<6}"
                    try:
                        with sdpa_kernel([kernel]):
                            def forward():
                                with torch.no_grad():
                                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                            fb, fm = time_ms(torch, forward, args.warmup, args.reps)
                            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                            def backward():
                                torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)

                            bb, bm = time_ms(torch, backward, args.warmup, args.reps)
                    except RuntimeError as e:
                        message = str(e).splitlines()[0] if str(e) else type(e).__name__
                        print(prefix % "both" + f"  skipped: {message}")
                        continue
                    for pass_, best, median in (("forward", fb, fm), ("backward", bb, bm)):
                        tflops = flops(b, h, s, d, causal, pass_ == "backward") / (best * 1e-3) / 1e12
                        print(prefix % pass_ + f"  {best:9.3f}  {median:9.3f}  {tflops:8.2f}")
                        rows.append({"backend": name, "pass": pass_, "dtype": "bf16", "B": b, "H": h, "S": s, "D": d,
                                     "causal": causal, "best_ms": best, "median_ms": median, "tflops": tflops})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
