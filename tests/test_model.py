"""model.py: the model family from the checkpoint's config, loading (a tokenizer without a pad token,
SmolLM2's conversion under a race), the decoding attention (transformers' SDPA answers), and the batched
forward's fixed-shape padding.

    python -m pytest tests/test_model.py -q
"""
import copy
import json
import shutil
import subprocess
import sys

import pytest
import torch

import data
import losses
from conftest import FIXTURE, ROOT
from model import (GENERATION_ATTENTION, TRAINING_ATTENTION, GraphedForward, Layout, cache_argument, choose_precision,
                   common_prefix_length, full_attention_cache, fuse_rms_norms, fused_rotary, generate, lean_swiglu,
                   load_model, model_family, packable, packed_attention_mask, reserved_cache, smollm2_folder,
                   special_tokens_from_config, to_device, use_generation_attention, use_training_attention)

REFUSAL = "Unfortunately, I cannot answer that."


def cpu_probe(monkeypatch, amx, avx512_bf16, onednn_bf16=True, cap=None):
    """Answer the CPU capability probe as a given machine would (no variable makes a bf16 CPU slow)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)


@pytest.mark.parametrize("amx,avx512_bf16,onednn_bf16,cap,want", [
    (False, False, False, None, "fp32"),                    # AVX2 only (most laptops, many CI runners)
    (False, False, True, None, "fp32"),                     # AVX-512 without BF16: oneDNN emulates bf16
    (False, True, True, None, "bf16"),                      # AVX512-BF16
    (True, True, True, None, "bf16"),                       # AMX
    (True, True, False, None, "fp32"),                      # oneDNN will not use them (torch's own probe)
    (True, True, True, "AVX2", "fp32"),                     # CI's emulation of an AVX2 machine
    (True, True, True, "AVX512_CORE", "fp32"),              # capped below BF16
    (True, True, True, "AVX512_CORE_AMX", "bf16"),
    (True, True, True, "ALL", "bf16"),
    (True, True, True, "avx2_vnni", "fp32"),
    (True, True, True, "AVX10_1_512", "bf16"),               # caps above BF16 whose names do not say so
    (True, True, True, "AVX512_CORE_FP16", "bf16"),
    (True, True, True, "DEFAULT", "bf16"),
])
def test_precision_follows_the_cpu(monkeypatch, amx, avx512_bf16, onednn_bf16, cap, want):
    """--precision auto: bf16 on a CPU only where bf16 matrix products are native and oneDNN may use
    them, else fp32; the reason names what was found. An explicit choice and a GPU are not probed."""
    cpu_probe(monkeypatch, amx, avx512_bf16, onednn_bf16, cap)
    precision, why = choose_precision("auto", "cpu")
    assert precision == want and why.startswith("auto: this CPU has")
    assert ("neither AMX nor AVX512-BF16" in why) == (not amx and not avx512_bf16)
    assert choose_precision("auto", "cuda") == ("bf16", "auto: a GPU")
    for explicit in ("bf16", "fp32"):
        assert choose_precision(explicit, "cpu") == (explicit, "--precision " + explicit)


def test_precision_of_a_run_and_an_evaluation(tiny_model_path, tmp_path, monkeypatch, capsys):
    """train.py's first line says which precision it chose and why, config.json records it, and the
    compute copy has its dtype; evaluate.py loads the model in the chosen dtype and records it. On a
    machine without a GPU (one that has one is hidden: there auto picks bf16 for the GPU)."""
    import evaluate
    import train
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, dtype in ((False, torch.float32), (True, torch.bfloat16)):
        cpu_probe(monkeypatch, amx=native, avx512_bf16=native)
        out = tmp_path / f"run_{native}"
        seen = []
        monkeypatch.setattr(train, "compile_models", lambda mode, spec, compute, ref: seen.append(compute.dtype))
        train.main(["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--out", str(out),
                    "--refusal", REFUSAL, "--print-every", "0", "--max-steps", "1", "--global-batch", "4", "--no-save"])
        first, second = capsys.readouterr().out.splitlines()[:2]
        assert first.startswith(f"precision {'bf16' if native else 'fp32'} (auto: this CPU has "), first
        assert second.startswith(f"plan: {'bf16 compute copy over fp32 masters' if native else 'fp32'}, "), second
        assert json.loads((out / "config.json").read_text())["precision"] == ("bf16" if native else "fp32")
        assert seen == [dtype]
        assert evaluate.lazy_model(tiny_model_path)()[0].dtype == dtype
        assert evaluate.lazy_model(tiny_model_path, "fp32")()[0].dtype == torch.float32


def test_model_family_comes_from_the_config_not_the_path(tmp_path, smollm2_path):
    """The family is read from config.json (model_type, architectures): a Llama saved under a Qwen-like
    name is a Llama; a Qwen2 under any name is a Qwen; Mistral is the "ministral" family; an
    architecture the paper did not tune is "default". No weights are needed to tell."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config
    for name, config, family in (("Qwen2.5-0.5B-Instruct", LlamaConfig(), "llama"),
                                 ("runs/x/final", Qwen2Config(), "qwen"),
                                 ("llama-3-relearned", Qwen2Config(), "qwen"),
                                 ("Llama-lookalike", MistralConfig(), "ministral"),
                                 ("qwen-gpt2", GPT2Config(), "default")):
        folder = tmp_path / name
        config.save_pretrained(folder)
        assert model_family(str(folder)) == family, (name, family)
        assert model_family(config) == family
    assert model_family("smollm2") == model_family("random:tiny") == "llama"   # SmolLM2 is a LlamaForCausalLM
    assert model_family({"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"]}) == "ministral"
    assert model_family({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}) == "qwen"


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path, monkeypatch):
    """A tokenizer converted from SmolLM2's GGUF by some transformers versions has no pad token; the
    random-weight models of bench.py share that tokenizer and must pad with end-of-turn too (data.collate
    cannot pad with None)."""
    folder = tmp_path / "tok"
    shutil.copytree(smollm2_folder(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(folder).pad_token_id is None
    monkeypatch.setattr("model.smollm2_folder", lambda: folder)
    model, tokenizer = load_model("random:tiny")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None
    # No padding_idx, so no embedding row left at zero (with <|im_start|> as pad, the row of the token that
    # starts every sequence was zero, and the 3B's gradients were NaN on an H100).
    assert model.config.pad_token_id is None
    assert model.get_input_embeddings().weight.abs().sum(-1).min() > 0


def test_smollm2_tokenizer_has_the_files_special_tokens():
    """The converted SmolLM2 tokenizer ends a sequence and pads with <|im_end|>, as the GGUF file and the
    converted config say, whatever the transformers version; and the fix-up turns the tokenizer that
    transformers 5.17 converted (end of sequence <|im_start|>, no pad) into that one."""
    from transformers import AutoConfig, AutoTokenizer
    folder = smollm2_folder()
    config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.eos_token_id == config.pad_token_id == end_of_turn
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (config.bos_token_id, end_of_turn, end_of_turn)
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None          # as transformers 5.17 left it
    special_tokens_from_config(tokenizer, config)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")


def test_padding_to_the_stage_shape_leaves_the_loss_unchanged(tiny_model_path):
    """--compile graphs pads every view to the stage's shape (rows, T, K): the longest sequence and answer
    span of the stage, and the micro-batch size in rows (filler rows for the smaller last step of an
    epoch, so that no new graph is compiled); --compile blocks fills the rows only. Padding and filler
    rows leave the loss unchanged; a batch that does not fit is an error, not a crop."""
    model, tokenizer = load_model(tiny_model_path)
    model.set_attn_implementation("eager")
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], FIXTURE, refusal=REFUSAL, seed=0,
                                   context_refusals=True)
    T, K = trainset.longest(("mixed",), True, 20)
    every = [s for epoch in range(20) for view in trainset.views(range(len(trainset)), ("mixed",), True, epoch).values()
             for s in view]
    assert (T, K) == (max(len(s["ids"]) for s in every), max(len(s["targets"]) for s in every))
    seqs = trainset.views(list(range(6)), ("mixed",), True, 0)
    assert max(len(s["ids"]) for view in seqs.values() for s in view) < T     # so padding happens
    summed, shapes = {}, {}
    for fixed in (None, (8, T, K), (8, None, None)):     # 6 real rows; of 8 at the stage's (T, K) or their own
        layout = Layout(tokenizer.pad_token_id, "cpu", fill_rows=fixed and fixed[0],
                        lengths=fixed[1:] if fixed and fixed[1] is not None else None)
        out, logits, ntok = layout.forward(model, seqs, "jensunpp")
        v = out["mixed"]
        assert v["logits"].shape[0] == 6
        summed[fixed] = float((losses.token_logprobs(v["logits"], v["labels"]) * v["weights"]).sum())
        assert ntok == sum(len(s["ids"]) for view in seqs.values() for s in view)
        shapes[fixed] = tuple(logits.shape[:2])
    k_own = max(len(s["targets"]) for view in seqs.values() for s in view)
    assert shapes == {None: (12, k_own + 1), (8, T, K): (16, K + 1), (8, None, None): (16, k_own + 1)}  # 2 views
    assert summed[(8, None, None)] == pytest.approx(summed[None], rel=1e-5)   # --compile blocks: rows filled only
    assert data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=(T, K))["input_ids"].shape == (6, T)
    assert summed[(8, T, K)] == pytest.approx(summed[None], rel=1e-5)
    # lengths rounded up to a multiple of 8 (aligned GEMMs on a GPU): more left padding, the same loss as none
    tight = data.collate(seqs["mixed"], tokenizer.pad_token_id, "jensunpp")
    padded = data.collate(seqs["mixed"], tokenizer.pad_token_id, "jensunpp", multiple=8)
    assert padded["input_ids"].shape[1] % 8 == 0 and tight["input_ids"].shape[1] < padded["input_ids"].shape[1] < tight["input_ids"].shape[1] + 8
    with torch.no_grad():
        logits = model(input_ids=tight["input_ids"], attention_mask=tight["attention_mask"],
                       position_ids=tight["position_ids"], logits_to_keep=tight["labels"].shape[1] + 1).logits
    unpadded = float((losses.token_logprobs(logits[:, :-1].float(), tight["labels"]) * tight["weights"]).sum())
    assert summed[None] == pytest.approx(unpadded, rel=1e-5)        # Layout.forward pads to a multiple of 8
    with pytest.raises(ValueError, match="does not fit the fixed shape"):
        data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=(T, 2))


