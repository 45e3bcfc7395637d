"""Hugging Face transformers backend: ``attn_implementation="tileflash"``.

After :func:`register`, any transformers model that supports flash attention (its class sets
``_supports_flash_attn``) runs its attention through tileflash, for training and generation::

    import tileflash.integrations.transformers as tf_hf
    from transformers import AutoModelForCausalLM

    tf_hf.register()                                   # idempotent, returns "tileflash"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="tileflash", dtype=torch.bfloat16)
    model.set_attn_implementation("tileflash")         # or switch an existing model

Design: transformers' own flash-attention path is reused unchanged, exactly as for its
``flash_attention_2`` and kernels-hub implementations. ``"tileflash"`` is registered in
``AttentionInterface`` with ``transformers.integrations.flash_attention.flash_attention_forward``
and in ``AttentionMaskInterface`` with ``masking_utils.flash_attention_mask``, so transformers
itself unpads padded batches to varlen, reads packed sequences from ``position_ids`` or
``cu_seq_lens_*``, computes sliding windows, softcap, dropout and scaling, and handles GQA and the
KV cache. That path then asks ``modeling_flash_attention_utils.lazy_import_flash_attention(name)``
for the kernels; its resolver ``_lazy_imports`` only knows flash-attn 2/3/4, NPU and hub kernels,
so :func:`register` wraps it: ``"tileflash"`` and ``"paged|tileflash"`` (continuous batching)
resolve to the thin flash-attn-2-compatible wrappers below, every other name goes to the
original resolver untouched.

transformers decides which keyword arguments to pass by inspecting the varlen function's
signature (``_lazy_define_process_function``). The wrappers therefore declare exactly what
tileflash honours (``dropout_p``, ``softmax_scale``, ``causal``, ``window_size``, ``softcap``,
``deterministic``, ``max_seqlen_*``), plus ``s_aux`` (attention sinks, e.g. gpt-oss), which is
declared only so that it is *not* silently dropped: a call with sinks raises
``NotImplementedError``. Models that list ``_compatible_flash_implementations`` (the sink models:
gpt-oss, granite-swa, ...) are redirected by transformers itself to a kernel from that list.

:func:`register` also wraps ``PreTrainedModel.get_correct_attn_implementation`` so that a model
whose class does not set ``_supports_flash_attn`` refuses ``"tileflash"`` (as transformers refuses
``flash_attention_2`` and hub flash kernels there) instead of running a mask flash cannot express.

Continuous batching (``model.generate_batch``) works through the same varlen path. transformers
5.17 routes it through a separate paged wrapper (``integrations/flash_paged.py``) that passes
neither softcap nor dropout and reads the window from the attention module (Mistral's has none);
``"paged|tileflash"`` raises ``NotImplementedError`` there rather than drop them.

Supported: transformers 5.x (tested with 5.17 and 5.24). :func:`register` checks the internals it
relies on and raises, naming the installed version, if they differ.

On CUDA, tileflash takes fp16/bf16 (load the model with ``dtype=torch.bfloat16``, or run under
autocast: transformers casts q/k/v to the autocast dtype; an fp32 model without autocast raises
``TypeError``); CPU tensors (float32 included) run tileflash's tiled PyTorch path, or the Triton
interpreter when ``TRITON_INTERPRET=1`` was set before tileflash was imported.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

NAME = "tileflash"
PAGED_NAME = "paged|" + NAME
_NAMES = (NAME, PAGED_NAME)
_SUPPORTED_MAJOR = 5
_TESTED = "5.17 and 5.24"

_options = None  # tileflash.Options bound by register(); None = the defaults


# -- flash-attn-2-compatible wrappers: what transformers' flash path calls ----------------------------------------


def _interface():
    from tileflash import interface  # looked up per call, so tests can count calls on tileflash.interface

    return interface


def _no_sinks(s_aux):
    if s_aux is not None:
        raise NotImplementedError(
            "attn_implementation='tileflash' got attention sinks (s_aux, e.g. gpt-oss / granite-swa), which "
            "tileflash's kernels do not implement; use attn_implementation='eager' or 'sdpa', or a sink-capable "
            "kernel such as 'kernels-community/vllm-flash-attn3'")


def _host_int(name, x):
    """max_seqlen as a Python int: transformers passes a 0-d tensor for sequences packed via position_ids."""
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name} must be an int or a one-element tensor, got shape {tuple(x.shape)}")
        return int(x.item())
    return x


def _int32(t):
    """cu_seqlens / cache_seqlens as contiguous int32 (transformers' collators may give int64)."""
    if isinstance(t, Tensor) and (t.dtype != torch.int32 or not t.is_contiguous()):
        return t.to(torch.int32).contiguous()
    return t


def _defaults(window_size, softcap, deterministic):
    return ((-1, -1) if window_size is None else window_size, 0.0 if softcap is None else softcap,
            False if deterministic is None else deterministic)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, s_aux=None):
    """:func:`tileflash.flash_attn_func` as transformers' flash path calls it (batches without padding).

    Arguments:
        q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads
            a multiple of nheads_k (GQA/MQA).
        dropout_p, softmax_scale, causal, softcap, alibi_slopes, deterministic, return_attn_probs:
            as in :func:`tileflash.flash_attn_func`. transformers passes dropout_p (the module's
            attention dropout in training, else 0), softmax_scale (the module's ``scaling``), causal,
            softcap (only when the model sets one, e.g. Gemma-2) and deterministic
            (``FLASH_ATTENTION_DETERMINISTIC=1`` or the ``deterministic`` kwarg). None for
            softcap / deterministic means off.
        window_size: (left, right), used as given. transformers passes
            ``(sliding_window - 1, sliding_window - 1)`` when ``seqlen_k > sliding_window``; with
            ``causal=True`` the right side is 0, so query i sees keys ``i - sliding_window + 1 .. i``
            (bottom-right aligned), transformers' sliding-window definition. None means no window.
        s_aux: attention sinks; only None is accepted (``NotImplementedError`` otherwise).

    Return:
        out: (batch, seqlen_q, nheads, headdim), plus (softmax_lse, None) if return_attn_probs.
    """
    _no_sinks(s_aux)
    window_size, softcap, deterministic = _defaults(window_size, softcap, deterministic)
    return _interface().flash_attn_func(
        q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
        return_attn_probs=return_attn_probs, options=_options)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, s_aux=None):
    """:func:`tileflash.flash_attn_varlen_func` as transformers' flash path calls it.

    transformers uses it for padded batches (unpadded with the 2-D attention mask; during cached
    decoding with padding, each query row is one sequence against its unpadded keys), for
    sequences packed in one row (``position_ids`` restarting at 0, or ``cu_seq_lens_q/k`` and
    ``max_length_q/k`` passed to the model) and for continuous batching.

    Arguments:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) cumulative lengths; int64 is converted to int32.
        max_seqlen_q, max_seqlen_k: ints, or one-element tensors (transformers passes
            ``cu_seqlens.diff().max()`` for packed ``position_ids``), read on the host.
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, s_aux: as in :func:`flash_attn_func` above.

    Return:
        out: (total_q, nheads, headdim), plus (softmax_lse, None) if return_attn_probs.
    """
    _no_sinks(s_aux)
    window_size, softcap, deterministic = _defaults(window_size, softcap, deterministic)
    return _interface().flash_attn_varlen_func(
        q, k, v, _int32(cu_seqlens_q), _int32(cu_seqlens_k), _host_int("max_seqlen_q", max_seqlen_q),
        _host_int("max_seqlen_k", max_seqlen_k), dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
        return_attn_probs=return_attn_probs, options=_options)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            s_aux=None):
    """:func:`tileflash.flash_attn_with_kvcache` for transformers' paged decode path.

    transformers calls it (continuous batching's block-table decode fast path) with
    ``q, k, v`` of shape (batch, 1, heads, headdim), the paged ``k_cache``/``v_cache``,
    ``block_table``, ``cache_seqlens`` (tokens already cached, int32; int64 is converted),
    ``causal``, ``softmax_scale``, ``window_size`` and ``softcap``; the new k/v are written into the
    cache in place. Other arguments as in :func:`tileflash.flash_attn_with_kvcache`; ``s_aux`` as
    in :func:`flash_attn_func` above. Forward only.
    """
    _no_sinks(s_aux)
    window_size, softcap, _ = _defaults(window_size, softcap, None)
    return _interface().flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=_int32(cache_seqlens), cache_batch_idx=_int32(cache_batch_idx),
        cache_leftpad=_int32(cache_leftpad), block_table=_int32(block_table), softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, softcap=softcap, rotary_interleaved=rotary_interleaved,
        alibi_slopes=alibi_slopes, num_splits=num_splits, return_softmax_lse=return_softmax_lse, options=_options)


