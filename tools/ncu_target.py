"""One attention call, run a few times, for Nsight Compute to profile (tools/ncu_attn.sh).

Usage: PYTHONPATH=. python3 tools/ncu_target.py PROVIDER --d 64 --n 8192 [--causal] [--cfg JSON]
PROVIDER: gluon (the Hopper Gluon forward, tiles from --cfg or config_for), cudnn / flash (SDPA's
forward), bwd (tileflash's backward as routed: the Gluon dK/dV and dQ kernels, or the fused
kernel when TILEFLASH_DEBUG=gluon_fused=1 is set, as ncu_attn.sh's fbwd128 case does, or where
deterministic=False routes to it), cudnn-bwd (SDPA cuDNN, forward and backward), fa4-bwd (FA4's
flash_attn.cute, forward and backward). Shapes as in gluon_check: B·N = 16k tokens, H = 2048 / D, fp16. The call runs three
times, then once between cudaProfilerStart/Stop: profile with `ncu --profile-from-start off`.
"""

import argparse
import json

import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileflash import flash_attn_func
from tileflash.ops.gluon import forward as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("provider", choices=["gluon", "cudnn", "flash", "bwd", "cudnn-bwd", "fa4-bwd"])
    ap.add_argument("--deterministic", action="store_true", help="bwd: flash_attn_func(deterministic=True)")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cfg", default=None)
    a = ap.parse_args()
    b, h = 16384 // a.n, 2048 // a.d
    q, k, v = (torch.randn(b, a.n, h, a.d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    scale = a.d ** -0.5
    dout = torch.randn_like(q)
    if a.provider == "gluon":
        cfg = json.loads(a.cfg) if a.cfg else None
        out, lse = torch.empty_like(q), torch.empty(b, h, a.n, device="cuda", dtype=torch.float32)
        call = lambda: G.forward(q.detach(), k.detach(), v.detach(), out, lse, scale, a.causal, cfg)  # noqa: E731
    elif a.provider in ("cudnn", "flash", "cudnn-bwd"):
        be = SDPBackend.FLASH_ATTENTION if a.provider == "flash" else SDPBackend.CUDNN_ATTENTION
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

        def call():
            with sdpa_kernel(be):
                o = Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)
                if a.provider == "cudnn-bwd":
                    o.backward(dout.transpose(1, 2))
    elif a.provider == "fa4-bwd":
        from flash_attn.cute import flash_attn_func as fa4_func

        def call():
            o = fa4_func(q, k, v, causal=a.causal)
            (o[0] if isinstance(o, tuple) else o).backward(dout)
    else:
        def call():
            flash_attn_func(q, k, v, causal=a.causal, deterministic=a.deterministic).backward(dout)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # ncu --profile-from-start off profiles this call only
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
