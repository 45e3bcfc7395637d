"""Does where the cache sits in memory change the decode kernel's bandwidth? (GPU experiment.)

For B=16, Hq 32, Hkv 8, D 128 bf16, several separately allocated contiguous caches (all kept
alive, so each gets memory of its own): the split kernel with the tile order as is (skew 0),
started at a tile spread by program (skew 1) or by batch entry (skew 2), or every 37th tile from
there (skew 3); the same memory read as pages of 256 through an identity block table and through
a shuffled one (pages drawn from every batch entry's memory, checked against SDPA on the gathered
cache); and SDPA cuDNN on the same tensors. CUDA-graph replays of 8 calls, as
`tileflash bench --decode` times them. Twelfth session, runs 4-8: docs/perf-notes.md section 21.

Usage: PYTHONPATH=. python3 scripts/decode_placement.py [--shapes 16:65536 16:131072] [--allocs 3]
       [--skews 0 1 2 3] [--rep 40]
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileflash.ops import decode as dec
from decode_sweep import timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["16:65536", "16:131072"], help="B:L")
    ap.add_argument("--allocs", type=int, default=3)
    ap.add_argument("--skews", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--rep", type=int, default=40, help="ms of replays per timing (do_bench rep)")
    args = ap.parse_args()
    dev, dt, h, hk, d = "cuda", torch.bfloat16, 32, 8, 128
    rows = []
    for spec in args.shapes:
        b, n = (int(x) for x in spec.split(":"))
        kv_bytes = 2 * b * n * hk * d * 2
        q = torch.randn(b, 1, h, d, device=dev, dtype=dt)
        caches = [(torch.randn(b, n, hk, d, device=dev, dtype=dt), torch.randn(b, n, hk, d, device=dev, dtype=dt))
                  for _ in range(args.allocs)]
        for a, (k, v) in enumerate(caches):
            ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 enable_gqa=True).transpose(1, 2)
            res = {}
            for name, kw, cfg in [(f"skew{s}", {}, {**dec.decode_config(d), "skew": s}) for s in args.skews] + [
                    ("ident256", dict(block_table=torch.arange(b * n // 256, device=dev, dtype=torch.int32).view(b, -1)),
                     dec.decode_config(d, 256)),
                    ("shuf256", dict(block_table=torch.randperm(b * n // 256, device=dev).int().view(b, -1)),
                     dec.decode_config(d, 256))]:
                kk = k if not kw else k.view(-1, 256, hk, d)
                vv = v if not kw else v.view(-1, 256, hk, d)

                def call(kk=kk, vv=vv, kw=kw, cfg=cfg):
                    return dec.decode_forward(q, kk, vv, None, d ** -0.5, False, max_seqlen_k=n, config=cfg, **kw)[0]
                want = ref
                if name == "shuf256":   # pages drawn from every batch entry's memory: gather them
                    t = kw["block_table"].long()
                    want = F.scaled_dot_product_attention(
                        q.transpose(1, 2), kk[t].view(b, n, hk, d).transpose(1, 2), vv[t].view(b, n, hk, d).transpose(1, 2),
                        enable_gqa=True).transpose(1, 2)
                err = (call().float() - want.float()).abs().max().item()
                assert err < 2e-2, (name, err)
                res[name] = kv_bytes / timed([call], 1, rep=args.rep) * 1e-9

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                          enable_gqa=True)
            res["cudnn"] = kv_bytes / timed([cudnn], 1, rep=args.rep) * 1e-9
            rows.append((b, n, a, res))
            print(b, n, a, {k_: round(v_, 3) for k_, v_ in res.items()}, flush=True)
        del caches
        torch.cuda.empty_cache()
    names = list(rows[0][3])
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; KV TB/s, graph of 8 calls")
    print("| B | L | alloc | " + " | ".join(names) + " |")
    print("|---" * (3 + len(names)) + "|")
    for b, n, a, res in rows:
        print(f"| {b} | {n} | {a} | " + " | ".join(f"{res[k_]:.3f}" for k_ in names) + " |")


if __name__ == "__main__":
    main()