@pytest.mark.parametrize("attention", ["eager", TRAINING_ATTENTION])
def test_packed_rows_give_left_paddings_outputs(tiny_model_path, monkeypatch, attention):
    """Layout(pack=...).forward packs the views' sequences into fewer rows and returns what left padding
    (eager attention) returns: the logits at the kept positions, a hooked layer's hidden states at the
    answers, labels and weights (fp32, the tiny model), with eager attention and with training's SDPA on
    packed rows; with a compiled model's shape it fills no rows but keeps two."""
    model, tokenizer = load_model(tiny_model_path)
    model.set_attn_implementation("eager")
    packed_model = copy.deepcopy(model)
    if attention == TRAINING_ATTENTION:
        use_training_attention(packed_model)
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], FIXTURE, refusal=REFUSAL, seed=0,
                                   context_refusals=True)
    seqs = trainset.views(list(range(8)), ("mixed",), True, 0)
    layer = model.get_decoder().layers[3]
    rows = []
    with torch.no_grad():
        padded, padded_logits, n_padded = Layout(tokenizer.pad_token_id, "cpu").forward(model, seqs, "jensunpp", layer)
        packed_layer = packed_model.get_decoder().layers[3]
        packed, packed_logits, n_packed = Layout(tokenizer.pad_token_id, "cpu", pack=torch.float32).forward(
            packed_model, seqs, "jensunpp", packed_layer)
        pack = data.pack
        monkeypatch.setattr(data, "pack", lambda *a, **k: rows.append(k.get("min_rows")) or pack(*a, **k))
        filled, _, _ = Layout(tokenizer.pad_token_id, "cpu", pack=torch.float32, fill_rows=8).forward(
            packed_model, seqs, "jensunpp", packed_layer)
        monkeypatch.undo()
    assert n_packed == n_padded and packed_logits.shape == padded_logits.shape
    packed_rows = data.pack([s for v in seqs.values() for s in v], tokenizer.pad_token_id, "jensunpp", multiple=8)
    assert packed_rows["input_ids"].shape[0] < 16                          # 16 sequences in fewer rows
    assert rows == [2]
    for view in seqs:
        supervised = padded[view]["labels"] != -100
        for out in (packed, filled):
            assert torch.equal(out[view]["labels"], padded[view]["labels"])
            assert torch.allclose(out[view]["logits"][supervised], padded[view]["logits"][supervised], atol=1e-5)
            assert torch.allclose(out[view]["own_logits"][supervised], padded[view]["own_logits"][supervised], atol=1e-5)
            assert torch.allclose(out[view]["hidden"][supervised], padded[view]["hidden"][supervised], atol=1e-5)


