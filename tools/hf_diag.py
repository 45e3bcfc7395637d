"""Why is transformers' generate slower with attn_implementation="tileflash" than with "sdpa" at B=1?

Runs one B=1 greedy generate (Llama-3.2-1B shape, random weights, bf16) per variant, after a
warm-up, and prints per variant: the wall time, and the host time spent inside tileflash's
wrappers (what transformers' flash path calls), with and without a device sync before each call
(``sync``: the queue drained first, so the time inside is tileflash's own).

Variants: sdpa; tileflash; tileflash with decode PDL off (debug switch pdl=0); tileflash with the
decode-shaped route off (decode steps on the prefill kernel); tileflash with a sync before each
attention call.

    python tools/hf_diag.py [--prompt-len 4096] [--new-tokens 16] [--layers 16]
"""

from __future__ import annotations

import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    import transformers

    import tileflash.integrations.transformers as tf_hf
    from tileflash.ops import route
    from tileflash.options import DEBUG

    sys_args = argparse.Namespace(vocab=128256, layers=a.layers)
    from hf_bench import llama_config

    tf_hf.register()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(llama_config(sys_args), attn_implementation="sdpa")
    model.to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(1, 128256, (a.batch, a.prompt_len), device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
              do_sample=False, pad_token_id=0)

    inside = {"t": 0.0, "n": 0, "sync": False}
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        real = getattr(tf_hf, name)

        def timed(*args, _real=real, **kwargs):
            if inside["sync"]:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                inside["t"] += time.perf_counter() - t0
                inside["n"] += 1
        setattr(tf_hf, name, timed)

    real_shaped = route.decode_shaped
    variants = [("sdpa", "sdpa", {}), ("tileflash", "tileflash", {}), ("pdl=0", "tileflash", {"pdl": 0}),
                ("no decode route", "tileflash", {"shaped": False}), ("sync each call", "tileflash", {"sync": True}),
                ("tileflash again", "tileflash", {})]
    rows = []
    for label, impl, opt in variants:
        model.set_attn_implementation(impl)
        DEBUG.pdl = opt.get("pdl", -1)
        route.decode_shaped = real_shaped if opt.get("shaped", True) else (lambda *x, **y: False)
        inside["sync"] = opt.get("sync", False)
        route._FWD_PLANS.clear()  # (a plan keeps its route: re-decide under this variant)
        with torch.no_grad():
            model.generate(ids, **kw)
            ts = []
            for _ in range(3):
                inside["t"], inside["n"] = 0.0, 0
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                ts.append((time.perf_counter() - t0, inside["t"], inside["n"]))
        t, t_in, n = sorted(ts)[1]
        rows.append((label, t, t_in, n))
        print(f"{label}: {t * 1e3:.1f} ms per generate, {t_in * 1e3:.1f} ms inside tileflash over {n} calls "
              f"({t_in / max(n, 1) * 1e6:.0f} us/call)", flush=True)
    route.decode_shaped = real_shaped
    DEBUG.pdl = -1
    print(f"\nB={a.batch} prompt {a.prompt_len}, {a.new_tokens} new tokens, {a.layers} layers; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}")
    print("| variant | ms / generate | ms inside tileflash | calls | us / call |")
    print("|---|---|---|---|---|")
    for label, t, t_in, n in rows:
        print(f"| {label} | {t * 1e3:.1f} | {t_in * 1e3:.1f} | {n} | {t_in / max(n, 1) * 1e6:.0f} |")


if __name__ == "__main__":
    main()
