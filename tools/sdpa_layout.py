"""Forward time of tileflash on (b, s, h, d) tensors vs the SDPA drop-in on (b, h, s, d)-contiguous ones."""
import torch, triton, tileflash
from triton.testing import do_bench
torch.manual_seed(0)
for (b, n, h, d, causal) in ((4, 4096, 16, 128, False), (4, 4096, 16, 128, True), (1, 16384, 16, 128, False), (8, 1024, 16, 64, True)):
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    ms_f = do_bench(lambda: tileflash.flash_attn_func(q, k, v, causal=causal), warmup=25, rep=100)
    ms_s = do_bench(lambda: tileflash.scaled_dot_product_attention(qh, kh, vh, is_causal=causal), warmup=25, rep=100)
    ms_t = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal), warmup=25, rep=100)
    a = tileflash.flash_attn_func(q, k, v, causal=causal)
    s = tileflash.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)
    print(f"B={b} N={n} H={h} D={d} causal={causal}: flash_attn_func bshd {ms_f:.3f} ms, tf SDPA drop-in bhsd {ms_s:.3f} ms "
          f"({ms_s / ms_f:.2f}x), torch SDPA bhsd {ms_t:.3f} ms; max |diff| {(a.float() - s.float()).abs().max().item():.2e}")
