"""Triton kernels, each beside the torch function it must equal (its reference), and the test that checks
it (tests/test_fused_kernels.py). model.py decides where each runs: the decoding attention in generation
(model.gqa_decode_attention), the rotary embedding in training (model.fused_rotary); elsewhere (the CPU, a
compiled graph, another layout) the reference or transformers' own code runs.
"""
import torch

try:                  # comes with torch's CUDA builds; without it the torch references run
    import triton
    import triton.language as tl
except ImportError:
    triton = None


# ----------------------------------------------------------------------------------------------
# Grouped-query attention of one decoding step

def decode_attention_reference(query, key, value, mask, scale, dropout=0.0, training=False):
    """The torch version of decode_attention: query (B, kv heads, group, d), key and value (B, kv heads, L, d),
    mask (B, 1, 1, L) bool (True = attend) or additive, or None; (B, kv heads, group, d) out. Two matmuls and
    a softmax in fp32, as transformers' eager attention (on the CPU the faster path; BENCHMARKS.md at 2b7c545
    measured it the faster only on an H100, eager, before the Triton kernel)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights, value)

if triton is not None:
    @triton.jit
    def _decode_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, scale, length,
                       q_b, q_h, q_g, k_b, k_h, k_n, v_b, v_h, v_n, m_b, m_n, o_b, o_h, o_g,
                       GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                       MASKED: tl.constexpr, PRECISION: tl.constexpr):
        """One (row, key/value head): its GROUP query heads against the cache, BLOCK keys at a time, with
        an online softmax in fp32 (flash attention's recurrence); blocks with no key to attend to (left
        padding, a static cache's unfilled end) are not read."""
        b, h = tl.program_id(0), tl.program_id(1)
        g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
        q = tl.load(q_ptr + b * q_b + h * q_h + g[:, None] * q_g + d[None, :], mask=g[:, None] < GROUP, other=0.0)
        top = tl.full([GROUP_PAD], float("-inf"), tl.float32)        # running max of the scores
        total = tl.zeros([GROUP_PAD], tl.float32)                     # running sum of exp(score - top)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for start in range(0, length, BLOCK):
            n = start + tl.arange(0, BLOCK)
            keep = n < length
            if MASKED:
                keep = keep & (tl.load(mask_ptr + b * m_b + n * m_n, mask=keep, other=0) != 0)
            if tl.max(keep.to(tl.int32), axis=0) > 0:
                k = tl.load(k_ptr + b * k_b + h * k_h + n[:, None] * k_n + d[None, :], mask=keep[:, None], other=0.0)
                s = (tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale).to(tl.float32)   # compiled: scale is fp64
                s = tl.where(keep[None, :], s, float("-inf"))
                new_top = tl.maximum(top, tl.max(s, axis=1))
                p = tl.exp(s - new_top[:, None])
                rescale = tl.exp(top - new_top)
                total = total * rescale + tl.sum(p, axis=1)
                v = tl.load(v_ptr + b * v_b + h * v_h + n[:, None] * v_n + d[None, :], mask=keep[:, None], other=0.0)
                acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]           # a row with nothing to attend to: zeros
        tl.store(out_ptr + b * o_b + h * o_h + g[:, None] * o_g + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=g[:, None] < GROUP)

    @torch.library.triton_op("suite::decode_attention", mutates_args=())
    def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                         scale: float) -> torch.Tensor:
        """Grouped-query attention of one decoding step: query (B, kv heads, group, d), key and value
        (B, kv heads, L, d), mask (B, L) bool (True = attend) or None; (B, kv heads, group, d) out. Each
        program reads one key/value head of one row once, for its whole group (a Triton kernel; a torch op,
        so that torch.compile keeps it in the static cache's decoding step). 128 keys and 2 warps per block:
        the fastest of 32-128 keys and 2-8 warps on an H100 (BENCHMARKS.md at 2b7c545 records only 64 keys
        and 4 warps: 15-22% slower)."""
        B, H, G, d = query.shape
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
        m_b, m_n = mask.stride() if mask is not None else (0, 0)
        kernel = _decode_kernel      # Triton's interpreter (TRITON_INTERPRET=1, tests) makes no JITFunction
        if isinstance(kernel, triton.runtime.JITFunction):
            kernel = torch.library.wrap_triton(kernel)
        kernel[(B, H)](query, key, value, query if mask is None else mask, out, scale, key.shape[2],
                       *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], m_b, m_n, *out.stride()[:3],
                       GROUP=G, GROUP_PAD=max(16, triton.next_power_of_2(G)), D=d, BLOCK=128, MASKED=mask is not None,
                       PRECISION="ieee" if query.dtype == torch.float32 else "tf32", num_warps=2)
        return out

