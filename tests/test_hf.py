"""Hugging Face transformers backend (tileflash.integrations.transformers): attn_implementation="tileflash".

Tiny random-weight models built from configs (nothing is downloaded), float32 on the CPU. They run
on tileflash's tiled PyTorch path (TRITON_INTERPRET=0, as the conftest's "tiled" backend sets);
one Llama case also runs the Triton kernels in the interpreter where conftest set it up.

Accuracy rule (flash-attn's, applied to whole models): for logits and for the gradient of every
parameter, the max error of the tileflash model against an fp64 eager reference is at most twice
the error of the eager model in the same dtype and batch layout against that reference, plus twice
the rounding of the reference's values in that dtype. The fp64 reference runs every sequence on its
own, unpadded, so padding and packing in the tileflash run must not change any real token's result.
`test_rule_catches_dropped_arguments` shows the rule fails when softcap, the window or the softmax
scale is dropped (or the scale is off by 5%). Greedy generation must give eager's tokens exactly.
A GPU test repeats logits and gradients in bf16 on CUDA.
"""

import copy
import inspect
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tileflash.integrations.transformers as tf_hf  # noqa: E402
from tileflash import interface  # noqa: E402

from helpers import rounding_atol  # noqa: E402

VOCAB = 128
N_LAYERS = 2
MODELS = ["llama", "mistral", "qwen2", "gemma2"]
LAYOUTS = ["unpadded", "left", "right", "packed", "packed_cu"]
# conftest sets TRITON_INTERPRET=1 before any test module is imported where there is no GPU
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
LENGTHS = {"unpadded": [24, 24], "left": [24, 13, 19], "right": [24, 13, 19], "packed": [11, 6, 15],
           "packed_cu": [11, 6, 15]}


@pytest.fixture(autouse=True)
def _tiled_one_thread_registered(monkeypatch):
    """The tiled CPU path (fast), one intra-op thread (these matmuls are tiny: threads only spin, and
    the rounding then does not depend on the machine's core count), and the backend registered."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    assert tf_hf.register() == "tileflash"
    yield
    torch.set_num_threads(threads)


def make_config(kind, **over):
    """A tiny config: hidden 64, 2 layers, 4 query heads / 2 kv heads (GQA) of dim 16. The larger
    initializer range gives attention scores of order 1, so that masks, windows, softcap and the
    scale all change the logits measurably."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  initializer_range=0.2, tie_word_embeddings=False, pad_token_id=0, eos_token_id=None,
                  bos_token_id=None)
    extra = {"llama": dict(head_dim=16),
             "mistral": dict(head_dim=16, sliding_window=8),  # every layer a sliding window of 8 tokens
             "qwen2": {},  # q/k/v biases
             # softcap 1.0; a sliding window (8) on layer 0, full attention on layer 1; scale 1/sqrt(8), not 1/sqrt(16)
             "gemma2": dict(head_dim=16, sliding_window=8, attn_logit_softcapping=1.0, query_pre_attn_scalar=8)}[kind]
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "gemma2": transformers.Gemma2Config}[kind]
    cfg = cls(**{**common, **extra, **over})
    return cfg


def make_models(kind, dtypes=("tileflash", "eager", "eager64"), device="cpu", dtype=torch.float32, **over):
    """Models sharing one set of random weights: "tileflash" and "eager" in `dtype`, "eager64" in
    float64, all on `device`. Each gets its own copy of the config (from_config keeps the config
    object, and the attention implementation is stored on it)."""
    cfg = make_config(kind, **over)
    models = {}
    for name in dtypes:
        impl = "eager" if name.startswith("eager") else name
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        if models:
            m.load_state_dict(next(iter(models.values())).state_dict())
        models[name] = m.to(device=device, dtype=torch.float64 if name == "eager64" else dtype).eval()
    return models


def make_seqs(lengths):
    return [torch.randint(1, VOCAB, (n,)) for n in lengths]


