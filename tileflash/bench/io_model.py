"""HBM traffic model of the attention forward pass: standard (eager) attention vs FlashAttention.

Counts the bytes that cross between HBM and the chip (reads + writes), per the op sequence
of the eager baseline tileflash benchmarks against and per tileflash's forward kernel
(one program per Q block of BLOCK_M rows, K and V streamed once per Q block). This is a
model; docs/io-model.md gives the derivation and its check against Nsight Compute's DRAM
byte counters on an H200 (tools/io_measure.py; plot with write_measured_plot).

Examples:
  tileflash io                          # d=64 fp16, one head, tileflash's BLOCK_M
  tileflash io --causal --l2-mib 60     # add the L2-reuse lower bound
  tileflash io --block-m sram --json    # FlashAttention-1's tile rule, JSON rows
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, List, Optional, Sequence, Tuple, Union

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_SRAM_KIB = 228  # shared memory per SM on the H100/H200
LSE_BYTES = 4  # tileflash stores the log-sum-exp in fp32, one value per query row

BlockM = Union[int, str, None]


def _check_positive(**kwargs) -> None:
    for name, value in kwargs.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------
# Standard attention
# ---------------------------------------------------------------------------


def standard_attention_bytes(seqlen: int, head_dim: int, batch_heads: int = 1, elem_bytes: int = 2,
                             causal: bool = False) -> int:
    """HBM bytes moved by eager attention, each PyTorch op one kernel that reads its inputs
    from HBM and writes its output back. With ``N = seqlen``, ``d = head_dim``, per head,
    in elements:

    ==============================  =====================  =========
    kernel                          reads                  writes
    ==============================  =====================  =========
    ``s = q @ k.transpose(-2,-1)``  Q, K: ``2·N·d``        S: ``N²``
    ``s = s * scale``               S: ``N²``              S: ``N²``
    causal only: ``masked_fill``    S: ``N²``              S: ``N²``
    ``p = s.softmax(-1)``           S: ``N²``              P: ``N²``
    ``o = p @ v``                   P: ``N²``, V: ``N·d``  O: ``N·d``
    ==============================  =====================  =========

    Total ``4·N·d + 6·N²`` elements (``+ 2·N²`` causal), times ``elem_bytes`` and
    ``batch_heads``. For causal the boolean ``N × N`` mask read by ``masked_fill`` is not
    counted (it is shared by all heads and 1 byte per element); nor are the scalar ``scale``,
    launch overheads, or any L2 hits between consecutive kernels (every intermediate is
    assumed to go to HBM and back, which holds once ``N²`` elements exceed the L2).
    """
    _check_positive(seqlen=seqlen, head_dim=head_dim, batch_heads=batch_heads, elem_bytes=elem_bytes)
    n, d = seqlen, head_dim
    elems = (2 * n * d + n * n)        # matmul 1: read Q, K; write S
    elems += 2 * n * n                 # * scale: read S, write S
    if causal:
        elems += 2 * n * n             # masked_fill: read S, write S (mask itself not counted)
    elems += 2 * n * n                 # softmax: read S, write P
    elems += n * n + n * d + n * d     # matmul 2: read P, V; write O
    return elems * elem_bytes * batch_heads


# ---------------------------------------------------------------------------
# FlashAttention (tileflash's forward kernel)
# ---------------------------------------------------------------------------


def sram_tile_sizes(head_dim: int, sram_bytes: int = DEFAULT_SRAM_KIB * 1024, elem_bytes: int = 2) -> Tuple[int, int]:
    """FlashAttention-1's tile rule (Algorithm 1): with ``M = sram_bytes / elem_bytes``
    elements of SRAM, ``B_c = ceil(M / (4·d))`` and ``B_r = min(B_c, d)``. Returns ``(B_c, B_r)``.

    In FA1's loop order, ``B_c`` is the size of the *outer* tile (a block of K, V kept on chip
    while all of Q and O stream past it); the number of passes over the streamed operand is
    ``N / B_c = Θ(N·d/M)``, which is where ``Θ(N²·d²/M)`` comes from. tileflash (FA2 order)
    keeps a Q block on chip and streams K, V past it, so the same rule applied to its outer
    tile is ``BLOCK_M = B_c`` (and ``BLOCK_N = B_r`` for the streamed tile).
    """
    _check_positive(head_dim=head_dim, sram_bytes=sram_bytes, elem_bytes=elem_bytes)
    m_elems = sram_bytes // elem_bytes
    b_c = max(1, math.ceil(m_elems / (4 * head_dim)))
    b_r = min(b_c, head_dim)
    return b_c, b_r


def resolve_blocks(head_dim: int, elem_bytes: int = 2, block_m: BlockM = None, block_n: Optional[int] = None,
                   sram_bytes: int = DEFAULT_SRAM_KIB * 1024) -> Tuple[int, int]:
    """The ``(block_m, block_n)`` the model uses.

    * ``block_m=None``: tileflash's untuned forward config,
      ``tileflash.ops.triton.forward.default_config(head_dim)`` (128 for d ≤ 128, 64 above; the
      non-causal tiles, which the TMA path shares; its causal D=128 tiles have BLOCK_M 64);
      ``block_n`` defaults to that config's ``BLOCK_N``.
    * ``block_m="sram"``: :func:`sram_tile_sizes` (``block_m = B_c``, ``block_n`` defaults to ``B_r``).
    * an int: used as is (``block_n`` then defaults to tileflash's ``BLOCK_N``).
    """
    if isinstance(block_m, str):
        if block_m != "sram":
            raise ValueError(f"block_m must be a positive int, None or 'sram', got {block_m!r}")
        b_c, b_r = sram_tile_sizes(head_dim, sram_bytes, elem_bytes)
        bm, bn_default = b_c, b_r
    else:
        _check_positive(block_m=block_m)
        from tileflash.ops.triton.forward import default_config

        cfg = default_config(head_dim)
        bm = cfg["BLOCK_M"] if block_m is None else block_m
        bn_default = cfg["BLOCK_N"]
    _check_positive(block_n=block_n)
    return bm, (bn_default if block_n is None else block_n)


def flash_kv_rows(seqlen: int, block_m: int, block_n: int, causal: bool = False) -> int:
    """Key rows (of K, and as many of V) that all Q-block programs of one head load together.

    Non-causal: every Q block loads all ``N`` keys, so ``N · ceil(N / block_m)``.
    Causal (``seqlen_q == seqlen_k``): Q block ``i`` loads keys ``[0, min(N, (i+1)·block_m))``,
    rounded up to whole ``block_n`` blocks (the kernel's loop steps by ``BLOCK_N``; only the
    ``>= N`` tail is masked off), so about half the non-causal figure.
    """
    n_qblocks = math.ceil(seqlen / block_m)
    if not causal:
        return seqlen * n_qblocks
    total = 0
    for i in range(n_qblocks):
        hi = min(seqlen, (i + 1) * block_m)
        total += min(seqlen, math.ceil(hi / block_n) * block_n)
    return total


def flash_attention_bytes(seqlen: int, head_dim: int, batch_heads: int = 1, elem_bytes: int = 2,
                          causal: bool = False, block_m: BlockM = None, block_n: Optional[int] = None,
                          sram_bytes: int = DEFAULT_SRAM_KIB * 1024, l2_bytes: Optional[int] = None) -> int:
    """HBM bytes moved by tileflash's forward kernel (one program per (Q block, head)).

    Per head, with ``N = seqlen``, ``d = head_dim``, ``e = elem_bytes``:

    * Q: each program reads its ``block_m × d`` tile once: ``N·d·e`` in all;
    * K and V: each program streams the key blocks it needs, so K and V are re-read once
      per Q block: ``2·d·e · R`` with ``R = N·ceil(N/block_m)`` key rows
      (causal: ``R ≈ N²/2``, see :func:`flash_kv_rows`);
    * O: each program writes its tile once: ``N·d·e``;
    * LSE: one fp32 per query row: ``4·N``.

    Non-causal total: ``e·(2·N·d + 2·N·d·ceil(N/block_m)) + 4·N`` per head, times
    ``batch_heads``. ``block_m``/``block_n``: see :func:`resolve_blocks` (``None`` is tileflash's
    real config; ``"sram"`` is FlashAttention-1's tile rule from ``sram_bytes``).

    ``l2_bytes=None`` (default) gives this plain, no-reuse figure. With ``l2_bytes`` set and one
    head's K and V (``2·N·d·e`` bytes) fitting in it, K and V are counted once per head instead
    (``e·4·N·d + 4·N``): the lower bound reached when the Q-block programs of a head that run
    concurrently share K/V through L2. If they do not fit, the plain figure is returned.
    """
    _check_positive(seqlen=seqlen, head_dim=head_dim, batch_heads=batch_heads, elem_bytes=elem_bytes,
                    sram_bytes=sram_bytes, l2_bytes=l2_bytes)
    n, d, e = seqlen, head_dim, elem_bytes
    bm, bn = resolve_blocks(d, e, block_m, block_n, sram_bytes)
    if l2_bytes is not None and 2 * n * d * e <= l2_bytes:
        kv_rows = n  # K and V come from HBM once per head; the re-reads hit L2
    else:
        kv_rows = flash_kv_rows(n, bm, bn, causal)
    per_head = e * (n * d + 2 * d * kv_rows + n * d) + LSE_BYTES * n
    return per_head * batch_heads


# ---------------------------------------------------------------------------
# Rows, table, plot
# ---------------------------------------------------------------------------


def io_rows(seqlens: Sequence[int], head_dim: int = 64, batch_heads: int = 1, elem_bytes: int = 2,
            causal: bool = False, block_m: BlockM = None, sram_bytes: int = DEFAULT_SRAM_KIB * 1024,
            l2_bytes: Optional[int] = None) -> List[Dict]:
    """One dict per sequence length: ``seqlen``, ``standard_bytes``, ``flash_bytes`` (plain, no L2
    reuse), ``flash_bytes_l2`` (L2-reuse figure; None when ``l2_bytes`` is None), ``ratio``
    (standard / flash) and ``ratio_l2`` (standard / flash_l2, or None)."""
    rows = []
    for n in seqlens:
        std = standard_attention_bytes(n, head_dim, batch_heads, elem_bytes, causal)
        common = dict(seqlen=n, head_dim=head_dim, batch_heads=batch_heads, elem_bytes=elem_bytes,
                      causal=causal, block_m=block_m, sram_bytes=sram_bytes)
        fl = flash_attention_bytes(**common)
        fl_l2 = None if l2_bytes is None else flash_attention_bytes(**common, l2_bytes=l2_bytes)
        rows.append(dict(seqlen=n, standard_bytes=std, flash_bytes=fl, flash_bytes_l2=fl_l2,
                         ratio=std / fl, ratio_l2=None if fl_l2 is None else std / fl_l2))
    return rows


def format_table(rows: List[Dict]) -> str:
    """Rows as a fixed-width text table in MiB (2**20 bytes)."""
    mib = float(1 << 20)
    has_l2 = any(r["flash_bytes_l2"] is not None for r in rows)
    header = ["N", "standard MiB", "flash MiB", "std/flash"]
    if has_l2:
        header += ["flash+L2 MiB", "std/flash+L2"]
    body = []
    for r in rows:
        line = [str(r["seqlen"]), f"{r['standard_bytes'] / mib:,.2f}", f"{r['flash_bytes'] / mib:,.2f}",
                f"{r['ratio']:,.1f}x"]
        if has_l2:
            line += [f"{r['flash_bytes_l2'] / mib:,.2f}", f"{r['ratio_l2']:,.1f}x"]
        body.append(line)
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    fmt = lambda cells: " | ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [fmt(header), "-+-".join("-" * w for w in widths)]
    out += [fmt(line) for line in body]
    return "\n".join(out)


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_plot(rows: List[Dict], path: str, title: str) -> None:
    """Log-log plot of modelled HBM bytes against N (PNG). Needs matplotlib."""
    plt = _import_pyplot()
    if plt is None:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib")
    ns = [r["seqlen"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(ns, [r["standard_bytes"] for r in rows], "o-", label="standard (eager), model")
    ax.loglog(ns, [r["flash_bytes"] for r in rows], "s-", label="FlashAttention (tileflash), model")
    if any(r["flash_bytes_l2"] is not None for r in rows):
        ax.loglog(ns, [r["flash_bytes_l2"] for r in rows], "^--", label="FlashAttention, L2-reuse lower bound")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("HBM bytes read + written")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def write_measured_plot(measured: Dict, path: str) -> None:
    """Model against Nsight Compute measurement (the JSON written by tools/io_measure.py):
    measured DRAM bytes of eager and tileflash beside the plain and L2 model figures. PNG."""
    plt = _import_pyplot()
    if plt is None:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"eager": ("o", "C0"), "tileflash": ("s", "C1")}
    for prov, (marker, color) in styles.items():
        rows = sorted((r for r in measured["rows"] if r["provider"] == prov), key=lambda r: r["seqlen"])
        if not rows:
            continue
        ns = [r["seqlen"] for r in rows]
        ax.loglog(ns, [r["measured_bytes"] for r in rows], marker, color=color, markersize=9,
                  label=f"{prov}: measured (ncu DRAM read + write)")
        ax.loglog(ns, [r["model_bytes"] for r in rows], "-", color=color, label=f"{prov}: model")
        if prov == "tileflash":
            ax.loglog(ns, [r["model_l2_bytes"] for r in rows], "--", color=color, label=f"{prov}: model, K/V via L2")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes")
    ax.set_title(f"{measured.get('gpu', '?')}: B={measured.get('batch')} H={measured.get('heads')} "
                 f"D={measured.get('head_dim')} fp16 forward", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value}")
    return value


def _block_m(text: str) -> Union[int, str]:
    if text == "sram":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'sram', got {text!r}") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqlens", type=_positive_int, nargs="+", default=list(DEFAULT_SEQLENS), metavar="N",
                        help="sequence lengths (default: %(default)s)")
    parser.add_argument("--head-dim", type=_positive_int, default=64, help="head dimension d (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="float16",
                        help="element type of Q, K, V, O, S, P (default: %(default)s)")
    parser.add_argument("--batch-heads", type=_positive_int, default=1,
                        help="batch × heads; every figure scales linearly with it (default: %(default)s)")
    parser.add_argument("--sram-kib", type=_positive_float, default=DEFAULT_SRAM_KIB,
                        help="on-chip SRAM M in KiB, used by --block-m sram (default: %(default)s, "
                             "the H200's shared memory per SM)")
    parser.add_argument("--l2-mib", type=_positive_float, default=None,
                        help="L2 size in MiB: adds the L2-reuse lower bound (K, V read once per head when "
                             "they fit). Take it from torch.cuda.get_device_properties(0).L2_cache_size")
    parser.add_argument("--block-m", type=_block_m, default=None, metavar="INT|sram",
                        help="Q rows per program: an integer, or 'sram' for FlashAttention-1's rule "
                             "ceil(M/(4d)) (default: tileflash's forward config for this head dim)")
    parser.add_argument("--causal", action="store_true", help="causal attention (N_q = N_k)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    parser.add_argument("--plot", metavar="PATH", default=None,
                        help="also write a log-log PNG of bytes vs N (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    if args.plot and _import_pyplot() is None:
        print("error: --plot needs matplotlib, which is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    elem_bytes = DTYPE_BYTES[args.dtype]
    sram_bytes = int(args.sram_kib * 1024)
    l2_bytes = None if args.l2_mib is None else int(args.l2_mib * (1 << 20))
    try:
        bm, bn = resolve_blocks(args.head_dim, elem_bytes, args.block_m, None, sram_bytes)
        rows = io_rows(args.seqlens, args.head_dim, args.batch_heads, elem_bytes, args.causal, args.block_m,
                       sram_bytes, l2_bytes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.block_m is None:
        source = "tileflash default config"
    elif args.block_m == "sram":
        source = f"FA1 rule ceil(M/(4d)), M = {args.sram_kib:g} KiB / {elem_bytes} B"
    else:
        source = "given"
    title = (f"HBM traffic model, forward: d={args.head_dim} {args.dtype} batch*heads={args.batch_heads}"
             f"{' causal' if args.causal else ''}, BLOCK_M={bm} BLOCK_N={bn}")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{title} ({source}); modelled bytes, not measured")
        if l2_bytes is not None:
            print(f"flash+L2: K, V read once per head when 2*N*d*e <= L2 = {args.l2_mib:g} MiB (lower bound)")
        print(format_table(rows))
    if args.plot:
        write_plot(rows, args.plot, title.replace("HBM traffic model, forward: ", "HBM traffic model (fwd):\n"))
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standalone entry point (``python -m tileflash.bench.io_model``)."""
    parser = argparse.ArgumentParser(prog="tileflash io", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
