"""Routing: the one place that decides which implementation runs a call.

Below the custom ops (``tileflash.ops.attention``) every call comes here:

* CPU tensors, ``TRITON_INTERPRET`` unset at import -> the tiled PyTorch path (``tileflash.cpu``);
* CPU tensors, ``TRITON_INTERPRET=1`` set before import -> the Triton kernels in Triton's
  interpreter (how CI tests them; bf16 runs in fp32 there, since the interpreter gets bf16 wrong);
* CUDA tensors -> the Hopper Gluon kernels (``tileflash.ops.gluon``) where they can take the call
  and ``Options.backend`` allows, else the portable Triton kernels (``tileflash.ops.triton``).

The two kernel families never import each other; each says what it can take (the Gluon
modules' ``plan_for`` / ``supported`` / ``dq_supported``), and this module strings them together:
for a head dim between the Gluon kernels' widths it pads the inputs (a Triton copy kernel) and runs
the Gluon kernels at the next width; for a backward whose dK/dV went to Gluon but whose dQ could
not, it hands the Triton launcher the rest (``run_dkdv`` / ``run_dq``, with the delta computed).
A Gluon kernel that fails to compile with the installed triton warns once and the Triton kernel
runs instead.
"""

from __future__ import annotations

import contextlib
import os

import torch

from tileflash import cpu
from tileflash.ops.triton import backward as tr_bwd
from tileflash.ops.triton import decode as tr_dec
from tileflash.ops.triton import forward as tr_fwd
from tileflash.ops.launch import aligned
from tileflash.ops.utils import feature_args, lse_scratch, problem_dims
from tileflash.options import DEBUG, DEFAULT, Options

# Triton decides interpreter-or-GPU when a kernel is decorated, i.e. at import.
_KERNELS_INTERPRETED = tr_fwd.interpreting()

_GLUON = None  # (forward module, backward module) once imported; False where this triton has no Gluon


def gluon_modules():
    """The Gluon kernel modules, imported on first use (None where this triton has no Gluon)."""
    global _GLUON
    if _GLUON is None:
        try:
            from tileflash.ops.gluon import backward as gb
            from tileflash.ops.gluon import forward as gf
            _GLUON = (gf, gb)
        except ImportError:  # triton < 3.5
            _GLUON = False
    return _GLUON or None


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernels serve tensors on ``t``'s device (see the module docstring)."""
    if t.is_cuda:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    if not _KERNELS_INTERPRETED:
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after tileflash's kernels were built (at its first call, or "
            "at the import of tileflash.interface / tileflash.ops), so they were built for the GPU. "
            "Set TRITON_INTERPRET=1 in the environment before that, or unset it to use the tiled "
            "PyTorch CPU path."
        )
    return True


def _interpreter_dtype(t: torch.Tensor) -> torch.dtype:
    # Triton's interpreter computes bf16 loads/stores/dots wrongly (docs/testing.md): run bf16 in
    # fp32 there and cast the result back.
    return torch.float32 if t.dtype == torch.bfloat16 else t.dtype


def _device(t):
    """``torch.cuda.device(t.device)`` for a CUDA tensor not on the current device, else nothing to
    enter (a device switch costs host time on every call)."""
    # (a CUDA tensor exists, so CUDA is initialized: torch's getter without torch.cuda's Python layer)
    if not t.is_cuda or t.device.index == torch._C._cuda_getDevice():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def _gluon_refused(what: str, why: str):
    raise ValueError(f"tileflash: Options(backend='gluon') but the Hopper Gluon {what} cannot take this call: {why}. "
                     f"Use backend='auto' to fall back to the Triton kernels.")


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------

