"""Public API: validate, set defaults, dispatch to the ``tileflash::*`` ops. Nothing else."""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import os

import torch
from torch import Tensor

from tileflash.ops.attention import (PackedAttention, attention, attention_args, attention_kept, attention_kept_bhsd,
                                     kvcache_append, kvcache_forward, kvcache_fwd, op_args)
from tileflash.ops import route
from tileflash.ops.route import use_triton
from tileflash.ops.triton.decode import check_grid, length_bucket, row_block_count
from tileflash.ops.utils import apply_rotary
from tileflash.options import DEBUG, Options, resolve

MAX_HEADDIM = 256
_GPU_DTYPES = (torch.float16, torch.bfloat16)
_INTERPRETER_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_qkv(q, k, v, names=("q", "k", "v"), layout="(batch, seqlen, nheads, headdim)"):
    """Validate q/k/v given in the (batch, seqlen, nheads, headdim) convention (after any transpose).

    ``names``/``layout`` are only used to word the errors in the caller's own terms.
    """
    nq, nk, nv = names
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"{nq}, {nk}, {nv} must be on the same device, got {q.device}, {k.device}, {v.device}; "
            f"move them with .to(device)"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"{nq}, {nk}, {nv} must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them to one dtype"
        )
    if q.device.type == "cuda":
        allowed = _GPU_DTYPES
    else:
        allowed = _INTERPRETER_DTYPES if use_triton(q) else _CPU_DTYPES
    if q.dtype not in allowed:
        names_ = ", ".join(str(d).replace("torch.", "") for d in allowed)
        hint = ""
        if q.dtype == torch.float64:
            hint = " (float64 is supported on the tiled CPU path only)"
        elif q.dtype == torch.float32 and q.device.type == "cuda":
            hint = (" (float32 on the GPU is not supported: cast to bfloat16, which has float32's range, "
                    "e.g. q.bfloat16(); the CPU paths compute float32)")
        raise TypeError(f"{nq} has dtype {q.dtype}, which is not supported here{hint}; use one of: {names_} "
                        f"(bfloat16 or float16 recommended on GPU)")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{nq} is on device {q.device}; tileflash runs on CUDA GPUs and on the CPU")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    bv, sv, hv, dv = v.shape
    if bk != b or bv != b:
        raise ValueError(f"batch size mismatch: {nq} has {b}, {nk} has {bk}, {nv} has {bv}; they must be equal")
    if dk != d or dv != d:
        raise ValueError(f"head dim mismatch: {nq} has {d}, {nk} has {dk}, {nv} has {dv}; they must be equal")
    if sv != sk:
        raise ValueError(f"{nk} and {nv} must have the same seqlen, got {sk} and {sv}")
    if hv != hk:
        raise ValueError(f"{nk} and {nv} must have the same number of heads, got {hk} and {hv}")
    if hk == 0 or h % hk != 0:
        raise ValueError(
            f"{nk} has {hk} heads but {nq} has {h}; the number of query heads must be a multiple of "
            f"the number of key/value heads (GQA/MQA)"
        )
    if d < 1 or d > MAX_HEADDIM:
        raise ValueError(f"head dim is {d}; tileflash supports head dims from 1 to {MAX_HEADDIM}")


