"""One-shot GPU check for the forward pass: correctness, then TFLOP/s against cuDNN SDPA and
SDPA-flash in the same run, then peak memory. Prints a short table last; writes JSON to --out.

FLOPs = 4·B·H·Sq·Sk·D (×0.5 causal). Shapes follow flash-attn: B·N = 16k tokens, H = 2048 / D.
"""

import argparse
import datetime
import json
import os
import subprocess

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash


def sdpa_with(backend):
    def fn(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return fn


def tileflash_with(**options):
    """tileflash.flash_attn_func with these tileflash.Options fields."""
    opts = tileflash.Options(**options)
    return lambda q, k, v, causal: tileflash.flash_attn_func(q, k, v, causal=causal, options=opts)


PROVIDERS = {
    "tileflash": lambda q, k, v, causal: tileflash.flash_attn_func(q, k, v, causal=causal),
    "tileflash_at": tileflash_with(autotune=True, backend="triton"),
    # the forward without tensor descriptors, the path GPUs before sm90 take (same backward kernels)
    "tileflash_ptr": tileflash_with(use_tma=False, backend="triton"),
    "cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
    "sdpa_flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--modes", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--no-autotune-row", action="store_true")
    ap.add_argument("--pointer-row", action="store_true", help="also time the forward forced onto pointers (Options(use_tma=False)); use with --modes fwd (the "
                         "backward is the same kernels)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    try:
        commit = os.environ.get("GIT_COMMIT") or subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        commit = "unknown"
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), commit=commit, dtype=args.dtype)
    print(meta, flush=True)
    if args.no_autotune_row:
        PROVIDERS.pop("tileflash_at")
    if not args.pointer_row:
        PROVIDERS.pop("tileflash_ptr")
    rows = []
    for mode in args.modes:
        rows += run_mode(mode, args, dtype)
    json.dump(dict(meta=meta, rows=rows), open(args.out, "w"), indent=1)
    table(rows)


def run_mode(mode, args, dtype):
    rows = []
    for d in args.dims:
        for causal in (False, True):
            for n in args.sizes:
                b, h = max(1, 16384 // n), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
                # correctness on batch 0 against fp32 math attention
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(*(t[:1].float().transpose(1, 2) for t in (q, k, v)),
                                                         is_causal=causal).transpose(1, 2)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0)
                if mode == "bwd":
                    for t in (q, k, v):
                        t.requires_grad_(True)
                    do = torch.randn_like(q)
                    # reference dq on batch 0, heads 0-1 (an fp32 N×N graph for all heads OOMs at 16k)
                    leaves = [t[:1, :, :2].detach().float().requires_grad_() for t in (q, k, v)]
                    with sdpa_kernel(SDPBackend.MATH):
                        r = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                           is_causal=causal).transpose(1, 2)
                    ref = torch.autograd.grad(r, leaves, do[:1, :, :2].float())[0]
                    del r, leaves
                for name, fn in PROVIDERS.items():
                    try:
                        out = fn(q, k, v, causal)
                        if mode == "fwd":
                            err = (out[:1].float() - ref).abs().max().item()
                            step = lambda: fn(q, k, v, causal)  # noqa: E731
                        else:
                            dq = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)[0]
                            err = (dq[:1, :, :2].float() - ref).abs().max().item()
                            step = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
                        ms, p20, p80 = do_bench(step, warmup=50, rep=200, quantiles=[0.5, 0.2, 0.8])
                        del out
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        o2 = fn(q, k, v, causal)
                        if mode == "bwd":
                            torch.autograd.grad(o2, (q, k, v), do)
                        del o2
                        torch.cuda.synchronize()
                        mem = (torch.cuda.max_memory_allocated() - base) / 2**20
                        rows.append(dict(mode=mode, d=d, causal=causal, n=n, b=b, h=h, provider=name, ms=ms, p20=p20,
                                         p80=p80, tflops=flops / ms * 1e-9, max_err=err, extra_mib=mem))
                    except Exception as e:  # a backend refusing a shape is reported, not fatal
                        rows.append(dict(mode=mode, d=d, causal=causal, n=n, b=b, h=h, provider=name,
                                         error=repr(e)[:300]))
                    print(rows[-1], flush=True)
                del q, k, v, ref
    return rows


def table(rows):
    from tileflash.ops.triton.forward import _attn_fwd_tuned
    for key_, cfg in getattr(_attn_fwd_tuned, "cache", {}).items():
        print("autotuned", key_[:5], cfg)
    print("\n| mode | D | causal | N | tileflash | cuDNN | SDPA-flash | tf/cuDNN | tf/flash | tf err | cudnn err | tf MiB | flash MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    # (tileflash = default config table; tileflash_at = Options(autotune=True), in the JSON)
    key = lambda r: (r["mode"], r["d"], r["causal"], r["n"])  # noqa: E731
    by = {}
    for r in rows:
        by.setdefault(key(r), {})[r["provider"]] = r
    for kk, cell in by.items():
        t = lambda p: cell.get(p, {}).get("tflops", float("nan"))  # noqa: E731
        tma = (f" (pointers {t('tileflash_ptr'):.0f}, err {cell['tileflash_ptr'].get('max_err', float('nan')):.2g})"
               if "tileflash_ptr" in cell else "")
        print(f"| {kk[0]} | {kk[1]} | {kk[2]} | {kk[3]} | {t('tileflash'):.0f}{tma} | {t('cudnn'):.0f} | "
              f"{t('sdpa_flash'):.0f} | {t('tileflash') / t('cudnn'):.2f} | {t('tileflash') / t('sdpa_flash'):.2f} | "
              f"{cell['tileflash'].get('max_err', float('nan')):.2g} | "
              f"{cell.get('cudnn', {}).get('max_err', float('nan')):.2g} | "
              f"{cell['tileflash'].get('extra_mib', float('nan')):.0f} | "
              f"{cell.get('sdpa_flash', {}).get('extra_mib', float('nan')):.0f} |")


if __name__ == "__main__":
    main()
