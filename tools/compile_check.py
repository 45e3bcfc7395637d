"""Compile every Triton kernel for sm_90 (Hopper) without a GPU, for each default config.

Catches code that the CPU interpreter accepts but the GPU compiler (e.g. triton 3.6 on the H200)
rejects. It does not run anything: a kernel that compiles can still be wrong or slow, so kernel
changes still need a GPU run. Usage (any triton version, no GPU needed):

    python tools/compile_check.py            # head dims 64, 128, 256, 40; fp16 and bf16
    python tools/compile_check.py --gluon    # only the Hopper Gluon forward's configs
    python tools/compile_check.py --ptx-digests F.json   # also write each case's PTX digest
                                                           # (debug lines stripped), to compare trees
"""

import hashlib
import inspect
import itertools
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTRS_FP32 = {"LSE", "DELTA", "ALIBI", "O_PART", "LSE_PART"}
PTRS_I32 = {"CU_Q", "CU_K", "SEQLENS_K", "BATCH_IDX", "BLOCK_TABLE", "COUNTER", "LEFTPAD"}
PTRS_I64 = {"SEED"}
FLOATS = {"qk_scale", "sm_scale", "softcap_scale", "softcap2", "dropout_p"}
# feature sets compiled for every kernel: plain, and every optional feature switched on
FEATURES = [
    dict(HAS_LEFT=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False, IS_VARLEN=False),
    dict(HAS_LEFT=True, HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_DROPOUT=True, IS_VARLEN=True),
]
OPTIONAL_PTRS = {"ALIBI": "HAS_ALIBI", "CU_Q": "IS_VARLEN", "CU_K": "IS_VARLEN", "SEED": "HAS_DROPOUT",
                 "BATCH_IDX": "HAS_BATCH_IDX", "BLOCK_TABLE": "PAGED", "SEQLENS_K": "HAS_SEQLENS",
                 "O_PART": "SPLIT", "LSE_PART": "SPLIT", "COUNTER": "SPLIT", "LEFTPAD": "HAS_LEFTPAD",
                 "O": "FUSE_DELTA"}


# case -> sha256 of its PTX without debug lines (--ptx-digests)
DIGESTS: dict = {}


def _record(case: str, kernel) -> None:
    """Keep the digest of a compiled case's PTX with the debug sections, .loc/.file lines and debug
    labels removed: two trees whose digests agree compiled to the same code."""
    ptx = kernel.asm["ptx"].split("\t.section\t.debug")[0]
    keep = [ln for ln in ptx.splitlines() if not ln.lstrip().startswith((".loc", ".file", "$L__tmp", "//"))]
    DIGESTS[case] = hashlib.sha256("\n".join(keep).encode()).hexdigest()


