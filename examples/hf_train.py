"""Train a tiny Hugging Face transformers model with attn_implementation="tileflash" (padding-free).

A random-weight causal LM is built from a config (nothing is downloaded) and trained for a few
steps on synthetic data: token strings that follow a fixed random permutation (the next token is
``perm[token]`` with probability 0.9, a uniformly random one otherwise), whose loss floor is the
chain's entropy rate (about 0.8 nats for a vocabulary of 128). Examples of different lengths are
packed into one row without padding by transformers' ``DataCollatorWithFlattening``; transformers'
flash-attention path turns its ``cu_seq_lens_*`` into ``tileflash.flash_attn_varlen_func`` calls,
so no token attends across examples and no compute goes to padding.

Before training, one batch's loss and gradients are compared with the same model under
``attn_implementation="eager"`` (the padded equivalent), and the training loop reports its loss
and throughput.

    python examples/hf_train.py                      # CPU (fp32, tiled path) or CUDA (bf16 autocast)
    python examples/hf_train.py --model gemma2 --steps 40
    python examples/hf_train.py --device cuda --hidden 512 --layers 4 --max-len 512 --batch 32
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch

import tileflash.integrations.transformers as tileflash_hf


def make_config(kind, hidden, layers, heads, kv_heads, vocab, max_len):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=2 * max_len, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=max(8, max_len // 4))
    if kind == "qwen2":
        common.pop("head_dim")
        return transformers.Qwen2Config(**common)
    if kind == "gemma2":
        return transformers.Gemma2Config(**common, sliding_window=max(8, max_len // 4), attn_logit_softcapping=50.0)
    raise ValueError(f"unknown model kind {kind!r}")


def chain_data(n, perm, max_len, gen, p=0.9):
    """n examples of lengths 8..max_len: t[i+1] = perm[t[i]] with probability p, else uniform (token 0 unused)."""
    vocab = perm.numel()
    out = []
    for _ in range(n):
        length = int(torch.randint(8, max_len + 1, (1,), generator=gen))
        t = [int(torch.randint(1, vocab, (1,), generator=gen))]
        for _ in range(length - 1):
            follow = torch.rand((), generator=gen) < p
            t.append(int(perm[t[-1]]) if follow else int(torch.randint(1, vocab, (1,), generator=gen)))
        out.append({"input_ids": t})
    return out


def entropy_floor(vocab, p=0.9):
    """Entropy rate (nats/token) of chain_data's chain: the best achievable loss."""
    r = (1 - p) / (vocab - 1)
    hit = p + r
    return -(hit * torch.tensor(hit).log() + (vocab - 2) * r * torch.tensor(r).log()).item()


def to_device(batch, device):
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}


def compare_with_eager(model, eager, packed, padded, autocast):
    """Loss and gradients of one batch: tileflash (packed, no padding) vs eager (padded)."""
    for m, batch in ((model, packed), (eager, padded)):
        m.zero_grad()
        with autocast():
            loss = m(**batch).loss
        loss.backward()
        m._loss = loss.item()
    worst = max(((p.grad.float() - q.grad.float()).abs().max() / q.grad.float().abs().max().clamp_min(1e-12)).item()
                for p, q in zip(model.parameters(), eager.parameters()) if q.grad is not None)
    model.zero_grad()
    return model._loss, eager._loss, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="llama", choices=["llama", "mistral", "qwen2", "gemma2"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="examples per step (packed into one row)")
    ap.add_argument("--max-len", type=int, default=32, help="longest example (tokens)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-2)
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
    # tileflash's GPU kernels take fp16/bf16: on CUDA keep fp32 weights and run under bf16 autocast
    # (transformers casts q/k/v to the autocast dtype); the CPU runs fp32 throughout.
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    cfg = make_config(args.model, args.hidden, args.layers, args.heads, args.kv_heads, args.vocab, args.max_len)
    # from_config keeps the config object and stores the attention implementation on it: one copy per model
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name)
    eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    model.to(args.device).train()
    eager.to(args.device).train()

    gen = torch.Generator().manual_seed(args.seed)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(args.vocab - 1, generator=gen)])
    pack = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)

    def padded(examples):  # the same examples right-padded, for the eager comparison
        n = max(len(e["input_ids"]) for e in examples)
        ids = torch.zeros(len(examples), n, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(examples):
            ids[i, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
            mask[i, : len(e["input_ids"])] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    examples = chain_data(args.batch, perm, args.max_len, gen)
    tf_loss, eager_loss, worst = compare_with_eager(model, eager, to_device(pack(examples), args.device),
                                                    to_device(padded(examples), args.device), autocast)
    del eager
    print(f"{args.model} on {args.device} ({'bf16 autocast' if cuda else 'fp32'}), "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, attn_implementation={name!r}")
    print(f"first batch: loss tileflash (packed) {tf_loss:.6f} vs eager (padded) {eager_loss:.6f}; "
          f"max relative gradient difference over all parameters {worst:.2e}")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, tokens, start, half = [], 0, None, None
    for step in range(args.steps):
        if step in (1, args.steps // 2):  # the first step (warm-up) is left out of the timing
            if cuda:
                torch.cuda.synchronize()
            if step == 1:
                start, tokens = time.perf_counter(), 0
            else:
                half = (time.perf_counter(), tokens)
        batch = to_device(pack(chain_data(args.batch, perm, args.max_len, gen)), args.device)
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens += batch["input_ids"].numel()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    timed = max(args.steps - 1, 1)
    print(f"trained {args.steps} steps of {args.batch} packed examples: loss {losses[0]:.3f} -> {losses[-1]:.3f} "
          f"(mean of last 5: {sum(losses[-5:]) / len(losses[-5:]):.3f}; the data's floor is "
          f"{entropy_floor(args.vocab):.3f})")
    print(f"{elapsed / timed * 1e3:.1f} ms/step, {tokens / elapsed:,.0f} tokens/s (steps 2..{args.steps})")
    if half is not None and args.steps // 2 > 1:
        t2, n2 = time.perf_counter() - half[0], tokens - half[1]
        print(f"second half alone (steps {args.steps // 2 + 1}..{args.steps}): "
              f"{t2 / (args.steps - args.steps // 2) * 1e3:.1f} ms/step, {n2 / t2:,.0f} tokens/s")
    return {"loss_tileflash": tf_loss, "loss_eager": eager_loss, "grad_rel_diff": worst, "losses": losses}


if __name__ == "__main__":
    main()
