"""The torch.library custom ops: one op per direction, plus autograd.

``tileflash::fwd``, ``tileflash::bwd`` (``bwd_into`` for the packed variants) and
``tileflash::kvcache_fwd`` are the only entry points below the public API; their bodies hand every
call to ``tileflash.ops.route``, which picks the implementation (tiled CPU path, Triton kernels,
Hopper Gluon kernels). ``options`` travels as ``Options.encode()``'s string, which the op schema
can carry.

Because these are ``torch.library.custom_op`` s with fake (meta) implementations,
``torch.compile(fullgraph=True)`` traces through them without a graph break.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Optional

import torch
from torch import Tensor

from tileflash.ops import route
from tileflash.options import Options


def _kw(window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, seed, options=""):
    """The op's feature arguments as ``route``'s keywords (``deterministic`` travels apart: only the
    backward reads it)."""
    return dict(window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p, seed=seed,
                options=Options.decode(options))


@torch.library.custom_op("tileflash::fwd", mutates_args=())
def attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, causal_shift: int,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0, max_seqlen_k: int = 0, dropout_p: float = 0.0, seed: Optional[Tensor] = None,
    deterministic: bool = False, options: str = "",
) -> tuple[Tensor, Tensor]:
    """Attention forward -> (out, lse fp32, natural log).

    Dense: q (b, sq, h, d), k/v (b, sk, hk, d), lse (b, h, sq). Varlen (cu_seqlens given):
    q (total_q, h, d), k/v (total_k, hk, d), lse (h, total_q). Query i sees key j iff
    ``-right <= i + shift - j <= left`` (-1: unbounded; causal forces right = 0); the dense
    shift is ``causal_shift`` (``seqlen_k - seqlen_q``: flash-attn's bottom-right; 0: torch's
    top-left), varlen uses each sequence's own lengths. The public functions call it through
    :func:`attention` (the op under torch.compile, its body in eager).
    """
    return _attention_fwd_body(q, k, v, softmax_scale, causal, causal_shift, window_left, window_right, softcap,
                               alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, seed,
                               deterministic, options)


def _attention_fwd_body(q, k, v, softmax_scale, causal, causal_shift, window_left=-1, window_right=-1, softcap=0.0,
                        alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                        dropout_p=0.0, seed=None, deterministic=False, options="", *, need_lse=True):
    """The body of ``tileflash::fwd`` (``tileflash.ops.route.forward``; ``deterministic`` is kept
    for the backward). ``need_lse=False`` (eager callers that discard it): the LSE may come back
    as None."""
    return route.forward(q, k, v, softmax_scale, causal, causal_shift, window=(window_left, window_right),
                         softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         dropout_p=dropout_p, seed=seed, options=Options.decode(options), need_lse=need_lse)


@attention_fwd.register_fake
def _(q, k, v, softmax_scale, causal, causal_shift, window_left=-1, window_right=-1, softcap=0.0,
      alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0,
      seed=None, deterministic=False, options=""):
    # (Options.like_inputs: q's memory order, as route.forward allocates it on every path)
    out = torch.empty_like(q) if Options.decode(options).like_inputs else q.new_empty(q.shape)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=lse_dtype)
    return out, lse


@torch.library.custom_op("tileflash::bwd", mutates_args=())
def attention_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    softmax_scale: float, causal: bool, causal_shift: int,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0, max_seqlen_k: int = 0, dropout_p: float = 0.0, seed: Optional[Tensor] = None,
    deterministic: bool = False, options: str = "",
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention backward by recomputation from (q, k, v, out, lse) -> (dq, dk, dv).

    ``deterministic=True``: bitwise repeatable (no atomics: dK/dV and dQ are separate kernels).
    False lets ``route.backward`` sum dQ in an unordered way where that is faster.
    """
    kw = _kw(window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, dropout_p, seed, options)
    if kw["options"].like_inputs:
        # contiguous gradients, as the fake says: under torch.compile the saved q, k, v may have other
        # strides at run time than when traced (the eager autograd class keeps the inputs' memory order)
        kw["options"] = dataclasses.replace(kw["options"], like_inputs=False)
    return route.backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, **kw,
                          deterministic=deterministic)


@torch.library.custom_op("tileflash::bwd_into", mutates_args=("dq", "dk", "dv"))
def attention_bwd_into(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    softmax_scale: float, causal: bool, causal_shift: int, dq: Tensor, dk: Tensor, dv: Tensor,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0, max_seqlen_k: int = 0, dropout_p: float = 0.0, seed: Optional[Tensor] = None,
    deterministic: bool = False, options: str = "",
) -> None:
    """``tileflash::bwd`` writing its gradients into given (strided) buffers: the packed variants
    pass views of one packed gradient tensor, so no concatenation is ever made."""
    kw = _kw(window_left, window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, dropout_p, seed, options)
    route.backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, **kw, dq=dq, dk=dk, dv=dv,
                   deterministic=deterministic)


