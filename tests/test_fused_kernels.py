"""fused_kernels.py: each Triton kernel equals its torch reference (and transformers' own computation), on the
GPU, and the decoding kernel also on the CPU under Triton's interpreter where Triton >= 3.9 is installed.

    python -m pytest tests/test_fused_kernels.py -q
"""
import contextlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fused_kernels import rotate_half_rope
from model import fused_rotary, gqa_decode_attention, load_model


@pytest.mark.parametrize("compiling", [False, True])
def test_decoding_attention_equals_transformers_sdpa(monkeypatch, compiling):
    """One query token of a grouped-query model, left padding masked: the same output as transformers'
    SDPA (which repeats the keys and values per query head), on both paths (eager matmuls; SDPA when
    compiled), with a boolean, an additive, no and a per-head mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    module = torch.nn.Module().eval()
    module.num_key_value_groups, module.is_causal = 3, True
    g = torch.Generator().manual_seed(0)
    B, kv, L, d = 4, 2, 9, 8
    query, key, value = (torch.randn(B, n, t, d, generator=g) for n, t in ((kv * 3, 1), (kv, L), (kv, L)))
    keep = torch.ones(B, 1, 1, L, dtype=torch.bool)
    keep[0, ..., :5] = False                             # left padding of two rows
    keep[2, ..., :1] = False
    additive = torch.zeros(B, 1, 1, L).masked_fill(~keep, torch.finfo(torch.float32).min)
    for mask in (keep, additive, None, keep.expand(B, kv * 3, 1, L)):      # the last, per head, goes to transformers' own
        ours, _ = gqa_decode_attention(module, query, key, value, mask, scaling=d ** -0.5)
        theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=d ** -0.5)
        assert ours.shape == theirs.shape == (B, 1, kv * 3, d)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def check_decode_kernel(device, dtypes):
    """fused_kernels.decode_attention (Triton) against transformers' SDPA in fp32, on `device`: left padding, a
    static cache's unfilled end, a row whose first blocks are all padding (skipped), no mask, a mask
    broadcast over the rows, and keys and values viewed out of larger buffers (the reserved cache)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from fused_kernels import decode_attention
    g = torch.Generator().manual_seed(0)
    for B, kv, group, L, d in ((5, 2, 3, 150, 64), (3, 2, 4, 64, 128)):
        module = torch.nn.Module().eval()
        module.num_key_value_groups, module.is_causal = group, True
        query = torch.randn(B, kv * group, 1, d, generator=g)
        key, value = (torch.randn(B, kv, L + 20, d, generator=g)[:, :, :L] for _ in range(2))
        keep = torch.ones(B, L, dtype=torch.bool)
        keep[0, :L // 2], keep[1, L - 40:], keep[2, :min(130, L - 1)] = False, False, False
        for mask in (keep, None, keep[-1:].expand(B, L)):
            theirs, _ = sdpa_attention_forward(module, query, key, value, None if mask is None else mask[:, None, None],
                                               scaling=d ** -0.5)
            for dtype in dtypes:
                q, k, v = (t.to(device, dtype) for t in (query, key, value))
                ours = decode_attention(q.reshape(B, kv, group, d), k, v, None if mask is None else mask.to(device),
                                        d ** -0.5)
                assert ours.shape == (B, kv, group, d) and ours.dtype == dtype
                tolerance = 1e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(ours.reshape(B, 1, kv * group, d).float().cpu(), theirs,
                                           rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the decoding kernel runs on a GPU (CPU: next test)")
def test_decoding_kernel_equals_sdpa_on_the_gpu():
    check_decode_kernel("cuda", (torch.float32, torch.bfloat16))


def triton_version():
    """(major, minor) of the installed Triton, None without it (not imported: TRITON_INTERPRET acts at import)."""
    return tuple(int(x) for x in importlib.metadata.version("triton").split(".")[:2]) if importlib.util.find_spec("triton") else None


@pytest.mark.skipif(torch.cuda.is_available() or (triton_version() or (0,)) < (3, 9),
                    reason="needs a CPU machine with Triton >= 3.9 (a GPU runs the test above; 3.6's interpreter "
                    "fails on the kernel's runtime loop bound)")
def test_decoding_kernel_equals_sdpa_in_tritons_interpreter():
    """The same checks on the CPU under Triton's interpreter (fp32: it miscomputes bf16), in a fresh
    process since TRITON_INTERPRET is read when the kernel is defined."""
    code = "import test_fused_kernels; test_fused_kernels.check_decode_kernel('cpu', (torch.float32,))"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT),
                                                                        os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", "import torch; " + code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the rotary kernel runs on a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotary_kernel_equals_transformers_on_the_gpu(tiny_model_path, dtype):
    """The Triton rotary kernel on odd shapes (37 positions, heads of 64 and 128, cos and sin broadcast over
    rows): its forward and gradient are rotate_half_rope's in fp32 rounded once (within one bf16 step),
    and transformers' torch ops' (fp32: to 1e-5; bf16, which rounds each product: to 1% of the norm); then
    a model's logits and gradients."""
    import transformers.models.llama.modeling_llama as llama
    close = lambda a, b, rel: (a.float() - b.float()).norm() <= rel * b.float().norm()
    rel = 1e-5 if dtype == torch.float32 else 1e-2
    one_step = dict(rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    g = torch.Generator(device="cuda").manual_seed(0)
    attention = torch.nn.Sequential(llama.LlamaAttention(llama.LlamaConfig(hidden_size=64, num_attention_heads=2), 0))
    for d, rows in ((64, 3), (128, 1)):
        q = torch.randn(3, 37, 4, d, device="cuda", generator=g).to(dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(3, 2, 37, d, device="cuda", generator=g).to(dtype).requires_grad_()
        cos, sin = (torch.randn(rows, 37, d, device="cuda", generator=g).to(dtype) for _ in range(2))
        outs = []
        for fused in (False, True):
            with fused_rotary(attention) if fused else contextlib.nullcontext():
                q_out, k_out = llama.apply_rotary_pos_emb(q, k, cos, sin)
            (q_out.float().pow(2).sum() + 3 * k_out.float().sum()).backward()
            outs.append((q_out.detach(), k_out.detach(), q.grad.clone(), k.grad.clone()))
            q.grad = k.grad = None
        (q_want, k_want, *grads_want), (q_out, k_out, q_grad, k_grad) = outs
        assert torch.allclose(q_out.float(), rotate_half_rope(q.detach(), cos, sin).float(), **one_step)
        assert torch.allclose(k_out.float(), rotate_half_rope(k.detach(), cos, sin).float(), **one_step)
        assert torch.allclose(q_grad.float(), rotate_half_rope((2 * q_out.float()).to(dtype), cos, sin, True).float(), **one_step)
        assert torch.allclose(k_grad.float(), rotate_half_rope(torch.full_like(k_out, 3), cos, sin, True).float(), **one_step)
        for got, want in zip((q_out, k_out, q_grad, k_grad), (q_want, k_want, *grads_want)):
            assert close(got, want, rel)
    model, _ = load_model(tiny_model_path, dtype, "cuda")
    ids = torch.randint(0, 1000, (2, 40), device="cuda", generator=g)
    outs = []
    for fused in (False, True):
        model.zero_grad()
        with fused_rotary(model) if fused else contextlib.nullcontext():
            logits = model(input_ids=ids).logits
        logits.float().pow(2).mean().backward()
        outs.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    assert close(outs[1][0], outs[0][0], rel)
    for a, b in zip(outs[1][1], outs[0][1]):
        assert close(a, b, 10 * rel)
