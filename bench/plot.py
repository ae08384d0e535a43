#!/usr/bin/env python3
"""GFLOP/s against sequence length: attend's implementations, the unfused
OpenBLAS baseline and (when given) PyTorch's SDPA, with the sgemm peak of the
same run as a line. One panel per pass.

    bench/plot.py build/bench/scaling.json [--sdpa build/bench/sdpa-scaling.json] -o scaling.png

The first file is `attend bench --seqlens 512,...,8192 --tokens N --json`
(format attend-bench/1); the second `python/bench_sdpa.py --scaling --json`
(torch's backward is its forward+backward time minus its forward time). Run
it with scripts/python-venv.sh bench, which provides matplotlib.
"""

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PASSES = ("forward", "backward")


def attend_series(report):
    """{(pass, label): [(S, GFLOP/s)]} for non-causal f32 rows."""
    series = defaultdict(list)
    for r in report["rows"]:
        if r["causal"] or r["seqlen_q"] != r["seqlen_kv"] or any(t in r["problem"] for t in (" bf16", " f16")):
            continue
        series[(r["pass"], r["impl"])].append((r["seqlen_q"], r["gflops"]))
    return series


def sdpa_series(report, series):
    by_key = {(r["seqlen"], r["pass"]): r for r in report["rows"] if not r["causal"] and r["dtype"] == "f32"}
    for (s, p), r in sorted(by_key.items()):
        if p == "forward":
            series[("forward", "torch sdpa")].append((s, r["torch_gflops"]))
            series[("forward", "attend (torch)")].append((s, r["attend_gflops"]))
            continue
        fwd = by_key.get((s, "forward"))
        if fwd is None:
            continue
        # Backward FLOPs over backward time: (fwd+bwd) minus forward, both measured.
        total_flops = r["torch_gflops"] * r["torch_ms"]
        fwd_flops = fwd["torch_gflops"] * fwd["torch_ms"]
        for side, label in (("torch", "torch sdpa"), ("attend", "attend (torch)")):
            t_bwd = r[f"{side}_ms"] - fwd[f"{side}_ms"]
            if t_bwd > 0:
                series[("backward", label)].append((s, (total_flops - fwd_flops) / t_bwd))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("attend_json", help="attend bench --json output (a --seqlens sweep)")
    ap.add_argument("--sdpa", help="python/bench_sdpa.py --scaling --json output")
    ap.add_argument("-o", "--output", default="scaling.png")
    args = ap.parse_args()
    with open(args.attend_json) as f:
        report = json.load(f)
    series = attend_series(report)
    if args.sdpa:
        with open(args.sdpa) as f:
            sdpa_series(json.load(f), series)
    head = report["header"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, p in zip(axes, PASSES):
        for (pass_, label), points in sorted(series.items()):
            if pass_ != p or not points:
                continue
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", label=label)
        ax.axhline(head["sgemm_gflops"], color="gray", linestyle="--", label=f"sgemm peak ({head['sgemm_gflops']:.0f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length S (B*S fixed)")
        ax.set_title(f"{p} (f32, non-causal)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("GFLOP/s")
    fig.suptitle(f"attend bench: {head['threads']} threads, flash {head['flash_isa']}, {head['blas_config'][:60]}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot: {args.output}")


if __name__ == "__main__":
    main()
