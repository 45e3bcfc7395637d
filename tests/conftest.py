"""Test set-up: choose where the Triton kernels run, seed every test, and the `backend` fixture.

Without a CUDA GPU, TRITON_INTERPRET=1 is set *before* tileflash's kernel modules (and triton's
kernels) are imported, so the real Triton kernels are built for Triton's CPU interpreter. The
`backend` fixture then picks, per test, between the interpreter ("interpret"), the tiled PyTorch
CPU path ("tiled") and the GPU ("cuda"), by setting or clearing TRITON_INTERPRET at call time.

Shared helpers (make_qkv, rounding_atol, count_calls, ...) live in helpers.py; test modules import
them from there, never from each other.
"""

import os
import random
import zlib

import numpy as np
import pytest
import torch

pytest.register_assert_rewrite("helpers")  # its asserts report their operands, as a test module's do
from helpers import HAS_CUDA  # noqa: E402

if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# `import tileflash` is lazy (the kernel modules load on first use), so import the kernel modules
# now: Triton builds the kernels under the environment chosen above, not under whatever a fixture
# has set when some test first reaches them.
import tileflash.interface  # noqa: E402,F401
import tileflash.ops.route  # noqa: E402,F401

BACKENDS = ["tiled", "interpret", "cuda"]


@pytest.fixture(autouse=True)
def _seed_every_test(request):
    """Seed torch (CPU and CUDA), python's random and numpy from a stable hash of the test's node
    id, so that a test draws the same numbers whatever ran before it (alone, in another order, or
    under -k), and every run of the suite is reproducible."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Select a backend; skip with a reason when this machine cannot run it."""
    name = request.param
    if name == "cuda" and not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    if name == "interpret" and not INTERPRETED:
        pytest.skip("Triton kernels were compiled for the GPU (TRITON_INTERPRET unset at import)")
    if name == "tiled":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    elif name == "interpret":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return name
