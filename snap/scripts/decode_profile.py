"""Where a decode call's time goes, on the GPU: public call vs the kernels alone vs CUDA-graph replay,
plus host time per call (no sync). bf16, Hq=32, Hkv=8, D=128.

Usage: PYTHONPATH=. python3 scripts/decode_profile.py B:L [B:L ...]
"""

import sys

import torch
from triton.testing import do_bench

import tileflash
from host_profile import host_us  # scripts/ is on sys.path when run as a script
from tileflash.bench.bench import _graph_of
from tileflash.ops import decode as Dk


def main():
    for spec in sys.argv[1:] or ["16:8192", "1:8192", "1:131072"]:
        b, n = (int(x) for x in spec.split(":"))
        h, hk, d = 32, 8, 128
        sets = int(min(16, max(1, -(-240e6 // (2 * b * n * hk * d * 2)))))
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        caches = [(torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16),
                   torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * b * n * hk * d * 2
        it = [0]

        def pick():
            it[0] += 1
            return caches[it[0] % sets]

        def public():
            k, v = pick()
            return tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=n)

        def public_t():
            k, v = pick()
            return tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)

        def kernels():
            k, v = pick()
            return Dk.decode_forward(q, k, v, seqlens, d ** -0.5, False, max_seqlen_k=n)

        res = {}
        for name, fn in (("public(int)", public), ("public(tensor)", public_t), ("decode_forward", kernels)):
            fn()
            res[name] = do_bench(fn, warmup=25, rep=100)
            res[name + " host"] = host_us(fn) * 1e-3
        k0, v0 = caches[0]
        res["graph (1 cache)"] = do_bench(_graph_of([lambda: tileflash.flash_attn_with_kvcache(
            q, k0, v0, cache_seqlens=seqlens)]), warmup=25, rep=100)
        splits = Dk.choose_num_splits(b, hk, n, q.device)
        print(f"B={b} L={n} splits={splits} caches={sets}: " + ", ".join(
            f"{k_} {v_ * 1e3:.0f} us" + ("" if "host" in k_ else f" ({kv_bytes / v_ * 1e-9:.2f} TB/s)")
            for k_, v_ in res.items()), flush=True)


def cprofile(b=1, n=8192):
    """Top host functions of the public call (read-only, int cache_seqlens) and of decode_forward."""
    import cProfile
    import pstats

    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, n, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for name, fn in (("public call", lambda: tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=n)),
                     ("decode_forward", lambda: Dk.decode_forward(q, k, v, None, 128 ** -0.5, False, max_seqlen_k=n))):
        for _ in range(50):
            fn()
        host = host_us(fn, 500)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"== {name}: {host:.0f} us host per call without the profiler")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cprofile"]:
        cprofile()
    else:
        main()