def signature(fn, dtype, constexprs):
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.isupper():
            sig[name] = ("*fp32" if name in PTRS_FP32 else "*i32" if name in PTRS_I32 else
                         "*i64" if name in PTRS_I64 else f"*{dtype}")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOATS:
            sig[name] = "fp32"
        elif name.startswith("rng_stride"):
            sig[name] = "i64"
        else:
            sig[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_one(fn, dtype, constexprs, num_warps, num_stages):
    constexprs = dict(constexprs)
    # constexpr parameters with a default (e.g. RAW_MAX, PAGE_TILE) take it when not given; else the
    # upper-case name would be read as a pointer argument below
    for p in fn.params:
        default = p._param.default
        if p.is_constexpr and p.name not in constexprs and default is not inspect.Parameter.empty:
            constexprs[p.name] = default
    for ptr, flag in OPTIONAL_PTRS.items():
        # (only where the flag is the kernel's own: _bwd_preprocess's O is not optional)
        if ptr in fn.arg_names and flag in fn.arg_names and not constexprs.get(flag, False):
            constexprs[ptr] = None  # an unused optional pointer is passed as None (a constexpr)
    sig, attrs = signature(fn, dtype, constexprs)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 128),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def compile_gluon(d, causal, cfg, dtype="fp16"):
    """Compile the Hopper Gluon forward (tileflash.ops.gluon.forward) for sm_90 at one config."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource

    from tileflash.ops.gluon import forward as G

    ws = cfg.get("WS", False)
    bm, bn, tdt = cfg["BLOCK_M"], cfg["BLOCK_N"], getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype])
    rows = G.q_block_rows(cfg)
    fn = G._attn_fwd_sm90_ws if ws else G._attn_fwd_sm90
    warps = 4 if ws else cfg["num_warps"]
    const = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal, num_warps=warps)
    const.update(dict(CONSUMER_REGS=cfg.get("CONSUMER_REGS", 232), PINGPONG=cfg.get("PINGPONG", True),
                      NUM_C=cfg.get("CONSUMERS", 2), PERSISTENT=cfg.get("PERSISTENT", False)) if ws
                 else dict(LOOKAHEAD=cfg.get("LOOKAHEAD", False)))
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_desc"):
            block = rows if name in ("q_desc", "o_desc") else bn
            layout = G._smem_layout(block, d, tdt) if hasattr(G, "_smem_layout") else \
                G.gl.NVMMASharedLayout.get_default_for([block, d], G.gl.float16 if dtype == "fp16" else G.gl.bfloat16)
            sig[name] = f"tensordesc<{dtype}[{block}, {d}],{layout!r}>"
        elif name == "LSE":
            sig[name] = "*fp32"
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    src = GluonASTSource(fn=fn, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=warps))


def _compile_gluon_sm90(fn, const, dtype, d, desc_rows, ptr_types, fp32_descs=()):
    """Compile a Gluon kernel for sm_90: constexprs `const`, tensor descriptors of [rows, d] tiles
    (rows from desc_rows[name]; fp32 for the names in fp32_descs, else `dtype`), pointers typed by
    ptr_types[name], fp32 scales, i32 the rest."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource

    from tileflash.ops.gluon import forward as G

    tdt = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype])
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_desc"):
            rows = desc_rows[name]
            if name in fp32_descs:  # rows = (rows, cols)
                rows, cols = rows
                lay = G.gl.NVMMASharedLayout.get_default_for([rows, cols], G.gl.float32)
                sig[name] = f"tensordesc<fp32[{rows}, {cols}],{lay!r}>"
            else:
                sig[name] = f"tensordesc<{dtype}[{rows}, {d}],{G._smem_layout(rows, d, tdt)!r}>"
        elif name in ptr_types:
            sig[name] = ptr_types[name].replace("DTYPE", dtype)
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    src = GluonASTSource(fn=fn, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=const["num_warps"]))


