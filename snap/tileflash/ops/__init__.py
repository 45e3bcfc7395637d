"""Kernel families. Order inside each module: @triton.jit kernels -> host launcher -> custom op."""