def forward(q, k, v, softmax_scale: float, causal: bool, causal_shift: int | None = None, *, window=(-1, -1),
            softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0, seed=None, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, config: dict | None = None, out=None, lse=None,
            options: Options = DEFAULT, need_lse: bool = True):
    """Attention forward -> (out, lse). Arguments as ``tileflash.ops.triton.forward.flash_attn_forward``
    (``out``/``lse``: preallocated outputs, which tests poison with NaN); ``options`` picks the kernel.
    ``need_lse=False``: the caller discards the LSE, so a planned launch writes it into a shared
    write-only buffer (``utils.lse_scratch``) and returns (out, None); other routes return it as usual."""
    common = (config is None and out is None and lse is None and alibi_slopes is None and seed is None
              and cu_seqlens_q is None and cu_seqlens_k is None)
    if common and q.is_cuda:
        # the common call: its route is planned once per layout (_FWD_PLANS) and replayed
        key = _fwd_key(q, k, v, softmax_scale, causal, causal_shift, window, softcap, dropout_p, options)
        plan = _FWD_PLANS.get(key)
        if plan.__class__ is tuple:  # a planned Gluon launch
            done = replay_forward(plan, q, k, v, softmax_scale, need_lse)  # (one that has launched before)
            if done is None and aligned(q, k, v):
                done = _replay_forward(plan, key, q, k, v, softmax_scale, causal, need_lse)
            if done is not None:
                return done
    kw = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed,
              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
              max_seqlen_k=max_seqlen_k)
    if not q.is_cuda and not use_triton(q):
        res_out, res_lse = cpu.forward(q, k, v, softmax_scale, causal, causal_shift, kw)
        return _fit(res_out, out, q, options), _into(res_lse, lse)
    decode = config is None and options.backend != "gluon"  # (decode_shaped calls may go to the decode kernel)
    if not q.is_cuda:  # the interpreter
        if decode and decode_shaped(q, k, causal_shift, dropout_p, cu_seqlens_q):
            res_out, res_lse = _decode_forward(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes)
            return _fit(res_out, out, q, options), _into(res_lse, lse)
        dt = _interpreter_dtype(q)
        res_out, res_lse = tr_fwd.flash_attn_forward(q.to(dt), k.to(dt), v.to(dt), softmax_scale, causal, causal_shift,
                                                     **kw, config=config, use_tma=options.use_tma,
                                                     autotune=options.autotune,
                                                     out=out if out is not None and out.dtype == dt else None, lse=lse)
        return _fit(res_out.to(q.dtype), out, q, options), res_lse
    if common:  # (on CUDA; the planned Gluon launches returned above)
        plan = _FWD_PLANS.get(key)
        if plan is None:
            plan = _plan_forward(q, k, v, softmax_scale, causal, causal_shift, kw, options, key)
        if plan is _DECODE:
            res_out, res_lse = _decode_forward(q, k, v, softmax_scale, causal, window, softcap, None, need_lse)
            return _fit(res_out, out, q, options), res_lse
        if plan.__class__ is tuple and aligned(q, k, v):
            done = _replay_forward(plan, key, q, k, v, softmax_scale, causal, need_lse)
            if done is not None:
                return done
    elif decode and decode_shaped(q, k, causal_shift, dropout_p, cu_seqlens_q):
        res_out, res_lse = _decode_forward(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes)
        return _fit(res_out, out, q, options), _into(res_lse, lse)
    if out is None and options.like_inputs:  # (the kernels below write any layout)
        out = torch.empty_like(q)
    with _device(q):
        if options.backend != "triton":
            # (the buffers it allocated come back, so that a call it declines allocates them once)
            done, out, lse = _gluon_forward(q, k, v, softmax_scale, causal, causal_shift, kw, config, out, lse,
                                            options)
            if done is not None:
                return done
        return tr_fwd.flash_attn_forward(q, k, v, softmax_scale, causal, causal_shift, **kw, config=config, out=out,
                                         lse=lse, use_tma=options.use_tma, autotune=options.autotune)


def _fwd_key(q, k, v, softmax_scale, causal, causal_shift, window, softcap, dropout_p, options) -> tuple:
    """A common forward call's layout and arguments: its ``_FWD_PLANS`` key."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, softmax_scale, causal,
            causal_shift, window, softcap, dropout_p, options)


def planned_forward(q, k, v, softmax_scale: float, causal: bool, causal_shift: int, window=(-1, -1),
                    softcap: float = 0.0, dropout_p: float = 0.0, options: Options = DEFAULT):
    """The ``_FWD_PLANS`` entry of this common forward call if it is a planned Gluon launch that has
    launched before (its compiled launcher kept), else None: what :func:`replay_forward` takes.
    ``tileflash.interface.flash_attn_func`` keeps it per call signature and replays it directly."""
    plan = _FWD_PLANS.get(_fwd_key(q, k, v, softmax_scale, causal, causal_shift, window, softcap, dropout_p,
                                   options))
    return plan if plan.__class__ is tuple and plan[1].runner is not None else None


def replay_forward(plan, q, k, v, softmax_scale: float, need_lse: bool = True):
    """The planned Gluon forward ``plan`` (a :func:`planned_forward` result: it has launched before,
    so no compile can fail) on these tensors of its layout -> (out, lse), or None where this call
    cannot replay it as it is: a pointer not 16-byte aligned (triton specializes on that), a CUDA
    device other than the current one, or a plan without a compiled launcher yet; the caller then
    takes the full route. ``need_lse=False``: the LSE goes to the write-only scratch buffer
    (``utils.lse_scratch``) and None is returned for it. No device switch, no key: host time
    (docs/perf-notes.md, "Host path")."""
    gf, gplan, lse_shape, lse_numel, like_q = plan
    runner = gplan.runner
    if (runner is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
            or q.device.index != runner[0] or torch._C._cuda_getDevice() != runner[0]):
        return None
    out, lse, keep = _planned_buffers(q, lse_shape, lse_numel, need_lse, like_q)
    gf.replay(gplan, q, k, v, out, lse, softmax_scale)
    return out, (lse if keep else None)


def _planned_buffers(q, lse_shape, lse_numel, need_lse, like_q):
    """A planned forward's (out, lse, whether the LSE is its own): without ``need_lse`` the LSE
    goes to the write-only scratch buffer (``utils.lse_scratch``) where it has one. ``like_q``
    (``Options.like_inputs``): out in q's memory order."""
    # (sizes unpacked: torch parses ints faster than a torch.Size, host time per call)
    out = torch.empty_like(q) if like_q else torch.empty(*q.shape, dtype=q.dtype, device=q.device)
    lse = None if need_lse else lse_scratch(lse_numel, q.device)
    if lse is None:
        return out, torch.empty(*lse_shape, dtype=torch.float32, device=q.device), True
    return out, lse, False


