"""tileflash: exact FlashAttention in Triton for PyTorch.

The public functions are imported on first use, so ``import tileflash`` costs no kernel module,
Triton or torch.library work until a function is called (``tileflash.options`` is light and
imported eagerly). The custom ops (``torch.ops.tileflash.*``) are registered then too: code that
needs them before any call (e.g. ``torch.export.load`` of a program that uses them) imports
``tileflash.ops.attention`` first. Submodules (``tileflash.interface``, ``tileflash.ops``, ...)
are imported on attribute access as well.
"""

import importlib

from tileflash.options import Options

__version__ = "0.1.0"
__all__ = [
    "Options",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
    "__version__",
]
_LAZY = frozenset(__all__) - {"Options", "__version__"}
_SUBMODULES = frozenset({"bench", "cli", "cpu", "integrations", "interface", "ops", "reference"})


def __getattr__(name):
    if name in _LAZY:
        from tileflash import interface

        value = getattr(interface, name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"tileflash.{name}")
    raise AttributeError(f"module 'tileflash' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY)