def _unit_last_stride(t: Tensor) -> Tensor:
    # The kernels need a unit stride on headdim only; every other stride is used as is.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _default_scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _check_features(q, dropout_p, causal, window_size, softcap, alibi_slopes, deterministic, batch, nheads,
                    options=None):
    """Validate flash-attn 2's optional features and tileflash's ``options``; returns the op's
    keyword arguments."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1 (left, right), -1 meaning unbounded; "
                         f"got {window_size!r}")
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or not softcap >= 0.0 \
            or not math.isfinite(softcap):
        raise ValueError(f"softcap must be a finite float >= 0 (0 disables it), got {softcap!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}; use alibi_slopes.float()")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}; move it with .to()")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
                             f"({batch}, {nheads}), got {tuple(alibi_slopes.shape)}")
    feats = dict(window_left=int(window_size[0]), window_right=int(window_size[1]), softcap=float(softcap),
                 alibi_slopes=alibi_slopes, deterministic=deterministic, options=resolve(options).encode())
    if dropout_p > 0.0:
        # One 62-bit Philox seed per call, drawn from torch's generator on q's device, so
        # torch.manual_seed makes dropout reproducible; the backward reuses it (never a stored mask).
        feats.update(dropout_p=float(dropout_p),
                     seed=torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device))
    return feats


def _check_cu_seqlens(name, cu, total, batch, max_seqlen, max_name, device):
    """Returns max_seqlen as an int. Cheap structural checks always; value checks on CPU tensors, or on CUDA when
    TILEFLASH_CHECK_INPUTS=1 (they need a device-to-host copy, i.e. a sync). Never inside a
    torch.compile graph, where the values are not known at trace time."""
    if not isinstance(cu, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}; use {name}.int()")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; move it with .to()")
    if batch is not None and cu.numel() != batch + 1:
        raise ValueError(f"{name} has {cu.numel()} entries but cu_seqlens_q has {batch + 1}; both are (batch + 1,)")
    try:
        if isinstance(max_seqlen, bool):
            raise TypeError
        max_seqlen = operator.index(max_seqlen)
    except TypeError:
        raise TypeError(f"{max_name} must be an int >= 0, got {max_seqlen!r}") from None
    if max_seqlen < 0:
        raise TypeError(f"{max_name} must be an int >= 0, got {max_seqlen!r}")
    if max_seqlen == 0 and total > 0:
        raise ValueError(f"{max_name} is 0 but there are {total} tokens; pass the longest sequence's length")
    if cu.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (the kernels read it with unit stride); "
                         f"pass {name}.contiguous()")
    if torch.compiler.is_compiling():
        return max_seqlen  # values are data-dependent: not checked inside torch.compile graphs
    if cu.device.type == "cpu" or os.environ.get("TILEFLASH_CHECK_INPUTS", "0") == "1":
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lens = [b - a for a, b in zip(vals, vals[1:])]
        if any(n < 0 for n in lens):
            raise ValueError(f"{name} must be non-decreasing, got {vals}")
        if vals[-1] != total:
            raise ValueError(f"{name} must end at the number of tokens ({total}), got {vals[-1]}")
        if lens and max(lens) > max_seqlen:
            raise ValueError(f"{max_name} = {max_seqlen} is smaller than the longest sequence ({max(lens)})")
    return max_seqlen


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, options=None):
    """Exact attention over a batch of sequences of different lengths, packed without padding.

    Same semantics as :func:`flash_attn_func`, applied to each sequence on its own (no token
    attends across sequences; causal and windows are aligned bottom-right on each sequence's
    own lengths). No compute is spent on tokens that do not exist.

    Arguments:
        q: (total_q, nheads, headdim), the sequences concatenated along the first dimension.
        k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q: (batch + 1,), int32. Sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``
            of q; it starts at 0 and ends at total_q. E.g. lengths [128, 512, 64] ->
            ``[0, 128, 640, 704]``.
        cu_seqlens_k: (batch + 1,), int32, the same for k and v.
        max_seqlen_q, max_seqlen_k: int, at least the longest sequence (sizes the grid).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, options:
            as in :func:`flash_attn_func` (alibi_slopes (batch, nheads) is per sequence).

    cu_seqlens are checked for dtype, shape and device on every call. Their values (start at 0,
    non-decreasing, end at the token count, ``max_seqlen >=`` the longest sequence) are checked
    on CPU tensors, and on CUDA only when the environment sets ``TILEFLASH_CHECK_INPUTS=1``:
    reading them would force a device sync on every call. Inside ``torch.compile`` they are not
    checked (their values are unknown while tracing).

    Return:
        out: (total_q, nheads, headdim).
        softmax_lse [if return_attn_probs]: (nheads, total_q), float32 (flash-attn's varlen layout).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, nheads, headdim) for varlen, got shape "
                             f"{tuple(t.shape)}")
    _check_qkv(q[None], k[None], v[None])
    max_seqlen_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], None, max_seqlen_q, "max_seqlen_q",
                                     q.device)
    batch = cu_seqlens_q.numel() - 1
    max_seqlen_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], batch, max_seqlen_k, "max_seqlen_k",
                                     q.device)
    feats = _check_features(q, dropout_p, causal, window_size, softcap, alibi_slopes, deterministic,
                            batch=batch, nheads=q.shape[1], options=options)
    scale = _default_scale(softmax_scale, q.shape[-1])
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    out, lse = attention(q, k, v, scale, causal, 0, **feats, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if return_attn_probs:
        return out, lse, None
    return out


# A validated CUDA call's signature (what the checks read: shapes, strides, dtypes, devices and the
# scalar arguments with their types) -> the op's arguments after q, k, v (``op_args``): a repeated
# call skips the checks and the argument assembly (host time; issue: host cost per call). Only
# calls without tensors among the features and with unit last strides, outside torch.compile.
_PREPARED: dict = {}
_PREPARE_CPU = False  # tests set it to run the CUDA-only signature caches (also flash_attn_with_kvcache's, whose
# value checks are then skipped on CPU too) on CPU tensors


def _int_pair(w) -> bool:
    """Whether w is a tuple of two ints (a window_size the signature caches key: equal values of
    other types, e.g. (-1.0, -1), hash alike but take the full checks)."""
    return type(w) is tuple and len(w) == 2 and type(w[0]) is int and type(w[1]) is int


def _call_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, options):
    if (type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor
            or (not q.is_cuda and not _PREPARE_CPU)
            or alibi_slopes is not None or type(dropout_p) is not float or dropout_p != 0.0
            or not _int_pair(window_size) or (options is not None and type(options) is not Options)
            or torch.compiler.is_compiling() or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1):
        return None
    # k and v without their length (no check depends on it but their being equal; the causal shift,
    # which does, is set per call): a decoding loop whose keys grow every step keeps one signature
    ks, vs = k.shape, v.shape
    if len(ks) != 4 or len(vs) != 4:
        return None  # (checked in full: an error)
    return (q.shape, ks[0], ks[2], ks[3], vs[0], vs[2], vs[3], ks[1] == vs[1], q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, softmax_scale, type(softmax_scale), causal, type(causal), window_size,
            softcap, type(softcap), deterministic, type(deterministic), options)


# A call signature as _call_key's (which it must have passed) plus the tensors' strides -> [the
# planned Gluon forward its call ran (False where it ran none);
# the op's arguments after q, k, v; the backward launches its first backward recorded
# (``route.planned_backward``; False where the route keeps none, None until the first)]: a repeated call skips the checks and every layer
# down to the launch (``route.replay_forward``, under autograd inside ``_EagerAttention``, whose
# backward replays the kept backward launches; host time, issue: host cost per call). Tensors
# keyed by their whole layout, scalars by value and type.
_FAST_FWD: dict = {}


def _fast_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, deterministic, options):
    """The ``_FAST_FWD`` key of a call with plain tensors and no ALiBi (it may be unhashable: then
    the call takes the full path), or None where window_size is not a tuple of two ints."""
    if not _int_pair(window_size):
        return None
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device, dropout_p, type(dropout_p), softmax_scale, type(softmax_scale), causal, type(causal),
            window_size, softcap, type(softcap), deterministic, type(deterministic), options, type(options))


def _keep_fast(table: dict, fast, q, k, v, args):
    """After a call validated in full (args: its ``op_args``; q, k, v as the op took them): keep
    its entry in ``table`` (``_FAST_FWD`` or ``_FAST_SDPA``) under its signature ``fast``, with the
    planned Gluon forward it replayed (``route.planned_forward``)."""
    if not q.is_cuda and not _PREPARE_CPU:
        return
    (scale, causal, shift, left, right, softcap, _, _, _, _, _, dropout_p, _, _, options) = args
    plan = route.planned_forward(q, k, v, scale, causal, shift, (left, right), softcap, dropout_p,
                                 Options.decode(options)) or False
    if len(table) >= 1024:
        table.clear()
    table[fast] = [plan, args, None]