def _replay_forward(plan, key, q, k, v, softmax_scale, causal, need_lse=True):
    """The planned Gluon forward ``plan`` (a ``_FWD_PLANS`` entry) on these tensors -> (out, lse),
    or None, with the plan dropped, if its kernel did not compile with this triton (warned).
    ``need_lse=False``: the LSE goes to the write-only scratch buffer and None is returned for it."""
    gf, gplan, lse_shape, lse_numel, like_q = plan
    with _device(q):
        out, lse, keep = _planned_buffers(q, lse_shape, lse_numel, need_lse, like_q)
        if gf.forward(q, k, v, out, lse, softmax_scale, causal, plan=gplan) is not None:
            return out, (lse if keep else None)
    _FWD_PLANS.pop(key, None)
    return None


# layout and arguments of a common forward call -> (Gluon forward module, its plan, the LSE's
# shape), or _SLOW where the Gluon kernel does not take it as it is (the full route decides:
# padded head dims, the Triton kernel, a refusal)
_FWD_PLANS: dict = {}
_SLOW = "slow"
_DECODE = "decode"  # the split-KV decode kernel (decode_shaped)
_PLANS_MAX = 1024


def _plan_forward(q, k, v, softmax_scale, causal, causal_shift, kw, options, key):
    """Decide once what ``forward`` runs for this layout (the Gluon kernel on q/k/v as they are, or
    anything else: padded head dims, the Triton kernel, a refusal), with the checks of
    :func:`_gluon_forward` and ``gluon.forward.plan_for`` that do not depend on the pointers."""
    plan = _SLOW
    if options.backend != "gluon" and decode_shaped(q, k, causal_shift, kw["dropout_p"], None):
        return _DECODE  # (not kept: a decoding loop's keys grow at every step, so would its keys here)
    mods = gluon_modules() if options.backend != "triton" and q.numel() and k.shape[1] else None
    if mods is not None and q.shape[-1] == mods[0].padded_head_dim(q.shape[-1]):
        gf = mods[0]
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        shift = seqlen_k - seqlen_q if causal_shift is None else causal_shift
        flags, _, _ = feature_args(softmax_scale, causal, kw["window"], kw["softcap"], None, batch,
                                   kw["dropout_p"], seqlen_q + abs(shift), seqlen_k + abs(shift))
        lse_shape = (batch, q.shape[2], seqlen_q)
        with _device(q):
            out = _new_out(q, options)
            lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
            gplan = gf.plan_for(q, k, v, out, lse, softmax_scale, causal, shift, flags, False, None)
        if gplan is not None:
            plan = (gf, gplan, lse_shape, lse_shape[0] * lse_shape[1] * lse_shape[2], options.like_inputs)
        elif not aligned(q, k, v):
            return _SLOW  # declined for these pointers only: not remembered for the layout
    if len(_FWD_PLANS) >= _PLANS_MAX:
        _FWD_PLANS.clear()
    _FWD_PLANS[key] = plan
    return plan


# At most this many query tokens, with the GQA group's heads packed into one row block of the
# split-KV decode kernel, go to that kernel rather than the prefill kernels (a 128-row Q tile
# holding one or a few rows leaves the GPU idle; the decode kernel splits the keys instead).
DECODE_MAX_Q = 16
DECODE_MAX_ROWS = 64


