#!/usr/bin/env python3
"""A real model's prefill and decode on attend against transformers' SDPA.

One process, one set of random weights (no download): a Hugging Face causal
LM built from a config (default: Qwen2-0.5B's shape — 24 layers, hidden 896,
heads 14/2, head dim 64, bfloat16), run with attn_implementation="attend"
and "sdpa" alternately, the same inputs, the same thread count. Per context
length (default 4,096 and 12,288 tokens):

- prefill: one forward over the whole prompt (batch 1, no padding, causal),
  as generate() runs it; tokens/s. The first prefill of each implementation
  in the process is reported apart (it pays allocation, page faults and any
  one-time setup), then the best of --reps;
- decode: --decode-tokens single-token steps on the prefill's KV cache
  (transformers' DynamicCache), ms per token, best of --reps.

ratio = sdpa time / attend time (> 1: attend is faster).

--kv8 int8|float8_e4m3fn|float8_e5m2 adds a third row, "kv8": attend on an
8-bit attend.integrations.transformers.QuantizedKVCache (prefill quantizes
into it; decode reads the codes), with the caches' bytes. --synthetic skips
the prefills: each cache is filled with random K/V of the context length
(per layer, through the cache's own update, so the 8-bit one quantizes), and
only decode is timed, so long contexts fit a small machine; --batch B then
decodes B sequences a step (a serving batch; tokens/s counts all of them).

Needs transformers
>= 5 and PYTHONPATH=build/python (the in-tree package) or an installed attend:

    PYTHONPATH=build/python scripts/python-venv.sh torch2 python/bench_transformers.py
    ... --layers 4 --contexts 1024 --reps 1     (a quick look)
    ... --json model.json                       (the rows, machine-readable)
"""

import argparse
import inspect
import json
import os
import platform
import sys
import time

# This file sits next to the *source* package python/attend, which has no
# compiled _C: drop its directory so that PYTHONPATH's built package is imported.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import torch  # noqa: E402
import transformers  # noqa: E402

import attend  # noqa: E402
import attend.integrations.transformers  # noqa: E402,F401  (registers "attend")

# Qwen2-0.5B's published config (config.json of Qwen/Qwen2-0.5B), less the
# weights: the attention problem per layer is GQA 14/2, D=64, causal.
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
IMPLS = ("attend", "sdpa")
KV8 = "kv8"  # attend on a QuantizedKVCache (--kv8)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_model(args):
    cfg = transformers.Qwen2Config(**{**QWEN2_05B, "num_hidden_layers": args.layers})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                          dtype=getattr(torch, args.dtype))
    return model.eval()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def prefill(model, ids, cache=None):
    extra = {_cache_kw(model): cache} if cache is not None else {}
    return model(input_ids=ids, use_cache=True, logits_to_keep=1, **extra)


def new_cache(impl, args):
    """A fresh cache for impl: None (the model's default DynamicCache) or the
    8-bit QuantizedKVCache."""
    if impl != KV8:
        return None
    from attend.integrations.transformers import QuantizedKVCache
    return QuantizedKVCache(None, args.kv8)


def synthetic_cache(impl, args, model, n, gen):
    """A cache holding n tokens of random K/V per layer (the same values for
    every impl: the generator is re-seeded), filled through its own update."""
    cfg = model.config
    cache = new_cache(impl, args)
    if cache is None:  # (not `or`: an empty Cache has no layers yet and is falsy)
        cache = transformers.DynamicCache()
    g = torch.Generator().manual_seed(7)
    d = cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(args.batch, cfg.num_key_value_heads, n, d, generator=g).to(model.dtype)
        v = torch.randn(args.batch, cfg.num_key_value_heads, n, d, generator=g).to(model.dtype)
        cache.update(k, v, layer)
    return cache


def cache_bytes(cache):
    """Bytes of a cache's stored tokens (codes and scales for the 8-bit one)."""
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


