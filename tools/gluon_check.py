"""The Hopper Gluon forward against the Triton kernel, cuDNN and SDPA-flash, in one run.

Usage: PYTHONPATH=. python3 tools/gluon_check.py [--dtype float16] [--sizes 1024 4096 16384] [--d 64 128]
       [--causal both|yes|no] [--configs 128/128/2/4/ws/p ...]
For each (D, causal, N): checks the Gluon output against the Triton kernel's (max difference) and
times both, cuDNN SDPA and SDPA-flash with do_bench (median). Shapes follow gpu_check:
B·N = 16k tokens, H = 2048 / D. The table is printed last.
"""

import argparse

import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tileflash.ops.triton import forward as F
from tileflash.ops.gluon import forward as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra Gluon tiles BLOCK_M/BLOCK_N/STAGES/warps[/la] timed beside the default, e.g. 128/64/4/8/la "
                         "(la: the LOOKAHEAD schedule; ws: the warp-specialized ping-pong kernel, BLOCK_M split in two; "
                         "free: the same without the ping-pong turns; c3: three consumer warpgroups of BLOCK_M/3 rows, "
                         "turns round robin, e.g. 192/128/2/4/c3; p: persistent (one program per SM over the tiles), "
                         "e.g. 128/128/2/4/ws/p)")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
            for n in args.sizes:
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1)
                scale = d ** -0.5
                tri_cfg = F.default_config(d, causal, tma=True)
                out_t, lse_t = F.flash_attn_forward(q, k, v, scale, causal, config=tri_cfg)
                out_g, lse_g = torch.full_like(q, float("nan")), torch.full_like(lse_t, float("nan"))
                flags = dict(HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)
                assert G.supported(q, k, v, out_g, lse_g, scale, causal, 0, flags, False, None)
                G.forward(q, k, v, out_g, lse_g, scale, causal)
                diff = (out_g.float() - out_t.float()).abs().max().item()
                ldiff = (lse_g - lse_t).abs().max().item()
                t = {}
                t["gluon"] = do_bench(lambda: G.forward(q, k, v, out_g, lse_g, scale, causal), warmup=25, rep=100)
                for spec in args.configs:
                    parts = spec.split("/")
                    bm, bn, st, w = (int(x) for x in parts[:4])
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, STAGES=st, num_warps=w, LOOKAHEAD="la" in parts[4:],
                               WS=any(f in parts[4:] for f in ("ws", "free", "c3", "p")))
                    if "c3" in parts[4:]:  # three consumers: 13 warps, 160 registers each fit without spills
                        cfg.update(CONSUMERS=3, CONSUMER_REGS=160)
                    if "free" in parts[4:]:  # the warp-specialized kernel without ping-pong turns
                        cfg["PINGPONG"] = False
                    if "p" in parts[4:]:  # persistent: one program per SM looping over the tiles
                        cfg["PERSISTENT"] = True
                    try:
                        o2, l2 = torch.full_like(q, float("nan")), torch.full_like(lse_t, float("nan"))
                        G.forward(q, k, v, o2, l2, scale, causal, cfg)
                        d2 = max((o2.float() - out_t.float()).abs().max().item(), (l2 - lse_t).abs().max().item())
                        ms = do_bench(lambda: G.forward(q, k, v, o2, lse_g, scale, causal, cfg), warmup=25, rep=100)
                        print(f"  D={d} causal={int(causal)} N={n} gluon {spec}: {flops / ms * 1e-9:.0f} TFLOP/s "
                              f"diff (out, lse) {d2:.3g}", flush=True)
                    except Exception as e:  # noqa: BLE001  (a tile that does not compile or fit is reported)
                        print(f"  D={d} causal={int(causal)} N={n} gluon {spec}: FAILED {repr(e)[:160]}", flush=True)
                t["triton"] = do_bench(lambda: F.flash_attn_forward(q, k, v, scale, causal, config=tri_cfg),
                                       warmup=25, rep=100)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    with sdpa_kernel(be):
                        t[name] = do_bench(lambda: Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                           warmup=25, rep=100)
                tf = {key: flops / ms * 1e-9 for key, ms in t.items()}
                row = (d, int(causal), n, tf["gluon"], tf["triton"], tf["cudnn"], tf["flash"], diff, ldiff)
                rows.append(row)
                print("D={} causal={} N={}: gluon {:.0f} triton {:.0f} cudnn {:.0f} flash {:.0f} TFLOP/s; "
                      "max|gluon-triton| out {:.3g} lse {:.3g}".format(*row), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; TFLOP/s (do_bench median)")
    print("| D | causal | N | gluon | triton | cuDNN | SDPA-flash | gluon/cuDNN | gluon/triton | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d, c, n, g, tr, cu, fl, diff, _ in rows:
        print(f"| {d} | {c} | {n} | {g:.0f} | {tr:.0f} | {cu:.0f} | {fl:.0f} | {g / cu:.2f} | {g / tr:.2f} | {diff:.2g} |")


if __name__ == "__main__":
    main()