def decode_shaped(q, k, causal_shift, dropout_p, cu_seqlens_q) -> bool:
    """Whether a dense forward is a decode step (a few query tokens against a longer key sequence)
    that :func:`forward` gives to the split-KV decode kernel (``tileflash.ops.triton.decode``),
    which computes the same attention for it: bottom-right alignment, windows, softcap, ALiBi;
    not dropout, varlen or another causal alignment."""
    if cu_seqlens_q is not None or dropout_p > 0 or q.dim() != 4:
        return False
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    return (0 < seqlen_q <= DECODE_MAX_Q and seqlen_q <= seqlen_k and q.shape[0] > 0
            and seqlen_q * (q.shape[2] // max(k.shape[2], 1)) <= DECODE_MAX_ROWS
            and (causal_shift is None or causal_shift == seqlen_k - seqlen_q))


def _decode_forward(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes, need_lse=True):
    """A :func:`decode_shaped` forward by the decode kernel, k/v as a full cache of seqlen_k keys."""
    dt = q.dtype if q.is_cuda else _interpreter_dtype(q)
    conv = (lambda t: t) if dt == q.dtype else (lambda t: t.to(dt))
    with _device(q):
        out, lse = tr_dec.decode_forward(conv(q), conv(k), conv(v), None, softmax_scale, causal, window=window,
                                         softcap=softcap, alibi_slopes=alibi_slopes, max_seqlen_k=k.shape[1],
                                         need_lse=need_lse)
    return (out if out.dtype == q.dtype else out.to(q.dtype)), lse


def _new_out(q, options: Options):
    """A forward's output buffer: contiguous, or in q's memory order with ``Options.like_inputs``
    (``torch.empty_like``, which the op's fake output follows)."""
    if options.like_inputs:
        return torch.empty_like(q)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _fit(res, buf, q, options: Options):
    """A forward's output ``res`` (q's shape) as the caller gets it: written into ``buf`` if given,
    else in q's memory order with ``Options.like_inputs`` (the order ``torch.empty_like(q)`` gives,
    which the op's fake output has): ``res`` itself where its elements already sit so (a view with
    those strides where they differ only at dims of size 1), else a copy; else ``res``."""
    if buf is not None or not options.like_inputs:
        return _into(res, buf)
    want = torch.empty_like(q, device="meta").stride()
    have = res.stride()
    if have == want:
        return res
    if all(a == b or n == 1 for a, b, n in zip(have, want, res.shape)):
        return res.as_strided(res.shape, want)
    return torch.empty_like(q).copy_(res)


def _into(res, buf):
    """``res`` written into the caller's buffer ``buf`` (if any)."""
    if buf is None or buf is res:
        return res
    return buf.copy_(res)


def _gluon_forward(q, k, v, softmax_scale, causal, causal_shift, kw, config, out, lse, options):
    """The Hopper Gluon forward if it takes this call: ((out, lse), out, lse), else (None, out, lse)
    with nothing written; out and lse are the caller's buffers, or the ones allocated here."""
    mods = gluon_modules()
    if mods is None:
        if options.backend == "gluon":
            _gluon_refused("forward", f"this triton ({__import__('triton').__version__}) has no Gluon")
        return None, out, lse
    gf = mods[0]
    varlen, batch, seqlen_q, seqlen_k, lse_shape, _ = problem_dims(q, k, kw["cu_seqlens_q"], kw["max_seqlen_q"],
                                                                   kw["max_seqlen_k"])
    if varlen or q.numel() == 0 or seqlen_k == 0:
        if options.backend == "gluon":
            _gluon_refused("forward", "varlen or empty inputs")
        return None, out, lse
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    flags, _, _ = feature_args(softmax_scale, causal, kw["window"], kw["softcap"], kw["alibi_slopes"], batch,
                               kw["dropout_p"], seqlen_q + abs(causal_shift), seqlen_k + abs(causal_shift))
    if out is None:
        out = _new_out(q, options)
    if lse is None:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    head_dim = q.shape[-1]
    width = gf.padded_head_dim(head_dim)
    if width == head_dim:
        plan = gf.plan_for(q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, False, config)
        # None from forward(): it did not compile with this triton (warned once); the Triton kernel runs
        done = None if plan is None else gf.forward(q, k, v, out, lse, softmax_scale, causal, plan=plan)
    elif width is not None and options.pad_head_dim and out.stride(-1) == 1:
        done = _gluon_forward_padded(gf, q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, config, width)
    else:
        done = None
    if done is None and options.backend == "gluon":
        _gluon_refused("forward", "its scope is dense fp16/bf16 on sm90, head dim 64-256, no window/softcap/ALiBi/"
                                  "dropout, lengths that are multiples of its tiles (tileflash.ops.gluon.forward)")
    return done, out, lse


def _gluon_forward_padded(gf, q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, config, width):
    """A head dim between the Gluon kernels' widths (``gluon.forward.padded_head_dim``): the Gluon
    forward at ``width`` on zero-padded copies of q, k and v, into a padded output whose first
    columns are copied into ``out``; lse is written in place. (out, lse) if it ran; None (nothing
    written) if the Gluon kernel does not take the padded call or did not compile."""
    qp, kp, vp = (torch.empty(t.shape[:-1] + (width,), dtype=t.dtype, device=t.device) for t in (q, k, v))
    outp = torch.empty(out.shape[:-1] + (width,), dtype=out.dtype, device=out.device)
    plan = gf.plan_for(qp, kp, vp, outp, lse, softmax_scale, causal, causal_shift, flags, False, config)
    if plan is None:
        return None
    for t, padded in ((q, qp), (k, kp), (v, vp)):
        tr_fwd.copy_cols(t, padded)
    if gf.forward(qp, kp, vp, outp, lse, softmax_scale, causal, plan=plan) is None:
        return None
    tr_fwd.copy_cols(outp, out)  # the first head_dim columns (the rest are 0)
    return out, lse


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------

def backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool, causal_shift: int | None = None, *,
             window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0, seed=None,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, config: dict | None = None,
             dq=None, dk=None, dv=None, options: Options = DEFAULT, deterministic: bool = False):
    """Attention backward -> (dq, dk, dv), written into dq/dk/dv when given. Arguments as
    ``tileflash.ops.triton.backward.flash_attn_backward``; ``options`` picks the kernels.
    ``deterministic=False`` (flash-attn's default) lets the Hopper backward run the fused kernel with
    unordered dQ sums where it measured faster than the split kernels (:func:`_fused_backward`);
    True, or ``torch.use_deterministic_algorithms(True)``, keeps every path bitwise repeatable."""
    key = None
    if q.is_cuda:
        deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
        if (config is None and dq is None and dk is None and dv is None and alibi_slopes is None and seed is None
                and cu_seqlens_q is None and cu_seqlens_k is None):
            # the common call: replay the launches recorded for its layout (_BWD_PLANS)
            key = _bwd_key(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, window, softcap, dropout_p,
                           options, deterministic)
            plan = _BWD_PLANS.get(key)
            if plan is not None and aligned(q, k, v, dout):
                gb, launches = plan
                with _device(q):
                    return gb.replay_default(launches, dout, q, k, v, out, lse, softmax_scale, options.like_inputs)
    if options.like_inputs:  # the gradients in their inputs' memory order, on every path below
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
    kw = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed,
              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
              max_seqlen_k=max_seqlen_k)
    if not use_triton(q):
        grads = cpu.backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, kw)
        return tuple(_into(g, buf) for g, buf in zip(grads, (dq, dk, dv)))
    if not q.is_cuda:  # the interpreter
        dt = _interpreter_dtype(q)
        grads = tr_bwd.flash_attn_backward(*(t.to(dt) for t in (dout, q, k, v, out)), lse, softmax_scale, causal,
                                           causal_shift, **kw, config=config, use_tma=options.use_tma)
        return tuple(_into(g.to(q.dtype), buf) for g, buf in zip(grads, (dq, dk, dv)))
    with _device(q):
        # (key: a common call's layout, which _cuda_backward plans for; None for the others)
        return _cuda_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, kw, config, dq, dk, dv,
                              options, deterministic, key)