def run_layout(model, seqs, layout):
    """Run `seqs` through `model` batched as `layout`; returns each sequence's logits (n, vocab)."""
    dev = model.device
    if layout == "single":
        return [model(s[None].to(dev), position_ids=torch.arange(len(s), device=dev)[None], use_cache=False).logits[0]
                for s in seqs]
    if layout in ("unpadded", "left", "right"):
        b, n = len(seqs), max(len(s) for s in seqs)
        ids = torch.zeros(b, n, dtype=torch.long)
        mask = torch.zeros(b, n, dtype=torch.long)
        for i, s in enumerate(seqs):
            sl = slice(n - len(s), n) if layout == "left" else slice(0, len(s))
            ids[i, sl], mask[i, sl] = s, 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        kw = dict(attention_mask=mask) if layout != "unpadded" else {}
        logits = model(ids, position_ids=pos, use_cache=False, **kw).logits
        return [logits[i][mask[i].bool()] for i in range(b)]
    if layout == "packed":  # one row, position_ids restarting at 0 (transformers finds the boundaries)
        ids = torch.cat(seqs)[None].to(dev)
        pos = torch.cat([torch.arange(len(s)) for s in seqs])[None].to(dev)
        logits = model(ids, position_ids=pos, use_cache=False).logits[0]
    elif layout == "packed_cu":  # transformers' DataCollatorWithFlattening: cu_seq_lens_* and max_length_*
        batch = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
            [{"input_ids": s.tolist()} for s in seqs])
        batch.pop("labels")
        batch = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}
        logits = model(**batch, use_cache=False).logits[0]
    else:
        raise ValueError(layout)
    return list(logits.split([len(s) for s in seqs]))


def check_rule(name, got, base, ref, factor=2.0):
    """max |got - ref| <= factor * max |base - ref| + rounding_atol(ref) in got's dtype."""
    atol = rounding_atol(ref, got.dtype)
    got, base, ref = (t.detach().cpu().double() for t in (got, base, ref))
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    err = (got - ref).abs().max().item()
    base_err = (base - ref).abs().max().item()
    allowed = factor * base_err + atol
    assert err <= allowed, (f"{name}: max error {err:.3g} > allowed {allowed:.3g} (= {factor} x eager's "
                            f"{base_err:.3g} in the same dtype + atol {atol:.3g}); max |ref| {ref.abs().max():.3g}")


@pytest.fixture
def calls(monkeypatch):
    """Record every call that reaches tileflash's public functions: (name, q's shape, kwargs)."""
    record = []
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        real = getattr(interface, name)

        def counting(q, *args, _real=real, _name=name, **kwargs):
            record.append((_name, tuple(q.shape), kwargs))
            return _real(q, *args, **kwargs)

        monkeypatch.setattr(interface, name, counting)
    return record


def check_logits(models, seqs, layout):
    with torch.no_grad():
        got = run_layout(models["tileflash"], seqs, layout)
        base = run_layout(models["eager"], seqs, layout)
        ref = run_layout(models["eager64"], seqs, "single")
    for i, (g, b, r) in enumerate(zip(got, base, ref)):
        check_rule(f"logits of sequence {i}", g, b, r)


def check_gradients(models, seqs, layout):
    """The gradient of every parameter of sum_i <logits_i, W_i> (fixed random W_i), which weighs every
    real token's logits, against the same loss of the sequences run alone in fp64."""
    weights = [torch.randn(len(s), VOCAB, dtype=torch.float64) for s in seqs]

    def grads(name, lay):
        model = models[name]
        model.zero_grad()
        logits = run_layout(model, seqs, lay)
        sum((x * w.to(x.device, x.dtype)).sum() for x, w in zip(logits, weights)).backward()
        return {n: p.grad for n, p in model.named_parameters()}

    got, base, ref = grads("tileflash", layout), grads("eager", layout), grads("eager64", "single")
    assert got.keys() == ref.keys() and len(got) > 10
    for name in ref:
        assert got[name] is not None, name
        check_rule(f"grad of {name}", got[name], base[name], ref[name])


# -- registration and the model API -------------------------------------------------------------------------------


