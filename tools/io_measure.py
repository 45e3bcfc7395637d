"""Measure the DRAM bytes of one attention forward with Nsight Compute, against `tileflash io`.

First run: 2026-11-29 on the H200 (docs/io-model.md has the table). Usage on the GPU machine:

    PYTHONPATH=. python3 tools/io_measure.py --seqlens 1024 2048 4096 8192 --out io.json

For each (provider, N) it starts a child process under

    ncu --clock-control none --profile-from-start off --csv \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum python3 tools/io_measure.py --child ...

The child warms up (compiles), then calls torch.cuda.profiler.start(), runs one forward,
synchronizes and stops, so only that call's kernels are profiled (ncu flushes the caches
before each kernel by default). The parent sums DRAM reads and writes over all profiled
kernels and prints them beside the model (`tileflash.bench.io_model`): the plain figure, and
for tileflash the L2 figure (K and V from HBM once per head when they fit in L2).
"""

import argparse
import csv
import io
import json
import subprocess
import sys

import torch

from tileflash.bench import io_model
from tileflash.bench.providers import PROVIDERS

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"


def child(args):
    torch.manual_seed(0)
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v = (torch.randn(b, args.seqlen, h, d, device="cuda", dtype=torch.float16) for _ in range(3))
    fn = PROVIDERS[args.provider].fn
    for _ in range(3):
        fn(q, k, v, args.causal)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn(q, k, v, args.causal)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def dram_bytes(csv_text):
    """(read, written) DRAM bytes summed over every profiled kernel (ncu --csv)."""
    start = csv_text.find('"ID"')
    rows = csv.DictReader(io.StringIO(csv_text[start:]))
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    tot = {"dram__bytes_read.sum": 0.0, "dram__bytes_write.sum": 0.0}
    for r in rows:
        if r.get("Metric Name") in tot:
            tot[r["Metric Name"]] += float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "byte"), 1)
    return tot["dram__bytes_read.sum"], tot["dram__bytes_write.sum"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--providers", nargs="+", default=["eager", "tileflash"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--provider", default=None)
    ap.add_argument("--seqlen", type=int, default=None)
    args = ap.parse_args()
    if args.child:
        return child(args)
    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for n in args.seqlens:
        for p in args.providers:
            cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv", "--metrics", METRICS,
                   sys.executable, __file__, "--child", "--provider", p, "--seqlen", str(n), "--batch",
                   str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim)]
            if args.causal:
                cmd.append("--causal")
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"ncu failed for {p} N={n}")
            rd, wr = dram_bytes(res.stdout)
            kw = dict(head_dim=args.head_dim, batch_heads=args.batch * args.heads, elem_bytes=2, causal=args.causal)
            if p == "eager":
                model = model_l2 = io_model.standard_attention_bytes(n, **kw)
            else:
                model = io_model.flash_attention_bytes(n, **kw)
                model_l2 = io_model.flash_attention_bytes(n, **kw, l2_bytes=l2)
            rows.append(dict(provider=p, seqlen=n, read_bytes=rd, write_bytes=wr, measured_bytes=rd + wr,
                             model_bytes=model, model_l2_bytes=model_l2, ratio=(rd + wr) / model,
                             ratio_l2=(rd + wr) / model_l2))
            print(rows[-1], flush=True)
    mib = 2 ** 20
    print(f"\nL2 = {l2 / mib:.0f} MiB; B={args.batch} H={args.heads} D={args.head_dim} fp16 causal={args.causal}")
    print("| provider | N | read MiB | written MiB | measured MiB | model MiB | model+L2 MiB | measured / model "
          "| measured / model+L2 |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['provider']} | {r['seqlen']} | {r['read_bytes'] / mib:.1f} | {r['write_bytes'] / mib:.1f} | "
              f"{r['measured_bytes'] / mib:.1f} | {r['model_bytes'] / mib:.1f} | {r['model_l2_bytes'] / mib:.1f} | "
              f"{r['ratio']:.2f} | {r['ratio_l2']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, l2_bytes=l2, batch=args.batch,
                           heads=args.heads, head_dim=args.head_dim, causal=args.causal, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