def compile_gluon_bwd(d, causal, cfg, dtype="fp16", deterministic=True):
    """Compile the Hopper Gluon dK/dV backward (tileflash.ops.gluon.backward) for sm_90 at one config."""
    from tileflash.ops.gluon import backward as GB

    ws = cfg.get("WS", False)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if ws:  # dK/dV only; K/V blocks are the two halves of BLOCK_N
        const = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                     CONSUMER_REGS=cfg.get("CONSUMER_REGS", 240), num_warps=4, CARRY_DK=cfg.get("CARRY_DK", True),
                     PINGPONG=cfg.get("PINGPONG", False), WITH_DQ=cfg.get("WITH_DQ", False),
                     DETERMINISTIC=deterministic, DQ_MODE=cfg.get("DQ_MODE", 0), PER_HEAD=cfg.get("PER_HEAD", False),
                     PDL_TRIGGER=cfg.get("PDL_TRIGGER", False), DQ_BUFS=cfg.get("DQ_BUFS", 2),
                     DQ_FIRST=cfg.get("DQ_FIRST", False), DQ_OWN_FIRST=cfg.get("DQ_OWN_FIRST", False),
                     LSE_EARLY=cfg.get("LSE_EARLY", 0), D_OUT=cfg.get("D_OUT", 0),
                     SPLIT_D=cfg.get("SPLIT_D", False))
        const["DQ_ALT"] = cfg.get("DQ_ALT", False)
        const["DQ_LATE"] = cfg.get("DQ_LATE", False)
        const["DQ_MSPLIT"] = cfg.get("DQ_MSPLIT", False)
        if not const["WITH_DQ"]:
            const.update(dq_desc=None, SEM=None)  # the launcher passes None for the unused dQ buffers
    else:
        const = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                     DETERMINISTIC=deterministic, VEC=cfg.get("VEC", 2), WITH_DQ=cfg.get("WITH_DQ", False),
                     CARRY_DK=cfg.get("CARRY_DK", True), num_warps=cfg["num_warps"], D_OUT=cfg.get("D_OUT", 0))
        if not const["WITH_DQ"]:
            const.update(DQ=None, SEM=None)  # the launcher passes None for the unused dQ buffers
    kv_rows = bn // 2 if ws and not cfg.get("SPLIT_D", False) else bn
    return _compile_gluon_sm90(GB._attn_bwd_sm90_ws if ws else GB._attn_bwd_sm90, const, dtype, d,
                               dict(q_desc=bm, do_desc=bm, k_desc=kv_rows, v_desc=kv_rows,
                                    dq_desc=(bm // 2, d) if cfg.get("DQ_MSPLIT", False) else
                                    (bm, d if cfg.get("DQ_ALT", False) else d // 2)),
                               dict(LSE="*fp32", DELTA="*fp32", DQ="*fp32", SEM="*i32", DK="*DTYPE", DV="*DTYPE"),
                               fp32_descs=("dq_desc",))


def compile_gluon_bwd_dq(d, causal, cfg, dtype="fp16"):
    """Compile the Gluon dQ kernel (tileflash.ops.gluon.backward) for sm_90."""
    from tileflash.ops.gluon import backward as GB

    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    const = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                 CONSUMER_REGS=cfg.get("CONSUMER_REGS", 240), num_warps=4, D_OUT=cfg.get("D_OUT", 0),
                 SPLIT_D=cfg.get("SPLIT_D", False), FUSE_DELTA=cfg.get("FUSE_DELTA", False))
    q_rows = bm if cfg.get("SPLIT_D", False) else bm // 2
    return _compile_gluon_sm90(GB._attn_bwd_dq_sm90_ws, const, dtype, d,
                               dict(q_desc=q_rows, do_desc=q_rows, k_desc=bn, v_desc=bn),
                               dict(LSE="*fp32", DELTA="*fp32", DQ="*DTYPE", O="*DTYPE"))


def main():
    # imported here, so that compile_one/signature also serve older trees (tools/spill_check.py)
    from tileflash.ops.triton import backward as B
    from tileflash.ops.triton import decode as DEC
    from tileflash.ops.triton import forward as F

    failures = 0
    gluon_only = "--gluon" in sys.argv
    for dtype, feats in [] if gluon_only else [("fp16", FEATURES[0]), ("bf16", FEATURES[0]), ("bf16", FEATURES[1])]:
        for d in (64, 128, 256, 40):
            for causal in (False, True):
                flags = dict(feats, HAS_RIGHT=causal)
                bd = F.block_d_for(d)
                cases = []
                # pointers (GPUs before sm90, Options(use_tma=False)) and tensor descriptors (the default on
                # Hopper), each with its own default tiles; RAW_MAX as the launcher sets it
                raw_max = not (feats["HAS_SOFTCAP"] or feats["HAS_ALIBI"])
                for tma in (False, True):
                    c = dict(F.default_config(d, causal=causal, tma=tma))
                    w, s = c.pop("num_warps"), c.pop("num_stages")
                    cases.append(("fwd-tma" if tma else "fwd", F._attn_fwd,
                                  dict(**flags, HEAD_DIM=d, BLOCK_D=bd, DOT_PRECISION="tf32", USE_TMA=tma,
                                       RAW_MAX=raw_max, **c), w, s))
                bc = B.default_bwd_config(d, causal)
                for (fam, fn), tma in itertools.product((("dkdv", B._bwd_dkdv), ("dq", B._bwd_dq)), (False, True)):
                    c = dict(bc[fam])
                    w, s = c.pop("num_warps"), c.pop("num_stages")
                    cases.append((fam + ("-tma" if tma else ""), fn, dict(**flags, HEAD_DIM=d, BLOCK_D=bd,
                                                                          DOT_PRECISION="tf32", USE_TMA=tma, **c), w, s))
                # the dQ kernel computing delta itself (FUSE_DELTA, the default route without the Gluon dQ kernel)
                cases += [(n + "-delta", fn, dict(c, FUSE_DELTA=True), w, s) for n, fn, c, w, s in list(cases)
                          if n in ("dq", "dq-tma")]
                cases.append(("pre", B._bwd_preprocess, dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=64), 4, 1))
                # the flat grid of calls with more than 65535 batch*heads (common.block_grid)
                cases += [(n + "-flat", fn, dict(c, FLAT_GRID=True), w, s) for n, fn, c, w, s in list(cases)
                          if "FLAT_GRID" in fn.arg_names and not feats["IS_VARLEN"]]
                for name, fn, const, w, s in cases:
                    try:
                        k = compile_one(fn, dtype, const, w, s)
                        tag = "features" if feats["IS_VARLEN"] else "plain"
                        _record(f"{dtype} {tag} D={d} causal={causal} {name}", k)
                        print(f"ok   {dtype} {tag:<8} D={d:<3} causal={causal!s:<5} {name:<7} warps={w} stages={s} "
                              f"smem={k.metadata.shared}", flush=True)
                    except Exception as e:  # noqa: BLE001
                        failures += 1
                        print(f"FAIL {dtype} D={d} causal={causal} {name}: {type(e).__name__}: {str(e)[:300]}",
                              flush=True)
    # decode kernel, one split and split-KV with the in-kernel merge: GQA group 4, one new token; plain and paged+features
    for dtype, bm in [] if gluon_only else (("fp16", 16), ("bf16", 16), ("bf16", 64)):
        for d in (40, 64, 128, 256):
            for feats in (dict(HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False,
                               HAS_BATCH_IDX=False, PAGED=False),
                          dict(HAS_LEFT=True, HAS_RIGHT=True, HAS_SOFTCAP=True, HAS_ALIBI=True,
                               HAS_BATCH_IDX=False, PAGED=True, HAS_LEFTPAD=True),
                          dict(HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False,
                               HAS_BATCH_IDX=False, PAGED=True, PAGE_TILE=True)):
                bd = F.block_d_for(d)
                cases = []
                # every default launch config: contiguous (= pages of 128·k), pages of 16/32/64 (multi-page
                # tiles), 192 (64-key page tiles), 8 (16-key tiles), short splits, pages of 16 on long splits
                cfgs = [DEC.decode_config(bd, page) for page in (0, 16, 192, 8)] + [DEC.DECODE_CONFIG_SHORT]
                cfgs += [c for c in [DEC.long_split_config(bd, 16, 1 << 20)] if c is not None]
                for cfg in [dict(c) for c in {tuple(sorted(c.items())) for c in cfgs}]:
                    base = dict(KV_GROUP=4, **feats, HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=bm, BLOCK_N=cfg["block_n"],
                                DOT_PRECISION="tf32")
                    tile = f"{cfg['block_n']}/{cfg['num_warps']}/{cfg['num_stages']}"
                    if cfg.get("multi_page") and feats["PAGED"] and not feats.get("PAGE_TILE"):
                        # pages of 16 per tile, entries 4 per load, with the config's PDL trigger
                        base.update(PAGES_PER_TILE=cfg["block_n"] // 16, TABLE_ASM=True, TABLE_VEC=True, PDL=cfg.get("pdl", 0))
                    cases += [(f"decode {tile}", DEC._decode_split, dict(base, SPLIT=False), cfg["num_warps"],
                               cfg["num_stages"]),
                              (f"split {tile}", DEC._decode_split, dict(base, SPLIT=True, BLOCK_S=128, S_CHUNK=4096 // bd,
                                                                HAS_SEQLENS=False), cfg["num_warps"], cfg["num_stages"])]
                    if "BH_AXIS0" in DEC._decode_split.arg_names and not feats["PAGED"]:
                        # batch*kv heads on grid axis 0 (more than 65535 of them)
                        cases.append((f"decode {tile} bh-axis0", DEC._decode_split, dict(base, SPLIT=False, BH_AXIS0=True),
                                      cfg["num_warps"], cfg["num_stages"]))
                for name, fn, const, w, s_ in cases:
                    try:
                        k = compile_one(fn, dtype, const, w, s_)
                        _record(f"{dtype} {name} {w}/{s_} {sorted(const.items())}", k)
                        print(f"ok   {dtype} D={d} BLOCK_M={bm} {name} paged={feats['PAGED']} "
                              f"page_tile={feats.get('PAGE_TILE', False)}", flush=True)
                    except Exception as e:  # noqa: BLE001
                        failures += 1
                        print(f"FAIL {dtype} D={d} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    # the Hopper Gluon kernels: every config the dispatcher picks, plus the backward's other modes
    from tileflash.ops.route import gluon_modules
    if gluon_modules() is not None:
        G, GB = gluon_modules()
        cases = []  # (tag, d, causal, cfg, build)
        for d in (64, 128):
            for causal in (False, True):
                for n in (1024, 2048, 4096, 8192):
                    cases.append((f"gluon D={d} causal={causal!s:<5} N={n}", G.config_for(d, causal, n), compile_gluon))
                # the default (the warp-specialized dK/dV kernel), the 8-warp dK/dV kernel, the fused
                # mode (dQ by ordered atomic adds), the 8-warp kernel with dK waited every block
                # (CARRY_DK=False), and the Gluon dQ kernel (not routed to yet)
                base = GB.config_for(d, causal, 4096)
                lock = dict(base, WS=False, CARRY_DK=True)
                for cfg in (base, lock, dict(lock, WITH_DQ=True), dict(lock, CARRY_DK=False)):
                    cases.append((f"gluon-bwd D={d} causal={causal!s:<5}", cfg, compile_gluon_bwd))
                cases.append((f"gluon-dq D={d} causal={causal!s:<5}", GB.dq_config_for(d, causal), compile_gluon_bwd_dq))
                # the default route's dQ kernel, which computes delta from O (backward_dq with out)
                cases.append((f"gluon-dq D={d} causal={causal!s:<5}", dict(GB.dq_config_for(d, causal), FUSE_DELTA=True),
                              compile_gluon_bwd_dq))
                # what deterministic=False routes to (route._fused_backward: D = 64/128 from 2k and 1e11 FLOPs): the fused
                # kernel, unordered dQ sums, the LSE/delta rows staged in shared memory, the per-head order
                cases.append((f"gluon-bwd-unordered D={d} causal={causal!s:<5}",
                              GB.fused_config_for(d, causal, deterministic=False),
                              lambda d_, c_, cfg_, dt_: compile_gluon_bwd(d_, c_, cfg_, dt_, deterministic=False)))
                # the consumers taking turns at whole dQ parts (DQ_ALT; not routed to yet), unordered and
                # ordered, at the route's Q blocks and at 128 rows
                for bm in (64, 128) if d == 64 else (64,):
                    for det in (False, True):
                        cases.append((f"gluon-bwd-dqalt D={d} causal={causal!s:<5} det={det}",
                                      dict(GB.fused_config_for(d, causal, deterministic=det), DQ_ALT=True, BLOCK_M=bm),
                                      lambda d_, c_, cfg_, dt_, det_=det: compile_gluon_bwd(d_, c_, cfg_, dt_,
                                                                                            deterministic=det_)))
                # the consumers splitting dQ's rows (DQ_MSPLIT, 128-row Q blocks; D = 64 only, where those
                # fit shared memory; not routed to yet), unordered and ordered
                if d == 64:
                    for det in (False, True):
                        cases.append((f"gluon-bwd-dqmsplit D={d} causal={causal!s:<5} det={det}",
                                      dict(GB.fused_config_for(d, causal, deterministic=det), DQ_MSPLIT=True,
                                           BLOCK_M=128),
                                      lambda d_, c_, cfg_, dt_, det_=det: compile_gluon_bwd(d_, c_, cfg_, dt_,
                                                                                            deterministic=det_)))
                # the fused kernel's ordered sums in the per-head launch order (PER_HEAD: a head's K blocks
                # together; opt-in: the unordered config above takes it)
                cases.append((f"gluon-bwd-perhead D={d} causal={causal!s:<5} det=True",
                              dict(GB.fused_config_for(d, causal), PER_HEAD=True), compile_gluon_bwd))
                # the dQ parts staged a block late (DQ_LATE; not routed to yet), unordered and ordered
                for det in (False, True):
                    cases.append((f"gluon-bwd-dqlate D={d} causal={causal!s:<5} det={det}",
                                  dict(GB.fused_config_for(d, causal, deterministic=det), DQ_LATE=True),
                                  lambda d_, c_, cfg_, dt_, det_=det: compile_gluon_bwd(d_, c_, cfg_, dt_,
                                                                                        deterministic=det_)))
                # the consumers' own LSE/delta loads (the rule before 2026-12-05, opt-in now: 0 for the
                # D = 64 non-causal dK carry, else a block ahead): the dK/dV kernel and the fused kernel
                early = 0 if d == 64 and not causal else 2
                cases.append((f"gluon-bwd-lse-global D={d} causal={causal!s:<5}", dict(base, LSE_EARLY=early),
                              compile_gluon_bwd))
                cases.append((f"gluon-bwd-lse-global-unordered D={d} causal={causal!s:<5}",
                              dict(GB.fused_config_for(d, causal, deterministic=False), LSE_EARLY=2),
                              lambda d_, c_, cfg_, dt_: compile_gluon_bwd(d_, c_, cfg_, dt_, deterministic=False)))
                if d == 128:  # a padded head dim (padded_head_dim): the gradients' first 96 columns stored
                    for cfg in (base, dict(lock, WITH_DQ=True), GB.fused_config_for(d, causal)):
                        cases.append((f"gluon-bwd D={d} causal={causal!s:<5}", dict(cfg, D_OUT=96), compile_gluon_bwd))
                    cases.append((f"gluon-dq D={d} causal={causal!s:<5}", dict(GB.dq_config_for(d, causal), D_OUT=96),
                                  compile_gluon_bwd_dq))
                    cases.append((f"gluon-dq D={d} causal={causal!s:<5}",
                                  dict(GB.dq_config_for(d, causal), D_OUT=96, FUSE_DELTA=True), compile_gluon_bwd_dq))
        for causal in (False, True):  # D = 256: the forward, and the dK/dV kernel with the columns split (SPLIT_D)
            cases.append((f"gluon D=256 causal={causal!s:<5} N=4096", G.config_for(256, causal, 4096), compile_gluon))
            cases.append((f"gluon-bwd D=256 causal={causal!s:<5}", GB.config_for(256, causal, 4096), compile_gluon_bwd))
            cases.append((f"gluon-dq D=256 causal={causal!s:<5}", GB.dq_config_for(256, causal), compile_gluon_bwd_dq))
            # 128 < D < 256 (padded_head_dim): the gradients' first 192 columns stored
            cases.append((f"gluon-bwd D=256 causal={causal!s:<5}", dict(GB.config_for(256, causal, 4096), D_OUT=192),
                          compile_gluon_bwd))
            cases.append((f"gluon-dq D=256 causal={causal!s:<5}", dict(GB.dq_config_for(256, causal), D_OUT=192),
                          compile_gluon_bwd_dq))
        for dtype in [a for a in sys.argv[1:] if a in ("fp16", "bf16")] or ["fp16", "bf16"]:
            for tag, cfg, build in cases:
                d, causal = int(tag.split("D=")[1].split()[0]), "True" in tag
                try:
                    k = build(d, causal, cfg, dtype)
                    _record(f"{dtype} {tag} {sorted(cfg.items())}", k)
                    print(f"ok   {dtype} {tag} {cfg} smem={k.metadata.shared}", flush=True)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    print(f"FAIL {dtype} {tag} {cfg}: {type(e).__name__}: {str(e)[:600]}", flush=True)
    print(f"triton {triton.__version__}: {failures} failure(s)")
    if "--ptx-digests" in sys.argv:
        with open(sys.argv[sys.argv.index("--ptx-digests") + 1], "w") as f:
            json.dump(DIGESTS, f, indent=0, sort_keys=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