def test_register_is_idempotent_and_reuses_transformers_wrapper():
    from transformers import masking_utils, modeling_flash_attention_utils as fa_utils
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    resolver = fa_utils._lazy_imports
    assert tf_hf.register() == tf_hf.register() == "tileflash"
    assert fa_utils._lazy_imports is resolver  # not wrapped twice
    assert ALL_ATTENTION_FUNCTIONS["tileflash"] is flash_attention_forward
    assert masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["tileflash"] is masking_utils.flash_attention_mask
    assert "paged|tileflash" in ALL_ATTENTION_FUNCTIONS
    for name in ("tileflash", "paged|tileflash"):
        fns = fa_utils._lazy_imports(name)
        assert fns[:3] == (tf_hf.flash_attn_func, tf_hf.flash_attn_varlen_func, tf_hf.flash_attn_with_kvcache)
    # the varlen signature decides what transformers passes: s_aux must be among it (to be refused, not dropped)
    params = inspect.signature(tf_hf.flash_attn_varlen_func).parameters
    assert {"dropout_p", "window_size", "softcap", "deterministic", "s_aux", "max_seqlen_q"} <= set(params)


def test_register_options_reach_every_call(calls):
    from tileflash import Options

    opts = Options(backend="triton", autotune=False)
    assert tf_hf.register(options=opts) == "tileflash"
    models = make_models("llama", dtypes=("tileflash",))
    with torch.no_grad():
        run_layout(models["tileflash"], make_seqs([8, 5]), "left")
        tf_hf.register()
        run_layout(models["tileflash"], make_seqs([8, 5]), "left")
    assert [c[2]["options"] for c in calls] == [opts] * N_LAYERS + [None] * N_LAYERS
    with pytest.raises(TypeError, match="tileflash.Options"):
        tf_hf.register(options={"backend": "triton"})


def test_other_names_reach_the_original_resolver():
    from transformers import modeling_flash_attention_utils as fa_utils

    original = fa_utils._lazy_imports.__wrapped__
    for name in ("flash_attention_2", "no-such/kernel", "tileflash2"):
        outcomes = []
        for fn in (original, fa_utils._lazy_imports):
            try:
                outcomes.append(("ok", fn(name)[:3]))
            except Exception as e:  # e.g. flash-attn or `kernels` missing here
                outcomes.append((type(e), str(e)))
        assert outcomes[0] == outcomes[1], name


def test_from_config_from_pretrained_and_set_attn_implementation(tmp_path, calls):
    cfg = make_config("llama")
    ids = torch.randint(1, VOCAB, (2, 12))
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="tileflash")
    assert model.config._attn_implementation == "tileflash"
    with torch.no_grad():
        out = model(ids).logits
    assert len(calls) == N_LAYERS and calls[0][0] == "flash_attn_func"

    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="tileflash")
    assert loaded.config._attn_implementation == "tileflash"
    calls.clear()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, out)
    assert len(calls) == N_LAYERS

    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    calls.clear()
    with torch.no_grad():
        ref = eager(ids).logits
    assert not calls
    eager.set_attn_implementation("tileflash")
    assert eager.config._attn_implementation == "tileflash"
    with torch.no_grad():
        assert torch.equal(eager(ids).logits, out)
    assert len(calls) == N_LAYERS
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)


def test_model_without_flash_support_is_refused(monkeypatch):
    monkeypatch.setattr(transformers.LlamaForCausalLM, "_supports_flash_attn", False)
    with pytest.raises(ValueError, match="does not support flash attention"):
        transformers.AutoModelForCausalLM.from_config(make_config("llama"), attn_implementation="tileflash")


def test_register_names_the_version_when_internals_differ(monkeypatch):
    from transformers import modeling_flash_attention_utils as fa_utils

    top = sys.modules["transformers"]  # transformers may swap its lazy top-level module object while loading models
    monkeypatch.setattr(top, "__version__", "4.57.1")
    with pytest.raises(RuntimeError, match=r"transformers 4\.57\.1 differs"):
        tf_hf.register()
    monkeypatch.setattr(top, "__version__", "5.99.0")
    monkeypatch.delattr(fa_utils, "_pad_input")
    with pytest.raises(RuntimeError, match=r"transformers 5\.99\.0 differs: missing .*_pad_input"):
        tf_hf.register()


# -- what transformers passes ---------------------------------------------------------------------------------------


