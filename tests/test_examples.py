"""examples/generate.py: paged-KV-cache decoding gives the logits of a full recompute."""

import importlib.util
import pathlib

import torch

from helpers import backend_device

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("generate_example", ROOT / "examples" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generate_matches_full_recompute(backend):
    dev = backend_device(backend)
    gen = _load()
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    tokens, worst = gen.generate(dev, steps=6, batch=2, prompt_len=4, page_size=4, dtype=dtype)
    assert tokens.shape == (2, 10)
    assert worst < (5e-2 if dtype == torch.bfloat16 else 1e-4), worst