class OffsetRMSNorm(torch.nn.Module):
    """The other RMSNorm form (Qwen3.5, Gemma): x / rms(x) * (1 + weight), computed in fp32."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(torch.zeros(size)), eps

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (y * (1.0 + self.weight.float())).type_as(x)


class ScaledRMSNorm(OffsetRMSNorm):
    """A norm whose forward reads more than weight and eps (the check must not fail on it)."""

    def __init__(self, size):
        super().__init__(size)
        self.scale = 2.0

    def forward(self, x):
        return super().forward(x) * self.scale


class GeluMLP(torch.nn.Module):
    """An MLP of the gate/up/down shape whose activation is not SiLU: lean_swiglu must leave it alone."""
    def __init__(self, d=8, i=16):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(d, i, bias=False), torch.nn.Linear(d, i, bias=False)
        self.down_proj, self.act_fn = torch.nn.Linear(i, d, bias=False), torch.nn.GELU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_lean_swiglu_keeps_two_intermediates_less_with_the_same_gradients(tiny_model_path):
    """lean_swiglu switches every SwiGLU MLP (one a block) and no other MLP; in fp32 the logits are
    transformers' own and the gradients agree to 1e-6; what forward keeps for backward (each storage once)
    is smaller by exactly two intermediate-size tensors per block."""
    model, _ = load_model(tiny_model_path)
    lean = copy.deepcopy(model)
    assert lean_swiglu(lean) == model.config.num_hidden_layers
    assert lean_swiglu(GeluMLP()) == 0
    ids = torch.randint(0, 1000, (3, 20), generator=torch.Generator().manual_seed(0))
    outputs = []
    for m in (model, lean):
        m.zero_grad()
        storages, params = {}, {p.untyped_storage().data_ptr() for p in m.parameters()}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = m(input_ids=ids).logits
        logits.float().pow(2).mean().backward()
        outputs.append((logits.detach(), [p.grad.clone() for p in m.parameters()], sum(storages.values())))
    (want, want_grads, want_saved), (got, got_grads, got_saved) = outputs
    assert torch.equal(got, want)
    for a, b in zip(got_grads, want_grads):
        assert (a - b).norm() <= 1e-6 * b.norm() + 1e-12
    blocks, inter = model.config.num_hidden_layers, model.config.intermediate_size
    assert want_saved - got_saved == blocks * 2 * 3 * 20 * inter * 4


def test_fused_rms_norms_compute_transformers_norms(tiny_model_path):
    """fuse_rms_norms switches every norm of the weight * x / rms(x) form (two a block and the final one)
    and leaves other forms alone; in fp32 the logits and every gradient are transformers' own, and in
    bf16 the logits stay within bf16 rounding of them (one rounding less)."""
    model, _ = load_model(tiny_model_path)
    fused = copy.deepcopy(model)
    assert fuse_rms_norms(fused) == 2 * model.config.num_hidden_layers + 1
    offset = torch.nn.Sequential(OffsetRMSNorm(8), ScaledRMSNorm(8))
    assert fuse_rms_norms(offset) == 0 and all("forward" not in vars(m) for m in offset)
    ids = torch.randint(0, 1000, (3, 20), generator=torch.Generator().manual_seed(0))
    outputs = []
    for m in (model, fused):
        m.zero_grad()
        logits = m(input_ids=ids).logits
        logits.float().pow(2).mean().backward()
        outputs.append((logits.detach(), [p.grad.clone() for p in m.parameters()]))
    (want, want_grads), (got, got_grads) = outputs
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        assert (a - b).norm() <= 1e-5 * b.norm() + 1e-12
    with torch.no_grad():
        half = copy.deepcopy(model).to(torch.bfloat16)(input_ids=ids).logits.float()
        fused_half = copy.deepcopy(fused).to(torch.bfloat16)(input_ids=ids).logits.float()
    assert fused_half.shape == half.shape and torch.isfinite(fused_half).all()
    assert (fused_half - want).abs().max() <= 4 * (half - want).abs().max() + 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel choice is CUDA's")
def test_training_attention_runs_the_memory_efficient_kernel_on_the_gpu(tiny_model_path):
    """On packed bf16 rows training's attention runs SDPA's memory-efficient kernel forward and backward
    (not cuDNN, which plans per shape, nor the math fallback), with eager attention's logits and finite
    gradients."""
    model, tokenizer = load_model(tiny_model_path, torch.bfloat16, "cuda")
    model.set_attn_implementation("eager")
    sdpa = use_training_attention(copy.deepcopy(model))
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], FIXTURE, refusal=REFUSAL, seed=0)
    seqs = trainset.views(list(range(8)), ("mixed",), True, 0)
    eager, _, _ = Layout(tokenizer.pad_token_id, "cuda", pack=torch.bfloat16).forward(model, seqs, "jensunpp")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, logits, _ = Layout(tokenizer.pad_token_id, "cuda", pack=torch.bfloat16).forward(sdpa, seqs, "jensunpp")
        logits.float().pow(2).mean().backward()
        torch.cuda.synchronize()
    kernels = " ".join(e.name.lower() for e in prof.events())
    assert "fmha" in kernels or "efficient" in kernels, kernels[:2000]
    assert "cudnn" not in kernels
    assert all(torch.isfinite(p.grad).all() for p in sdpa.parameters() if p.grad is not None)
    for view in seqs:
        supervised = eager[view]["labels"] != -100
        assert torch.allclose(out[view]["logits"][supervised].float(), eager[view]["logits"][supervised].float(),
                              atol=5e-2, rtol=5e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_graphed_frozen_model_gives_the_eager_logits(tiny_model_path):
    """GraphedForward on the frozen model's packed passes (SDPA, fused norms and the rotary kernel, as in
    training): a shape runs eagerly when first seen, is captured when seen again and replayed after that,
    each time with the eager pass's logits for that call's own tokens (a replay reads fresh inputs), as a
    copy that later replays leave alone. Past max_graphs a new shape runs eagerly. The kept positions,
    rounded up for the graphs, are cut back: the logits are those of a pass at the batch's own K, up to
    the head's rounding at another shape."""
    model, tokenizer = load_model(tiny_model_path, torch.bfloat16, "cuda")
    use_training_attention(model)
    fuse_rms_norms(model)
    model.eval().requires_grad_(False)
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], FIXTURE, refusal=REFUSAL, seed=0)

    def shifted(seqs, by):      # the same lengths (so the same shapes), other tokens
        return {v: [{**s, "ids": [(t + by) % 1000 for t in s["ids"]]} for s in ss] for v, ss in seqs.items()}
    a, b = trainset.views(list(range(8)), ("mixed",), True, 0), trainset.views(list(range(4)), ("mixed",), True, 0)
    batches = [a, shifted(a, 1), shifted(a, 2), b, shifted(b, 3), shifted(a, 4)]
    graphs, calls = GraphedForward(max_graphs=1), []
    pad = tokenizer.pad_token_id
    with fused_rotary(model), torch.no_grad():
        for seqs in batches:
            calls.append((seqs, Layout(pad, "cuda", pack=torch.bfloat16, graphs=graphs).forward(model, seqs, "jensunpp")[0]))
        for i, (seqs, got) in enumerate(calls):                 # compared after all the replays
            same_shapes = Layout(pad, "cuda", pack=torch.bfloat16, graphs=GraphedForward(max_graphs=0)).forward(
                model, seqs, "jensunpp")[0]                                        # eager, K rounded up
            own_k = Layout(pad, "cuda", pack=torch.bfloat16).forward(model, seqs, "jensunpp")[0]
            for view in seqs:
                assert got[view]["logits"].dtype == torch.float32
                assert torch.equal(got[view]["logits"], same_shapes[view]["logits"]), (i, view)
                for key in ("labels", "weights", "answer_mask"):
                    assert torch.equal(got[view][key], own_k[view][key]), (i, view, key)
                assert torch.allclose(got[view]["logits"], own_k[view]["logits"], rtol=1e-2, atol=1e-2), (i, view)
    # a: eager, captured, replayed; b: eager, and eager again (max_graphs reached); a: replayed
    assert graphs.failed is None and (graphs.captures, graphs.replays, len(graphs.graphs)) == (1, 2, 1)
    with pytest.raises(ValueError, match="hidden states"):
        Layout(pad, "cuda", pack=torch.bfloat16, graphs=graphs).forward(model, a, "uniform", model.model.layers[0])