def test_attention_sinks_raise_instead_of_being_dropped():
    from transformers.integrations.flash_attention import flash_attention_forward

    class Attn(torch.nn.Module):  # what flash_attention_forward reads from a model's attention module
        def __init__(self):
            super().__init__()
            self.config = make_config("llama")
            self.config._attn_implementation = "tileflash"
            self.is_causal, self.layer_idx = True, 0
            self.proj = torch.nn.Linear(2, 2)

    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    out, _ = flash_attention_forward(Attn(), q, k, v, None)  # without sinks: fine
    assert out.shape == (1, 8, 4, 16)
    for mask in (None, torch.ones(1, 8, dtype=torch.bool)):
        with pytest.raises(NotImplementedError, match="attention sinks"):
            flash_attention_forward(Attn(), q, k, v, mask, s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="attention sinks"):
        tf_hf.flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2).contiguous(),
                                      v.transpose(1, 2).contiguous(), s_aux=torch.zeros(4))


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_arguments_transformers_passes(kind, calls):
    """window_size, softcap, scale and causal arrive as transformers computes them."""
    models = make_models(kind, dtypes=("tileflash",))
    with torch.no_grad():
        run_layout(models["tileflash"], make_seqs([24, 13]), "left")
    assert [c[0] for c in calls] == ["flash_attn_varlen_func"] * N_LAYERS
    for layer, (_, _, kw) in enumerate(calls):
        windowed = kind == "mistral" or layer == 0
        assert kw["window_size"] == ((7, 7) if windowed else (-1, -1))  # (sliding_window - 1,) * 2; causal
        assert kw["causal"] is True and kw["dropout_p"] == 0.0 and kw["deterministic"] is False
        assert kw["softcap"] == (1.0 if kind == "gemma2" else 0.0)
        assert kw["softmax_scale"] == pytest.approx(8 ** -0.5 if kind == "gemma2" else 16 ** -0.5)


def test_dropout_in_training(calls):
    models = make_models("llama", dtypes=("tileflash",), attention_dropout=0.25)
    model = models["tileflash"]
    ids = torch.randint(1, VOCAB, (2, 16))
    with torch.no_grad():
        clean = model(ids).logits
    assert {c[2]["dropout_p"] for c in calls} == {0.0}
    model.train()
    calls.clear()
    torch.manual_seed(1)
    a = model(ids).logits
    torch.manual_seed(1)
    b = model(ids).logits
    assert {c[2]["dropout_p"] for c in calls} == {0.25}
    assert torch.equal(a, b) and not torch.allclose(a, clean, atol=1e-3)  # seeded, and really dropped
    a.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


# -- logits, gradients, generation against eager ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", MODELS)
def test_logits_match_eager(kind, layout, calls):
    models = make_models(kind)
    check_logits(models, make_seqs(LENGTHS[layout]), layout)
    expected = "flash_attn_func" if layout == "unpadded" else "flash_attn_varlen_func"
    assert [c[0] for c in calls] == [expected] * N_LAYERS, calls
    if layout.startswith("packed"):
        assert calls[0][1][0] == sum(LENGTHS[layout])  # one varlen call over the packed row


@pytest.mark.parametrize("kind,layout",
                         [(k, lay) for k in MODELS for lay in ("left", "packed")] + [("llama", "unpadded")])
def test_gradients_of_every_parameter(kind, layout, calls):
    check_gradients(make_models(kind), make_seqs(LENGTHS[layout]), layout)
    assert len(calls) == N_LAYERS