# ----------------------------------------------------------------------------------------------
# Rotary position embedding (training)

def rotate_half_rope(x, cos, sin, backward=False):
    """Rotary position embedding in transformers' rotate-half form, x * cos + rotate_half(x) * sin (x (B, H, T, d),
    cos and sin (B, T, d)), in plain torch; backward=True applies its transpose (the gradient with respect
    to x). The reference of the Triton kernel below (fused_rope)."""
    c, s = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    x1, x2 = x.float().chunk(2, dim=-1)
    c1, c2 = c.chunk(2, dim=-1)
    s1, s2 = s.chunk(2, dim=-1)
    if backward:
        out = torch.cat((x1 * c1 + x2 * s2, x2 * c2 - x1 * s1), dim=-1)
    else:
        out = torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)
    return out.to(x.dtype)


if triton is not None:
    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, T, x_b, x_h, x_t, c_b, c_t, o_b, o_h, o_t,
                     HALF: tl.constexpr, BLOCK_T: tl.constexpr, BACKWARD: tl.constexpr):
        """One (row, head) and BLOCK_T positions: both halves of each vector, in fp32, rounded once."""
        bh, tb = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        d = tl.arange(0, HALF)
        keep = t[:, None] < T
        x = x_ptr + b * x_b + h * x_h + t[:, None] * x_t + d[None, :]
        c = cos_ptr + b * c_b + t[:, None] * c_t + d[None, :]
        s = sin_ptr + b * c_b + t[:, None] * c_t + d[None, :]
        x1, x2 = tl.load(x, mask=keep).to(tl.float32), tl.load(x + HALF, mask=keep).to(tl.float32)
        c1, c2 = tl.load(c, mask=keep).to(tl.float32), tl.load(c + HALF, mask=keep).to(tl.float32)
        s1, s2 = tl.load(s, mask=keep).to(tl.float32), tl.load(s + HALF, mask=keep).to(tl.float32)
        if BACKWARD:
            o1, o2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
        else:
            o1, o2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
        o = out_ptr + b * o_b + h * o_h + t[:, None] * o_t + d[None, :]
        tl.store(o, o1.to(out_ptr.dtype.element_ty), mask=keep)
        tl.store(o + HALF, o2.to(out_ptr.dtype.element_ty), mask=keep)


def _rope_launch(x, cos, sin, backward):
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, H, T, d = x.shape
    out = torch.empty((B, T, H, d), dtype=x.dtype, device=x.device).transpose(1, 2)    # as q_proj(...).transpose
    cos, sin = cos.expand(B, T, d), sin.expand(B, T, d)
    _rope_kernel[(B * H, triton.cdiv(T, 32))](x, cos, sin, out, H, T, *x.stride()[:3], cos.stride(0), cos.stride(1),
                                              *out.stride()[:3], HALF=d // 2, BLOCK_T=32, BACKWARD=backward)
    return out


class _FusedRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_launch(x, cos, sin, False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rope_launch(grad, cos, sin, True), None, None


def fused_rope(x, cos, sin):
    """rotate_half_rope(x, cos, sin) as one Triton kernel forward and one backward (x (B, H, T, d) on CUDA,
    d a power of two >= 32; cos and sin (B or 1, T, d), contiguous in d)."""
    return _FusedRope.apply(x, cos, sin)
