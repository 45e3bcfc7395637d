"""A/B of the Hopper backward designs in one process, with FA4 and cuDNN beside them.

For each (dtype, D, causal, N) of the grid (B·N = 16k tokens, H = 2048/D, unless ``--batch``,
``--heads`` and ``--kv-heads`` (GQA) fix the shape): the backward alone
(dQ, dK, dV from saved out/lse), TFLOP/s by the ×2.5 convention, of

* ``split``     the split dK/dV + dQ kernels (bitwise deterministic; the ``deterministic=True`` route)
* ``fused_ord`` the fused warp-specialized kernel, dQ sums ordered (bitwise deterministic)
* ``fused``     the same kernel, dQ sums unordered (``deterministic=False``)
* ``fused_base`` with ``--fused-cfg``: the unordered kernel at route's config, without the overrides
  (which ``fused_ord`` and ``fused`` then take), so both sides of an A/B share the process;
  ``fused+1``, ``fused+2``, ...: the unordered kernel with the second, third, ... ``--fused-cfg``
* ``dkdv`` / ``dkdv_alt`` with ``--dkdv-cfg``: the split design's dK/dV kernel alone (delta given),
  at ``config_for``'s config and with the overrides, e.g. ``{"LSE_EARLY": 3}``
* ``fa4``       FA4 (flash_attn.cute), when it imports
* ``cudnn``     SDPA's cuDNN backend

The fused results are checked against the split ones (max abs difference per gradient, relative to
the gradient's max). Prints one line per cell and a table last.

The arms of a cell are timed in ``--rounds`` rounds (default 3), the order rotated by one arm each
round, and each arm's median round is reported. With one fixed order the same kernel read up to
~10% apart by its place in the order (H100, 2026-12-05: the route's D = 64 fused kernel 413 / 425
TFLOP/s third in line, right after the ordered kernel, and 397 / 387 fourth), which is larger than
most of the differences being measured.

    python tools/fused_ab.py [--dtypes float16 bfloat16] [--seqlens 1024 ... 16384] [--dims 64 128]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from triton.testing import do_bench

from tileflash.bench.providers import PROVIDERS
from tileflash.ops import route
from tileflash.ops.gluon import backward as gb
from tileflash.ops.triton import backward as tr_bwd


def ours(kind, dout, q, k, v, out, lse, scale, causal, fused_cfg=None, dkdv_cfg=None):
    if kind == "split":
        return lambda: route.backward(dout, q, k, v, out, lse, scale, causal, deterministic=True)
    if kind in ("dkdv", "dkdv_alt"):  # the dK/dV kernel alone, delta computed once outside
        cfg = dict(gb.config_for(q.shape[-1], causal, q.shape[1]), **(dkdv_cfg if kind == "dkdv_alt" else {}))
        delta = tr_bwd.compute_delta(out, dout, lse, False, q.shape[2], q.shape[3])
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        return lambda: gb.backward(dout, q, k, v, lse, delta, dq, dk, dv, scale, causal, cfg) and (dq, dk, dv)
    # the config route runs for each mode (unordered: LSE_EARLY=2), then --fused-cfg's overrides
    cfg = gb.fused_config_for(q.shape[-1], causal, deterministic=(kind == "fused_ord"))
    if kind.startswith("fused+"):  # the n-th extra override set (fused_cfg: the list of them)
        cfg = dict(cfg, **fused_cfg[int(kind[6:])])
    elif kind != "fused_base":
        cfg = dict(cfg, **(fused_cfg[0] if fused_cfg else {}))
    memset = kind == "fused_memset"  # the sums zeroed by a memset of their own, not by the delta kernel
    kind = "fused_ord" if kind == "fused_ord" else "fused"

    def run():
        # as the route runs it: the fp32 dQ sums and counters zeroed by the delta kernel
        bufs = None if memset else gb.fused_buffers(q, cfg["BLOCK_M"], zeroed=False)
        delta = tr_bwd.compute_delta(out, dout, lse, False, q.shape[2], q.shape[3], zero=None if bufs is None else bufs[2])
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        gb.backward(dout, q, k, v, lse, delta, dq, dk, dv, scale, causal, cfg, deterministic=(kind == "fused_ord"),
                    bufs=bufs)
        return dq, dk, dv
    return run


def rotated_medians(fns: dict, rounds: int, bench) -> dict:
    """{name: median over ``rounds`` of ``bench(fn)``}, timing the arms of ``fns`` in an order
    rotated by one arm each round (round r starts with the r-th arm), so that no arm always runs
    right after the same one or in the same place."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(bench(fns[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def autograd_bwd(fn, q, k, v, dout, causal):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, causal)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--fused-cfg", type=json.loads, action="append", default=None,
                    help='JSON overrides of fused_config_for for the fused kinds, e.g. {"LSE_EARLY": 2}; '
                         'repeat it for more unordered variants (kinds fused+1, fused+2, ...)')
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell, the arms' order rotated each round")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: 16384 // N, B*N = 16k tokens)")
    ap.add_argument("--heads", type=int, default=None, help="query heads (default: 2048 // D)")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA; default: --heads)")
    ap.add_argument("--dkdv-cfg", type=json.loads, default=None,
                    help='JSON overrides of config_for for the dK/dV kernel alone (kinds dkdv, dkdv_alt)')
    a = ap.parse_args()
    # FA4 and cuDNN as the benchmark calls them (tileflash.bench.providers)
    fa4 = PROVIDERS["fa4"].fn if PROVIDERS["fa4"].unavailable("cuda") is None else None
    cudnn = PROVIDERS["sdpa_cudnn"].fn
    extra = [f"fused+{i}" for i in range(1, len(a.fused_cfg or ()))]
    kinds = (["split", "fused_ord", "fused"] + (["fused_base"] if a.fused_cfg else []) + extra
             + (["dkdv", "dkdv_alt"] if a.dkdv_cfg else []) + (["fa4"] if fa4 else []) + ["cudnn"])
    rows = []
    for dt in a.dtypes:
        dtype = getattr(torch, dt)
        for d in a.dims:
            for causal in map(bool, a.causal):
                for n in a.seqlens:
                    b, h = a.batch or 16384 // n, a.heads or 2048 // d
                    hk = a.kv_heads or h
                    torch.manual_seed(0)
                    q, dout = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(2))
                    k, v = (torch.randn(b, n, hk, d, device="cuda", dtype=dtype) for _ in range(2))
                    scale = d ** -0.5
                    out, lse = route.forward(q, k, v, scale, causal)
                    flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 2.5
                    ref = ours("split", dout, q, k, v, out, lse, scale, causal)()
                    err = {}
                    for kind in ("fused_ord", "fused", *extra) + (("dkdv_alt",) if a.dkdv_cfg else ()):
                        g = ours(kind, dout, q, k, v, out, lse, scale, causal, a.fused_cfg, a.dkdv_cfg)()
                        # (the dK/dV kernel alone leaves dQ unwritten: compare dK and dV only)
                        pairs = list(zip(g, ref))[1:] if kind == "dkdv_alt" else zip(g, ref)
                        err[kind] = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                                        for x, y in pairs)
                    fns = {}
                    for kind in kinds:
                        if kind == "fa4":
                            fns[kind] = autograd_bwd(fa4, q, k, v, dout, causal)
                        elif kind == "cudnn":
                            fns[kind] = autograd_bwd(cudnn, q, k, v, dout, causal)
                        else:
                            fns[kind] = ours(kind, dout, q, k, v, out, lse, scale, causal, a.fused_cfg, a.dkdv_cfg)
                    ms = rotated_medians(fns, a.rounds,
                                         lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median"))
                    tf = {kind: flops / ms[kind] * 1e-9 for kind in kinds}
                    rows.append((dt, d, causal, n, tf, err))
                    print(f"{dt} D={d} causal={int(causal)} N={n} B={b} H={h}/{hk}: "
                          + " ".join(f"{kk}={x:.0f}" for kk, x in tf.items())
                          + f" | rel.diff vs split: ordered {err['fused_ord']:.1e}, unordered {err['fused']:.1e}"
                          + "".join(f", {kk} {err[kk]:.1e}" for kk in extra)
                          + (f", dK/dV alt {err['dkdv_alt']:.1e}" if a.dkdv_cfg else ""), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; backward TFLOP/s (x2.5), "
          + (f"B={a.batch}" if a.batch else "B*N=16k") + ", " + (f"H={a.heads}" if a.heads else "H=2048/D")
          + (f"/{a.kv_heads}" if a.kv_heads else "") + "; "
          f"median of {a.rounds} rounds, the arms' order rotated each round"
          + (f"; fused config overrides {a.fused_cfg}" if a.fused_cfg else "")
          + (f"; dK/dV config overrides {a.dkdv_cfg}" if a.dkdv_cfg else ""))
    print("| dtype | D | causal | N | " + " | ".join(kinds) + " | fused/split | fused/fa4 | fused/cudnn |")
    print("|---" * (4 + len(kinds) + 3) + "|")
    for dt, d, causal, n, tf, _ in rows:
        r = [tf["fused"] / tf["split"], tf["fused"] / tf["fa4"] if "fa4" in tf else float("nan"),
             tf["fused"] / tf["cudnn"]]
        print(f"| {dt} | {d} | {int(causal)} | {n} | " + " | ".join(f"{tf[kk]:.0f}" for kk in kinds) + " | "
              + " | ".join(f"{x:.2f}" for x in r) + " |")
    med = {kk: statistics.median(tf[kk] / tf["split"] for *_, tf, _ in rows) for kk in kinds}
    print("median ratio to split: " + ", ".join(f"{kk} {x:.3f}" for kk, x in med.items()))


if __name__ == "__main__":
    main()
