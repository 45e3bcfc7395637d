"""How fast can anything read a decode step's K/V cache on this GPU? The floor under issue 7's targets.

A decode step must at least (a) launch, (b) read every K and V byte once and (c) write its output.
This script times, in the way ``tileflash bench --decode`` does (a CUDA graph replaying at least 8
calls that cycle several caches together >= 240 MB, so no call finds its cache in the 60 MB L2):

* ``empty``: a kernel of 132 programs that each store one int (the launch floor of a call);
* ``touch``: the same, each program first loading one int of the cache (launch + one DRAM round trip);
* ``read P/BLOCK/warps/stages``: a streaming kernel that XORs all of K and V (viewed as int32) in
  P programs over contiguous chunks, BLOCK int32 per load, and stores one int per program: a
  pure read, no attention, no merge. The best config over the sweep is the read floor;
* tileflash's ``flash_attn_with_kvcache`` (default config), SDPA cuDNN and SDPA flash on the same caches.

The issue's targets, bf16, Hq 32, Hkv 8, D 128, one new token: B=1 L=8k must reach 2x SDPA
flash, B=16 L=8k/64k 1.0x cuDNN. If the pure read of B=1 L=8k's 33.5 MB cannot take less than
the 2x target's time, no attention kernel can meet it in this timing.

Usage: PYTHONPATH=. python3 scripts/decode_floor.py [--shapes 1:8192 16:8192] [--out floor.json] [--quick]
       python3 scripts/decode_floor.py --plot-from floor.json floor.png   (no GPU needed)
"""

import argparse
import itertools
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.bench.bench import _graph_of


@triton.jit
def _read_kv(K, V, OUT, n, chunk, BLOCK: tl.constexpr):
    """Program p XORs int32 words [p*chunk, min((p+1)*chunk, n)) of K and of V; stores the result."""
    pid = tl.program_id(0)
    lo = pid * chunk
    hi = tl.minimum(lo + chunk, n)
    acc = tl.zeros([BLOCK], dtype=tl.int32)                                       # [BLOCK]
    for i in range(lo, hi, BLOCK):
        o = i + tl.arange(0, BLOCK)
        m = o < hi
        acc ^= tl.load(K + o, mask=m, other=0) ^ tl.load(V + o, mask=m, other=0)
    tl.store(OUT + pid, tl.xor_sum(acc, 0))


@triton.jit
def _touch(K, OUT, stride, LOAD: tl.constexpr):
    """Program p stores one int (after loading one word of K at p*stride when LOAD)."""
    pid = tl.program_id(0)
    x = pid
    if LOAD:
        x = tl.load(K + pid.to(tl.int64) * stride)
    tl.store(OUT + pid, x)


def graph_ms(calls, sets, graph_calls, rep):
    n = max(graph_calls, sets)
    return do_bench(_graph_of([calls[i % sets] for i in range(n)]), warmup=10, rep=rep, return_mode="median") / n