# layout and arguments of a common backward call -> (Gluon backward module, the launches its default
# route made: dQ computing delta, then dK/dV; or the fused kernel's), replayed by gluon.backward.replay_default
_BWD_PLANS: dict = {}


def _bwd_switches(deterministic: bool) -> tuple:
    """The process-wide switches a common backward's plan depends on besides its arguments:
    ``torch.use_deterministic_algorithms`` and the debug switches that pick its kernels."""
    return (deterministic or torch.are_deterministic_algorithms_enabled(), DEBUG.gluon_bwd, DEBUG.gluon_dq,
            DEBUG.dq_delta, DEBUG.gluon_fused)


def _bwd_key(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, window, softcap, dropout_p, options,
             deterministic) -> tuple:
    """A common backward call's layout, arguments and switches: its ``_BWD_PLANS`` key
    (``deterministic`` as :func:`backward` resolved it)."""
    return (dout.shape, dout.stride(), q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            out.shape, out.stride(), lse.shape, lse.stride(), q.dtype, q.device, softmax_scale, causal,
            causal_shift, window, softcap, dropout_p, options, deterministic, DEBUG.gluon_bwd,
            DEBUG.gluon_dq, DEBUG.dq_delta, DEBUG.gluon_fused)


def planned_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool, causal_shift: int,
                     window=(-1, -1), softcap: float = 0.0, dropout_p: float = 0.0, options: Options = DEFAULT,
                     deterministic: bool = False):
    """The kept launches of this common backward call (``_BWD_PLANS``, where :func:`backward` just
    recorded them) with what :func:`replay_backward` must find unchanged to replay them on a later
    call (the strides of dO, q, k, v, out and the LSE; :func:`_bwd_switches`), else None.
    ``tileflash.interface.flash_attn_func`` keeps it per call signature, beside the planned
    forward: the backward of a repeated call then skips this key (host time, docs/perf-notes.md,
    "Host path")."""
    if not q.is_cuda:
        return None
    switches = _bwd_switches(deterministic)
    plan = _BWD_PLANS.get(_bwd_key(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, window, softcap,
                                   dropout_p, options, switches[0]))
    if plan is None:
        return None
    return (dout.stride(), q.stride(), k.stride(), v.stride(), out.stride(), lse.stride()), switches, plan, \
        options.like_inputs


def replay_backward(kept, dout, q, k, v, out, lse, softmax_scale: float, deterministic: bool = False):
    """The backward ``kept`` (a :func:`planned_backward` result of a call of this signature: tensors
    of its shapes and dtypes) on these tensors -> (dq, dk, dv), or None where it cannot be replayed
    as it is: any of dO, q, k, v, out, LSE with other strides (saved-tensor hooks may hand the
    backward copies), a switch of :func:`_bwd_switches` changed, a pointer not 16-byte aligned, or
    a CUDA device other than the current one. The caller then takes :func:`backward`."""
    strides, switches, (gb, launches), like = kept
    if ((dout.stride(), q.stride(), k.stride(), v.stride(), out.stride(), lse.stride()) != strides
            or q.device.index != torch._C._cuda_getDevice() or _bwd_switches(deterministic) != switches
            or not aligned(q, k, v, dout)):
        return None
    return gb.replay_default(launches, dout, q, k, v, out, lse, softmax_scale, like)


def _keep_bwd_plan(key, gb, launches):
    """Record a common backward's launches (``gb.default_launches`` or ``gb.fused_launches``; None:
    nothing to keep) under its ``_BWD_PLANS`` key."""
    if launches is not None:
        if len(_BWD_PLANS) >= _PLANS_MAX:
            _BWD_PLANS.clear()
        _BWD_PLANS[key] = (gb, launches)


