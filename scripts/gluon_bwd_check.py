"""The Hopper Gluon backward against the Triton backward, cuDNN and SDPA-flash, in one run.

Usage: PYTHONPATH=. python3 scripts/gluon_bwd_check.py [--dtype float16] [--sizes 1024 4096 16384] [--d 64 128]
       [--configs 64/128/2/8 ...] [--nondet] [--triton-dq]
For each (D, causal, N), B·N = 16k tokens and H = 2048 / D (as gluon_check.py):
* accuracy: the Gluon dq/dk/dv against an fp32 autograd reference (flash-attn's rule: error at most
  2x that of the Triton backward, which the test suite holds to the same rule, plus 1e-3), and the
  max difference to the Triton backward;
* determinism: two Gluon runs compared bitwise;
* speed: the whole backward (delta + kernels) through ``flash_attn_backward`` for Gluon and for
  the Triton kernels (config pinned), and cuDNN / SDPA-flash backward (autograd of SDPA), do_bench
  median; TFLOP/s = 2.5 x the forward's 4·B·H·N²·D (x0.5 causal).
The table is printed last.
"""

import argparse
import os

import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tileflash.ops import backward as B
from tileflash.ops import backward_sm90 as GB
from tileflash.ops import forward as F


def ref_grads(q, k, v, do, causal, scale):
    """fp32 autograd of eager attention on batch 0 (keeps memory small)."""
    q32, k32, v32 = (x[:1].float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    s = q32 @ k32.transpose(-1, -2) * scale
    n_q, n_k = s.shape[-2], s.shape[-1]
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + (n_k - n_q), float("-inf"))
    o = torch.softmax(s, -1) @ v32
    o.backward(do[:1].float().transpose(1, 2))
    return [g.transpose(1, 2) for g in (q32.grad, k32.grad, v32.grad)]


def problem(d, n, causal, dtype):
    """The benchmark shape for (D, N): B·N = 16k tokens, H = 2048 / D, fresh random q, k, v, dO
    (seed 0) and the forward's out and LSE: (q, k, v, do, out, lse, scale, flops), flops the
    backward's (2.5 × 4·B·H·N²·D, × 0.5 causal)."""
    b, h = 16384 // n, 2048 // d
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(4))
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1)
    scale = d ** -0.5
    out, lse = F.flash_attn_forward(q, k, v, scale, causal)
    return q, k, v, do, out, lse, scale, flops


