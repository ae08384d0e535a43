#!/usr/bin/env python3
"""attend.torch forward+backward vs PyTorch's math path on the same tensors.

The baseline is what torch 1.13 offers on the CPU (it has no fused SDPA):
softmax(q k^T * scale + mask) v through autograd, materialising the scores. On
torch 2.x the table adds torch's own F.scaled_dot_product_attention (its CPU
flash kernel where it applies) as a second baseline.
Both sides run forward + backward of the same loss on the same float32 leaves,
in the same process, with the same thread count; the ratio is baseline time /
attend time (> 1: attend is faster).

    PYTHONPATH=build/python /usr/bin/python3 python/bench_torch.py [--quick]
    PYTHONPATH=build/python scripts/python-venv.sh torch2 python/bench_torch.py [--quick]
"""

import argparse
import os
import sys
import time

# This file sits next to the *source* package python/attend, which has no
# compiled _C: drop its directory so that PYTHONPATH's built package is imported.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import attend  # noqa: E402
from attend.torch import scaled_dot_product_attention  # noqa: E402


def math_sdpa(q, k, v, causal):
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    if causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def best_of(fn, reps):
    fn()  # warm-up (thread pools, allocator)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def step(attn, q, k, v, g, causal):
    for t in (q, k, v):
        t.grad = None
    out = attn(q, k, v, causal)
    out.backward(g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer repetitions")
    args = ap.parse_args()
    shapes = [(1, 8, 512, 64, 64, False), (1, 8, 512, 64, 64, True), (1, 8, 1024, 64, 64, True),
              (1, 8, 512, 192, 128, True)]
    if args.quick:
        shapes = [(1, 4, 256, 64, 64, False), (1, 4, 256, 64, 64, True)]
    reps = 2 if args.quick else 3
    print(f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, attend flash ISA {attend.flash_isa()}")
    torch_sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    print(f"{'B':>2} {'H':>3} {'S':>5} {'D/Dv':>8} {'causal':>6} {'math ms':>9} {'attend ms':>10} "
          f"{'ratio':>6} backend" + ("   torch-sdpa ms  sdpa/attend" if torch_sdpa else ""))
    ratios = []
    for b, h, s, d, dv, causal in shapes:
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(b, h, s, d, generator=gen).requires_grad_() for _ in range(2))
        v = torch.randn(b, h, s, dv, generator=gen).requires_grad_()
        g = torch.randn(b, h, s, dv, generator=gen)
        t_math = best_of(lambda: step(math_sdpa, q, k, v, g, causal), reps)
        t_att = best_of(lambda: step(lambda q, k, v, c: scaled_dot_product_attention(q, k, v, is_causal=c),
                                     q, k, v, g, causal), reps)
        ratio = t_math / t_att
        ratios.append(ratio)
        print(f"{b:>2} {h:>3} {s:>5} {f'{d}/{dv}':>8} {str(causal):>6} {t_math * 1e3:9.1f} {t_att * 1e3:10.1f} "
              f"{ratio:6.2f} {attend.torch.last_selection().selected:<8}", end="")
        if torch_sdpa:
            t_sdpa = best_of(lambda: step(lambda q, k, v, c: torch_sdpa(q, k, v, is_causal=c), q, k, v, g, causal),
                             reps)
            print(f" {t_sdpa * 1e3:14.1f} {t_sdpa / t_att:12.2f}", end="")
        print()
    geo = 1.0
    for r in ratios:
        geo *= r
    print(f"forward+backward speed-up vs the math path (geometric mean): {geo ** (1 / len(ratios)):.2f}x")


if __name__ == "__main__":
    main()