def _fast_call(entry, q, k, v, need_lse: bool):
    """A call of a kept signature (an entry of ``_FAST_FWD`` or ``_FAST_SDPA``) -> (out, lse; lse
    may be None without ``need_lse``): under autograd the autograd class with the entry's planned
    launches, else the planned Gluon forward replayed directly, else (no plan, or the replay
    declined) the op's body."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return attention_kept(q, k, v, entry)
    plan, args = entry[0], entry[1]
    done = route.replay_forward(plan, q, k, v, args[0], need_lse) if plan else None
    return attention_args(q, k, v, args, need_lse=need_lse) if done is None else done


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, options=None):
    """Exact attention, ``softmax(q kᵀ · softmax_scale) v``, without materialising the score matrix.

    Argument names, order and semantics follow flash-attn 2's ``flash_attn_func``.

    Differentiable: gradients flow to q, k and v through the ``tileflash::bwd`` op, which
    recomputes the attention probabilities block by block from q, k and the saved LSE (only
    q, k, v, out and the LSE are kept for the backward).

    Supports multi-query and grouped-query attention (MQA/GQA) by passing in K, V with
    fewer heads than Q. The number of heads in Q must be divisible by the number of heads
    in KV. For example, if Q has 6 heads and K, V have 2 heads, heads 0, 1, 2 of Q attend
    to head 0 of K, V and heads 3, 4, 5 of Q attend to head 1 of K, V: query head ``h``
    uses kv head ``h // (nheads // nheads_k)``. K and V are never expanded in memory.

    If ``causal=True``, the causal mask is aligned to the bottom-right corner of the
    attention matrix: query ``i`` sees key ``j`` iff ``j <= i + seqlen_k - seqlen_q``.
    For example, with seqlen_q = 2 and seqlen_k = 5 (1 = visible)::

        1 1 1 1 0
        1 1 1 1 1

    and with seqlen_q = 5 and seqlen_k = 2::

        0 0
        0 0
        0 0
        1 0
        1 1

    A query row that sees no key (the first three rows above) outputs exactly 0, and its
    ``softmax_lse`` is ``-inf``; it never produces NaN.

    If ``window_size != (-1, -1)``, sliding-window (local) attention: query ``i`` sees key ``j``
    iff ``i + seqlen_k - seqlen_q - window_size[0] <= j <= i + seqlen_k - seqlen_q + window_size[1]``;
    -1 leaves that side unbounded, and ``causal=True`` sets ``window_size[1] = 0``. Key blocks
    outside every row's window are never loaded, so the cost grows with the window, not N.

    The score of (i, j) is ``s = softmax_scale · q_i·k_j``, then
    ``s = softcap · tanh(s / softcap)`` if ``softcap > 0`` (Gemma-2 style logit capping), then
    ``s = s − slope · |i + seqlen_k − seqlen_q − j|`` with ALiBi slopes, before the softmax.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim)
        k: (batch, seqlen_k, nheads_k, headdim)
        v: (batch, seqlen_k, nheads_k, headdim)
        softmax_scale: float. The scaling of QKᵀ before the softmax. Default 1 / sqrt(headdim).
        dropout_p: float in [0, 1). Dropout on the attention probabilities P (after the
            softmax; kept entries scaled by 1 / (1 - dropout_p)). The mask is drawn in the kernel
            from a counter-based RNG (Philox on the GPU and in the interpreter, a hash on the tiled
            CPU path) seeded from torch's generator, so ``torch.manual_seed`` reproduces it; the
            backward regenerates it and never stores it. Pass 0.0 at evaluation time.
        causal: bool. Whether to apply a causal mask (bottom-right aligned, see above).
        window_size: (left, right). Sliding window; -1 means unbounded on that side.
        softcap: float. > 0 caps the scores with softcap · tanh(s / softcap); 0 disables.
        alibi_slopes: (nheads,) or (batch, nheads), float32, on q's device. Adds
            -slope · |i + seqlen_k - seqlen_q - j| to the score of (i, j). No gradient.
        deterministic: bool. As in flash-attn: False (default) lets the backward sum dQ with
            unordered fp32 reductions where that is faster, so two runs may differ in the last bits;
            True makes the backward bitwise reproducible (as does
            ``torch.use_deterministic_algorithms(True)``). Today only the Hopper Gluon backward
            takes the unordered kernel, at head dim 128 with both lengths >= 8192 and at head dim 64
            with both >= 16384 (causal or not); every other call is bitwise reproducible either way.
        return_attn_probs: bool. If True, also return ``softmax_lse``. The attention
            probabilities themselves are never formed, so the third element is None
            (flash-attn returns them only for testing with dropout).
        options: :class:`tileflash.Options` (or a dict of its fields, or None for the defaults):
            which kernels run the call (``backend``, ``use_tma``, ``autotune``, ``pad_head_dim``),
            never what it computes. ``Options(backend="gluon")`` raises ``ValueError`` where the
            Hopper kernels cannot take the call.

    Shapes and dtypes:
        * any seqlen >= 0 (seqlen 0 returns an empty output without a kernel launch;
          seqlen_k = 0 gives out = 0 and lse = -inf), seqlen_q != seqlen_k allowed;
        * headdim from 1 to 256 (padded inside the kernel, never in your tensors);
        * CUDA: float16 and bfloat16 (float32 is rejected with a TypeError that recommends
          bfloat16). CPU: float32 recommended, float16/bfloat16 accepted (the tiled path
          computes in float32), float64 on the tiled path only;
        * any strides with a unit stride on headdim are used without a copy.

    Devices:
        CUDA tensors run the Triton kernel. CPU tensors run the same Triton kernel in
        Triton's interpreter if ``TRITON_INTERPRET=1`` was set before import, otherwise a
        tiled PyTorch implementation of the same algorithm with O(seqlen · block) memory.

    Return:
        out: (batch, seqlen_q, nheads, headdim), the dtype of q.
        softmax_lse [optional, if return_attn_probs=True]: (batch, nheads, seqlen_q), float32.
            The natural-log logsumexp of each row of the final scores (after softcap and
            ALiBi), -inf for a row that sees no key. It has no gradient: a loss that depends on
            it does not backpropagate through it (as in flash-attn). Two differences from
            flash-attn 2's value: it returns +inf for rows that see no key, and with causal +
            ALiBi its lse is ours + slope·(i + seqlen_k - seqlen_q) (it biases by +slope·j).
        None [optional, if return_attn_probs=True]: placeholder for the attention probabilities.
    """
    fast = None
    if (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and alibi_slopes is None
            and q.dim() == 4 and q.shape[1] > route.DECODE_MAX_Q and not torch.compiler.is_compiling()):
        # a validated signature seen before (_FAST_FWD): its op arguments and its planned Gluon
        # forward, replayed directly (under autograd inside the autograd class, with the backward
        # launches the signature kept). (Not for a few query tokens: such calls go to the decode
        # kernel, and a decoding loop's keys grow every step, so its signatures never repeat.)
        fast = _fast_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, deterministic, options)
        try:
            entry = _FAST_FWD.get(fast)
        except TypeError:  # (unhashable arguments, e.g. a dict of options: the full path)
            entry = fast = None
        if entry is not None:
            done = _fast_call(entry, q, k, v, return_attn_probs)
            return (done[0], done[1], None) if return_attn_probs else done[0]
    key = _call_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                    options)
    args = _PREPARED.get(key) if key is not None else None
    if args is None:
        _check_qkv(q, k, v)
        feats = _check_features(q, dropout_p, causal, window_size, softcap, alibi_slopes, deterministic,
                                batch=q.shape[0], nheads=q.shape[2], options=options)
        args = op_args(_default_scale(softmax_scale, q.shape[-1]), causal, k.shape[1] - q.shape[1], **feats)
        if key is not None:
            if len(_PREPARED) >= 1024:
                _PREPARED.clear()
            _PREPARED[key] = args
        else:
            q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    elif args[2] != k.shape[1] - q.shape[1]:  # the signature's keys at another length: this call's causal shift
        args = (args[0], args[1], k.shape[1] - q.shape[1], *args[3:])
    out, lse = attention_args(q, k, v, args, need_lse=return_attn_probs)
    if fast is not None and key is not None:
        _keep_fast(_FAST_FWD, fast, q, k, v, args)
    if return_attn_probs:
        return out, lse, None
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, options=None):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention``, computed by tileflash.

    Same layout and semantics as torch's function: ``query`` is
    ``(batch, nheads, seqlen_q, headdim)``, ``key``/``value`` are
    ``(batch, nheads_k, seqlen_k, headdim)``, and the result has query's shape and dtype.
    The (batch, seqlen, nheads, headdim) kernels read these tensors through a transpose,
    so no copy is made. The result has query's memory order (``Options.like_inputs``):
    (batch, nheads, seqlen, headdim)-contiguous inputs give a contiguous result, as torch's
    function does; views of (batch, seqlen, nheads, headdim) memory give a view of such memory.

    ``is_causal=True`` is torch's *top-left* alignment: query ``i`` sees key ``j`` iff
    ``j <= i``, whatever the lengths (this differs from ``flash_attn_func(causal=True)``
    when seqlen_q != seqlen_k). With seqlen_q = 2, seqlen_k = 5::

        1 0 0 0 0
        1 1 0 0 0

    ``enable_gqa=True`` allows ``nheads_k < nheads`` (nheads a multiple of nheads_k;
    query head h uses kv head ``h // (nheads // nheads_k)``, as in torch). Without it the
    head counts must match, as in torch.

    ``options``: :class:`tileflash.Options`, as in :func:`flash_attn_func`, with ``like_inputs``
    always set (the output, and the gradients in eager mode, in their inputs' memory order).

    The backward is :func:`flash_attn_func`'s with ``deterministic=False``: bitwise reproducible
    under ``torch.use_deterministic_algorithms(True)``, and otherwise allowed unordered dQ sums where
    faster (see ``deterministic`` there).

    Not supported yet (raise ``NotImplementedError``): ``attn_mask`` other than None,
    ``dropout_p > 0``.
    """
    fast = None
    if (attn_mask is None and type(query) is Tensor and type(key) is Tensor and type(value) is Tensor
            and query.dim() == 4 and query.shape[2] > route.DECODE_MAX_Q and not torch.compiler.is_compiling()):
        # a signature validated before (_FAST_SDPA), as flash_attn_func's _FAST_FWD
        fast = (query.shape, query.stride(), key.shape, key.stride(), value.shape, value.stride(), query.dtype,
                key.dtype, value.dtype, query.device, key.device, value.device, dropout_p, type(dropout_p), is_causal,
                type(is_causal), scale, type(scale), enable_gqa, type(enable_gqa), options, type(options))
        try:
            entry = _FAST_SDPA.get(fast)
        except TypeError:  # (unhashable arguments, e.g. a dict of options: the full path)
            entry = fast = None
        if entry is not None:
            if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
                return attention_kept_bhsd(query, key, value, entry)  # (the transposes inside its autograd node)
            return _fast_call(entry, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              False)[0].transpose(1, 2)
    if attn_mask is not None:
        raise NotImplementedError(
            "tileflash.scaled_dot_product_attention does not support attn_mask yet; pass attn_mask=None "
            "(use is_causal=True for a causal mask) or call torch.nn.functional.scaled_dot_product_attention"
        )
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"tileflash.scaled_dot_product_attention does not support dropout yet (got dropout_p={dropout_p}); "
            "pass dropout_p=0.0"
        )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, nheads, seqlen, headdim), got shape {tuple(t.shape)}")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise ValueError(
            f"query has {query.shape[1]} heads but key has {key.shape[1]}; pass enable_gqa=True for "
            "grouped-query attention (query heads must be a multiple of key/value heads)"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    _check_qkv(q, k, v, names=("query", "key", "value"), layout="(batch, nheads, seqlen, headdim)")
    sc = _default_scale(scale, q.shape[-1])
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        fast = None  # (copied: the signature's tensors are not what the op takes)
        q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    # (the output in q's memory order: (b, h, s, d)-contiguous inputs get a (b, h, s, d)-contiguous
    # output, and the planned Hopper forward, whose output must share q's layout, takes them)
    args = op_args(sc, is_causal, 0, options=dataclasses.replace(resolve(options), like_inputs=True).encode())
    out, _ = attention_args(q, k, v, args, need_lse=False)
    if fast is not None:
        _keep_fast(_FAST_SDPA, fast, q, k, v, args)
    return out.transpose(1, 2)