def _cache_kw(model):
    """transformers renamed past_key_values to cache (5.2x); either is taken."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out):
    return out.cache if hasattr(out, "cache") else out.past_key_values


def decode(model, cache, next_id, steps):
    """steps single-token forwards on the prefill's cache (each repetition
    prefills afresh, so every decode starts at the same context); returns
    seconds per token."""
    kw = _cache_kw(model)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=next_id, use_cache=True, **{kw: cache})
        next_id = out.logits[:, -1:].argmax(-1)
        cache = _cache_of(out)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=QWEN2_05B["num_hidden_layers"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 12288])
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions after the first call (best is kept)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--kv8", choices=["int8", "float8_e4m3fn", "float8_e5m2"],
                    help="also run attend on an 8-bit QuantizedKVCache of this dtype")
    ap.add_argument("--synthetic", action="store_true",
                    help="fill the caches with random K/V instead of prefilling; time decode only")
    ap.add_argument("--batch", type=int, default=1, help="sequences per decode step (with --synthetic)")
    args = ap.parse_args()
    if args.batch != 1 and not args.synthetic:
        ap.error("--batch needs --synthetic (the prefills are of one prompt)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.layers < 1 or args.decode_tokens < 1 or args.reps < 1 or min(args.contexts) < 1 or args.batch < 1:
        ap.error("--layers, --decode-tokens, --reps, --contexts and --batch must be positive")

    print(f"# cpu: {cpu_model()}; threads {torch.get_num_threads()}; torch {torch.__version__}; "
          f"transformers {transformers.__version__}; attend {attend.__version__}")
    print(f"# model: Qwen2-0.5B shape, {args.layers} layers, heads 14/2, D=64, {args.dtype}, random weights")
    model = build_model(args)
    gen = torch.Generator().manual_seed(1)
    impls = IMPLS + ((KV8,) if args.kv8 else ())
    if args.kv8:
        print(f"# kv8: attend on QuantizedKVCache({args.kv8}); attend and sdpa on the {args.dtype} DynamicCache")
    if args.synthetic:
        return synthetic_decode(model, impls, args, gen)
    rows = []
    header = f"{'context':>8} {'impl':>7} {'first prefill s':>16} {'prefill s':>10} {'prefill tok/s':>14} " \
             f"{'decode ms/tok':>14}"
    print(header)
    with torch.inference_mode():
        # A short prompt through both first: torch's own one-time costs (its
        # thread pool, GEMM set-up) then fall on neither implementation's
        # first long prefill, which keeps what that size costs the first time.
        warm = torch.randint(0, QWEN2_05B["vocab_size"], (1, 32), generator=gen)
        for impl in IMPLS:
            model.set_attn_implementation(impl)
            prefill(model, warm)
        for n in args.contexts:
            ids = torch.randint(0, QWEN2_05B["vocab_size"], (1, n), generator=gen)
            best = {impl: [float("inf"), float("inf")] for impl in impls}
            nbytes = {}
            first_s = {}
            # Alternate the implementations each repetition, so that drift of
            # the machine's clock falls on both alike.
            for rep in range(args.reps + 1):
                for impl in impls:
                    model.set_attn_implementation("attend" if impl == KV8 else impl)
                    s, out = timed(lambda: prefill(model, ids, new_cache(impl, args)))
                    nbytes[impl] = cache_bytes(_cache_of(out))
                    if rep == 0:  # the first prefill of this length
                        first_s[impl] = s
                        continue
                    best[impl][0] = min(best[impl][0], s)
                    next_id = out.logits[:, -1:].argmax(-1)
                    best[impl][1] = min(best[impl][1], decode(model, _cache_of(out), next_id,
                                                              args.decode_tokens))
            for impl in impls:
                pre, dec = best[impl]
                row = dict(context=n, impl=impl, first_prefill_s=first_s[impl], prefill_s=pre, prefill_tok_s=n / pre,
                           decode_ms_per_token=1e3 * dec, cache_bytes=nbytes[impl])
                rows.append(row)
                print(f"{n:>8} {impl:>7} {first_s[impl]:>16.3f} {pre:>10.3f} {n / pre:>14.1f} {1e3 * dec:>14.2f}"
                      f"   cache {nbytes[impl] / 2 ** 20:.1f} MiB")
            s = best["sdpa"]
            for impl in impls[:1] + impls[2:]:
                a = best[impl]
                print(f"{n:>8} {'ratio':>7} {first_s['sdpa'] / first_s[impl]:>16.2f} {s[0] / a[0]:>10.2f} "
                      f"{'':>14} {s[1] / a[1]:>14.2f}   (sdpa / {impl})")
    write_json(args, rows)


def write_json(args, rows):
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu_model(), threads=torch.get_num_threads(), layers=args.layers, dtype=args.dtype,
                           kv8=args.kv8, synthetic=args.synthetic, batch=args.batch, rows=rows), f, indent=1)


def synthetic_decode(model, impls, args, gen):
    """Decode only, on caches filled with random K/V (--synthetic)."""
    rows = []
    print(f"# batch {args.batch}: ms/tok is a step's time (one token of each sequence), tok/s counts them all")
    print(f"{'context':>8} {'impl':>7} {'decode ms/tok':>14} {'decode tok/s':>13} {'cache MiB':>10}")
    with torch.inference_mode():
        next_id = torch.randint(0, QWEN2_05B["vocab_size"], (args.batch, 1), generator=gen)
        for n in args.contexts:
            best, nbytes = {impl: float("inf") for impl in impls}, {}
            # rep 0 warms each implementation at this context (allocations, selection), untimed.
            for rep in range(args.reps + 1):
                for impl in impls:
                    model.set_attn_implementation("attend" if impl == KV8 else impl)
                    cache = synthetic_cache(impl, args, model, n, gen)
                    nbytes[impl] = cache_bytes(cache)
                    dec = decode(model, cache, next_id, args.decode_tokens)
                    if rep > 0:
                        best[impl] = min(best[impl], dec)
            for impl in impls:
                rows.append(dict(context=n, batch=args.batch, impl=impl, decode_ms_per_token=1e3 * best[impl],
                                 decode_tok_s=args.batch / best[impl], cache_bytes=nbytes[impl]))
                print(f"{n:>8} {impl:>7} {1e3 * best[impl]:>14.2f} {args.batch / best[impl]:>13.1f} "
                      f"{nbytes[impl] / 2 ** 20:>10.1f}")
            for impl in impls[:1] + impls[2:]:
                print(f"{n:>8} {'ratio':>7} {best['sdpa'] / best[impl]:>14.2f}   (sdpa / {impl} decode time)")
    write_json(args, rows)


if __name__ == "__main__":
    main()