# The least backward work (FLOPs by the x2.5 convention, 10·B·H·Sq·Sk·D, halved when causal) for
# which deterministic=False takes the fused kernel (~0.5 ms of backward). Measured below it (H100,
# B=1 H=16/8 D=128 bf16, 2026-12-06, docs/perf-notes.md, "Hopper backward"):
# - N=2k causal (4.3e10): the step is host-bound, and the fused design's extra host work (the delta
#   kernel, a memset of the fp32 dQ sums, their cast: four more torch calls than the split pair's at
#   the time; since 6f72bbd the delta kernel zeroes the sums and the memset is gone, not re-measured)
#   cost more than its kernel saves: flash_attn_func forward+backward, `tileflash bench --host` 509 /
#   684 us per step against 341 / 503 for deterministic=True (two runs), tools/step_kernels.py 571
#   against 480 (200 steps; 315 against 347 in a run of 50); its backward kernels alone 0.92x the
#   split pair's (tools/fused_ab.py), 1.04x non-causal (8.6e10);
# - N=4k causal (1.7e11): the fused kernel alone 0.94x (0.98x with 16 kv heads), the step 638 us
#   against 605.
# Above it, B=1 non-causal 4k (3.4e11) measured 1.10x and causal 8k (6.9e11) 1.03x; every cell of the
# B*N = 16k grid (at least 3.4e11) is above it.
FUSED_MIN_FLOPS = 2e11
# The least length (of Q and of K) at which deterministic=False takes the fused kernel. At 1k (B*N =
# 16k, H = 2048/D, fp16, tools/fused_ab.py, 3 rotated rounds, kernels through gb.backward against the
# routed split pair) the fused kernel measured 1.10x / 1.04x the split pair non-causal at D = 64 / 128
# and 1.02x / 0.95x causal (H100, 2026-12-06 08:15 UTC); on the H200 at 07:10 UTC that day 1.05x at D = 64
# non-causal and level at D = 128. So non-causal from 1k, causal from 2k.
FUSED_MIN_LEN = 1024
FUSED_MIN_LEN_CAUSAL = 2048


def _fused_backward(width: int, head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int,
                    deterministic: bool, batch: int, nheads: int) -> bool:
    """Whether a Gluon-eligible backward runs the fused kernel (dQ summed in the K/V loop) rather
    than the split dQ + dK/dV kernels. Always with the debug switch ``gluon_fused=1`` (ordered sums
    when ``deterministic``). Otherwise only unordered (``deterministic=False``) and only where it
    measured faster than the split pair: with the LSE/delta rows staged in shared memory
    (``LSE_EARLY=3``) and a head's K blocks launched together (``PER_HEAD``), at 2k tokens and
    more, D = 64 and 128, causal or not (H200, fp16, B*N = 16k, 2026-12-06, ``tools/fused_ab.py``,
    both in one process, 3 rotated rounds: 1.03-1.11x the split pair at 2k, 1.05-1.11x at 4k,
    1.08-1.16x at 16k), and non-causal from 1k (``FUSED_MIN_LEN``: 1.04-1.10x there). Both designs
    launch through cached launches and are
    replayed per layout (``_BWD_PLANS``). Only from ``FUSED_MIN_FLOPS`` of backward work (batch ·
    nheads query heads): smaller backwards keep the split pair, which measured faster there (a
    host-bound step at 2k, a slower fused kernel at B=1 causal 4k).
    docs/perf-notes.md, "Hopper backward"."""
    if DEBUG.gluon_fused:
        return width <= 128
    # (head dims padded to 64 or 128 are not taken: measured and GPU-tested at D = 64 and 128 only. The
    # rule was measured at B*N = 16k tokens, 2048 / D heads, no GQA; it applies at any head count and
    # group, above the work floor FUSED_MIN_FLOPS, which every cell of that grid clears (its least,
    # D = 64 and 128 causal at 2k, is 3.4e11). The fused kernel also holds an fp32 dQ buffer: 2x dq's own size
    # more peak memory.)
    if deterministic or head_dim != width:
        return False
    if width not in (64, 128) or min(seqlen_q, seqlen_k) < (FUSED_MIN_LEN_CAUSAL if causal else FUSED_MIN_LEN):
        return False
    return 10 * batch * nheads * seqlen_q * seqlen_k * head_dim * (0.5 if causal else 1.0) >= FUSED_MIN_FLOPS


