"""Sweep the split-KV decode kernel's launch config on the GPU; print the best per shape last.

Shapes: the decode targets (bf16, Hq=32, Hkv=8, D=128): B=16 at L=8k and 64k, B=1 at 8k
and 128k, contiguous and (with --pages) paged. Several caches are rotated so that their total
exceeds twice the 60 MB L2. Every time is a CUDA-graph replay of at least 8 calls cycling the
rotated caches (kernels only, as a serving loop that captures its decode step runs them); the public call is
also timed from Python. SDPA flash / cuDNN are timed the same way in the same run.

Usage: PYTHONPATH=. python3 tools/decode_sweep.py [--defaults-only] [--pages 16 64 256]
       [--shapes 16:8192 1:131072]
"""

import argparse
import itertools
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.bench.bench import _graph_of, _to_paged
from tileflash.ops.triton import decode as dec


def timed(calls, sets, graph_calls=8, rep=40):
    """Median ms per call of a CUDA graph replaying max(graph_calls, sets) calls, cycling the
    `sets` calls (one per cache), as `tileflash bench --decode` times them."""
    n = max(graph_calls, sets)
    return do_bench(_graph_of([calls[i % sets] for i in range(n)]), warmup=10, rep=rep, return_mode="median") / n


FLAGS = {"asm": ("table_asm", True), "noasm": ("table_asm", False), "fresh": ("reuse_counter", False),
         "mp": ("multi_page", True), "nomp": ("multi_page", False), "novec": ("table_vec", False), "nopdl": ("pdl", 0), "pdl1": ("pdl", 1), "pdl2": ("pdl", 2),
         "pdl3": ("pdl", 3), "sk0": ("skew", 0), "sk1": ("skew", 1), "sk2": ("skew", 2), "sk3": ("skew", 3)}