@attention_bwd_into.register_fake
def _(*args, **kwargs):
    return None


class PackedAttention(torch.autograd.Function):
    """Attention on packed inputs: ``qkv`` (q, k, v stacked on ``dim``) or ``q`` plus ``kv``.

    The forward reads q/k/v as views of the packed tensors (no copy); the backward allocates one
    packed gradient per input and has the kernels write dq/dk/dv straight into its slices.
    """

    @staticmethod
    def forward(ctx, q_or_qkv, kv, dim, softmax_scale, causal, causal_shift, feats):
        if kv is None:
            q, k, v = q_or_qkv.unbind(dim)
        else:
            q, (k, v) = q_or_qkv, kv.unbind(dim)
        out, lse = attention(q, k, v, softmax_scale, causal, causal_shift, **feats)
        ctx.save_for_backward(q_or_qkv, kv, out, lse)
        ctx.args = (dim, softmax_scale, causal, causal_shift, feats)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q_or_qkv, kv, out, lse = ctx.saved_tensors
        dim, softmax_scale, causal, causal_shift, feats = ctx.args
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        if kv is None:
            q, k, v = q_or_qkv.unbind(dim)
            dqkv = torch.empty_like(q_or_qkv)
            dq, dk, dv = dqkv.unbind(dim)
            grads = (dqkv, None)
        else:
            q, (k, v) = q_or_qkv, kv.unbind(dim)
            dq, dkv = torch.empty_like(q_or_qkv), torch.empty_like(kv)
            dk, dv = dkv.unbind(dim)
            grads = (dq, dkv)
        attention_bwd_into(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, dq, dk, dv, **feats)
        return (*grads, None, None, None, None, None)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, window_left=-1, window_right=-1, softcap=0.0,
      alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0,
      seed=None, deterministic=False, options=""):
    # (contiguous whatever the options: tileflash::bwd clears Options.like_inputs, see there)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


_FEATURES = ("window_left", "window_right", "softcap", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k",
             "max_seqlen_q", "max_seqlen_k", "dropout_p", "seed", "deterministic", "options")


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, causal_shift, *features = inputs
    out, lse = output
    f = dict(zip(_FEATURES, features))
    # Only q, k, v, out and the LSE are kept (plus the small feature tensors): P is recomputed.
    ctx.save_for_backward(q, k, v, out, lse, f.pop("alibi_slopes", None), f.pop("cu_seqlens_q", None),
                          f.pop("cu_seqlens_k", None), f.pop("seed", None))
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.causal_shift = causal_shift
    ctx.features = f


def _backward(ctx, dout, dlse):
    # softmax_lse is returned for inspection and has no gradient (as in flash-attn); dlse is ignored.
    q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seed = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.causal_shift,
                               alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                               seed=seed, **ctx.features)
    return (dq, dk, dv) + (None,) * (3 + len(_FEATURES))


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# the innermost saved-tensor hooks in effect (None: none), as torch.utils.checkpoint reads them
_saved_tensor_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", lambda _: True)