def _cuda_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, kw, config, dq, dk, dv, options,
                   deterministic=False, plan_key=None):
    mods = gluon_modules() if options.backend != "triton" and DEBUG.gluon_bwd else None
    varlen, batch, seqlen_q, seqlen_k, _, _ = problem_dims(q, k, kw["cu_seqlens_q"], kw["max_seqlen_q"],
                                                           kw["max_seqlen_k"])
    empty = q.numel() == 0 or k.numel() == 0 or batch == 0
    if mods is None or empty:
        if options.backend == "gluon":
            _gluon_refused("backward", "no Gluon in this triton (or the debug switch gluon_bwd=0)" if mods is None
                           else "empty inputs")
        return tr_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, **kw,
                                          config=config, dq=dq, dk=dk, dv=dv, use_tma=options.use_tma)
    gb = mods[1]
    nheads, head_dim = q.shape[-2], q.shape[-1]
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    dout_in, lse_in = dout, lse
    if dout.stride(-1) != 1:
        dout = dout.contiguous()  # e.g. the expanded ones of loss = out.sum()
    lse = lse.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    flags, _, _ = feature_args(softmax_scale, causal, kw["window"], kw["softcap"], kw["alibi_slopes"], batch,
                               kw["dropout_p"], seqlen_q + abs(causal_shift), seqlen_k + abs(causal_shift))
    delta = None
    gluon_done = dq_done = False
    padded_ok = options.pad_head_dim or gb._f90.padded_head_dim(head_dim) == head_dim
    if padded_ok and gb.supported(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, varlen, config,
                                  dk=dk, dv=dv):
        # 64 < D < 128 (128 < D < 256) runs the Gluon kernels at D = 128 (256) on copies of dO, q, k
        # and v zero-padded to that width; they store the gradients' own D columns (D_OUT), and delta
        # is the same either way (gluon.forward.padded_head_dim says why that is exact).
        width = gb._f90.padded_head_dim(head_dim)
        g_in = (dout, q, k, v) if width == head_dim else tuple(tr_fwd.pad_head_dim(t, width) for t in (dout, q, k, v))
        if (_fused_backward(width, head_dim, causal, seqlen_q, seqlen_k, deterministic, batch, nheads)
                and dq.stride(-1) == 1):
            fcfg = gb.fused_config_for(width, causal, deterministic)
            if not gb.config_broken(g_in[1], causal, fcfg):
                # the fp32 dQ sums and counters, zeroed by the delta kernel (one launch for both)
                bufs = gb.fused_buffers(g_in[1], fcfg["BLOCK_M"], zeroed=False)  # (at the padded width)
                delta = tr_bwd.compute_delta(out, dout, lse, varlen, nheads, head_dim, zero=bufs[2])
                if gb.backward(*g_in, lse, delta, dq, dk, dv, softmax_scale, causal, fcfg,
                               deterministic=deterministic, bufs=bufs) is not None:
                    # fused: one Gluon kernel wrote dQ, dK and dV (kept for a replay as below)
                    if plan_key is not None and width == head_dim and lse is lse_in and dout is dout_in:
                        _keep_bwd_plan(plan_key, gb, gb.fused_launches(dout, q, k, v, lse, delta, dk, dv, causal,
                                                                       fcfg, deterministic))
                    return dq, dk, dv
        # dQ by the Gluon dQ kernel (None: it did not compile, the Triton dQ kernel runs). By default
        # it runs first and computes delta itself, which the dK/dV kernel then reads: no delta kernel.
        dq_gluon = DEBUG.gluon_dq and gb.dq_supported(g_in[1], g_in[2], dq, causal)
        if options.backend == "gluon" and DEBUG.gluon_dq and not dq_gluon:
            _gluon_refused("dQ kernel", "its lengths must be multiples of its tiles, with at most 65535 batch*heads "
                                        "(tileflash.ops.gluon.backward.dq_supported)")
        dq_first = False
        if (dq_gluon and delta is None and gb.dq_computes_delta(width, causal)
                and gb.out_supported(out, g_in[1], dq)):
            delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
            dq_done = gb.backward_dq(*g_in, lse, delta, dq, softmax_scale, causal, out=out) is not None
            dq_first = dq_done
            if not dq_done:
                delta = None
        if delta is None:
            delta = tr_bwd.compute_delta(out, dout, lse, varlen, nheads, head_dim)
        # the Gluon kernel writes dK and dV (None: it did not compile, the Triton kernel runs)
        gluon_done = gb.backward(*g_in, lse, delta, dq, dk, dv, softmax_scale, causal) is not None
        if gluon_done and dq_gluon and not dq_done:
            dq_done = gb.backward_dq(*g_in, lse, delta, dq, softmax_scale, causal) is not None
        if gluon_done and dq_done:
            # (recorded only where the launches ran on the caller's own dO and LSE, as a replay passes them)
            if plan_key is not None and dq_first and width == head_dim and lse is lse_in and dout is dout_in:
                _keep_bwd_plan(plan_key, gb, gb.default_launches(dout, q, k, v, lse, delta, dq, dk, dv, causal, out))
            return dq, dk, dv
    if options.backend == "gluon" and not (gluon_done and (dq_done or not DEBUG.gluon_dq)):
        _gluon_refused("backward", "its scope is dense fp16/bf16 on sm90, head dim 64-256, no window/softcap/ALiBi/"
                                   "dropout, lengths that are multiples of its tiles (tileflash.ops.gluon.backward)")
    # the Triton kernels take what the Gluon ones did not
    return tr_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, **kw,
                                      config=config, dq=dq, dk=dk, dv=dv, use_tma=options.use_tma, delta=delta,
                                      run_dkdv=not gluon_done, run_dq=not dq_done)


