"""Forward block-config sweep on the GPU, pointer loads against tensor descriptors (TMA).

Usage: PYTHONPATH=. python3 tools/fwd_sweep.py D CAUSAL(0/1) N [N ...] [--dtype bfloat16] [--tma-only]
For each (BLOCK_M, BLOCK_N, warps, stages) x {pointers, TMA} prints the forward TFLOP/s and the
max difference from the default config's output, with cuDNN SDPA timed in the same run; the best
config per path is printed last. Shapes follow gpu_check: B*N = 16k tokens, H = 2048 / D.
"""

import argparse
import itertools

import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tileflash.ops.triton import forward as F

TILES = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3),
         (64, 64, 4, 3), (64, 128, 4, 3), (128, 32, 4, 4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("d", type=int)
    ap.add_argument("causal", type=int)
    ap.add_argument("sizes", type=int, nargs="+")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--tma-only", action="store_true", help="sweep the tensor-descriptor path only")
    args = ap.parse_args()
    paths = (True,) if args.tma_only else (False, True)
    d, causal, dtype = args.d, bool(args.causal), getattr(torch, args.dtype)
    score = {}
    for n in args.sizes:
        b, h = 16384 // n, 2048 // d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1)
        ref, _ = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            ms = do_bench(lambda: Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=25, rep=100)
        cudnn = flops / ms * 1e-9
        print(f"N={n} cuDNN {cudnn:.0f} TFLOP/s", flush=True)
        for tile, tma in itertools.product(TILES, paths):
            conf = dict(BLOCK_M=tile[0], BLOCK_N=tile[1], num_warps=tile[2], num_stages=tile[3], USE_TMA=tma)
            try:
                out, _ = F.flash_attn_forward(q, k, v, d ** -0.5, causal, config=conf)
                err = (out.float() - ref.float()).abs().max().item()
                ms = do_bench(lambda: F.flash_attn_forward(q, k, v, d ** -0.5, causal, config=conf),
                              warmup=25, rep=100)
            except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
                print(f"N={n} {tile} tma={tma}: FAILED {repr(e)[:120]}", flush=True)
                continue
            t = flops / ms * 1e-9
            score.setdefault((tile, tma), []).append(t / cudnn)
            print(f"N={n} {tile} tma={int(tma)}: {t:.0f} TFLOP/s ({t / cudnn:.2f}x cuDNN) err={err:.2g}", flush=True)
    for tma in paths:
        cands = [kv for kv in score.items() if kv[0][1] == tma and len(kv[1]) == len(args.sizes)]
        if cands:
            best = max(cands, key=lambda kv: sum(kv[1]))
            print(f"best D={d} causal={int(causal)} tma={int(tma)}: {best[0][0]}: "
                  + ", ".join(f"{x:.2f}x" for x in best[1]) + " cuDNN")


if __name__ == "__main__":
    main()