class _EagerAttention(torch.autograd.Function):
    """Eager autograd of ``tileflash::fwd``: the op's body, context and backward, without the
    dispatcher's custom-op layers (which cost ~75 us of host time per differentiable call,
    measured on this repository's 2-core CPU machine). torch.compile sees the op instead.
    ``rest``: the op's arguments after q, k, v as one tuple (each argument of ``apply`` costs
    autograd host time). ``kept``: a repeated signature's entry of ``interface._FAST_FWD`` or
    ``_FAST_SDPA``, ``[planned forward or False, args, kept backward or False or None]``: the
    forward replays its planned Gluon launch (``route.replay_forward``) and the backward its kept
    launches (``route.replay_backward``, recorded into the entry by a backward through the route)
    where they take the call, and the op's body runs where they decline. Not the backward's under
    saved-tensor hooks (activation offloading, checkpointing), which may hand the backward tensors
    of other layouts."""

    @staticmethod
    def forward(ctx, q, k, v, rest, kept=None):
        done = route.replay_forward(kept[0], q, k, v, rest[0]) if kept is not None and kept[0] else None
        out, lse = _attention_fwd_body(q, k, v, *rest) if done is None else done
        # Only q, k, v, out and the LSE are kept: P is recomputed. (rest's tensors, ALiBi slopes,
        # cu_seqlens and the dropout seed, take no gradient and are read back from ctx.rest.)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.rest = rest
        ctx.kept = kept if kept is not None and _saved_tensor_hooks(False) is None else None
        # the LSE's gradient is ignored: let autograd pass None rather than build zeros for it (a
        # fill kernel and an allocation per backward)
        ctx.set_materialize_grads(False)
        return out, lse  # lse stays differentiable-looking with no gradient, as from the op

    @staticmethod
    def backward(ctx, dout, dlse):
        # _backward's work, calling the body of tileflash::bwd rather than the op (dlse is ignored)
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:  # only the LSE was differentiated: zero gradients, as the op's backward gives
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None
        (softmax_scale, causal, causal_shift, window_left, window_right, softcap, alibi_slopes, cu_seqlens_q,
         cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, seed, deterministic, options) = ctx.rest
        kept = ctx.kept
        if kept is not None and kept[2]:  # the signature's kept launches
            done = route.replay_backward(kept[2], dout, q, k, v, out, lse, softmax_scale, deterministic)
            if done is not None:
                return (*done, None, None)
        opts = Options.decode(options)
        dq, dk, dv = route.backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift,
                                    window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                                    dropout_p=dropout_p, seed=seed, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                    options=opts, deterministic=deterministic)
        if kept is not None and kept[2] is not False:  # (a kept signature: no ALiBi, seed or cu_seqlens)
            # the launches the route just replayed or recorded (none yet, or a kept replay declined:
            # other dO strides, a switch changed), or False where its route keeps none (not looked up
            # again), or None for a dO it made contiguous first (a later, contiguous one may be kept)
            kept[2] = route.planned_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift,
                                             (window_left, window_right), softcap, dropout_p, opts,
                                             deterministic) or (False if dout.stride(-1) == 1 else None)
        return dq, dk, dv, None, None


class _EagerAttentionBHSD(torch.autograd.Function):
    """:class:`_EagerAttention` on (batch, nheads, seqlen, headdim) tensors, for a caller that
    discards the LSE (``tileflash.scaled_dot_product_attention`` on a kept signature): the
    transposes to and from the kernels' (batch, seqlen, nheads, headdim) views happen inside, so that
    autograd records one node per call instead of one per transpose as well (host time). The output
    (the attention alone) is returned detached from the view made inside, so that autograd treats it
    as an ordinary output (an in-place change gets the usual saved-tensor check, not the error for
    views made inside a custom Function); the gradients come back in (batch, nheads, seqlen, headdim) form, in their
    inputs' memory order where the op's options say so (``Options.like_inputs``)."""

    @staticmethod
    def forward(ctx, query, key, value, rest, kept=None):
        out, _ = _EagerAttention.forward(ctx, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                         rest, kept)
        return out.transpose(1, 2).detach()

    @staticmethod
    def backward(ctx, dout):
        # (dout None: the output's gradient is undefined, e.g. from a custom Function returning None;
        # _EagerAttention.backward then gives zero gradients)
        dq, dk, dv, _, _ = _EagerAttention.backward(ctx, None if dout is None else dout.transpose(1, 2), None)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), None, None


# the feature arguments' defaults, read off the op's body (one place to change them)
_FEATURE_DEFAULTS = {name: prm.default for name, prm in inspect.signature(_attention_fwd_body).parameters.items()
                     if name in _FEATURES}
assert tuple(_FEATURE_DEFAULTS) == _FEATURES  # the op's positional order, which _setup_context and
# _EagerAttention.backward rely on


def op_args(softmax_scale: float, causal: bool, causal_shift: int, **features) -> tuple:
    """The arguments of ``tileflash::fwd`` after q, k, v, in its order with the defaults filled in
    (what :func:`attention_args` takes; callers that repeat a call may keep the tuple)."""
    if features.keys() - _FEATURE_DEFAULTS.keys():
        raise TypeError(f"attention: unknown feature arguments {sorted(features.keys() - _FEATURE_DEFAULTS.keys())}")
    return (softmax_scale, causal, causal_shift, *[features.get(n, d) for n, d in _FEATURE_DEFAULTS.items()])


def attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, causal_shift: int, *,
              need_lse: bool = True, **features) -> tuple[Tensor, Tensor]:
    """The one forward entry of the public functions: ``tileflash::fwd`` (arguments as there).

    Under torch.compile it is the custom op (no graph break, its registered autograd). In eager
    mode the same body runs through ``_EagerAttention`` when a gradient may be needed, and directly
    otherwise: the results and the backward are the op's, with less host time per call.
    ``need_lse=False``: the caller discards the LSE (see :func:`attention_args`)."""
    return attention_args(q, k, v, op_args(softmax_scale, causal, causal_shift, **features), need_lse)