# -- registration --------------------------------------------------------------------------------------------------


def _mismatch(version, what):
    return RuntimeError(
        f"tileflash.integrations.transformers supports transformers {_SUPPORTED_MAJOR}.x (tested with {_TESTED}); the "
        f"installed transformers {version} differs: {what}. Install a supported version "
        f"(pip install 'tileflash[hf]'), or use attn_implementation='sdpa'.")


def _load(version):
    """Import and check every transformers internal this integration relies on."""
    try:
        from transformers import masking_utils, modeling_flash_attention_utils as fa_utils, modeling_utils
        from transformers.integrations import flash_attention
    except ImportError as e:
        raise _mismatch(version, f"a module failed to import ({e})") from e
    missing = [f"{mod.__name__}.{attr}" for mod, attr in (
        (fa_utils, "_lazy_imports"), (fa_utils, "lazy_import_flash_attention"),
        (fa_utils, "_process_flash_attention_kwargs"), (fa_utils, "_hf_api_to_flash_mapping"),
        (fa_utils, "_pad_input"), (fa_utils, "_unpad_input"), (flash_attention, "flash_attention_forward"),
        (masking_utils, "AttentionMaskInterface"), (masking_utils, "flash_attention_mask"),
        (modeling_utils, "AttentionInterface"), (modeling_utils, "PreTrainedModel")) if not hasattr(mod, attr)]
    if missing:
        raise _mismatch(version, "missing " + ", ".join(missing))
    sig = inspect.signature(fa_utils._lazy_imports)
    if next(iter(sig.parameters), None) != "implementation":
        raise _mismatch(version, f"modeling_flash_attention_utils._lazy_imports{sig} does not take the "
                                 "implementation name first")
    wanted = {"dropout", "softmax_scale", "sliding_window", "softcap", "deterministic", "s_aux", "max_seqlen_q",
              "max_seqlen_k", "supports_mapping"}
    lacking = wanted - set(inspect.signature(fa_utils._process_flash_attention_kwargs).parameters)
    if lacking:
        raise _mismatch(version, f"_process_flash_attention_kwargs lacks {sorted(lacking)}")
    if {k: fa_utils._hf_api_to_flash_mapping.get(k) for k in ("dropout", "sliding_window")} != \
            {"dropout": "dropout_p", "sliding_window": "window_size"}:
        raise _mismatch(version, f"_hf_api_to_flash_mapping is {fa_utils._hf_api_to_flash_mapping}")
    if not hasattr(modeling_utils.PreTrainedModel, "get_correct_attn_implementation"):
        raise _mismatch(version, "PreTrainedModel.get_correct_attn_implementation is missing")
    return fa_utils, flash_attention, masking_utils, modeling_utils


