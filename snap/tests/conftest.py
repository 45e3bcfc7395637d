"""Test set-up: choose where the Triton kernels run.

Without a CUDA GPU, TRITON_INTERPRET=1 is set *before* tileflash/triton are imported, so the
real Triton kernels are built for Triton's CPU interpreter. The `backend` fixture then picks,
per test, between the interpreter ("interpret"), the tiled PyTorch CPU path ("tiled") and the
GPU ("cuda"), by setting or clearing TRITON_INTERPRET at call time.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Import now, so Triton builds the kernels under the environment chosen above, not under whatever a
# fixture has set when some test module first imports tileflash.
import tileflash  # noqa: E402,F401

BACKENDS = ["tiled", "interpret", "cuda"]


def backend_device(backend):
    return "cuda" if backend == "cuda" else "cpu"


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


def count_calls(monkeypatch, module, name):
    """Replace module.<name> by a wrapper that records the positional arguments of each call that
    returned something other than None (the Gluon launchers return None when their kernel did
    not compile and the Triton kernel ran instead); returns the list of records, which tests
    assert is non-empty, i.e. that the kernel really ran."""
    calls = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        res = real(*args, **kwargs)
        if res is not None:
            calls.append(args)
        return res

    monkeypatch.setattr(module, name, counting)
    return calls
