"""Gluon imports and the shims between triton releases, for the Hopper kernels of this package.

Importing this module raises ImportError where the installed triton has no Gluon (before 3.5):
the router (``tileflash.ops.route``) then runs the Triton kernels.
"""

from triton.experimental import gluon  # noqa: F401
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,  # noqa: F401
                                                               warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401

# triton 3.8 renamed the TMA copies (the old names raise); same arguments
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
if hasattr(tma, "async_atomic_add"):  # triton >= 3.8
    _tma_add = tma.async_atomic_add
else:  # triton 3.6 builds the same op (cp.reduce.async.bulk.tensor ... .add) without exposing it
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_add(tensor_desc, coord, src, _semantic=None):
        """global[tile at coord] += shared src, one TMA bulk reduction (asynchronous, like a store)."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

# a CTA-wide barrier: gl.thread_barrier in triton 3.6, renamed gl.barrier in later releases
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