# scaled_dot_product_attention's signatures validated before (its arguments as given: shapes,
# strides, dtypes, devices; scalars by value and type) -> an entry as _FAST_FWD's
_FAST_SDPA: dict = {}


# ------------------------------------------------------------------------------------------------
# Packed variants: q, k, v (or k, v) stacked in one tensor, as a fused QKV projection produces them.
# They are read through views (no copy), and their gradients are written by the kernels straight
# into one packed gradient tensor (no concatenation).
# ------------------------------------------------------------------------------------------------


def _check_packed(name, t, ndim, count, layout):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim or t.shape[ndim - 3] != count:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")


def _packed(q_or_qkv, kv, dim, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
            deterministic, return_attn_probs, varlen=None, options=None):
    if kv is None:
        q, k, v = q_or_qkv.unbind(dim)
    else:
        q, (k, v) = q_or_qkv, kv.unbind(dim)
    if varlen is None:
        _check_qkv(q, k, v)
        batch, nheads, shift = q.shape[0], q.shape[2], k.shape[1] - q.shape[1]
        extra = {}
    else:
        cu_q, cu_k, max_q, max_k = varlen
        _check_qkv(q[None], k[None], v[None])
        max_q = _check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], None, max_q, "max_seqlen_q", q.device)
        batch = cu_q.numel() - 1
        max_k = _check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], batch, max_k, "max_seqlen_k", q.device)
        nheads, shift = q.shape[1], 0
        extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    if q_or_qkv.stride(-1) != 1 or (kv is not None and kv.stride(-1) != 1):
        raise ValueError("packed tensors need a unit stride on headdim; call .contiguous() on them")
    feats = _check_features(q, dropout_p, causal, window_size, softcap, alibi_slopes, deterministic,
                            batch=batch, nheads=nheads, options=options)
    scale = _default_scale(softmax_scale, q.shape[-1])
    out, lse = PackedAttention.apply(q_or_qkv, kv, dim, scale, causal, shift, {**feats, **extra})
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, options=None):
    """:func:`flash_attn_func` on ``qkv`` of shape (batch, seqlen, 3, nheads, headdim).

    Equivalent to ``flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ...)`` but the
    gradient is one (batch, seqlen, 3, nheads, headdim) tensor that the backward kernels fill
    in place (no concatenation of dq, dk, dv). Same arguments and return as flash_attn_func.
    """
    _check_packed("qkv", qkv, 5, 3, "(batch, seqlen, 3, nheads, headdim)")
    return _packed(qkv, None, 2, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   deterministic, return_attn_probs, options=options)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, options=None):
    """:func:`flash_attn_func` with ``kv`` of shape (batch, seqlen_k, 2, nheads_k, headdim).

    q is (batch, seqlen_q, nheads, headdim); GQA/MQA as in flash_attn_func. dk and dv are
    written in place into one packed gradient of kv's shape.
    """
    _check_packed("kv", kv, 5, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return _packed(q, kv, 2, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   deterministic, return_attn_probs, options=options)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, options=None):
    """:func:`flash_attn_varlen_func` on ``qkv`` of shape (total, 3, nheads, headdim), with
    one ``cu_seqlens`` (batch + 1,) int32 and ``max_seqlen`` for q, k and v."""
    _check_packed("qkv", qkv, 4, 3, "(total_tokens, 3, nheads, headdim)")
    return _packed(qkv, None, 1, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   deterministic, return_attn_probs, varlen=(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen), options=options)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, options=None):
    """:func:`flash_attn_varlen_func` with ``kv`` of shape (total_k, 2, nheads_k, headdim)."""
    for name, t in (("q", q),):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor (total_q, nheads, headdim)")
    _check_packed("kv", kv, 4, 2, "(total_k, 2, nheads_k, headdim)")
    return _packed(q, kv, 1, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   deterministic, return_attn_probs, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                   options=options)


