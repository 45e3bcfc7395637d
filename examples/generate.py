"""A tiny decoder-only transformer generating tokens with a paged KV cache through tileflash.

Random weights (nothing is downloaded). Each step feeds only the new token:
``flash_attn_with_kvcache`` appends its (rotated) key/value to a paged cache in place and attends
over the cache. The same model is also run the slow way, recomputing full causal attention with
plain PyTorch over the whole sequence, and the logits of every step are compared.

    python examples/generate.py                 # CPU (tiled path) or CUDA if available
    python examples/generate.py --device cpu --steps 16
"""

from __future__ import annotations

import argparse
import math

import torch

import tileflash
from tileflash.ops.utils import apply_rotary


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab=97, dim=64, layers=2, heads=4, kv_heads=2, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g) * 0.5)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            layer = torch.nn.Module()
            layer.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
            layer.out = torch.nn.Linear(dim, dim, bias=False)
            layer.up = torch.nn.Linear(dim, 4 * dim, bias=False)
            layer.down = torch.nn.Linear(4 * dim, dim, bias=False)
            for lin in (layer.qkv, layer.out, layer.up, layer.down):
                with torch.no_grad():
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / math.sqrt(lin.weight.shape[1]))
            self.layers.append(layer)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _split(self, layer, x):
        b, s, _ = x.shape
        q, k, v = layer.qkv(self._norm(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        return (q.view(b, s, self.heads, self.head_dim), k.view(b, s, self.kv_heads, self.head_dim),
                v.view(b, s, self.kv_heads, self.head_dim))

    def _mlp(self, layer, x):
        return x + layer.down(torch.nn.functional.gelu(layer.up(self._norm(x))))

    def forward_full(self, tokens):
        """Reference: the whole sequence at once, plain PyTorch causal attention."""
        x = self.emb[tokens]
        b, s, _ = x.shape
        pos = torch.arange(s, device=x.device)[None].expand(b, s)
        for layer in self.layers:
            q, k, v = self._split(layer, x)
            q = apply_rotary(q, self.cos, self.sin, pos, interleaved=False)
            k = apply_rotary(k, self.cos, self.sin, pos, interleaved=False)
            g = self.heads // self.kv_heads
            att = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(g, 2).transpose(1, 2), v.repeat_interleave(g, 2).transpose(1, 2),
                is_causal=True).transpose(1, 2)
            x = self._mlp(layer, x + layer.out(att.reshape(b, s, -1)))
        return self._norm(x) @ self.emb.t()

    def step(self, tokens, caches, block_table, seqlens):
        """One decode step: tokens (batch, 1); caches hold each layer's paged (k, v)."""
        x = self.emb[tokens]
        b = x.shape[0]
        for layer, (kc, vc) in zip(self.layers, caches):
            q, k, v = self._split(layer, x)
            att = tileflash.flash_attn_with_kvcache(
                q, kc, vc, k, v, rotary_cos=self.cos, rotary_sin=self.sin, cache_seqlens=seqlens,
                block_table=block_table, causal=True, rotary_interleaved=False)
            x = self._mlp(layer, x + layer.out(att.reshape(b, 1, -1)))
        return self._norm(x) @ self.emb.t()


@torch.no_grad()
def generate(device="cpu", steps=12, batch=2, prompt_len=5, page_size=16, dtype=torch.float32, seed=0):
    """Greedy generation with a paged cache; returns (tokens, max logit difference vs full recompute)."""
    model = TinyDecoder(seed=seed).to(device)
    total = prompt_len + steps
    pages_per_seq = -(-total // page_size)
    g = torch.Generator().manual_seed(seed + 1)
    # a shuffled page pool, as a serving engine would hand out
    perm = torch.randperm(batch * pages_per_seq + 3, generator=g)
    block_table = perm[: batch * pages_per_seq].view(batch, pages_per_seq).int().to(device)
    caches = [tuple(torch.zeros(batch * pages_per_seq + 3, page_size, model.kv_heads, model.head_dim,
                                device=device, dtype=dtype) for _ in range(2)) for _ in model.layers]
    model = model.to(dtype)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.randint(0, model.emb.shape[0], (batch, prompt_len), generator=g).to(device)
    seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
    worst = 0.0
    for i in range(total - 1):
        logits = model.step(tokens[:, i: i + 1], caches, block_table, seqlens)[:, -1]
        seqlens += 1
        ref = model.forward_full(tokens[:, : i + 1])[:, -1]
        worst = max(worst, (logits.float() - ref.float()).abs().max().item())
        if i + 1 >= prompt_len:
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], 1)
    return tokens, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    tokens, worst = generate(args.device, args.steps, page_size=args.page_size, dtype=dtype)
    print(f"device {args.device}, {dtype}: generated {tokens.shape[1]} tokens per sequence")
    print(tokens.tolist())
    print(f"max |logits(paged kv-cache decode) - logits(full recompute)| over all steps: {worst:.2e}")
    return worst


if __name__ == "__main__":
    main()