def _wrap_resolver(fa_utils):
    original = fa_utils._lazy_imports
    if getattr(original, "_tileflash", False):
        return

    @functools.wraps(original)
    def _lazy_imports(implementation, *args, **kwargs):
        if implementation in _NAMES:
            return flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fa_utils._pad_input, \
                fa_utils._unpad_input
        return original(implementation, *args, **kwargs)

    _lazy_imports._tileflash = True
    fa_utils._lazy_imports = _lazy_imports
    # transformers <= 5.17 marks a name as loaded before resolving it: never keep a stale entry for ours
    if getattr(fa_utils, "_loaded_implementation", None) in _NAMES:
        fa_utils._loaded_implementation = None


def _guard_model_support(modeling_utils):
    """Refuse "tileflash" on models that do not declare flash-attention support, as transformers does
    for flash_attention_2 and hub kernels (their attention may need a mask flash cannot express)."""
    cls = modeling_utils.PreTrainedModel
    original = cls.get_correct_attn_implementation
    if getattr(original, "_tileflash", False):
        return

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        if isinstance(requested_attention, str) and requested_attention.removeprefix("paged|") == NAME and not (
                getattr(self, "_supports_flash_attn", False) or getattr(self, "_supports_flash_attn_2", False)):
            raise ValueError(
                f"{type(self).__name__} does not support flash attention (its class does not set "
                f"_supports_flash_attn), so it cannot use attn_implementation={requested_attention!r}; use 'sdpa' "
                f"or 'eager'")
        return original(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._tileflash = True
    cls.get_correct_attn_implementation = get_correct_attn_implementation


@functools.lru_cache(maxsize=None)
def _paged_forward(flash_attention, version):
    """The attention function for "paged|tileflash" (continuous batching)."""
    from transformers import modeling_flash_attention_utils as fa_utils

    if not hasattr(fa_utils, "lazy_import_paged_flash_attention"):
        # newer 5.x (5.24 checked): flash_attention_forward handles the paged cache itself
        return flash_attention.flash_attention_forward
    try:  # 5.17: a separate paged wrapper
        from transformers.integrations.flash_paged import paged_attention_forward
    except ImportError as e:
        raise _mismatch(version, f"integrations.flash_paged.paged_attention_forward failed to import ({e})") from e

    def refuse(what):
        raise NotImplementedError(
            f"attn_implementation={PAGED_NAME!r}: the paged flash wrapper of transformers {version} "
            f"(integrations/flash_paged.py) {what}; use model.generate() with attn_implementation={NAME!r}, or a "
            f"newer transformers 5.x, instead")

    @functools.wraps(paged_attention_forward)
    def paged_forward(module, *args, **kwargs):
        # That wrapper passes neither softcap nor dropout to the kernel, and takes the window from the
        # attention module's `sliding_window` attribute (Mistral's modules have none): refuse what it would drop.
        for name in ("softcap", "dropout"):
            if kwargs.get(name):
                refuse(f"does not pass {name}={kwargs[name]!r} to the kernel")
        if getattr(module, "sliding_window", None) != kwargs.get("sliding_window"):
            refuse(f"takes the sliding window from {type(module).__name__}.sliding_window "
                   f"({getattr(module, 'sliding_window', None)!r}), not the model's sliding_window="
                   f"{kwargs.get('sliding_window')!r}")
        return paged_attention_forward(module, *args, **kwargs)

    return paged_forward


def register(options=None) -> str:
    """Make ``attn_implementation="tileflash"`` available in Hugging Face transformers.

    Registers ``"tileflash"`` (and ``"paged|tileflash"``, which continuous batching selects) with
    transformers' ``AttentionInterface`` and ``AttentionMaskInterface``, reusing transformers'
    flash-attention wrapper and mask, and teaches transformers' flash-attention resolver the name.
    Afterwards ``AutoModelForCausalLM.from_config(cfg, attn_implementation="tileflash")``,
    ``from_pretrained(..., attn_implementation="tileflash")`` and
    ``model.set_attn_implementation("tileflash")`` work for every model whose class sets
    ``_supports_flash_attn`` (others raise ``ValueError``, as for ``flash_attention_2``).

    Idempotent: calling it again re-registers the same functions (other names are never touched).

    Arguments:
        options: a :class:`tileflash.Options` used by every call made through transformers, or None
            for the defaults. A later ``register(options=...)`` replaces it.

    Return:
        ``"tileflash"``, the name to pass as ``attn_implementation``.

    Raises:
        ImportError: transformers is not installed (``pip install 'tileflash[hf]'``).
        RuntimeError: the installed transformers is not 5.x, or its internals differ from what this
            integration was written against; the message names the version.
    """
    global _options
    try:
        import transformers
    except ImportError as e:
        raise ImportError("tileflash.integrations.transformers needs Hugging Face transformers 5.x: "
                          "pip install 'tileflash[hf]'") from e
    version = getattr(transformers, "__version__", "unknown")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = None
    if major != _SUPPORTED_MAJOR:
        raise _mismatch(version, "only the 5.x internals are known")
    if options is not None:
        from tileflash.options import Options

        if not isinstance(options, Options):
            raise TypeError(f"options must be a tileflash.Options or None, got {type(options).__name__}")
    fa_utils, flash_attention, masking_utils, modeling_utils = _load(version)

    _options = options
    _wrap_resolver(fa_utils)
    _guard_model_support(modeling_utils)
    modeling_utils.AttentionInterface.register(NAME, flash_attention.flash_attention_forward)
    modeling_utils.AttentionInterface.register(PAGED_NAME, _paged_forward(flash_attention, version))
    masking_utils.AttentionMaskInterface.register(NAME, masking_utils.flash_attention_mask)
    return NAME


__all__ = ["NAME", "register", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
