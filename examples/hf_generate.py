"""Greedy generation with a Hugging Face transformers model and attn_implementation="tileflash".

A random-weight causal LM is built from a config (nothing is downloaded). A batch of prompts of
different lengths, left-padded as ``generate`` expects, is decoded greedily with transformers'
KV cache: the prompt goes through ``tileflash.flash_attn_varlen_func`` (unpadded by transformers),
then every new token attends to the cache through tileflash as well. The same weights are then
switched to ``attn_implementation="eager"`` with ``model.set_attn_implementation`` and decode
again; the script prints both continuations, whether they agree, and the time per new token.

    python examples/hf_generate.py                   # CPU (fp32, tiled path) or CUDA (bf16)
    python examples/hf_generate.py --model gemma2 --new-tokens 32
    python examples/hf_generate.py --device cuda --hidden 1024 --layers 8 --batch 16 --prompt-len 512

In fp32 (CPU) the greedy tokens of tileflash and eager agree exactly; in bf16 two different exact
attention implementations round differently, so a near-tie between two logits can flip a token
and the continuations then diverge from that step on.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import tileflash.integrations.transformers as tileflash_hf


def make_config(kind, hidden, layers, heads, kv_heads, vocab, max_len):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=max_len, initializer_range=0.2, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=16)
    if kind == "qwen2":
        common.pop("head_dim")
        return transformers.Qwen2Config(**common)
    if kind == "gemma2":  # alternating sliding-window / full layers, logit softcap
        return transformers.Gemma2Config(**common, sliding_window=16, attn_logit_softcapping=50.0)
    raise ValueError(f"unknown model kind {kind!r}")


def timed_generate(model, ids, mask, new_tokens, cuda):
    kw = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              pad_token_id=0)
    model.generate(ids, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up (CUDA kernels compile here)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, **kw)
    if cuda:
        torch.cuda.synchronize()
    return out[:, ids.shape[1]:], (time.perf_counter() - start) / new_tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="llama", choices=["llama", "mistral", "qwen2", "gemma2"])
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=24, help="longest prompt; the others are shorter")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU intra-op threads (the tiny default model runs fastest on one; 0 keeps torch's default)")
    args = ap.parse_args(argv)
    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)

    import transformers

    name = tileflash_hf.register()
    torch.manual_seed(args.seed)
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32  # tileflash's GPU kernels take fp16/bf16
    cfg = make_config(args.model, args.hidden, args.layers, args.heads, args.kv_heads, args.vocab,
                      2 * (args.prompt_len + args.new_tokens))
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name)
    model.to(device=args.device, dtype=dtype).eval()

    gen = torch.Generator().manual_seed(args.seed)
    lengths = [max(1, args.prompt_len - (i * args.prompt_len) // (2 * args.batch)) for i in range(args.batch)]
    ids = torch.zeros(args.batch, args.prompt_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):  # left padding
        ids[i, args.prompt_len - n:] = torch.randint(1, args.vocab, (n,), generator=gen)
        mask[i, args.prompt_len - n:] = 1
    ids, mask = ids.to(args.device), mask.to(args.device)

    with torch.no_grad():
        prefill = model(ids, attention_mask=mask).logits
        got, t_tileflash = timed_generate(model, ids, mask, args.new_tokens, cuda)
        model.set_attn_implementation("eager")  # the same weights, transformers' reference attention
        prefill_ref = model(ids, attention_mask=mask).logits
        ref, t_eager = timed_generate(model, ids, mask, args.new_tokens, cuda)

    real = mask.bool()
    diff = (prefill.float() - prefill_ref.float())[real].abs().max().item()
    if dtype != torch.float32:  # how far each bf16 run is from the same model in fp32 (eager)
        with torch.no_grad():
            exact = model.float()(ids, attention_mask=mask).logits
        errs = [(x.float() - exact)[real].abs().max().item() for x in (prefill, prefill_ref)]
    same = (got == ref).all(dim=1)
    print(f"{args.model} on {args.device} ({dtype}), {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
          f"parameters; prompts of {lengths} tokens, left-padded to {args.prompt_len}")
    print(f"prompt logits, max |tileflash - eager| over real tokens: {diff:.2e}")
    if dtype != torch.float32:
        print(f"  against the same model in fp32 (eager): tileflash {dtype} {errs[0]:.2e}, eager {dtype} {errs[1]:.2e}"
              f" (max |logit| {exact[real].abs().max().item():.1f})")
    for i in range(args.batch):
        print(f"  sequence {i}: tileflash {got[i].tolist()}")
        if not same[i]:
            first = int((got[i] != ref[i]).nonzero()[0])
            print(f"              eager     {ref[i].tolist()} (differs from new token {first} on)")
    print(f"greedy tokens identical to eager's for {int(same.sum())} of {args.batch} sequences")
    print(f"time per new token (batch {args.batch}, KV cache): tileflash {t_tileflash * 1e3:.2f} ms, "
          f"eager {t_eager * 1e3:.2f} ms")
    return {"same": same.tolist(), "prefill_diff": diff, "tokens": got, "ref_tokens": ref}


if __name__ == "__main__":
    main()
