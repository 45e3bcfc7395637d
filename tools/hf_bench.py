"""Hugging Face transformers benchmark: a ~1B Llama-shaped model (random weights, bf16) with
attn_implementation="tileflash" against "sdpa" (and "flash_attention_2" where flash-attn imports).

* generate: greedy ``model.generate`` with transformers' KV cache, batch 1 and 8, prompts of
  each --prompt-len, --new-tokens new ones; new tokens per second (batch x new / time).
* train: forward + backward of the causal-LM loss (no optimizer step: it is the same for every
  attention) at batch 1 x 8k and 1 x 16k tokens; ms per step (median of --repeats after a warm-up).

Prints one table with the ratios to sdpa, plus the versions. Needs CUDA and transformers 5.x.

    python tools/hf_bench.py                       # Llama-3.2-1B shape
    python tools/hf_bench.py --layers 4 --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def llama_config(args):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=32768,
        rope_theta=500000.0, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=None)


def timed(fn, repeats):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def profile(model, impls, args):
    """Where one B=1 generate's time goes, per implementation: torch.profiler's top host ops and
    CUDA kernels, and cProfile's top Python functions (by own time)."""
    import cProfile
    import io
    import pstats

    ids = torch.randint(1, args.vocab, (1, args.prompt_len[0]), device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16, do_sample=False,
              pad_token_id=0)
    import triton.compiler.compiler as tcc

    compiles = []  # seconds of each triton compile (the JIT's in-memory cache missed)
    real_compile = tcc.compile

    def counting_compile(*a, **k):
        t0 = time.perf_counter()
        try:
            return real_compile(*a, **k)
        finally:
            compiles.append(time.perf_counter() - t0)
    import triton.compiler

    tcc.compile = triton.compiler.compile = counting_compile  # (the JIT imports it from triton.compiler per call)
    with open(args.profile, "w") as f:
        for impl in impls:
            model.set_attn_implementation(impl)
            model.eval()
            with torch.no_grad():
                for run in range(5):  # does a later run get faster, and does triton compile during it?
                    n0, c0 = len(compiles), sum(compiles)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    model.generate(ids, **kw)
                    torch.cuda.synchronize()
                    t = time.perf_counter() - t0
                    line = (f"{impl} run {run}: {t * 1e3:.1f} ms, {len(compiles) - n0} triton compiles "
                            f"({sum(compiles) - c0:.2f} s)")
                    print(line, flush=True)
                    f.write(line + "\n")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
                    model.generate(ids, **kw)
                    torch.cuda.synchronize()
                pr = cProfile.Profile()
                pr.enable()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
            f.write(f"==== {impl}: generate B=1 prompt {args.prompt_len[0]} 16 new: {t * 1e3:.1f} ms ====\n")
            f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30) + "\n")
            f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15) + "\n")
            f.write(s.getvalue() + "\n")
            print(f"profiled {impl}: {t * 1e3:.1f} ms", flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--prompt-len", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--train-tokens", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", nargs="+", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", metavar="FILE", default=None,
                    help="instead of the table: profile one B=1 generate per implementation (torch.profiler and "
                         "cProfile, first --prompt-len, 16 new tokens) and write the top entries to FILE")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("hf_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.quick:
        args.new_tokens, args.train_tokens, args.repeats, args.prompt_len = 16, [2048], 1, [512]
    import transformers

    import tileflash.integrations.transformers as tf_hf

    impls = args.impls or ["sdpa", tf_hf.register()]
    if args.impls is None:
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():  # (FA4's flash_attn.cute alone is not flash-attn 2)
            impls.append("flash_attention_2")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(llama_config(args), attn_implementation="sdpa")
    model.to(device="cuda", dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    if args.profile:
        return profile(model, impls, args)
    results = {}
    for impl in impls:
        model.set_attn_implementation(impl)
        model.eval()
        for plen in args.prompt_len:
            for b in args.batches:
                ids = torch.randint(1, args.vocab, (b, plen), device="cuda")
                mask = torch.ones_like(ids)
                kw = dict(attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                          do_sample=False, pad_token_id=0)
                with torch.no_grad():
                    t = timed(lambda: model.generate(ids, **kw), args.repeats)
                results[("generate", plen, b, impl)] = b * args.new_tokens / t
                print(f"generate prompt {plen} B={b} {impl}: {b * args.new_tokens / t:.1f} tok/s", flush=True)
        model.train()
        for n in args.train_tokens:
            ids = torch.randint(1, args.vocab, (1, n), device="cuda")

            def step():
                loss = model(ids, labels=ids, use_cache=False).loss
                loss.backward()
                for p in model.parameters():
                    p.grad = None
            torch.cuda.reset_peak_memory_stats()
            t = timed(step, args.repeats)
            results[("train", n, impl)] = (t * 1e3, torch.cuda.max_memory_allocated() / 2**30)
            print(f"train 1x{n} {impl}: {t * 1e3:.1f} ms/step, peak {results[('train', n, impl)][1]:.1f} GiB",
                  flush=True)
    print(f"\nLlama-shaped model, {n_params / 1e9:.2f}B parameters, {args.layers} layers, hidden 2048, 32/8 heads, "
          f"head dim 64, bf16, random weights. {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"| what | {' | '.join(impls)} | " + " | ".join(f"{i}/sdpa" for i in impls[1:]) + " |")
    print("|---" * (2 * len(impls)) + "|")
    for plen in args.prompt_len:
        for b in args.batches:
            v = [results[("generate", plen, b, i)] for i in impls]
            print(f"| generate B={b}, tok/s (prompt {plen}, {args.new_tokens} new) | "
                  + " | ".join(f"{x:.1f}" for x in v) + " | " + " | ".join(f"{x / v[0]:.2f}" for x in v[1:]) + " |")
    for n in args.train_tokens:
        v = [results[("train", n, i)][0] for i in impls]
        print(f"| train fwd+bwd 1x{n}, ms/step | " + " | ".join(f"{x:.1f}" for x in v) + " | "
              + " | ".join(f"{v[0] / x:.2f}" for x in v[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