def test_fused_rotary_replaces_only_the_rotate_half_form_and_puts_it_back(tiny_model_path):
    """fused_rotary swaps the Llama modeling module's apply_rotary_pos_emb for the block and restores it;
    on the CPU the swapped function is transformers' own (the kernel is CUDA's); a partial rotary dimension
    is not the form it fuses."""
    import transformers.models.llama.modeling_llama as llama
    model, _ = load_model(tiny_model_path)
    original = llama.apply_rotary_pos_emb
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with fused_rotary(model) as patched:
            assert patched == 1 and llama.apply_rotary_pos_emb is not original
            assert torch.equal(model(input_ids=ids).logits, want)
    assert llama.apply_rotary_pos_emb is original

    def partial_rotary(q, k, cos, sin):       # rotates the first half of each head only
        half = q.shape[-1] // 2
        q1, k1 = original(q[..., :half], k[..., :half], cos[..., :half], sin[..., :half])
        return torch.cat((q1, q[..., half:]), -1), torch.cat((k1, k[..., half:]), -1)
    try:
        llama.apply_rotary_pos_emb = partial_rotary
        with fused_rotary(model) as patched:
            assert patched == 0 and llama.apply_rotary_pos_emb is partial_rotary
    finally:
        llama.apply_rotary_pos_emb = original