# ------------------------------------------------------------------------------------------------
# Inference: attention over a KV cache, with in-place append and rotary.
# ------------------------------------------------------------------------------------------------


def _int_tensor(name, t, shape, device):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}; use {name}.int()")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; move it with .to()")
    return t.contiguous()


def _kvcache_checks_values(device_type: str, seqlen_new: int, rotary_append: bool, compiling: bool) -> bool:
    """Whether flash_attn_with_kvcache reads cache_seqlens / block_table / cache_batch_idx /
    cache_leftpad on the host to check them (on CUDA a device sync per tensor read).

    CPU tensors: always, except for a read-only call while torch.compile traces (values unknown);
    an append or rotary is checked there too, as a graph break. CUDA tensors: only with
    TILEFLASH_CHECK_INPUTS=1 (likewise); by default a CUDA call reads no value, as in flash-attn,
    and the kernels guard instead: the append kernel writes no position, page or cache entry out
    of range, the attention kernel clamps lengths and indices into the cache, and rotary positions
    are clamped into the table. Bad values then give wrong results for their rows, never a write
    or read outside the cache."""
    if device_type == "cuda" and os.environ.get("TILEFLASH_CHECK_INPUTS", "0") != "1":
        return False
    return seqlen_new > 0 or rotary_append or not compiling


def _check_kvcache_lengths(sl, seqlen_new, capacity):
    """Lengths known on the host: non-negative, and the append fits the cache."""
    if min(sl, default=0) < 0:
        raise ValueError(f"cache_seqlens must be >= 0, got {sl}")
    if max(sl, default=0) + seqlen_new > capacity:
        b = max(range(len(sl)), key=lambda i: sl[i])
        raise ValueError(f"cache overflow: batch {b} holds {sl[b]} tokens and appends {seqlen_new}, but the "
                         f"cache has room for {capacity}; grow the cache (or its block_table) first")


