"""One decode call per provider, for Nsight Compute: kernel time and DRAM traffic of a decode step.

Usage: ncu --clock-control none --profile-from-start off --metrics M python3 scripts/ncu_decode.py
       [--shapes 1:8192 16:65536] [--providers tileflash tileflash_paged16 sdpa_cudnn sdpa_flash]
(scripts/ncu_decode.sh runs it with the metrics.) bf16, Hq 32, Hkv 8, D 128, one new token, as in
`tileflash bench --decode`. Each call runs twice to compile and warm up, then once between
cudaProfilerStart/Stop. Nsight Compute flushes the L2 before each profiled kernel (its default
cache control), so the cache is read from HBM as in the bench's rotated-cache timing.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileflash
from tileflash.bench.bench import _to_paged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["1:8192", "16:65536"], help="B:L")
    ap.add_argument("--providers", nargs="*", default=["tileflash", "tileflash_paged16", "sdpa_cudnn", "sdpa_flash"])
    a = ap.parse_args()
    dev, dt, h, hk, d = "cuda", torch.bfloat16, 32, 8, 128
    for spec in a.shapes:
        b, n = (int(x) for x in spec.split(":"))
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(b, 1, h, d, device=dev, generator=g).to(dt)
        k = torch.randn(b, n, hk, d, device=dev, generator=g).to(dt)
        v = torch.randn(b, n, hk, d, device=dev, generator=g).to(dt)
        for prov in a.providers:
            if prov.startswith("tileflash_paged"):
                kp, vp, table = _to_paged(k, v, int(prov[len("tileflash_paged"):]), torch.Generator().manual_seed(1))
                call = lambda: tileflash.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=table)  # noqa: E731
            elif prov == "tileflash":
                call = lambda: tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=n)  # noqa: E731
            else:
                be = SDPBackend.CUDNN_ATTENTION if prov == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION

                def call(be=be):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                              v.transpose(1, 2), enable_gqa=True)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            print(f"== {prov} B={b} L={n} KV bytes {2 * b * n * hk * d * 2}", flush=True)
            torch.cuda.cudart().cudaProfilerStart()
            call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