def sdpa_backward_ms(q, k, v, do, causal):
    """do_bench medians (ms) of the cuDNN and SDPA-flash backward (autograd of SDPA) on the same
    tensors: {"cudnn": ms, "flash": ms}."""
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)
    t = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(be):
            o = Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            t[name] = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True),
                               warmup=25, rep=100)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--configs", nargs="*", default=[], help="extra tiles BLOCK_M/BLOCK_N/STAGES/warps[/fused][/nd]"
                    "[/nocarry][/ws][/pp], or BLOCK_M/BLOCK_N/STAGES/dq for the Gluon dQ kernel, timed beside the default "
                    "(fused: dQ inside the kernel by ordered atomic adds; nd: "
                    "unordered; nocarry: dK waited every block, CARRY_DK=False; ws: the warp-specialized dK/dV "
                    "kernel, a producer warp and two consumer warpgroups; pp: with ws, the two consumers take turns at "
                    "issuing their matmuls, PINGPONG=True; ph: with ws, the dK/dV grid with a head's K blocks together, "
                    "PER_HEAD=True), or default[/heads] for config_for's config (/heads: in the 2-D grid, heads fastest)")
    ap.add_argument("--nondet", action="store_true", help="also time the fused mode, ordered and unordered")
    ap.add_argument("--triton-dq", action="store_true", help="also time (and check) the whole backward with the "
                    "Gluon dK/dV kernel and the Triton dQ kernel (TILEFLASH_GLUON_DQ=0), printed as gluon+tdq: the "
                    "difference to the default is the two dQ kernels' difference")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for causal in (False, True):
            for n in args.sizes:
                q, k, v, do, out, lse, scale, flops = problem(d, n, causal, dtype)
                tri_cfg = B.default_bwd_config(d, causal)

                def tri():
                    return B.flash_attn_backward(do, q, k, v, out, lse, scale, causal, config=tri_cfg)

                def glu():
                    return B.flash_attn_backward(do, q, k, v, out, lse, scale, causal)

                flags = dict(HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)
                if not GB.supported(do, q, k, v, out, lse, scale, causal, 0, flags, False, None):
                    print(f"D={d} causal={int(causal)} N={n}: not routed to the Gluon backward (its default)")
                g1, g2, t1 = glu(), glu(), tri()
                det = all(torch.equal(x, y) for x, y in zip(g1, g2))
                nan = any(torch.isnan(x).any().item() for x in g1)
                diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(g1, t1))
                # accuracy on batch 0 against fp32 autograd (N <= 4k: the fp32 scores must fit)
                ref = ref_grads(q, k, v, do, causal, scale) if n <= 4096 else None
                ok = "n/a"
                if ref is not None:
                    errs = []
                    for gg, tt, rr in zip(g1, t1, ref):
                        eg = (gg[:1].float() - rr).abs().max().item()
                        et = (tt[:1].float() - rr).abs().max().item()
                        errs.append((eg, et))
                    ok = "ok" if all(eg <= 2 * et + 1e-3 for eg, et in errs) else "FAIL " + str(errs)
                t = {"gluon": do_bench(glu, warmup=25, rep=100), "triton": do_bench(tri, warmup=25, rep=100)}
                if args.triton_dq:
                    os.environ["TILEFLASH_GLUON_DQ"] = "0"
                    try:
                        h1 = glu()
                        hd = max((x.float() - y.float()).abs().max().item() for x, y in zip(h1, t1))
                        hok = "n/a"
                        if ref is not None:
                            hok = "ok" if all((hh[:1].float() - rr).abs().max().item()
                                              <= 2 * (tt[:1].float() - rr).abs().max().item() + 1e-3
                                              for hh, tt, rr in zip(h1, t1, ref)) else "FAIL"
                        hdet = all(torch.equal(x, y) for x, y in zip(h1, glu()))
                        t["tdq"] = do_bench(glu, warmup=25, rep=100)
                        print(f"  D={d} causal={int(causal)} N={n} gluon+tdq (whole backward, Triton dQ): "
                              f"{flops / t['tdq'] * 1e-9:.0f} TFLOP/s max|diff to Triton| {hd:.3g} "
                              f"bitwise rerun {hdet} vs fp32 {hok}", flush=True)
                    finally:
                        os.environ.pop("TILEFLASH_GLUON_DQ")
                delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
                extra = list(args.configs) + (["64/128/2/8/fused", "64/128/2/8/fused/nd"] if args.nondet else [])
                for spec in extra:
                    parts = spec.split("/")
                    if "dq" in parts[3:]:  # BLOCK_M/BLOCK_N/STAGES/dq: the Gluon dQ kernel alone
                        cfg = dict(BLOCK_M=int(parts[0]), BLOCK_N=int(parts[1]), STAGES=int(parts[2]))
                        try:
                            dq2 = torch.full_like(q, float("nan"))
                            GB.backward_dq(do, q, k, v, lse, delta, dq2, scale, causal, cfg)
                            d2 = (dq2.float() - t1[0].float()).abs().max().item()
                            ms = do_bench(lambda: GB.backward_dq(do, q, k, v, lse, delta, dq2, scale, causal, cfg),
                                          warmup=25, rep=100)
                            print(f"  D={d} causal={int(causal)} N={n} gluon dQ {spec}: {flops / ms * 1e-9:.0f} "
                                  f"TFLOP/s (this kernel alone) max|dQ - Triton dQ| {d2:.3g}", flush=True)
                        except Exception as e:  # noqa: BLE001
                            print(f"  D={d} causal={int(causal)} N={n} gluon dQ {spec}: FAILED {repr(e)[:300]}",
                                  flush=True)
                        continue
                    if parts[0] == "default":  # config_for as is; /heads: the 2-D grid, heads fastest
                        cfg = GB.config_for(d, causal, n)
                        if "heads" in parts[1:]:
                            cfg = dict(cfg, PER_HEAD=False)
                    else:
                        bm, bn, st, w = (int(x) for x in parts[:4])
                        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, STAGES=st, num_warps=w,
                                   WITH_DQ="fused" in parts[4:] or "nd" in parts[4:],
                                   CARRY_DK="nocarry" not in parts[4:], WS="ws" in parts[4:],
                                   PINGPONG="pp" in parts[4:], PER_HEAD="ph" in parts[4:])
                    detm = "nd" not in parts[4:]
                    try:
                        bufs = [torch.full_like(x, float("nan")) for x in (q, k, v)]
                        GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg, detm)
                        pairs = list(zip(bufs, t1))[0 if cfg["WITH_DQ"] else 1:]  # dQ only in the fused mode
                        d2 = max((x.float() - y.float()).abs().max().item() for x, y in pairs)
                        ms = do_bench(lambda: GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg, detm),
                                      warmup=25, rep=100)
                        print(f"  D={d} causal={int(causal)} N={n} gluon {spec}: {flops / ms * 1e-9:.0f} TFLOP/s "
                              f"(this kernel alone{'' if cfg['WITH_DQ'] else ', dQ not computed'}) diff {d2:.3g}",
                              flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"  D={d} causal={int(causal)} N={n} gluon {spec}: FAILED {repr(e)[:300]}", flush=True)
                t.update(sdpa_backward_ms(q, k, v, do, causal))
                tf = {key: flops / ms * 1e-9 for key, ms in t.items()}
                row = (d, int(causal), n, tf["gluon"], tf["triton"], tf["cudnn"], tf["flash"], diff, det, nan, ok,
                       tf.get("tdq", float("nan")))
                rows.append(row)
                print("D={} causal={} N={}: gluon {:.0f} triton {:.0f} cudnn {:.0f} flash {:.0f} TFLOP/s; "
                      "max|gluon-triton| {:.3g} deterministic {} nan {} vs fp32 {}; gluon+tdq {:.0f}".format(*row), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; backward TFLOP/s "
          "(do_bench median, whole backward incl. delta)")
    print("| D | causal | N | gluon | gluon+tdq | triton | cuDNN | SDPA-flash | gluon/cuDNN | gluon+tdq/cuDNN | gluon/triton "
          "| max diff | bitwise rerun | fp32 rule |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d, c, n, g, tr, cu, fl, diff, det, nan, ok, gq in rows:
        print(f"| {d} | {c} | {n} | {g:.0f} | {gq:.0f} | {tr:.0f} | {cu:.0f} | {fl:.0f} | {g / cu:.2f} | {gq / cu:.2f} | "
              f"{g / tr:.2f} | {diff:.2g} | {'same' if det else 'DIFFERENT'}{' NaN' if nan else ''} | {ok} |")


if __name__ == "__main__":
    main()
