"""tileflash: exact FlashAttention in Triton for PyTorch.

The public functions are imported on first use, so ``import tileflash`` costs no kernel module,
Triton or torch.library work until a function is called (``tileflash.options`` is light and
imported eagerly).
"""

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


def __getattr__(name):
    if name in _LAZY:
        from tileflash import interface

        value = getattr(interface, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'tileflash' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY)