# ----------------------------------------------------------------------------------------------
# KV-cache decoding (forward only)
# ----------------------------------------------------------------------------------------------

def refuse_gluon_kvcache():
    """``Options(backend="gluon")`` on a KV-cache call: there is no Gluon decode kernel.
    (``flash_attn_with_kvcache`` calls this before it appends to the cache.)"""
    _gluon_refused("kernels", "there is no Gluon decode kernel; KV-cache calls run the Triton kernel")


def kvcache_append(k_cache, v_cache, k, v, seqlens, seqlen_fixed: int, cache_batch_idx=None, block_table=None):
    """Write the new k/v into the cache in place (``flash_attn_with_kvcache``'s append): the Triton
    kernel on CUDA and in the interpreter (which reads no value on the host and guards every write
    into the cache), PyTorch indexing on the tiled CPU path and for bf16 in the interpreter (its
    bf16 loads/stores are wrong)."""
    if k_cache.is_cuda or (use_triton(k_cache) and k_cache.dtype != torch.bfloat16):
        with _device(k_cache):
            tr_dec.append_kv(k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx, block_table)
        return
    cpu.append_kv(k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx, block_table)


def planned_kvcache(q, k_cache, v_cache, k, v, seqlens_k, softmax_scale, causal, window, softcap, cache_batch_idx,
                    block_table, num_splits, cache_leftpad, seqlen_add, options: Options = DEFAULT,
                    max_seqlen_k: int = -1):
    """What a CUDA ``flash_attn_with_kvcache`` call with a length tensor (or with an int length:
    seqlens_k None and max_seqlen_k its key count, appended tokens included) ran, where both
    launches are kept and have launched before: (the append's launch, None without k/v; the decode
    plan), else None. ``tileflash.interface`` keeps it per call signature for
    :func:`replay_kvcache`."""
    if not q.is_cuda or options.backend == "gluon":
        return None
    plan = tr_dec.planned_decode(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap,
                                 cache_batch_idx, block_table, num_splits, cache_leftpad, seqlen_add, max_seqlen_k)
    if plan is None or plan.launch.runner is None:
        return None
    append = None
    if k is not None and k.shape[1] > 0:
        append = tr_dec.planned_append(k_cache, v_cache, k, v, seqlens_k, cache_batch_idx, block_table)
        if append is None:
            return None
    return append, plan


def replay_kvcache(planned, q, k_cache, v_cache, k, v, seqlens_k, cache_batch_idx, block_table, cache_leftpad,
                   seqlen_fixed: int, need_lse: bool, append_at: int = 0):
    """A decoding step through a :func:`planned_kvcache` result on tensors of its layout: the
    append (if any), then the decode launch -> (out, lse or None with ``need_lse=False``).
    seqlen_fixed: with a length tensor, the tokens appended to each entry (seqlen_add); without
    one, every entry's key count after the append, and append_at its length before (where the
    append writes). None, before any write, where q is not on the current CUDA device (the caller
    takes the full path, which switches devices)."""
    if q.device.index != torch._C._cuda_getDevice():
        return None
    append, plan = planned
    if append is not None:
        tr_dec.replay_append(append, k_cache, v_cache, k, v, seqlens_k, append_at, cache_batch_idx, block_table)
    return plan(q, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, None, cache_leftpad, seqlen_fixed,
                need_lse)


def kvcache(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, *, window=(-1, -1), softcap=0.0,
            alibi_slopes=None, cache_batch_idx=None, block_table=None, num_splits=0, max_seqlen_k=-1,
            cache_leftpad=None, options: Options = DEFAULT, seqlen_add: int = 0, need_lse: bool = True):
    """Attention of q over a contiguous or paged KV cache -> (out, lse): the Triton split-KV decode
    kernel (GPU or interpreter), or the tiled CPU path. (No Gluon decode kernel: ``options.backend``
    = "gluon" is refused.) With seqlens_k, entry b holds seqlens_k[b] + seqlen_add keys.
    ``need_lse=False``: the caller discards the LSE (it may come back as None)."""
    if options.backend == "gluon" and q.is_cuda:
        refuse_gluon_kvcache()
    if not use_triton(q):
        return cpu.kvcache_forward(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap,
                                   alibi_slopes, cache_batch_idx, block_table, max_seqlen_k, cache_leftpad, seqlen_add)
    dt = q.dtype if q.is_cuda else _interpreter_dtype(q)
    conv = (lambda t: t) if dt == q.dtype else (lambda t: t.to(dt))
    with _device(q):
        out, lse = tr_dec.decode_forward(conv(q), conv(k_cache), conv(v_cache), seqlens_k, softmax_scale, causal,
                                         window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                         cache_batch_idx=cache_batch_idx, block_table=block_table,
                                         num_splits=num_splits, max_seqlen_k=max_seqlen_k, cache_leftpad=cache_leftpad,
                                         seqlen_add=seqlen_add, need_lse=need_lse)
    return (out if out.dtype == q.dtype else out.to(q.dtype)), lse