def plot(json_path, png_path):
    """Bars per shape (µs per call): the launch floor, the best pure read, tileflash, cuDNN, SDPA
    flash, with the 2x-SDPA-flash time marked (CPU is enough: it reads the JSON of a GPU run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(json_path))
    shapes = data["summary"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.6 * len(shapes), 3.8))
    for ax, s in zip(axes if len(shapes) > 1 else [axes], shapes):
        names = ["touch", s["best_read"], "tileflash", "sdpa_cudnn", "sdpa_flash"]
        labels = ["launch +\n1 load", "pure\nread", "tileflash", "cuDNN", "SDPA\nflash"]
        vals = [s.get(n, float("nan")) for n in names]
        ax.bar(labels, vals, color=["#bbbbbb", "#888888", "#1f77b4", "#2ca02c", "#d62728"])
        if "sdpa_flash" in s and (s["batch"], s["seqlen_k"]) == (1, 8192):   # issue 7's target at that shape
            ax.axhline(s["sdpa_flash"] / 2, color="k", ls="--", lw=1, label="target: 2x SDPA-flash")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_title(f"B={s['batch']} L={s['seqlen_k'] // 1024}k ({s['kv_mb']:.0f} MB)", fontsize=9)
        ax.set_ylabel("µs per call (CUDA graph)")
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"decode step vs. a pure read of the same K/V bytes ({data['device']}, bf16, Hq 32, Hkv 8, D 128)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def main():
    if "--plot-from" in sys.argv:   # decode_floor.py --plot-from floor.json out.png
        i = sys.argv.index("--plot-from")
        return plot(sys.argv[i + 1], sys.argv[i + 2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["1:8192", "16:8192", "1:32768"], help="B:L pairs")
    ap.add_argument("--out", default="decode_floor.json")
    ap.add_argument("--quick", action="store_true", help="a smaller sweep of the read kernel")
    ap.add_argument("--graph-calls", type=int, default=8)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_floor.py needs a CUDA GPU")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    h, hk, d, dtype = 32, 8, 128, torch.bfloat16
    progs = [sms, 2 * sms, 4 * sms, 8 * sms] if not args.quick else [sms, 4 * sms]
    blocks = [2048, 4096] if not args.quick else [4096]
    warps = [4, 8]
    stages = [3, 4] if not args.quick else [3]
    rows = []
    summary = []
    for spec in args.shapes:
        b, n = (int(x) for x in spec.split(":"))
        kv_bytes = 2 * b * n * hk * d * 2
        sets = int(min(16, max(1, -(-240e6 // kv_bytes))))
        g = torch.Generator(device=dev).manual_seed(n)
        q = torch.randn(b, 1, h, d, generator=g, device=dev).to(dtype)
        caches = [(torch.randn(b, n, hk, d, generator=g, device=dev).to(dtype),
                   torch.randn(b, n, hk, d, generator=g, device=dev).to(dtype)) for _ in range(sets)]
        res = {}
        words = caches[0][0].numel() // 2
        sink = torch.empty(8 * sms * 8, dtype=torch.int32, device=dev)

        def add(name, calls):
            ms = graph_ms(calls, sets, args.graph_calls, 60)
            res[name] = ms
            rows.append(dict(batch=b, seqlen_k=n, name=name, us=ms * 1e3, kv_tb_s=kv_bytes / ms * 1e-9))
            print(f"B={b} L={n} {name:28s} {ms * 1e3:8.2f} us {kv_bytes / ms * 1e-9:6.3f} TB/s", flush=True)

        add("empty", [lambda: _touch[(sms,)](caches[0][0], sink, 0, LOAD=False)] * sets)
        add("touch", [lambda c=c: _touch[(sms,)](c[0], sink, c[0].numel() // sms, LOAD=True) for c in caches])
        best = None
        for p, blk, w, s in itertools.product(progs, blocks, warps, stages):
            chunk = triton.cdiv(triton.cdiv(words, p), blk) * blk
            grid = (triton.cdiv(words, chunk),)
            calls = [lambda c=c: _read_kv[grid](c[0].view(torch.int32), c[1].view(torch.int32), sink, words, chunk,
                                                BLOCK=blk, num_warps=w, num_stages=s) for c in caches]
            name = f"read {p}/{blk}/{w}/{s}"
            add(name, calls)
            if best is None or res[name] < res[best]:
                best = name
        # the read kernel must have read every word: one program over all of cache 0 against numpy's XOR
        c0 = caches[0]
        _read_kv[(1,)](c0[0].view(torch.int32), c0[1].view(torch.int32), sink, words, words, BLOCK=4096)
        flat = (c0[0].view(torch.int32).flatten() ^ c0[1].view(torch.int32).flatten()).cpu().numpy()
        ref = int(np.bitwise_xor.reduce(flat))
        got = int(sink[0].item())
        assert got == ref, f"read kernel XOR {got} != {ref}: it did not read every word"

        def tf(c):
            return tileflash.flash_attn_with_kvcache(q, c[0], c[1], cache_seqlens=n)
        add("tileflash", [lambda c=c: tf(c) for c in caches])
        qt = q.transpose(1, 2)
        for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def sd(c, be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(qt, c[0].transpose(1, 2), c[1].transpose(1, 2),
                                                          enable_gqa=True)
            try:
                add(name, [lambda c=c: sd(c) for c in caches])
            except Exception as e:  # noqa: BLE001
                print(f"B={b} L={n} {name}: {type(e).__name__}: {e}", flush=True)
        summary.append(dict(batch=b, seqlen_k=n, kv_mb=kv_bytes / 1e6, caches=sets, best_read=best,
                            **{k_: res[k_] * 1e3 for k_ in ("empty", "touch", best, "tileflash", "sdpa_cudnn",
                                                              "sdpa_flash") if k_ in res}))
        del caches
        torch.cuda.empty_cache()
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   rows=rows, summary=summary), open(args.out, "w"), indent=1)
    print("\n| B | L | KV MB | empty | touch | best pure read (P/BLOCK/warps/stages) | tileflash | cuDNN | "
          "SDPA-flash | read floor / 2x-target time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        r = s[s["best_read"]]
        tgt = s.get("sdpa_flash", float("nan")) / 2
        print(f"| {s['batch']} | {s['seqlen_k']} | {s['kv_mb']:.1f} | {s['empty']:.2f} us | {s['touch']:.2f} us | "
              f"{r:.2f} us, {s['kv_mb'] / r:.2f} TB/s ({s['best_read'][5:]}) | {s.get('tileflash', 0):.2f} us | "
              f"{s.get('sdpa_cudnn', 0):.2f} us | {s.get('sdpa_flash', 0):.2f} us | {r / tgt:.2f} |")


if __name__ == "__main__":
    main()