def test_packed_attention_mask_keeps_sequences_apart():
    """A position sees the earlier positions of its own sequence only; padding sees itself (no empty
    softmax row); the mask is additive in the compute dtype."""
    segments = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, -1, -1]])
    mask = packed_attention_mask(segments, torch.bfloat16)
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bfloat16
    seen = mask[:, 0] == 0
    assert seen[0, 4].tolist() == [False, False, False, True, True, False]      # second sequence, its 2nd token
    assert seen[0, 2].tolist() == [True, True, True, False, False, False]
    assert seen[0, 5].tolist() == [False] * 5 + [True]                          # padding: itself only
    assert seen.any(-1).all()
    assert (mask[:, 0][~seen] == torch.finfo(torch.bfloat16).min).all()


def test_packing_only_where_every_layer_is_full_attention():
    """model.packable: Llama (no layer types, no window) packs; a config with linear-attention layers
    (Qwen3.5's Gated DeltaNet) or a sliding window in use does not; to_device leaves CPU tensors as they are."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config
    assert packable(LlamaConfig(num_hidden_layers=2))
    qwen = Qwen2Config(num_hidden_layers=2)
    assert packable(qwen)
    qwen.layer_types = ["linear_attention", "full_attention"]
    assert not packable(qwen)
    assert not packable(MistralConfig(num_hidden_layers=2, sliding_window=4096))
    assert packable(MistralConfig(num_hidden_layers=2, sliding_window=None))
    x = torch.arange(3)
    assert to_device(x, "cpu") is x


def test_conversion_is_safe_when_two_processes_race(tmp_path):
    """Two processes making the same folder at once (parallel blocks converting SmolLM2 at its first use):
    both write their copy before either renames it (a real race, by a barrier), both succeed with the
    same complete folder, and no temporary folder is left behind. model.smollm2_folder saves through
    save_atomically; the conversion itself (38 s of GGUF parsing here) runs once, in conftest's fixture."""
    code = """import sys, time, model
from pathlib import Path
folder, barrier, me = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def write(tmp):
    (tmp / "config.json").write_text(me)
    (barrier / me).touch()
    deadline = time.time() + 60
    while len(list(barrier.iterdir())) < 2 and time.time() < deadline:
        time.sleep(0.01)
print(model.save_atomically(folder, write))"""
    folder, barrier = tmp_path / "cache" / "smollm2-135m-instruct-v2", tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(folder), str(barrier), me], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in ("a", "b")]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert sorted(p.name for p in barrier.iterdir()) == ["a", "b"]                   # both wrote: a real race
    assert {out.strip().split("\n")[-1] for out, _ in results} == {str(folder)}
    assert (folder / "config.json").read_text() in ("a", "b")                        # one whole copy won
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_generation_is_plain_greedy_whatever_the_checkpoint_asks(tiny_model_path):
    """A checkpoint whose generation_config asks for penalties (Qwen2.5-Instruct ships repetition_penalty 1.05)
    answers as one without them: the same greedy decoding for every model. The penalties do change this
    model's answers (it repeats itself), so the test sees them."""
    model, tok = load_model(tiny_model_path)
    prompts = [data.prompt_ids(tok, q) for q in ["What is 2+2?", "Name a colour of the sky."]]
    plain = generate(model, tok, prompts, 12, 2)
    model.generation_config.repetition_penalty, model.generation_config.no_repeat_ngram_size = 1.5, 2
    penalised = [tok.decode(o[len(p):], skip_special_tokens=True).strip() for p, o in zip(prompts, (
        model.generate(input_ids=torch.tensor([p]), max_new_tokens=12, do_sample=False)[0] for p in prompts))]
    assert penalised != plain
    assert generate(model, tok, prompts, 12, 2) == plain