def parse_config(text):
    """'128/4/3/asm' -> dict(block_n=128, num_warps=4, num_stages=3, table_asm=True)."""
    parts = text.split("/")
    cfg = dict(zip(("block_n", "num_warps", "num_stages"), map(int, parts[:3])))
    cfg.update(("merge_rows", int(f[2:])) if f.startswith("mr") else ("min_split", int(f[2:]))
               if f.startswith("ms") else FLAGS[f] for f in parts[3:])
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--defaults-only", action="store_true", help="time only the default config (no sweep)")
    ap.add_argument("--pages", type=int, nargs="*", default=[], help="also sweep paged caches of these page sizes")
    ap.add_argument("--shapes", nargs="*", default=["16:8192", "16:65536", "1:8192", "1:131072"], help="B:L")
    ap.add_argument("--waves", type=int, nargs="*", default=[2, 4, 8], help="target programs per SM (split counts)")
    ap.add_argument("--configs", nargs="*", default=None,
                    help="contiguous configs as BLOCK_N/WARPS/STAGES[/flag...]; flags: asm, noasm (force the "
                         "block-table lookup through inline PTX or tl.load), mp, nomp (tiles of several whole pages or not), novec (their lookups one entry per load), fresh (a zeroed counter per call), "
                         "nopdl, pdl1, pdl2, pdl3 (programmatic dependent launch off, or on with the trigger at the "
                         "start, after the key loop, at exit), sk0-sk3 (tile order: in order, rotated by program, by batch entry, every 37th tile), mrN (N merge rows per load), msN (splits of at least N keys)")
    ap.add_argument("--page-configs", nargs="*", default=None, help="paged configs, the same syntax (every page size)")
    args = ap.parse_args()
    dev, dt, h, hk, d = "cuda", torch.bfloat16, 32, 8, 128
    contiguous = [dict(block_n=bn, num_warps=w, num_stages=s)
                  for bn, w, s in ((128, 8, 3), (128, 4, 3), (64, 4, 3), (64, 4, 4), (64, 8, 3))]
    paged = {16: [(16, 2, 8), (16, 4, 8), (32, 2, 6), (64, 2, 4), (64, 4, 3), (128, 4, 3)],
             64: [(64, 4, 3), (64, 2, 4), (64, 4, 4), (32, 2, 6)],
             256: [(128, 4, 3), (128, 8, 3), (64, 4, 3), (64, 2, 4), (64, 4, 4)]}
    waves_list = tuple(args.waves)
    if args.configs:
        contiguous = [parse_config(c) for c in args.configs]
    if args.page_configs:
        paged = {p: [parse_config(c) for c in args.page_configs] for p in args.pages}
    lines = []
    t_start = time.time()
    for spec in args.shapes:
        b, n = (int(x) for x in spec.split(":"))
        kv_bytes = 2 * b * n * hk * d * 2
        sets = int(min(16, max(1, -(-240e6 // kv_bytes))))
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(b, 1, h, d, device=dev, generator=g).to(dt)
        caches = [(torch.randn(b, n, hk, d, device=dev, generator=g).to(dt),
                   torch.randn(b, n, hk, d, device=dev, generator=g).to(dt)) for _ in range(sets)]
        ref = F.scaled_dot_product_attention(q.transpose(1, 2), caches[0][0].transpose(1, 2),
                                             caches[0][1].transpose(1, 2), enable_gqa=True).transpose(1, 2)

        def tbs(ms):
            return kv_bytes / ms * 1e-9

        for page in [0] + list(args.pages):
            if page:
                pc = [_to_paged(k_, v_, page, torch.Generator().manual_seed(page)) for k_, v_ in caches]
                mem = [(kp, vp, dict(block_table=t)) for kp, vp, t in pc]
                configs = [c if isinstance(c, dict) else dict(block_n=c[0], num_warps=c[1], num_stages=c[2])
                           for c in paged.get(page, [(128, 8, 3)])]
            else:
                mem = [(k_, v_, {}) for k_, v_ in caches]
                configs = contiguous
            if args.defaults_only:
                configs, waves = [None], (None,)  # decode_forward's own choice of config and splits
            else:
                waves = waves_list
            best = None
            for wv, cfg in itertools.product(waves, configs):
                if cfg is not None:   # what decode_forward runs: the page size's defaults, then the flags
                    cfg = {**dec.decode_config(d, page), **cfg}
                min_split = (cfg or {}).get("min_split", dec.decode_config(d, page).get("min_split", 256))
                ns = 0 if wv is None else dec.choose_num_splits(b, hk, n, q.device, waves=wv, min_split=min_split)

                def call(i, cfg=cfg, ns=ns):
                    k_, v_, kw = mem[i]
                    return dec.decode_forward(q, k_, v_, None, d ** -0.5, False, num_splits=ns, max_seqlen_k=n,
                                              config=cfg, **kw)[0]
                try:
                    err = (call(0).float() - ref.float()).abs().max().item()
                    assert err < 2e-2, f"max error {err}"
                    ms = timed([lambda i=i: call(i) for i in range(sets)], sets)
                except Exception as e:  # noqa: BLE001
                    print(f"B={b} L={n} page={page} waves={wv} {cfg}: failed {type(e).__name__}: {str(e)[:160]}",
                          flush=True)
                    continue
                print(f"B={b} L={n} page={page} waves={wv} splits={ns} {cfg}: {ms * 1e3:.1f} us "
                      f"{tbs(ms):.2f} TB/s", flush=True)
                if best is None or ms < best[0]:
                    best = (ms, wv, ns, cfg)

            def public(i):
                k_, v_, kw = mem[i]
                return tileflash.flash_attn_with_kvcache(q, k_, v_, cache_seqlens=n, **kw)
            it = [0]

            def public_eager():
                it[0] += 1
                return public(it[0] % sets)
            pub_graph = timed([lambda i=i: public(i) for i in range(sets)], sets)
            pub_eager = do_bench(public_eager, warmup=10, rep=60, return_mode="median")
            sd = {}
            if not page:
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    def sdpa(i, be=be):
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(q.transpose(1, 2), caches[i][0].transpose(1, 2),
                                                                  caches[i][1].transpose(1, 2), enable_gqa=True)
                    try:
                        sd[name] = f"{tbs(timed([lambda i=i: sdpa(i) for i in range(sets)], sets)):.2f}"
                    except Exception as e:  # noqa: BLE001
                        sd[name] = f"failed ({type(e).__name__})"
            lines.append(f"| {b} | {n} | {page or '-'} | {best[1]} ({best[2]} splits) {best[3]} | {tbs(best[0]):.2f} | "
                         f"{tbs(pub_graph):.2f} | {tbs(pub_eager):.2f} | {sd.get('flash', '')} | {sd.get('cudnn', '')} |")
            print(lines[-1], f"[{time.time() - t_start:.0f} s]", flush=True)
            del mem
        del caches
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; KV TB/s (K+V bytes read once / median time); "
          f"defaults: contiguous {dec.decode_config(d)}, " + ", ".join(
              f"page {p}: {dec.decode_config(d, p)}" for p in args.pages))
    print("| B | L | page | best waves, config | best, graph | public call, graph | public call, eager "
          "| SDPA flash, graph | SDPA cuDNN, graph |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