@pytest.mark.parametrize("kind,padded", [(k, True) for k in MODELS] + [("llama", False)])
def test_greedy_generate_with_kv_cache_matches_eager(kind, padded, calls):
    models = make_models(kind, dtypes=("tileflash", "eager"))
    lengths = [10, 6] if padded else [8, 8]
    b, n, new = len(lengths), max(lengths), 8
    ids = torch.zeros(b, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.long)
    for i, s in enumerate(make_seqs(lengths)):  # left padding, as generation wants
        ids[i, n - len(s):], mask[i, n - len(s):] = s, 1
    kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    out = {name: m.generate(ids, **kw) for name, m in models.items()}
    assert out["tileflash"].shape == (b, n + new)
    assert len(set(out["eager"][:, n:].flatten().tolist())) > new // 2  # a varied continuation, not one token repeated
    assert torch.equal(out["tileflash"], out["eager"]), (out["tileflash"][:, n:], out["eager"][:, n:])
    # one prefill over the prompt, then one call per new token with one query row per sequence (the KV
    # cache): varlen while the mask holds padding, dense (b, 1, ...) once a sliding-window cache has
    # dropped the padded positions or when there is no padding
    assert len(calls) == new * N_LAYERS
    assert calls[0][0] == ("flash_attn_varlen_func" if padded else "flash_attn_func")
    assert calls[0][1][0] == (sum(lengths) if padded else b)
    for name, shape, _ in calls[N_LAYERS:]:
        assert (name, shape[0]) == ("flash_attn_varlen_func", b) or (name, shape[:2]) == ("flash_attn_func", (b, 1))
    if padded and kind in ("llama", "qwen2"):  # full attention keeps the padded positions: varlen to the end
        assert calls[-1][0] == "flash_attn_varlen_func"


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_continuous_batching_matches_eager(kind, calls):
    """generate_batch (continuous batching: a paged cache, prompts and decode steps of several
    requests in one varlen call) gives each request eager's greedy tokens."""
    from transformers import modeling_flash_attention_utils as fa_utils
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    models = make_models(kind, dtypes=("tileflash", "eager"))
    old_wrapper = hasattr(fa_utils, "lazy_import_paged_flash_attention")  # transformers <= 5.17
    if old_wrapper and kind != "llama":
        # that paged wrapper would drop Mistral's window and Gemma-2's softcap: "paged|tileflash" refuses them
        attn = models["tileflash"].model.layers[0].self_attn
        kw = dict(sliding_window=8, softcap=1.0 if kind == "gemma2" else None)
        with pytest.raises(NotImplementedError, match="paged flash wrapper of transformers"):
            ALL_ATTENTION_FUNCTIONS["paged|tileflash"](attn, None, None, None, None, **kw)
        return
    if old_wrapper:  # 5.17 sizes its paged cache with psutil on the CPU, and for the GPU wherever there is one
        pytest.importorskip("psutil")
        if torch.cuda.is_available():
            pytest.skip("transformers <= 5.17's continuous batching of a CPU model fails on a machine with a GPU")
    seqs = [s.tolist() for s in make_seqs([10, 6, 8])]
    new = 6
    gen_cfg = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb_cfg = transformers.ContinuousBatchingConfig(block_size=16, num_blocks=16, max_batch_tokens=64)
    out = models["tileflash"].generate_batch(inputs=seqs, generation_config=gen_cfg, continuous_batching_config=cb_cfg)
    got = sorted((r.prompt_ids, r.generated_tokens) for r in out.values())
    ref = sorted((s, models["eager"].generate(torch.tensor([s]), max_new_tokens=new, min_new_tokens=new,
                                              do_sample=False, pad_token_id=0)[0, len(s):].tolist()) for s in seqs)
    assert got == ref
    assert calls and {c[0] for c in calls} == {"flash_attn_varlen_func"}
    if kind != "llama":
        assert any(c[2]["window_size"] == (7, 7) for c in calls)