@torch.compiler.disable
def _check_kvcache_values(sl, seqlens, seqlen_new, seqlen_q, capacity, num_cache, page_size, block_table,
                          cache_batch_idx, rotary_cos, cache_leftpad=None):
    """Value checks of flash_attn_with_kvcache, before any write; returns the lengths as a list.

    Kept out of torch.compile graphs (a graph break), so a compiled append is checked too. Syncs:
    one for tensor lengths, one for the block table (min, max and repeats computed on the device),
    one for cache_batch_idx, one for cache_leftpad."""
    if sl is None:
        sl = seqlens.tolist()
    batch = len(sl)
    _check_kvcache_lengths(sl, seqlen_new, capacity)
    if block_table is not None and batch and block_table.shape[1]:
        # the pages each row uses (those holding its first sl[b] + seqlen_new keys); unused slots
        # get distinct negative sentinels so that they neither repeat nor set the range
        dev = block_table.device
        need = torch.tensor([-(-(n + seqlen_new) // page_size) for n in sl], device=dev)
        slots = torch.arange(block_table.shape[1], device=dev)
        used = slots[None, :] < need[:, None]                                   # (batch, max_blocks)
        bt = block_table.long()
        big = 2 ** 62
        sentinel = -1 - torch.arange(bt.numel(), device=dev).view_as(bt) - big
        srt = torch.where(used, bt, sentinel).flatten().sort().values
        lo_, hi_, rep, n_used = torch.stack((
            torch.where(used, bt, big).min(), torch.where(used, bt, -big).max(),
            (srt[1:] == srt[:-1]).any().long(), used.sum())).tolist()
        if n_used and (lo_ < 0 or hi_ >= num_cache):
            raise ValueError(f"block_table entries must be in [0, {num_cache}) (the number of pages); "
                             f"got values from {lo_} to {hi_}")
        if n_used and seqlen_new and rep:
            raise ValueError("block_table maps two batch rows (or two positions) to the same page while "
                             "appending; give every sequence its own pages")
    if cache_batch_idx is not None:
        idx = cache_batch_idx.tolist()
        if min(idx) < 0 or max(idx) >= num_cache:
            raise ValueError(f"cache_batch_idx entries must be in [0, {num_cache}), got {idx}")
        if seqlen_new and len(set(idx)) != len(idx):
            raise ValueError(f"cache_batch_idx has repeated entries {idx}: two batch rows would append to the same "
                             f"cache entry")
    if cache_leftpad is not None:
        pad = cache_leftpad.tolist()
        bad = [b for b in range(batch) if not 0 <= pad[b] <= sl[b]]
        if bad:
            raise ValueError(f"cache_leftpad must satisfy 0 <= cache_leftpad[b] <= cache_seqlens[b]; batch {bad[0]} "
                             f"has cache_leftpad {pad[bad[0]]} and cache_seqlens {sl[bad[0]]}")
    if rotary_cos is not None:
        _check_rotary_length(sl, seqlen_new, seqlen_q, rotary_cos)
    return sl


def _check_rotary_length(sl, seqlen_new, seqlen_q, rotary_cos):
    """The rotary table covers every position the call rotates (lengths known on the host)."""
    if max(sl, default=0) + max(seqlen_new, seqlen_q) > rotary_cos.shape[0]:
        raise ValueError(f"rotary_cos has {rotary_cos.shape[0]} positions but positions up to "
                         f"{max(sl) + max(seqlen_new, seqlen_q) - 1} are needed")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, options=None):
    """Attention of new query tokens against a KV cache (decoding), flash-attn 2's signature.

    If ``k`` and ``v`` are given, they are first **written in place** into the cache at positions
    ``cache_seqlens[b], cache_seqlens[b] + 1, ...`` (after rotary, if given); attention then runs
    over ``cache[:cache_seqlens[b] + seqlen_new]``, causal aligned bottom-right (new token t is at
    position ``cache_seqlens[b] + t``). Without k/v it runs over ``cache[:cache_seqlens[b]]``.
    Forward only: there is no backward.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), usually seqlen_q = 1 (longer chunks work too).
        k_cache, v_cache: contiguous cache (batch_cache, seqlen_cache, nheads_k, headdim), or,
            with ``block_table``, a paged cache (num_blocks, page_size, nheads_k, headdim). Any
            page size >= 1 works (16 to 256 are the usual ones); key j of batch b is row
            ``j % page_size`` of page ``block_table[b, j // page_size]``.
        k, v: (batch, seqlen_new, nheads_k, headdim) or None.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2), rotary_dim <= headdim and even.
            Only used when k and v are appended (as in flash-attn): applied to the new k and to q,
            at positions cache_seqlens + t when causal or local, otherwise every q token at
            position cache_seqlens (flash-attn's rule).
        cache_seqlens: int, or (batch,) int32: tokens already in the cache. None: the cache is full.
        cache_batch_idx: (batch,) int32: which cache entry each batch element uses (contiguous
            caches only). None: entry b.
        cache_leftpad: (batch,) int32: the index where each sequence's cache starts; keys before it
            are ignored (flash-attn's left padding). Positions stay absolute: appends go to
            cache_seqlens[b] onward, rotary uses cache_seqlens[b] + t, and the causal alignment is
            to the end. Must satisfy 0 <= cache_leftpad[b] <= cache_seqlens[b]. None: 0.
        block_table: (batch, max_blocks) int32 for a paged cache.
        softmax_scale, causal, window_size, softcap, alibi_slopes, options: as in flash_attn_func
            (there is no Gluon decode kernel: ``Options(backend="gluon")`` raises on CUDA).
        rotary_interleaved: True for GPT-J style pairs (0,1),(2,3)...; False for GPT-NeoX halves.
        num_splits: how many pieces the KV length is split into (flash-decoding). 0 chooses from
            the number of SMs and the cache length; 1 disables splitting.
        return_softmax_lse: also return the merged LSE (batch, nheads, seqlen_q), float32.

    Shapes, dtypes, devices and head counts are validated before anything is written, and raise
    leaving the cache untouched. Values inside tensors (cache_seqlens, block_table,
    cache_batch_idx, cache_leftpad) are a different matter, as in flash-attn: reading them on the
    host costs a device sync per tensor on CUDA, so on CUDA they are checked only with the
    environment variable TILEFLASH_CHECK_INPUTS=1 (then an append past the cache's end, table
    entries out of range, repeated pages or entries raise before any write). By default a CUDA
    call reads no value, stays asynchronous (append and attention can be captured in a CUDA graph)
    and the kernels guard instead: the append writes no position, page or cache entry outside the
    cache (the tokens of an overflowing row that still fit are written, the rest dropped), the
    attention kernel clamps lengths and indices into the cache, rotary positions are clamped into
    the table. Bad values then give wrong outputs for their rows, never an access outside the
    cache. CPU tensors are always checked (also inside torch.compile, as a graph break, when the
    call appends), and cache_seqlens given as a Python int is checked for free everywhere (the
    overflow and the rotary table's length). With tensor lengths that are not read, the KV splits
    are sized by the cache's capacity rather than the longest sequence, so a cache allocated much
    longer than its contents splits its work coarsely (fewer busy programs at small batch);
    passing cache_seqlens as an int, or a cache sized to the contents, avoids that.
    """
    key = _kvcache_key(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                       cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
                       num_splits, options)
    prepared = _KV_PREPARED.get(key) if key is not None else None
    if prepared is not None:
        # a step of a signature whose launches are kept (_KV_FAST): append and attend directly
        fast = _KV_FAST.get(key)
        if fast is not None and fast[2] == DEBUG.pdl:
            if type(cache_seqlens) is Tensor:
                done = route.replay_kvcache(fast[0], q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                                            block_table, cache_leftpad, fast[1], return_softmax_lse)
            else:  # an int length (the key holds its type, not its value): the kept plan serves one
                # length bucket; a length outside it, or one the cache has no room for, takes the full
                # path (which plans it, or raises)
                n = cache_seqlens + prepared[3]
                done = None
                if 0 <= cache_seqlens and n <= prepared[2] and length_bucket(n) == fast[3]:
                    done = route.replay_kvcache(fast[0], q, k_cache, v_cache, k, v, None, cache_batch_idx,
                                                block_table, cache_leftpad, n, return_softmax_lse, cache_seqlens)
            if done is not None:
                return done if return_softmax_lse else done[0]
    if prepared is None:
        prepared = _kvcache_prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                    cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                                    softcap, alibi_slopes, num_splits, options)
        # the tensors it made contiguous (a key is only made for contiguous ones, which it returns as given)
        cache_batch_idx, cache_leftpad, block_table = prepared[4:7]
        if key is not None:
            if len(_KV_PREPARED) >= 1024:
                _KV_PREPARED.clear()
            _KV_PREPARED[key] = prepared[:4]
    scale, feats, capacity, seqlen_new = prepared[:4]
    batch, seqlen_q = q.shape[0], q.shape[1]
    uniform = cache_seqlens is None or type(cache_seqlens) is int or (
        isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool))
    seqlens = None if uniform else cache_seqlens.contiguous()

    # -- value checks, all before any write --------------------------------------------------------
    if uniform:
        sl = [int(cache_seqlens) if cache_seqlens is not None else capacity] * batch  # known on the host
    else:
        sl = None
    checked = key is None and _kvcache_checks_values(q.device.type, seqlen_new, k is not None and rotary_cos is not None,
                                                     torch.compiler.is_compiling())
    if checked:
        sl = _check_kvcache_values(sl, seqlens, seqlen_new, seqlen_q, capacity, k_cache.shape[0], k_cache.shape[1],
                                   block_table, cache_batch_idx, rotary_cos if k is not None else None,
                                   cache_leftpad)
    elif sl is not None:  # host-known lengths: free to check, no sync
        _check_kvcache_lengths(sl, seqlen_new, capacity)
        if rotary_cos is not None and k is not None:
            _check_rotary_length(sl, seqlen_new, seqlen_q, rotary_cos)

    # -- rotary and in-place append ----------------------------------------------------------------
    # (uniform lengths: one host int, no length tensor is built; the kernels take the scalar)
    first = (sl[0] if sl else 0) if uniform else 0
    if rotary_cos is not None and k is not None:  # flash-attn: rotary only applies with an append
        dev = q.device
        start = first if uniform else seqlens.long()[:, None]
        span = capacity  # flash-attn's rule: a window at least the cache's size is no window
        local = 0 <= feats["window_left"] < span or 0 <= feats["window_right"] < span
        t_q = torch.arange(seqlen_q, device=dev) if (causal or local) else \
            torch.zeros(seqlen_q, dtype=torch.long, device=dev)
        pos_q = start + t_q[None, :]
        pos_k = start + torch.arange(seqlen_new, device=dev)[None, :]
        if not checked:  # unchecked lengths (CUDA): clamp into the table rather than index past it
            pos_q, pos_k = (p.clamp(0, rotary_cos.shape[0] - 1) for p in (pos_q, pos_k))
        q = apply_rotary(q, rotary_cos, rotary_sin, pos_q, rotary_interleaved)
        k = apply_rotary(k, rotary_cos, rotary_sin, pos_k, rotary_interleaved)
    if k is not None and seqlen_new > 0:
        append = kvcache_append if torch.compiler.is_compiling() else route.kvcache_append
        append(k_cache, v_cache, k, v, seqlens, first, cache_batch_idx, block_table)
    q = _unit_last_stride(q)
    # forward-only: outside torch.compile the op's dispatch is pure host overhead, so call its body.
    # Length tensors stay the caller's: the kernel adds the appended tokens (seqlen_add)
    args = (q, k_cache, v_cache, seqlens, scale, causal, feats["window_left"], feats["window_right"],
            feats["softcap"], feats["alibi_slopes"], cache_batch_idx, block_table, num_splits,
            max(sl, default=0) + seqlen_new if sl is not None else -1, cache_leftpad, feats["options"],
            0 if uniform or k is None else seqlen_new)
    if torch.compiler.is_compiling():
        out, lse = kvcache_fwd(*args)
    else:  # (an LSE nobody returns need not be allocated: kvcache_forward's need_lse)
        out, lse = kvcache_forward(*args, need_lse=return_softmax_lse)
        # (a length tensor or an int length, which the key holds by type; q as given)
        if key is not None and (not uniform or type(cache_seqlens) is int) and q is args[0]:
            planned = route.planned_kvcache(q, k_cache, v_cache, k, v, seqlens, scale, causal,
                                            (feats["window_left"], feats["window_right"]), feats["softcap"],
                                            cache_batch_idx, block_table, num_splits, cache_leftpad, args[-1],
                                            Options.decode(feats["options"]), args[13])
            if planned is not None:
                if len(_KV_FAST) >= 1024:
                    _KV_FAST.clear()
                _KV_FAST[key] = (planned, args[-1], DEBUG.pdl, length_bucket(args[13]) if uniform else None)
    return (out, lse) if return_softmax_lse else out