def attention_args(q: Tensor, k: Tensor, v: Tensor, args: tuple, need_lse: bool = True) -> tuple[Tensor, Tensor]:
    """:func:`attention` with the op's other arguments as :func:`op_args` returned them.
    ``need_lse=False``: the caller discards the LSE; a forward without autograd may then return
    None for it (one allocation less per call: ``route.forward``'s ``need_lse``)."""
    if torch.compiler.is_compiling():
        return attention_fwd(q, k, v, *args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, args)
    return _attention_fwd_body(q, k, v, *args, need_lse=need_lse)


def attention_kept(q: Tensor, k: Tensor, v: Tensor, kept: list) -> tuple[Tensor, Tensor]:
    """:func:`attention_args` for an eager call that may need a gradient, of a repeated signature
    whose ``interface._FAST_FWD`` (or ``_FAST_SDPA``) entry is ``kept`` (its arguments ``kept[1]``):
    the autograd class replays the planned launches the entry holds."""
    return _EagerAttention.apply(q, k, v, kept[1], kept)


def attention_kept_bhsd(query: Tensor, key: Tensor, value: Tensor, kept: list) -> Tensor:
    """:func:`attention_kept` on (batch, nheads, seqlen, headdim) tensors -> the output alone, of
    that shape (``_EagerAttentionBHSD``: the SDPA drop-in's kept signatures under autograd)."""
    return _EagerAttentionBHSD.apply(query, key, value, kept[1], kept)


def kvcache_forward(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens_k: Optional[Tensor], softmax_scale: float, causal: bool,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None, block_table: Optional[Tensor] = None, num_splits: int = 0,
    max_seqlen_k: int = -1, cache_leftpad: Optional[Tensor] = None, options: str = "", seqlen_add: int = 0,
    *, need_lse: bool = True,
) -> tuple[Tensor, Tensor]:
    """Attention of q (batch, seqlen_q, nheads, d) over the first seqlens_k[b] + seqlen_add keys of
    a contiguous or paged KV cache -> (out, lse (batch, nheads, seqlen_q)). Forward only.
    need_lse=False (eager callers that discard it): the LSE may come back as None.
    seqlens_k=None: every batch entry holds max_seqlen_k keys (seqlen_add must be 0).
    cache_leftpad[b]: keys before it are masked (positions stay absolute). seqlen_add: the tokens
    an append just wrote after seqlens_k (added in the kernel: no new length tensor per step).

    The body of the custom op ``tileflash::kvcache_fwd`` (``tileflash.ops.route.kvcache``). Eager
    callers may call it directly: a decode step is forward-only, so the op's dispatch (about 30 us
    of host time per call, measured on CPU) buys nothing outside torch.compile."""
    return route.kvcache(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window=(window_left, window_right),
                         softcap=softcap, alibi_slopes=alibi_slopes, cache_batch_idx=cache_batch_idx,
                         block_table=block_table, num_splits=num_splits, max_seqlen_k=max_seqlen_k,
                         cache_leftpad=cache_leftpad, options=Options.decode(options), seqlen_add=seqlen_add,
                         need_lse=need_lse)


@torch.library.custom_op("tileflash::kvcache_append", mutates_args=("k_cache", "v_cache"))
def kvcache_append(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, seqlens: Optional[Tensor],
                   seqlen_fixed: int, cache_batch_idx: Optional[Tensor] = None,
                   block_table: Optional[Tensor] = None) -> None:
    """Write k/v (batch, seqlen_new, nheads_k, d) into the cache in place at positions seqlens[b] + t
    (seqlen_fixed + t without a length tensor): ``tileflash.ops.route.kvcache_append``. Reads no
    value on the host on CUDA (guarded writes), so a decode step stays capturable in a CUDA graph."""
    route.kvcache_append(k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx, block_table)


@kvcache_append.register_fake
def _(k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx=None, block_table=None):
    return None


@torch.library.custom_op("tileflash::kvcache_fwd", mutates_args=())
def kvcache_fwd(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens_k: Optional[Tensor], softmax_scale: float, causal: bool,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None, block_table: Optional[Tensor] = None, num_splits: int = 0,
    max_seqlen_k: int = -1, cache_leftpad: Optional[Tensor] = None, options: str = "", seqlen_add: int = 0,
) -> tuple[Tensor, Tensor]:
    """torch.compile-visible wrapper of :func:`kvcache_forward`."""
    return kvcache_forward(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
                           alibi_slopes, cache_batch_idx, block_table, num_splits, max_seqlen_k, cache_leftpad,
                           options, seqlen_add)


@kvcache_fwd.register_fake
def _(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, *args, **kwargs):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