def test_paged_decode_branch_uses_flash_attn_with_kvcache(calls):
    """transformers' block-table decode branch of _flash_attention_forward (continuous batching's fast
    path where a version enables it) reaches tileflash.flash_attn_with_kvcache: the new k/v are
    written into the paged cache and each request attends to its cached keys plus the new one."""
    from transformers import modeling_flash_attention_utils as fa_utils

    if "k_cache" not in inspect.signature(fa_utils._flash_attention_forward).parameters:
        pytest.skip("this transformers has no block-table branch in _flash_attention_forward")
    h, hk, d, page, n_pages = 4, 2, 16, 4, 12
    cached = [5, 9, 2]  # tokens already in each request's cache
    n = len(cached)
    k_cache, v_cache = torch.randn(n_pages, page, hk, d), torch.randn(n_pages, page, hk, d)
    block_table = torch.randperm(n_pages)[: n * 3].view(n, 3).int()
    q, k, v = torch.randn(1, n, h, d), torch.randn(1, n, hk, d), torch.randn(1, n, hk, d)
    cu_k = torch.tensor([0] + cached).add(torch.tensor([0, 1, 1, 1])).cumsum(0).int()  # lengths with the new token
    scale, softcap = 0.3, 2.0
    keys = k_cache.clone(), v_cache.clone()
    out = fa_utils._flash_attention_forward(
        q, k, v, None, query_length=n, is_causal=True, softmax_scale=scale, softcap=softcap,
        attn_implementation="tileflash", cu_seq_lens_q=torch.arange(n + 1, dtype=torch.int32), cu_seq_lens_k=cu_k,
        max_length_q=1, max_length_k=max(cached) + 1, block_table=block_table, k_cache=k_cache, v_cache=v_cache)
    assert [c[0] for c in calls] == ["flash_attn_with_kvcache"]
    assert out.shape == (1, n, h, d)
    for b, m in enumerate(cached):
        pos = torch.arange(m + 1)
        rows = block_table[b].long()[pos // page], pos % page
        kb, vb = keys[0][rows].clone(), keys[1][rows].clone()
        kb[m], vb[m] = k[0, b], v[0, b]
        assert torch.equal(k_cache[rows], kb) and torch.equal(v_cache[rows], vb)  # appended in place
        kb, vb = kb.double().repeat_interleave(h // hk, 1), vb.double().repeat_interleave(h // hk, 1)
        s = torch.einsum("hd,nhd->hn", q[0, b].double(), kb) * scale
        ref = torch.einsum("hn,nhd->hd", (softcap * torch.tanh(s / softcap)).softmax(-1), vb)
        torch.testing.assert_close(out[0, b].double(), ref, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_cuda_bf16_logits_and_gradients(kind, calls):
    """On the GPU in bf16 (tileflash's CUDA kernels take fp16/bf16): logits and every gradient of a
    left-padded batch and of a packed row, against eager bf16 / fp64 by the same rule."""
    models = make_models(kind, device="cuda", dtype=torch.bfloat16)
    for layout in ("left", "packed"):
        seqs = make_seqs(LENGTHS[layout])
        check_logits(models, seqs, layout)
        check_gradients(models, seqs, layout)
    assert calls and all(c[1] and c[0] == "flash_attn_varlen_func" for c in calls)


def test_rule_catches_dropped_arguments(monkeypatch):
    """The checks above can fail: dropping softcap, the window or the scale breaks the rule."""
    for kind, arg, off in (("gemma2", "softcap", 0.0), ("mistral", "window_size", (-1, -1)),
                           ("llama", "softmax_scale", None)):
        models = make_models(kind)
        seqs = make_seqs(LENGTHS["left"])
        with monkeypatch.context() as mp:
            real = interface.flash_attn_varlen_func

            def dropping(*args, _real=real, _arg=arg, _off=off, **kwargs):
                kwargs[_arg] = _off if _arg != "softmax_scale" else kwargs[_arg] * 1.05
                return _real(*args, **kwargs)

            mp.setattr(interface, "flash_attn_varlen_func", dropping)
            with pytest.raises(AssertionError, match="max error"):
                check_logits(models, seqs, "left")
        check_logits(models, seqs, "left")  # and passes again once restored


def test_triton_interpreter_case(monkeypatch, calls):
    """One tiny forward through the Triton kernels in the interpreter (skipped where conftest
    compiled them for a GPU)."""
    if not INTERPRETED:
        pytest.skip("Triton kernels were compiled for the GPU (TRITON_INTERPRET unset at import)")
    import tileflash.cpu

    def tiled(*args, **kwargs):
        raise AssertionError("the tiled CPU path ran instead of the interpreter")

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tileflash.cpu, "forward", tiled)
    models = make_models("llama", num_hidden_layers=1)
    check_logits(models, make_seqs([9, 5]), "left")
    assert len(calls) == 1


def _load_example(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_hf_train(calls, capsys):
    res = _load_example("hf_train").main(["--device", "cpu", "--steps", "6", "--model", "gemma2", "--threads", "0"])
    assert abs(res["loss_tileflash"] - res["loss_eager"]) < 1e-5 and res["grad_rel_diff"] < 1e-4
    assert res["losses"][-1] < res["losses"][0]
    assert calls and all(c[0] == "flash_attn_varlen_func" for c in calls)  # packed: varlen only
    assert "tokens/s" in capsys.readouterr().out


def test_example_hf_generate(calls, capsys):
    res = _load_example("hf_generate").main(["--device", "cpu", "--new-tokens", "6", "--model", "mistral",
                                             "--threads", "0"])
    assert all(res["same"]) and res["prefill_diff"] < 1e-4
    assert calls and "ms" in capsys.readouterr().out