# A validated CUDA call's signature (what _kvcache_prepare reads: shapes, strides, dtypes and devices
# of every tensor argument, which optional ones are given, the scalar arguments and their types) ->
# (softmax scale, feature arguments, cache capacity, seqlen_new): a repeated decoding step skips the
# checks (host time; issue: host cost per call). Only calls without rotary or ALiBi, with contiguous
# index tensors, outside torch.compile and without TILEFLASH_CHECK_INPUTS=1 (whose value checks run
# at every call).
_KV_PREPARED: dict = {}
# A _KV_PREPARED signature with a length tensor or an int length whose step ran kept launches ->
# (what route.planned_kvcache returned, seqlen_add, the debug switch pdl then, and for an int length
# the length bucket its decode plan serves, else None): later steps replay them (route.replay_kvcache)
# without the interface's and the route's other layers (host time).
_KV_FAST: dict = {}


def _tensor_meta(t):
    """An optional tensor argument's part of a call signature: None for None, False (no signature)
    for anything but a contiguous plain Tensor."""
    if t is None:
        return None
    if type(t) is not Tensor or not t.is_contiguous():
        return False
    return t.shape, t.dtype, t.device


def _kvcache_key(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                 block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits, options):
    """flash_attn_with_kvcache's call signature for ``_KV_PREPARED``, or None: check in full."""
    if (type(q) is not Tensor or type(k_cache) is not Tensor or type(v_cache) is not Tensor
            or (not q.is_cuda and not _PREPARE_CPU)
            or rotary_cos is not None or rotary_sin is not None or alibi_slopes is not None
            or not _int_pair(window_size) or (options is not None and type(options) is not Options)
            or os.environ.get("TILEFLASH_CHECK_INPUTS", "0") == "1" or torch.compiler.is_compiling()):
        return None
    lens = type(cache_seqlens) if cache_seqlens is None or type(cache_seqlens) is int else _tensor_meta(cache_seqlens)
    metas = (lens, _tensor_meta(cache_batch_idx), _tensor_meta(cache_leftpad), _tensor_meta(block_table),
             None if k is None else (type(k) is Tensor and (k.shape, k.stride(), k.dtype, k.device)),
             None if v is None else (type(v) is Tensor and (v.shape, v.stride(), v.dtype, v.device)))
    if any(m is False for m in metas):
        return None
    return (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device,
            v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device, *metas, softmax_scale, type(softmax_scale),
            causal, type(causal), window_size, softcap, type(softcap), num_splits, type(num_splits), options)


