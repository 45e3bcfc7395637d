"""A transformers-style decode loop (the keys grow by one token per step, concatenated as a
DynamicCache does) through tileflash.flash_attn_func and SDPA: us per step, and where tileflash's
host time goes (cProfile). Prints a short table.

    python tools/decode_growth.py [--start 4096] [--steps 64]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

import tileflash


def loop(fn, b, h, hk, d, start, steps, layers=16):
    torch.manual_seed(0)
    ks = [torch.randn(b, hk, start, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    vs = [torch.randn_like(x) for x in ks]
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    new = torch.randn(b, hk, 1, d, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        for i in range(layers):
            ks[i] = torch.cat([ks[i], new], dim=2)
            vs[i] = torch.cat([vs[i], new], dim=2)
            fn(q, ks[i], vs[i])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (steps * layers) * 1e6


def tf(q, k, v):
    return tileflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args()
    for b in (1, 8):
        args = (b, 32, 8, 64, a.start, a.steps)
        loop(tf, *args[:-1], 4)
        loop(sdpa, *args[:-1], 4)
        t_tf, t_sd = loop(tf, *args), loop(sdpa, *args)
        print(f"B={b} L={a.start}+: tileflash {t_tf:.1f} us/call, sdpa {t_sd:.1f} us/call (cat included)", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    loop(tf, 1, 32, 8, 64, a.start + 1000, 8)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30)
    print(s.getvalue())


if __name__ == "__main__":
    main()