def test_shared_prefix_prefilled_once_answers_as_left_padding(smollm2_path):
    """generate prefills the prefix a batch's prompts share once (dynamic cache), the rest of each prompt
    after the padding: on a real model (fp32) the greedy answers of the paper-format prompts, with and
    without in-context examples, are those of plain left padding, in one batch and in two."""
    import evaluate
    model, tok = load_model(smollm2_path)
    queries = evaluate.build_queries("challenger_disaster", FIXTURE)
    picked = [q for q in queries if q["format"] == "context"][:3] + [q for q in queries if q["set"] == "retain"][:3]
    prompts = [evaluate.query_prompt_ids(tok, q, "paper", None) for q in picked]
    assert common_prefix_length(prompts) > 60 and common_prefix_length(prompts[3:]) > common_prefix_length(prompts)
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2 and common_prefix_length([[4, 2], [1, 2]]) == 0
    for batch_size in (6, 3):
        shared = generate(model, tok, prompts, 16, batch_size)
        assert shared == generate(model, tok, prompts, 16, batch_size, share_prefix=False)
    assert sum(bool(a) for a in shared) >= 4          # real answers (SmolLM2 answers two retain questions with nothing)


def test_reserved_cache_holds_what_a_full_forward_computes():
    """reserved_cache: a (1, P) prefix prefilled once for 2 rows, then a 2-token chunk and single tokens,
    the last ones past the reserved capacity (where it concatenates), give the logits of one forward over
    the whole rows; a sliding-window model keeps transformers' own layers for those (fp32, tiny models)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    for config in (LlamaConfig(**shape), MistralConfig(**shape, sliding_window=5)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        ids = torch.randint(0, 64, (2, 10))
        ids[1, :4] = ids[0, :4]                                           # the shared prefix
        with torch.no_grad():
            full = model(input_ids=ids).logits
            cache = reserved_cache(model, rows=2, capacity=8, prefix_ids=ids[:1, :4])
            reserved = [type(layer).__name__ == "ReservedLayer" for layer in cache.layers]
            assert reserved == [config.model_type == "llama"] * 2
            assert full_attention_cache(model) == (config.model_type == "llama")   # generate shares no prefix with windows
            for a, b in ((4, 6), (6, 7), (7, 8), (8, 9), (9, 10)):       # 8 tokens reserved: the last two concatenate
                step = model(input_ids=ids[:, a:b], use_cache=True, **{cache_argument(model): cache}).logits
                torch.testing.assert_close(step, full[:, a:b], rtol=1e-5, atol=1e-5)
        assert cache.get_seq_length() == 10


def test_generation_attention_answers_as_sdpa(smollm2_path):
    """load_model gives SDPA models the decoding attention; a real model's greedy answers are those of
    transformers' SDPA, with the dynamic and the static cache (fp32, left-padded batches)."""
    model, tok = load_model(smollm2_path)
    assert model.config._attn_implementation == GENERATION_ATTENTION and model.config.num_key_value_heads < model.config.num_attention_heads
    prompts = [data.prompt_ids(tok, q) for q in ["What is the capital of France?", "Hi",
                                                  "Name three colours of the rainbow, one after the other.",
                                                  "Who wrote the play Romeo and Juliet?", "What is 2+2?"]]
    ours = {cache: generate(model, tok, prompts, 16, 4, cache=cache) for cache in (None, "static")}
    use_generation_attention(model, "sdpa")
    theirs = {cache: generate(model, tok, prompts, 16, 4, cache=cache) for cache in (None, "static")}
    assert ours == theirs
    assert sum(bool(a) for a in ours[None]) >= 4         # real answers, not empty strings