def _kvcache_prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                     cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
                     num_splits, options):
    """Every check of flash_attn_with_kvcache that reads no tensor value (shapes, dtypes, devices,
    head counts, the grid's limits, the options) -> (softmax scale, feature arguments, the cache's
    capacity, seqlen_new, cache_batch_idx, cache_leftpad, block_table), the last three contiguous."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit stride on headdim (it is updated in place, so it cannot be "
                             f"copied); allocate it contiguous")
    batch, seqlen_q, nheads, d = q.shape
    # validate q against the cache as if it were one (batch_cache, seqlen, nheads_k, d) k/v
    _check_qkv(q, k_cache[:1].expand(batch, *k_cache.shape[1:]), v_cache[:1].expand(batch, *v_cache.shape[1:]),
               names=("q", "k_cache", "v_cache"))
    nheads_k, dev = k_cache.shape[2], q.device
    paged = block_table is not None
    if paged:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be combined with block_table (a paged cache)")
        if not isinstance(block_table, Tensor) or block_table.dim() != 2:
            raise ValueError("block_table must be a 2-D int32 tensor (batch, max_blocks)")
        block_table = _int_tensor("block_table", block_table, (batch, block_table.shape[1]), dev)
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences but q has batch {batch}; without "
                             f"cache_batch_idx, batch row b uses cache row b, so the cache needs at least {batch}")
    if cache_batch_idx is not None:
        cache_batch_idx = _int_tensor("cache_batch_idx", cache_batch_idx, (batch,), dev)
    if cache_leftpad is not None:
        cache_leftpad = _int_tensor("cache_leftpad", cache_leftpad, (batch,), dev)
    if not (cache_seqlens is None or (isinstance(cache_seqlens, numbers.Integral)
                                      and not isinstance(cache_seqlens, bool))):
        _int_tensor("cache_seqlens", cache_seqlens, (batch,), dev)
    if (k is None) != (v is None):
        raise ValueError("pass both k and v to append to the cache, or neither")
    seqlen_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or tuple(t.shape[:1]) != (batch,) or t.dim() != 4 \
                    or tuple(t.shape[2:]) != (nheads_k, d):
                raise ValueError(f"{name} must be (batch, seqlen_new, nheads_k, headdim) = ({batch}, *, {nheads_k}, "
                                 f"{d}), got {tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
            if t.dtype != k_cache.dtype or t.device != dev:
                raise TypeError(f"{name} must match the cache's dtype and device ({k_cache.dtype}, {dev})")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"k and v must have the same seqlen_new, got {k.shape[1]} and {v.shape[1]}")
        seqlen_new = k.shape[1]
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("pass both rotary_cos and rotary_sin, or neither")
    if rotary_cos is not None:
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape or 2 * rotary_cos.shape[1] > d:
            raise ValueError(f"rotary_cos/rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                             f"headdim = {d}; got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 = automatic), got {num_splits!r}")
    feats = _check_features(q, 0.0, causal, window_size, softcap, alibi_slopes, False, batch=batch, nheads=nheads,
                            options=options)
    scale = _default_scale(softmax_scale, d)
    if use_triton(q):  # a grid past CUDA's limits must raise before the append, not after it
        check_grid(batch * nheads_k, row_block_count(nheads // nheads_k, seqlen_q))
    if q.is_cuda and resolve(options).backend == "gluon":  # before the append, too
        route.refuse_gluon_kvcache()
    return scale, feats, capacity, seqlen_new, cache_batch_idx, cache_leftpad, block_table
