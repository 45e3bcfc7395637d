"""Kernel options: how a call is run, never what it computes.

Every public function takes ``options=`` (an :class:`Options`, or None for the defaults), in the
spirit of FlexAttention's ``kernel_options``. The result is the same attention whichever options
are chosen (to rounding: different kernels sum in different orders); options pick the kernel and
its launch.

Kernel developers' A/B switches are not options: they live in :data:`DEBUG`, read once from the
environment variable ``TILEFLASH_DEBUG`` when tileflash is imported (see :class:`Debug`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Optional

BACKENDS = ("auto", "triton", "gluon")


@dataclasses.dataclass(frozen=True)
class Options:
    """How tileflash runs a call on a CUDA device (CPU tensors always take the tiled PyTorch path,
    or the Triton kernels in Triton's interpreter when ``TRITON_INTERPRET=1`` was set before import).

    Args:
        backend: ``"auto"`` (default): the Hopper Gluon kernels where they take the call (sm90,
            dense fp16/bf16, head dim 64-256, no window/softcap/ALiBi/dropout, lengths that are
            multiples of their tiles), the portable Triton kernels everywhere else.
            ``"triton"``: the portable Triton kernels only. ``"gluon"``: the Gluon kernels, and a
            ``ValueError`` naming the reason where they cannot take the call.
        use_tma: Triton kernels only: move tiles through TMA tensor descriptors. None (default):
            on Hopper (sm90) where the layout allows (16-byte aligned base and strides); True /
            False force it on / off (on falls back to pointers where descriptors are impossible).
        autotune: Triton kernels only: benchmark a small list of tiles once per (length bucket,
            head dim, flags, dtype) instead of the fixed per-head-dim default. The first call of
            each bucket then costs seconds.
        pad_head_dim: run a head dim between the Gluon kernels' widths (64 < D < 128, 128 < D < 256)
            on copies zero-padded to the next width (exact: zero columns add nothing). False keeps
            such calls on the Triton kernels. Default True.
        like_inputs: the forward's output takes q's memory order (``torch.empty_like(q)``, as
            flash-attn and torch's SDPA allocate it) instead of being a contiguous
            (batch, seqlen, nheads, headdim) tensor, on every path and under torch.compile; the
            values are the same. The eager backward's gradients (autograd outside torch.compile) take
            q's, k's and v's memory order likewise; the custom op ``tileflash::bwd``, which
            torch.compile calls, keeps contiguous gradients, as its fake says. The KV-cache functions
            ignore it. ``tileflash.scaled_dot_product_attention`` always sets it, so that
            (batch, nheads, seqlen, headdim)-contiguous inputs get an output of that memory order and
            gradients that autograd keeps without a copy, and take the planned Hopper forward (whose
            output must share q's layout). Default False.
    """

    backend: str = "auto"
    use_tma: Optional[bool] = None
    autotune: bool = False
    pad_head_dim: bool = True
    like_inputs: bool = False

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"Options.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not (self.use_tma is None or isinstance(self.use_tma, bool)):
            raise ValueError(f"Options.use_tma must be None, True or False, got {self.use_tma!r}")
        for name in ("autotune", "pad_head_dim", "like_inputs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Options.{name} must be a bool, got {getattr(self, name)!r}")

    def encode(self) -> str:
        """The options as one string: the custom ops' schema takes it (``decode`` inverts it)."""
        return (f"{self.backend},{ {None: -1, False: 0, True: 1}[self.use_tma]},{int(self.autotune)},"
                f"{int(self.pad_head_dim)},{int(self.like_inputs)}")

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def decode(text: str) -> "Options":
        if not text:
            return DEFAULT
        # (four fields: a string from before like_inputs existed, e.g. in a saved graph)
        backend, tma, autotune, pad, like_inputs = (text + ",0" if text.count(",") == 3 else text).split(",")
        return Options(backend, {-1: None, 0: False, 1: True}[int(tma)], autotune == "1", pad == "1",
                       like_inputs == "1")


DEFAULT = Options()


def resolve(options) -> Options:
    """``options`` as an :class:`Options`: None gives the defaults; a dict is ``Options(**dict)``."""
    if options is None:
        return DEFAULT
    if isinstance(options, Options):
        return options
    if isinstance(options, dict):
        return Options(**options)
    raise TypeError(f"options must be a tileflash.Options, a dict of its fields or None, got {type(options).__name__}")


@dataclasses.dataclass
class Debug:
    """A/B switches for kernel development, read once from ``TILEFLASH_DEBUG`` at import, as
    comma-separated ``name=value`` pairs, e.g. ``TILEFLASH_DEBUG=gluon_fused=1,desc_cache=0``.
    Tests change them with ``monkeypatch.setattr(tileflash.options.DEBUG, name, value)``.

    Args:
        gluon_fused: Hopper backward as one fused Gluon kernel (dQ by ordered TMA reductions)
            instead of the split dK/dV + dQ kernels. Default 0.
        gluon_bwd: the Gluon dK/dV kernel on Hopper. Default 1.
        gluon_dq: the Gluon dQ kernel on Hopper (0: the Triton dQ kernel after the Gluon dK/dV). Default 1.
        dq_delta: the dQ kernel computes delta = rowsum(dO * O) itself (0: a separate delta kernel). Default 1.
        desc_cache: the compiled launcher caches encoded TMA descriptors per address. Default 1.
        pdl: decode's programmatic-dependent-launch trigger, 0 (off) to 3; -1 (default) keeps the
            launch config's own.
        scale_cast: the fused backward scales and casts its fp32 dQ sums into dq with tileflash's
            own kernel (``triton.backward.scale_cast``; 0: ``torch.mul``, the same bits). Default 1:
            6-8% faster than ``torch.mul`` on an H100 (72.5-72.7 against 77.2-78.5 us per cast at
            B*N = 16k, H*D = 2048; docs/benchmarks.md, "H100 backward grid at 0dbc0b7").
        ptr_ints: planned launches hand the compiled launcher their raw pointers as integer
            addresses (``launch.addresses``), sparing it a ``data_ptr`` call and a driver pointer
            query (``cuPointerGetAttribute``) per tensor (0: the tensors, as triton's own launches
            pass them). Default 1: on an H100 (2026-12-06, two rotated runs each, bitwise equal
            arms) decode 26.2-26.7 -> 24.7-25.3 us per call, decode+append 38.0-39.8 -> 35.7-36.9,
            forward 17.3-17.4 -> 16.9-17.0; forward+backward within its spread (-2.3% to +2.1%).
    """

    gluon_fused: bool = False
    gluon_bwd: bool = True
    gluon_dq: bool = True
    dq_delta: bool = True
    desc_cache: bool = True
    pdl: int = -1
    scale_cast: bool = True
    ptr_ints: bool = True

    @classmethod
    def from_env(cls, text: Optional[str] = None) -> "Debug":
        text = os.environ.get("TILEFLASH_DEBUG", "") if text is None else text
        dbg = cls()
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name not in cls.__dataclass_fields__:
                raise ValueError(f"TILEFLASH_DEBUG: {item!r} is not name=value with a name among "
                                 f"{sorted(cls.__dataclass_fields__)}")
            if name == "pdl":
                if value not in ("-1", "0", "1", "2", "3"):
                    raise ValueError(f"TILEFLASH_DEBUG: pdl={value!r}: use -1 (the config's), 0 (off), 1, 2 or 3")
                setattr(dbg, name, int(value))
            elif value in ("0", "1"):
                setattr(dbg, name, value == "1")
            else:
                raise ValueError(f"TILEFLASH_DEBUG: {name}={value!r}: use 0 or 1")
        return dbg


DEBUG = Debug.from_env()

# environment switches of earlier releases, no longer read: what replaces each
LEGACY_SWITCHES = {
    "TILEFLASH_GLUON": "options=tileflash.Options(backend='triton')",
    "TILEFLASH_TMA": "options=tileflash.Options(use_tma=True/False)",
    "TILEFLASH_AUTOTUNE": "options=tileflash.Options(autotune=True)",
    "TILEFLASH_GLUON_PAD": "options=tileflash.Options(pad_head_dim=False)",
    "TILEFLASH_GLUON_BWD": "TILEFLASH_DEBUG=gluon_bwd=0",
    "TILEFLASH_GLUON_DQ": "TILEFLASH_DEBUG=gluon_dq=0",
    "TILEFLASH_GLUON_FUSED": "TILEFLASH_DEBUG=gluon_fused=1",
    "TILEFLASH_DQ_DELTA": "TILEFLASH_DEBUG=dq_delta=0",
    "TILEFLASH_DESC_CACHE": "TILEFLASH_DEBUG=desc_cache=0",
    "TILEFLASH_PDL": "TILEFLASH_DEBUG=pdl=N",
}


def warn_legacy_switches(environ=None) -> list:
    """Warn (FutureWarning) for each old environment switch that is set, since it has no effect
    any more; returns their names."""
    environ = os.environ if environ is None else environ
    found = [name for name in LEGACY_SWITCHES if name in environ]
    for name in found:
        warnings.warn(f"tileflash: the environment variable {name} is no longer read and has no effect; "
                      f"use {LEGACY_SWITCHES[name]}", FutureWarning, stacklevel=2)
    return found


warn_legacy_switches()
