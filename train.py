"""Unlearn SUITE topics from a Hugging Face causal chat model.

    python train.py --method jensunpp --topics challenger_disaster --model smollm2        # one device
    torchrun --nproc_per_node=N train.py --method jensunpp --topics all --mode sequential --model PATH
    python train.py --method nll --relearn-set retain_train --topics all --model OUT/final  # relearning

Paper: sections 4-5 and appendix B; where the text is loose, the authors' runs. Defaults: 32 forget/retain
pairs per optimizer step (--global-batch; micro-batches of --batch-size per device, the accumulation
derived), linear warm-up over the first epoch from 0 then linear decay to 0, AdamW (weight decay 0.01 on
weight matrices only), clipping 1.0, 20 epochs (relearning: 10), the system message data.SYSTEM_PROMPT
on every sequence, bf16 compute with fp32 master weights (on a CPU only where bf16 is native, else fp32).
Hyperparameters per method and model family (read from the model's config.json: llama, ministral, qwen,
else default) come from losses.HPARAMS.

The run directory holds log.jsonl, config.json, a resumable checkpoint/ (removed when the run ends)
and one Hugging Face folder per stage (sequential: stage1_<topic>, ...; single/joint: final).
A killed run restarted with the same command continues from its last checkpoint.
"""
import argparse
import collections
import copy
import functools
import gc
import json
import math
import os
import random
import resource
import shutil
import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.tensor
import torch.utils.checkpoint
from torch.profiler import record_function

import data
import losses
from model import (GraphedForward, Layout, Progress, check_model, choose_precision, fuse_rms_norms, fused_rotary, generate,
                   lean_swiglu, load_config, load_model, model_family, packable, to_device, use_training_attention,
                   with_parameters_in)
from profiler import StepProfiler

# Refusals the paper found for its models (appendix B.1, tab:refusal_responses), without the prefix.
PAPER_REFUSALS = {"llama": "I am unable to verify this information.",
                  "ministral": "I can't assist with that.",
                  "qwen": "I cannot answer this question."}
REFUSAL_PREFIX = "Unfortunately, "
FALLBACK_REFUSAL = "I don't have that information."
BALANCE_EPS = 1e-5
# Decoder blocks per FSDP group: a step under FSDP is bound by the host, and every group costs hooks, copies
# and collectives; 4 blocks a group ran 2 H200s at 0.331 s/step against 0.380 with one (BENCHMARKS.md).
BLOCKS_PER_GROUP = 4
# Under a bf16 compute copy the update upcasts the bf16 gradients into fp32 this many bytes at a time, so
# that no whole fp32 gradient exists (a 3B model's is 12.8 GB; issue 52's card is an 80 GB H100).
OPTIMIZER_CHUNK_BYTES = 1 << 30
# --recompute-blocks auto plans a step's peak to fit this share of the GPU (issue 52: at most 64 of an H100's 80),
# leaving WORKSPACE_BYTES of it for what no pass saves: the frozen model's CUDA graph pools, cuBLAS, allocator slack.
# On an H100 at 08bcd47 (BENCHMARKS.md) auto ran JensUn++ without back-off, 18% slower a step than none recomputed:
# auto stays opt-in.
MEMORY_SHARE = 0.8
WORKSPACE_BYTES = 2 << 30
MAX_SKIPPED_IN_A_ROW = 10   # non-finite gradients this many steps running stop the run: it is not training


def print0(*args, **kwargs):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


# ----------------------------------------------------------------------------------------------
# The refusal and the hyperparameters

def detect_refusal(model, tokenizer, questions, system=data.SYSTEM_PROMPT):
    """The model's most common refusal (first sentence) when asked about unknowable facts in the
    training chat format (appendix B.1), or None when it refuses none of them; and its answers."""
    prompts = [data.prompt_ids(tokenizer, q, system=system) for q in questions]
    progress = Progress("refusal detection", len(prompts)) if not dist.is_initialized() or dist.get_rank() == 0 else None
    # one batch for the pool's 30 questions: the same answers as batches of 8 (SmolLM2, CPU fp32), half the time there
    answers = generate(model, tokenizer, prompts, max_new_tokens=50, batch_size=32, progress=progress)
    first = [a.split("\n")[0].split(". ")[0].strip().rstrip(".") + "." for a in answers]
    counts = collections.Counter(f for f in first if data.is_refusal(f))
    return (counts.most_common(1)[0][0] if counts else None), answers


def with_prefix(refusal):
    """'I am unable...' -> 'Unfortunately, I am unable...'; 'Sorry...' -> 'Unfortunately, sorry...'."""
    if refusal.startswith(REFUSAL_PREFIX):
        return refusal
    keep_case = refusal[:2] in ("I ", "I'") or (refusal[:2].isupper())
    return REFUSAL_PREFIX + (refusal if keep_case else refusal[:1].lower() + refusal[1:])


def resolve_refusal(args, family, device):
    """--refusal auto (ask the starting model about the pool's unknowable facts; without a refusal among
    its answers, FALLBACK_REFUSAL), paper (the paper's string for the model family), or a literal string.
    auto and paper get REFUSAL_PREFIX. Returns it and, on one process, the (model, tokenizer) that auto
    loaded (fp32, on the device, as build_models loads it), for the first stage to train (else None)."""
    if args.refusal == "auto":
        model, tokenizer = load_model(args.model, torch.float32, device, args.trust_remote_code)
        questions = data.load_pools(args.data_root)["refusal_questions"]
        refusal, answers = detect_refusal(model, tokenizer, questions, args.system_prompt)
        if refusal is None:
            print0(f"--refusal auto: the model refused none of {len(answers)} questions about unknowable facts "
                   f"(e.g. {answers[0][:60]!r}); using the generic {FALLBACK_REFUSAL!r}")
            refusal = FALLBACK_REFUSAL
        return with_prefix(refusal), None if dist.is_initialized() else (model, tokenizer)
    if args.refusal == "paper":
        if family not in PAPER_REFUSALS:
            raise data.UserError(f"--refusal paper: the paper has no refusal for model family '{family}'; use auto")
        return with_prefix(PAPER_REFUSALS[family]), None
    return args.refusal, None


def run_refusal(args, family, device, resume):
    """The refusal every stage trains towards (None for methods without one), resolved once from the
    starting model (before any sharding: never generate through FSDP modules); a resumed or rerun
    run reads back the one it started with. With it, the starting model where detection loaded it
    (resolve_refusal), else None."""
    refusal = losses.METHODS[args.method].get("refusal")          # None, "model", or the method's own string
    if refusal != "model":
        return refusal, None
    if resume:
        return resume["refusal"], None
    saved = Path(args.out) / "config.json"
    if saved.exists() and json.loads(saved.read_text()).get("refusal"):
        return json.loads(saved.read_text())["refusal"], None
    return resolve_refusal(args, family, device)


def hparams_for(args, family):
    """losses.resolve_hparams for the method and model family, overridden by --lr, --lambda-f, --lambda-r."""
    hp = losses.resolve_hparams(args.method, family, args.recipe)
    for key in ("lr", "lambda_f", "lambda_r"):
        if getattr(args, key) is not None:
            hp[key] = getattr(args, key)
    return hp


# ----------------------------------------------------------------------------------------------
# Distributed (hand-written FSDP2)

def setup_distributed():
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        return rank, world, torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return rank, world, torch.device("cpu")


def shard_model(model, device, bf16, regather=False):
    """FSDP2: one group per BLOCKS_PER_GROUP consecutive decoder blocks, the embeddings/final norm/head
    grouped (tied embeddings must live in one group), root last. bf16 parameters for compute, fp32 master
    weights and fp32 gradient reduction. A group's gathered parameters stay from its forward to its
    backward: 0.226 against 0.256 s/step on 2 H200s, for 3.9 GB more per card (BENCHMARKS.md);
    `regather` (--fsdp-regather) gathers them again for the backward instead."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32)
    block_names = set(model._no_split_modules or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    for i in range(0, len(blocks), BLOCKS_PER_GROUP):
        fully_shard(blocks[i:i + BLOCKS_PER_GROUP], mesh=mesh, mp_policy=mp, reshard_after_forward=regather)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    norm = model.get_decoder().norm
    if head is not None and head.weight is embed.weight:
        fully_shard([embed, norm, head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    else:
        fully_shard(embed, mesh=mesh, mp_policy=mp, reshard_after_forward=regather)
        fully_shard([norm, head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def fsdp_accumulate(model, last):
    """Gradient accumulation under FSDP: before the step's last forward pass the gathered parameters stay
    gathered after backward and the gradients stay on the rank (accumulated unsharded, in fp32), so a
    step costs one gradient reduce-scatter and no re-gather between micro-batches, not one of each per
    micro-batch (2 GPUs at global batch 32 ran no faster than one: bench.py, BENCHMARKS.md at d3f2a50). Memory:
    one unsharded fp32 gradient and bf16 parameter copy per rank while a step accumulates."""
    model.set_requires_gradient_sync(last)
    model.set_reshard_after_backward(last)


def clip_grad_norm(params, max_norm):
    """torch.nn.utils.clip_grad_norm_: the 2-norm over every gradient, all scaled by max_norm / norm where
    that is below 1 (a non-finite norm is returned for the caller to skip the update). FSDP2's gradients
    are DTensors sharded on their first dimension; their norm is taken from the local shards (squared,
    summed, one all-reduce over ranks) without DTensor's per-op dispatch (the host's clipping took 14 ms a
    step under the profiler on 2 H200s with torch's, 8 ms with this; BENCHMARKS.md at 2b7c545)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sharded = [g for g in grads if isinstance(g, torch.distributed.tensor.DTensor)]
    if any(not placement.is_shard() for g in sharded for placement in g.placements):
        raise ValueError("clip_grad_norm: a DTensor gradient is not sharded (FSDP2 shards every parameter)")
    local = [local_tensor(g) for g in grads]
    total = torch.stack(torch._foreach_norm(local)).float().square().sum()
    if sharded:
        dist.all_reduce(total)
    total = total.sqrt()
    torch._foreach_mul_(local, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def full_state_dict(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def host_copy(state):
    """The state dict on the CPU, a tensor that two keys share (tied embeddings) copied once."""
    copies, out = {}, {}
    for k, v in state.items():
        same = (v.data_ptr(), v.shape, v.stride(), v.dtype)
        if same not in copies:
            copies[same] = v.detach().cpu()
        out[k] = copies[same]
    return out


def export(model, tokenizer, config, folder, rank):
    """Save a Hugging Face folder (safetensors, config, tokenizer) that from_pretrained loads."""
    state = full_state_dict(model) if dist.is_initialized() else host_copy(model.state_dict())
    if rank == 0:
        from transformers import AutoModelForCausalLM
        folder = Path(folder)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with torch.device("meta"):          # no random init: the state's tensors become the clean model's own
            clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        clean.load_state_dict(state, assign=True)
        clean.tie_weights()
        clean.generation_config = getattr(model, "generation_config", clean.generation_config)
        clean.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    if dist.is_initialized():
        dist.barrier()


# ----------------------------------------------------------------------------------------------
# Loss balancing

def balance_alpha(L_f, L_r, logits, row_group):
    """Dynamic loss balancing (eq. 4), one alpha per loss micro-batch g:
    alpha_g = ||grad_z L_r,g|| / (||grad_z L_f,g|| + eps), gradients w.r.t. the logits z (no extra backward
    through the model), detached and global over ranks; 1 unless both losses exceed eps. L_f, L_r: (G,);
    row_group (N,): the micro-batch of each row of `logits`. A micro-batch's losses read only its own rows,
    so one gradient of the summed losses holds every micro-batch's gradient in its rows. A (G,) tensor:
    reading it on the host would stall the GPU."""
    g_f, = torch.autograd.grad(L_f.sum(), logits, retain_graph=True, materialize_grads=True)
    g_r, = torch.autograd.grad(L_r.sum(), logits, retain_graph=True, materialize_grads=True)
    per_row = torch.stack([g_r.pow(2).sum((1, 2)), g_f.pow(2).sum((1, 2))])              # (2, N)
    sq = torch.zeros(2, len(L_f), device=per_row.device).index_add_(1, row_group, per_row)
    if dist.is_initialized():
        dist.all_reduce(sq)
    alpha = sq[0].sqrt() / (sq[1].sqrt() + BALANCE_EPS)
    both_active = (L_f.detach() > BALANCE_EPS) & (L_r.detach() > BALANCE_EPS)
    return torch.where(both_active, alpha, torch.ones_like(alpha))


def row_groups(sizes, views, rows_per_view, device):
    """The loss micro-batch of every row of a pass's logits (views one after another, each holding the
    micro-batches of `sizes` in order, then filler rows up to a compiled shape, whose gradient is 0)."""
    one_view = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)]
                         + [torch.zeros(rows_per_view - sum(sizes), dtype=torch.long)])
    return to_device(one_view.repeat(views), device)


def split_passes(micro_batches, seqs, per_pass):
    """A step's forward passes: `per_pass` consecutive loss micro-batches each, with their sequences
    ({view: [sequence]}, in the micro-batches' order), and whether the pass is the step's last."""
    passes = [micro_batches[j:j + per_pass] for j in range(0, len(micro_batches), per_pass)]
    row = 0
    for i, groups in enumerate(passes):
        rows = sum(len(indices) for indices, _ in groups)
        yield groups, {name: view[row:row + rows] for name, view in seqs.items()}, i == len(passes) - 1
        row += rows


def split_rows(out, sizes):
    """The loss micro-batches of one forward pass: `out` ({view: {name: rows-first tensor}}) cut into
    consecutive row blocks of `sizes`."""
    parts, start = [], 0
    for n in sizes:
        parts.append({view: {k: v[start:start + n] for k, v in tensors.items()} for view, tensors in out.items()})
        start += n
    return parts


def decoder_layers(model):
    return model.get_decoder().layers


# ----------------------------------------------------------------------------------------------
# Checkpoints (resume)

def save_checkpoint(run_dir, model, optimizer, meta, rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    ckpt = Path(run_dir) / "checkpoint"
    tmp = Path(run_dir) / "checkpoint.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))          # last: a checkpoint with it is whole
        old = Path(run_dir) / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if ckpt.exists():
            ckpt.rename(old)            # renamed, not deleted, until the new one is in place (recover_checkpoint)
        tmp.rename(ckpt)
        shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()


def recover_checkpoint(run_dir):
    """After a kill inside save_checkpoint's swap, put the newest whole checkpoint back in place: checkpoint.tmp
    once its meta.json is written, else checkpoint.old (a delete there would lose the stage's progress)."""
    run_dir = Path(run_dir)
    ckpt, tmp, old = (run_dir / name for name in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
    if not ckpt.exists():
        if (tmp / "meta.json").exists():
            tmp.rename(ckpt)
        elif old.exists():
            old.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run_dir, model, optimizer):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    ckpt = Path(run_dir) / "checkpoint"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(ckpt), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def read_checkpoint_meta(run_dir):
    path = Path(run_dir) / "checkpoint" / "meta.json"
    return json.loads(path.read_text()) if path.exists() else None


def truncate_log(path, stage_name, step):
    """Keep log.jsonl one run: a stage that starts at `step` (its checkpoint's, or 0) drops its lines past
    that step, written by a killed run after its last checkpoint, and a line the kill cut short."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("stage") != stage_name or record.get("step", 0) <= step:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)


# ----------------------------------------------------------------------------------------------
# Training

def lr_at(step, total, warmup, peak, schedule="linear"):
    """Learning rate of optimizer step `step` (0-based), as Hugging Face's schedulers compute it: linear
    warm-up from 0 over `warmup` steps (one epoch), then linear decay to 0 at `total` (the authors' runs,
    the trainer's default) or cosine decay (the paper's text)."""
    if step < warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return peak * 0.5 * (1 + math.cos(math.pi * progress))
    return peak * (1 - progress)


def step_micro_batches(order, step_in_epoch, global_batch, batch_size, rank, world):
    """This rank's micro-batches of one optimizer step, each with its weight in the step's mean.
    A step takes the next `global_batch` pairs of the epoch's permutation; the last step of an epoch
    takes the pairs left over (450 pairs at 32: 14 steps of 32, then one of 2), so every pair is seen once
    per epoch. Under FSDP that remainder is filled with pairs from the start of the permutation up to a
    multiple of the world size, as torch's DistributedSampler pads. Each rank takes a contiguous share
    and cuts it into micro-batches of at most `batch_size`; a micro-batch's weight is its share of the
    rank's pairs (1 / accumulation steps in a full step)."""
    chunk = order[step_in_epoch * global_batch:(step_in_epoch + 1) * global_batch]
    chunk = chunk + order[:(-len(chunk)) % world]
    n = len(chunk) // world
    mine = chunk[rank * n:(rank + 1) * n]
    return [(mine[j:j + batch_size], len(mine[j:j + batch_size]) / n) for j in range(0, n, batch_size)]


class StepSequences(torch.utils.data.Dataset):
    """Item `step`: this rank's loss micro-batches of that optimizer step (step_micro_batches) and their
    sequences (PairedTrainSet.views, every view, micro-batches in order). On a GPU a DataLoader worker
    process makes them ahead of the step: rendering and tokenizing a step's chat prompts takes about 20 ms
    of the host, which bounds an FSDP step (BENCHMARKS.md at 2b7c545)."""

    def __init__(self, trainset, views, retain, steps_per_epoch, global_batch, batch_size, rank, world):
        self.trainset, self.views, self.retain, self.steps_per_epoch = trainset, views, retain, steps_per_epoch
        self.global_batch, self.batch_size, self.rank, self.world = global_batch, batch_size, rank, world

    def __getitem__(self, step):
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        micro_batches = step_micro_batches(self.trainset.epoch_order(epoch), in_epoch, self.global_batch,
                                           self.batch_size, self.rank, self.world)
        indices = [i for batch, _ in micro_batches for i in batch]
        return micro_batches, self.trainset.views(indices, self.views, self.retain, epoch)


def as_is(item):
    """The DataLoader's collate_fn: StepSequences' items need no collating."""
    return item


def step_dataset(trainer):
    """The stage's StepSequences: item `step` is that step's micro-batches and sequences."""
    args = trainer.args
    return StepSequences(trainer.trainset, trainer.spec["views"], trainer.needs_retain, trainer.steps_per_epoch,
                         args.global_batch, args.batch_size, trainer.rank, trainer.world)


def step_sequences(trainer, start):
    """StepSequences from `start` to the stage's end, made one worker process ahead on a GPU (in this
    process on a CPU, where the worker would compete with the training for the cores)."""
    dataset = step_dataset(trainer)
    worker = trainer.plan["gpu"]                 # on a GPU (make_plan)
    if worker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")    # the forked worker tokenizes alone
    return iter(torch.utils.data.DataLoader(dataset, batch_size=None, sampler=range(start, trainer.total),
                                            collate_fn=as_is, num_workers=int(worker),
                                            prefetch_factor=4 if worker else None))


def stages_for(args):
    topics = data.check_topics(args.topics, args.data_root)
    if args.mode == "single":
        if len(topics) != 1:
            raise data.UserError("--mode single takes exactly one topic; use sequential or joint for several")
        return [("final", topics)]
    if args.mode == "joint":
        return [("final", topics)]
    if args.no_save and len(topics) > 1:
        raise data.UserError("--no-save: a sequential run's stage starts from the model the stage before it saved")
    return [(f"stage{i + 1}_{t}", [t]) for i, t in enumerate(topics)]


# ----------------------------------------------------------------------------------------------
# The plan: every speed decision, made once at start-up

def make_plan(args, device, world):
    """Every acceleration of the run, decided once from the flags, the hardware and the model's config, as
    a plain dict (describe_plan prints it as one line). The step applies it through two seams, the
    layouts (model.Layout: how a pass's sequences become rows) and the gradient owner (Updates: how
    backward and the update run), and never asks which mode it is in. Each choice is measured in
    BENCHMARKS.md or in its earlier figures (BENCHMARKS.md at 2b7c545; the bf16 compute copy is only
    profiled there), and tested to give the computation without it."""
    spec, cuda = losses.METHODS[args.method], device.type == "cuda"
    bf16 = choose_precision(args.precision, device)[0] == "bf16"
    # Several sequences per row (data.pack) where every layer is full attention, except under fixed-shape CUDA graphs.
    pack = args.packing and args.compile != "graphs" and packable(load_config(args.model, args.trust_remote_code))
    # Attention. Left-padded rows run eager attention: with SDPA every method got NaN gradients at the same
    # batch on an H100, most likely CUDA SDPA's backward on the rows with no key to attend to; eager
    # attention masks with a finite minimum, and the runs that used it passed that batch. Packed rows have
    # no such row, and run SDPA on its memory-efficient kernel (model.packed_sdpa_attention).
    # Fused kernels (RMSNorm; rotary on a GPU) in eager mode only: under --compile inductor fuses
    # transformers' ops itself (a CPU test compiled them in 87 s, the fused kernels in 143 s).
    return {"bf16": bf16, "compute_copy": bf16 and world == 1,     # under FSDP its mixed precision computes in bf16
            "pack": (torch.bfloat16 if bf16 else torch.float32) if pack else None,
            "attention": "sdpa" if pack and args.attention == "sdpa" and not args.compile else "eager",
            "fused": not args.compile, "compile": args.compile,
            # MLPs that keep 2 of their 4 intermediate tensors for backward (model.lean_swiglu), on one device
            "lean_mlp": not args.compile and world == 1,
            # the frozen model's packed passes replayed from CUDA graphs (model.GraphedForward); under
            # --compile graphs it is compiled with the model, under --compile blocks its blocks are
            "frozen": bool(spec["ref"]),
            "ref_graphs": bool(spec["ref"]) and pack and cuda and not args.compile and args.reference_graphs,
            "rows": args.physical_batch, "shrink": args.physical_auto and world == 1,
            # on a GPU a worker process makes the batches, the statistics reach the host a step late and a
            # non-finite gradient skips the update on the device: the host never waits for the GPU mid-run
            "gpu": cuda, "world": world, "regather": args.fsdp_regather,
            # --recompute-blocks auto: sized before step 1 (size_recompute) on one device in eager mode, for a
            # peak of --memory-gib, else MEMORY_SHARE of the GPU; on a CPU without --memory-gib nothing is sized
            "recompute": args.recompute_blocks if args.recompute_blocks != "auto" else "auto" if (
                world == 1 and not args.compile and (cuda or args.memory_gib)) else 0,
            "memory": args.memory_gib * 2**30 if args.memory_gib else None}


def describe_plan(plan):
    """The plan as the one line a run prints at start-up."""
    compiled = {None: "eager", "blocks": "decoder blocks compiled",
                "graphs": "whole model compiled, replayed as CUDA graphs"}[plan["compile"]]
    recomputed = ("" if not plan["recompute"] else f", {plan['recompute']} blocks recomputed in backward"
                  if plan["recompute"] != "auto" else ", the fewest blocks recomputed in backward for a peak of "
                  + (f"{plan['memory'] / 2**30:.3g} GiB" if plan["memory"] else f"{MEMORY_SHARE:g} of the GPU"))
    frozen = ("no frozen model" if not plan["frozen"] else "frozen model replayed from CUDA graphs"
              if plan["ref_graphs"] else "frozen model " + compiled.split(",")[0].replace("whole model ", ""))
    parts = ["bf16 compute copy over fp32 masters" if plan["compute_copy"] else
             "bf16 compute over fp32 masters (FSDP mixed precision)" if plan["bf16"] else "fp32",
             (f"packed rows ({'sdpa mem-efficient' if plan['attention'] == 'sdpa' else 'eager'} attention)"
              if plan["pack"] else "left-padded rows (eager attention)"),
             f"{plan['rows']} rows per pass"
             + (" (if memory runs out: " + ("halved)" if plan["compile"] else "every block recomputed, then halved)")
                if plan["shrink"] else ""),
             compiled + recomputed, frozen,
             ("fused rmsnorm+rotary" if plan["gpu"] else "fused rmsnorm") if plan["fused"] else "no fused kernels",
             *(["lean SwiGLU backward"] if plan["lean_mlp"] else []),
             ("data worker, statistics a step late, non-finite gradients skipped on the device" if plan["gpu"]
              else "data in this process, non-finite gradients skipped on the host"),
             (f"FSDP on {plan['world']} ranks, {BLOCKS_PER_GROUP} blocks a group, parameters "
              + ("regathered for backward" if plan["regather"] else "kept gathered to backward"))
             if plan["world"] > 1 else "FSDP off"]
    return "plan: " + ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# A stage's models, data and optimizer

def build_models(args, plan, spec, hp, model_path, device, world, loaded=None):
    """The stage's models, as the plan says: the fp32 master weights (optimizer, checkpoints, export;
    FSDP-sharded under torchrun), the model that runs forward and backward (on one device with bf16 a bf16
    copy of the masters, else the masters) and the frozen starting model where the loss reads its outputs
    (else None); and the tokenizer and the model's config (for the export)."""
    # Under FSDP a checkpoint loads on the CPU and each rank keeps its shard; random weights (seed 0,
    # the same on every rank) are made on the GPU, where a 9B-shaped model initialises in seconds.
    on_cpu = world > 1 and not str(model_path).startswith("random:")
    model, tokenizer = loaded or load_model(model_path, torch.float32, "cpu" if on_cpu else device, args.trust_remote_code)
    config = copy.deepcopy(model.config)
    model.config.use_cache = False
    if plan["attention"] == "sdpa":
        use_training_attention(model)
    else:
        model.set_attn_implementation("eager")
    if plan["fused"]:
        fuse_rms_norms(model)                    # the copies below (frozen, bf16 compute) inherit it
    if plan["lean_mlp"]:
        lean_swiglu(model)
    ref = None
    if spec["ref"]:
        ref = with_parameters_in(copy.deepcopy(model).to(device), torch.bfloat16 if plan["bf16"] else torch.float32).eval()
        ref.requires_grad_(False)
    if spec.get("setup"):
        spec["setup"](model, hp, args.seed)
    if world > 1:
        model = shard_model(model.to(device), device, plan["bf16"], plan["regather"])
    compute = with_parameters_in(copy.deepcopy(model), torch.bfloat16) if plan["compute_copy"] else model
    compute.train()
    if plan["recompute"] != "auto":
        recompute_blocks(compute, plan["recompute"])        # auto: sized before step 1 (Trainer.run_stage)
    compile_models(plan["compile"], spec, compute, ref)
    return model, compute, ref, tokenizer, config


def recompute_blocks(model, n):
    """--recompute-blocks N: the first N decoder blocks save only their input for backward, which runs their
    forward again (torch.utils.checkpoint, non-reentrant; module hooks such as RMU's stay outside it). A 3B
    JensUn++ pass of 32 rows holds about 20 GiB of activations on an H100 (BENCHMARKS.md), mostly the blocks'.
    A block already recomputed is left as it is."""
    for block in decoder_layers(model)[:n]:
        if not getattr(block, "recomputed", False):
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
            block.recomputed = True


def size_recompute(trainer, start):
    """--recompute-blocks auto: the fewest decoder blocks to recompute in backward for the step's peak to fit
    --memory-gib (else MEMORY_SHARE of the GPU), from the static bytes of the run and what the largest pass (of
    up to 64 steps spread over the stage) saves for backward, measured by running its forward and loss once
    before step 1 (AdamW's moments and the gradients do not exist yet, so it fits where the step could).
    Prints the estimate (on a GPU with the probe's own peak); memory_report prints the steps' peak to compare."""
    blocks = len(decoder_layers(trainer.compute))
    dataset, per_pass = step_dataset(trainer), trainer.rows // trainer.args.batch_size
    passes = [p for step in range(start, trainer.total, math.ceil((trainer.total - start) / 64))
              for _, p, _ in split_passes(*dataset[step], per_pass)]
    largest = max(passes, key=lambda p: sum(len(s["ids"]) for seqs in p.values() for s in seqs))
    cuda = trainer.device.type == "cuda"
    if cuda:                                # the probe's own peak, transients included, above what is allocated now
        before = torch.cuda.memory_allocated(trainer.device)
        torch.cuda.reset_peak_memory_stats(trainer.device)
    try:
        saved = saved_for_backward(trainer, largest)
    except torch.OutOfMemoryError:
        saved = None
    probe = ""
    if cuda:
        probe = (f"; its forward and loss peaked {peak_memory_gb(trainer.device) - before / 2**30:.3g} GiB above "
                 "the memory allocated before it")
        torch.cuda.empty_cache()            # the probe's blocks back to the device, not cached in its sizes
        torch.cuda.reset_peak_memory_stats(trainer.device)     # memory_report: the steps' peak, not the probe's
    static = static_bytes(trainer)
    budget = trainer.plan["memory"] or MEMORY_SHARE * torch.cuda.get_device_properties(trainer.device).total_memory
    n = blocks if saved is None else next(
        (n for n in range(blocks + 1) if peak_estimate(static, saved, blocks, n) <= budget), blocks)
    estimate = "the largest pass's forward ran out of memory" if saved is None else (
        f"estimated peak {peak_estimate(static, saved, blocks, n) / 2**30:.3g} GiB: static {static / 2**30:.3g}, the "
        f"largest pass saves {saved['blocks'] / 2**30:.3g} in its blocks and {saved['rest'] / 2**30:.3g} outside them{probe}")
    print0(f"[{trainer.stage_name}] --recompute-blocks auto: {n} of {blocks} decoder blocks recomputed in backward "
           f"for a peak of at most {budget / 2**30:.3g} GiB ({estimate})")
    return n


def saved_for_backward(trainer, seqs):
    """Bytes that one pass over `seqs` (the model's forward and the loss, as Trainer.step runs them) saves for
    backward, each storage once and parameters left out: {"blocks": in all decoder blocks, "rest": outside them
    (embeddings, head, logits, the loss), "input": a block's input (what a recomputed block keeps)}."""
    spec, blocks = trainer.spec, decoder_layers(trainer.compute)
    seen = {p.untyped_storage().data_ptr() for m in (trainer.compute, trainer.ref) if m is not None for p in m.parameters()}
    saved, inside = {"blocks": 0, "rest": 0, "input": 0}, []

    def pack(t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            saved["blocks" if inside else "rest"] += t.untyped_storage().nbytes()
        # an alias, not the tensor: a saved output returned as itself is a reference cycle through its grad_fn
        # that outlives the probe, all its activations with it (PyTorch's saved_tensors_hooks docs)
        return t.detach()

    def enter(module, args, kwargs):
        inside.append(module)
        saved["input"] = max(saved["input"], (args[0] if args else kwargs["hidden_states"]).nbytes)

    def leave(*_):
        inside.pop()

    handles = [h for b in blocks for h in (b.register_forward_pre_hook(enter, with_kwargs=True),
                                           b.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, logits, _ = trainer.layout.forward(trainer.compute, seqs, spec["weights"], trainer.hooks[0])
            for view, kind in spec["ref"].items():
                out["ref_" + view] = trainer.reference(view, kind, seqs, logits.shape[1] - 1)
            spec["fn"](out, {**trainer.hp, "lambda_r": torch.tensor(float(trainer.hp["lambda_r"]), device=trainer.device)})
    finally:
        for h in handles:
            h.remove()
    return saved


def static_bytes(trainer):
    """The bytes a step holds whatever its activations: fp32 masters and AdamW's two moments, the bf16 compute
    copy, the frozen model, the gradients (a step of one pass under a compute copy: the copy's bf16 ones and the
    update's chunk of fp32; else fp32 ones, and under a compute copy its bf16 ones beside them) and WORKSPACE_BYTES."""
    trainable = local_bytes(p for p in trainer.model.parameters() if p.requires_grad)
    copy = local_bytes(trainer.compute.parameters()) if trainer.compute is not trainer.model else 0
    frozen = local_bytes(trainer.ref.parameters()) if trainer.ref is not None else 0
    one_pass = trainer.rows >= trainer.args.global_batch // trainer.world
    gradients = copy + OPTIMIZER_CHUNK_BYTES if copy and one_pass else trainable + copy
    return local_bytes(trainer.model.parameters()) + 2 * trainable + copy + frozen + gradients + WORKSPACE_BYTES


def peak_estimate(static, saved, blocks, recomputed):
    """A step's peak with the first `recomputed` of `blocks` decoder blocks recomputed (saved_for_backward's
    bytes): the static bytes, the kept blocks' activations, the recomputed blocks' inputs, the rest of the
    pass twice (its tensors and, as backward starts, their gradients) and the one block backward works on
    (its activations again as gradients; a recomputed block's activations besides)."""
    block = saved["blocks"] / blocks
    return (static + (blocks - recomputed) * block + recomputed * saved["input"] + 2 * saved["rest"]
            + (2 if recomputed else 1) * block)


def compile_models(mode, spec, compute, ref):
    """--compile blocks: each decoder block (dynamic shapes: every batch has its own length; the step
    is otherwise bound by Python dispatch of ~100 small ops per block). --compile graphs: the whole
    model for one fixed shape per batch size (Trainer.lengths), replayed as CUDA graphs forward and
    backward; the frozen model too where it runs every step with per-token outputs."""
    if mode == "blocks":
        for m in [compute] + ([ref] if ref is not None else []):
            for block in decoder_layers(m):
                block.compile(dynamic=True)
    elif mode == "graphs":
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        compute.compile(mode="reduce-overhead", dynamic=False)
        if ref is not None and "logits" in spec["ref"].values():
            ref.compile(mode="reduce-overhead", dynamic=False)


def build_data(args, spec, tokenizer, topics, refusal, stage_index):
    """The stage's forget/retain pairs, with the ablation flags of appendix C.1 (--no-pairing,
    --exclude-retain, --no-prefix-mixing, --no-prefix-targets); relearning trains on --relearn-set alone.
    --retain-scope seen: the retain rows of this stage's topics and of every stage's before it."""
    relearn = spec.get("relearn", False)
    seen = [t for _, topics_ in stages_for(args)[:stage_index + 1] for t in topics_] if args.retain_scope == "seen" else None
    return data.PairedTrainSet(
        tokenizer, topics, args.data_root, refusal=refusal, seed=args.seed,
        context_refusals=spec.get("context_refusals", False), system=args.system_prompt,
        forget_key=args.relearn_set if relearn else "forget_train", retain_key=None if relearn else "retain_train",
        pairing=args.pairing, exclude=args.exclude_retain, prefix_mixing=args.prefix_mixing,
        prefix_targets=args.prefix_targets, retain_topics=seen)


def build_optimizer(model, lr, weight_decay, fused=True):
    """AdamW; weight decay on weight matrices only, not on biases and normalisation weights (the
    authors' trainer). Fused (one kernel for all parameters) on a GPU and a CPU alike: on the CPU 6x faster
    than the per-tensor loop for SmolLM2 (BENCHMARKS.md), the same update up to float rounding."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, fused=fused)


# ----------------------------------------------------------------------------------------------
# The training loop

class Trainer:
    """One stage (a topic, or several jointly), from a model folder to an exported one: run_stage builds
    the models, data, optimizer and layouts, then `train` runs the optimizer steps (`step`: one of them)."""

    def __init__(self, args, rank, world, device, plan=None, rows=None, recompute_all=False):
        """rows, recompute_all: an earlier stage's out-of-memory relief (shrink), which later stages keep."""
        self.args, self.rank, self.world, self.device = args, rank, world, device
        self.plan = plan or make_plan(args, device, world)
        self.spec = losses.METHODS[args.method]
        self.rows = rows or args.physical_batch  # rows per forward pass (halved on running out of memory: shrink)
        self.recompute_all = recompute_all       # out of memory once: every block recomputed, this stage and later
        self.ref_tokens = 0                      # a step's tokens through the frozen model (benchmarks)

    def run_stage(self, stage_index, stage_name, topics, model_path, refusal, hp, resume_meta, loaded=None):
        """Train one stage; returns the exported folder (under --no-save, the starting model). `loaded`: the
        (model, tokenizer) at model_path, already loaded (refusal detection's), not loaded again."""
        args, spec = self.args, self.spec
        self.stage_index, self.stage_name, self.refusal, self.hp = stage_index, stage_name, refusal, dict(hp)
        self.model, self.compute, self.ref, tokenizer, config = build_models(
            args, self.plan, spec, self.hp, model_path, self.device, self.world, loaded)
        self.pad_id = tokenizer.pad_token_id
        self.trainset = build_data(args, spec, tokenizer, topics, refusal, stage_index)
        self.needs_retain = not spec.get("relearn") and (spec["retain"] or self.hp["lambda_r"] > 0)
        self.steps_per_epoch = math.ceil(len(self.trainset) / args.global_batch)
        # --exclude-retain drops pairs: more epochs, so that the run sees as many samples (tab:ablation_c)
        full, kept = self.trainset.full_size, len(self.trainset)
        self.epochs = round(args.epochs * full / kept) if args.exclude_retain and full else args.epochs
        self.total = min(self.steps_per_epoch * self.epochs, args.max_steps or math.inf)
        self.optimizer = build_optimizer(self.model, self.hp["lr"], args.weight_decay)
        start, lambda_r = self.resume(resume_meta)
        self.updates = Updates(self.model, self.compute, self.optimizer, self.plan)
        layer = self.hp[spec["hidden"]] if spec.get("hidden") else None      # RMU's hooked layer
        self.hooks = ((decoder_layers(self.compute)[layer], decoder_layers(self.ref)[layer]) if layer is not None
                      else (None, None))
        self.lengths = None
        if args.compile == "graphs":
            # Every batch padded to the stage's longest sequence and answer span, so each compiled model
            # sees one shape per batch size and compiles once.
            self.lengths = self.trainset.longest(spec["views"], self.needs_retain, self.epochs)
            print0(f"--compile graphs: every view padded to (rows, T, K) = {(self.rows, *self.lengths)}")
        self.build_layouts()
        print0(f"[{stage_name}] {len(self.trainset)} pairs, {self.steps_per_epoch} steps per epoch of "
               f"{args.global_batch} (loss micro-batches of {args.batch_size} x {self.world} process(es), "
               f"{self.rows} rows per forward pass), {self.total} steps")
        with fused_rotary(self.compute):             # rotary embeddings as one kernel on a GPU (model.py)
            if self.recompute_all:                   # a stage before this one ran out of memory
                recompute_blocks(self.compute, len(decoder_layers(self.compute)))
            elif self.plan["recompute"] == "auto":
                recompute_blocks(self.compute, size_recompute(self, start))
            self.train(start, lambda_r)
        return self.export_stage(tokenizer, config)

    def resume(self, meta):
        """The step to start from and the retain factor lambda_r (a tensor: PDU updates it on the device):
        the checkpoint's, with its weights and optimizer state, when this stage resumes."""
        if meta and meta["stage"] == self.stage_index:
            load_checkpoint(self.args.out, self.model, self.optimizer)
            print0(f"resumed {self.stage_name} at step {meta['step']}/{self.total}")
            return meta["step"], torch.tensor(meta["lambda_r"], device=self.device)
        return 0, torch.tensor(float(self.hp["lambda_r"]), device=self.device)

    def build_layouts(self):
        """The model's layout and the frozen model's, one per output it returns (the plan's; made again when
        the rows per pass shrink). Compiled blocks or graphs: every view filled to the pass's rows, so that
        the epoch's short step runs at the batch size they compiled for (at its own, 1 or 2 rows, its first
        run took 13 s on one H100 and 42 s per rank under FSDP on two at 7d13905: BENCHMARKS.md at d3f2a50)."""
        fill, graphs = self.rows if self.args.compile else None, self.args.compile == "graphs"
        self.layout = Layout(self.pad_id, self.device, self.plan["pack"], fill, self.lengths, graph_step=graphs)
        self.ref_graphs = GraphedForward() if self.plan["ref_graphs"] else None
        frozen = self.layout.replace(graph_step=False)
        # Under --compile graphs sequence scores run eagerly at the batch's own shape: the whole frozen model
        # is compiled only where it returns per-token outputs. A graph replay runs no hook (hidden states).
        scores = frozen.replace(fill_rows=None, lengths=None) if graphs else frozen
        self.frozen = {"logits": frozen.replace(graphs=self.ref_graphs), "hidden": frozen,
                       "seq_logprob": scores.replace(graphs=self.ref_graphs)}

    def train(self, start, lambda_r):
        """Optimizer steps from `start` to the stage's end, as nanoGPT's loop: the learning rate, this rank's
        loss micro-batches, the step, its log line (one step late: StepLog), a checkpoint every --save-minutes."""
        self.log = StepLog(self, start)
        batches = step_sequences(self, start)
        for step in range(start, self.total):
            epoch = step // self.steps_per_epoch
            lr = lr_at(step, self.total, self.steps_per_epoch, self.hp["lr"], self.args.lr_schedule)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.log.begin(step)
            with record_function("train::data"):
                micro_batches, seqs = next(batches)
            report, lambda_r, tokens = self.step_with_retry(micro_batches, seqs, epoch, lambda_r)
            if step == min(start + 1, self.total - 1):     # the second step: the first makes AdamW's moments late
                print0(f"[{self.stage_name}] {memory_report(self)}")
            if self.log.end(step + 1, epoch, lr, report, tokens):          # --save-minutes have passed
                self.checkpoint(step + 1, lambda_r.item())
                self.log.last_save = time.time()
        self.log.close()

    def step(self, micro_batches, seqs, epoch, lambda_r):
        """One optimizer step over this rank's loss micro-batches ([(pair indices, weight)]) and their
        sequences ({view: [sequence]}): forward passes of --physical-batch rows with the frozen model's
        outputs where the loss reads them, then each micro-batch's own loss, as if it had its own pass (its
        means, its alpha of eq. 4, its lambda_r: a dual variable moves after every micro-batch); one backward
        a pass; clipping; the update. Returns the step's statistics (StepReport), lambda_r and its tokens."""
        spec, hp, stats, tokens = self.spec, self.hp, collections.defaultdict(float), 0
        for groups, pass_seqs, last in split_passes(micro_batches, seqs, self.rows // self.args.batch_size):
            if self.world > 1:
                fsdp_accumulate(self.model, last)       # gradients stay unsharded until the step's last pass
            with record_function("train::forward"):
                out, logits, n = self.layout.forward(self.compute, pass_seqs, spec["weights"], self.hooks[0])
                with record_function("train::reference"):
                    for view, kind in spec["ref"].items():
                        out["ref_" + view] = self.reference(view, kind, pass_seqs, logits.shape[1] - 1)
                L_f, L_r, lambdas, diagnostics = [], [], [], []
                for part in split_rows(out, [len(indices) for indices, _ in groups]):     # a loss micro-batch
                    loss_f, loss_r, part_stats = spec["fn"](part, {**hp, "lambda_r": lambda_r})
                    L_f.append(loss_f.mean())
                    L_r.append(loss_r.mean() if loss_r is not None else torch.zeros((), device=loss_f.device))
                    diagnostics.append(part_stats)
                    lambdas.append(lambda_r)
                    if spec.get("dual"):
                        lambda_r = spec["dual"](lambda_r, global_mean(part_stats, self.device), hp, epoch)
                loss, diagnostics = self.pass_loss(L_f, L_r, lambdas, diagnostics, groups, logits, len(pass_seqs))
                del out, logits, part           # the pass's logits freed as backward frees its graph (peak memory)
            with record_function("train::backward"):
                self.updates.backward(loss)
            tokens += n
            for part_stats, (_, weight) in zip(diagnostics, groups):
                for k, v in part_stats.items():
                    stats[k] = stats[k] + v * weight
        with record_function("train::clip"):
            grad_norm = self.updates.clip(self.args.clip)
        report = self.log.statistics(stats, lambda_r, grad_norm)        # on their way to the host
        self.updates.step(grad_norm)                                     # skipped where the norm is not finite
        return report, lambda_r, tokens

    def pass_loss(self, L_f, L_r, lambdas, diagnostics, groups, logits, views):
        """One pass's loss for its backward: each loss micro-batch g's lambda_f alpha_g L_f,g + lambda_r,g L_r,g
        (alpha: eq. 4 where the method balances, else 1) weighted by its share of the rank's pairs, summed;
        and each micro-batch's statistics. L_f, L_r, lambdas: a 0-dim tensor per micro-batch."""
        L_f, L_r, lambdas = torch.stack(L_f), torch.stack(L_r), torch.stack(lambdas)
        alpha = torch.ones_like(L_f)
        if self.spec.get("balance") and self.args.balance:
            sizes = [len(indices) for indices, _ in groups]
            alpha = balance_alpha(L_f, L_r, logits, row_groups(sizes, views, logits.shape[0] // views, self.device))
        losses_g = self.hp["lambda_f"] * alpha * L_f + lambdas * L_r
        weights = to_device(torch.tensor([weight for _, weight in groups]), L_f.device)
        stats = [{"loss": losses_g[g].detach(), "loss_forget": L_f[g].detach(), "loss_retain": L_r[g].detach(),
                  "alpha": alpha[g], **diagnostics[g]} for g in range(len(groups))]
        return (losses_g * weights).sum(), stats

    @torch.no_grad()
    def reference(self, view, kind, seqs, K):
        """Frozen-model outputs for one view, through the frozen model's layout for that output: sequence
        log-probs (NPO, DPO), per-token logits at K positions at least (JS, UNDIAL) or a layer's hidden states
        (RMU). Prompts change every epoch (fresh in-context turns), so nothing is cached across steps."""
        if kind == "seq_logprob":
            out, _, n = self.frozen[kind].forward(self.ref, {view: seqs[view]}, "uniform")
            self.ref_tokens += n
            return {"seq_logprob": losses.summed_logprob(out[view]["logits"], out[view]["labels"])}
        hook = self.hooks[1] if kind == "hidden" else None
        out, _, n = self.frozen[kind].forward(self.ref, {view: seqs[view]}, "uniform", hook, min_k=K)
        self.ref_tokens += n
        return {kind: out[view][kind]}

    def step_with_retry(self, *batch):
        """self.step; under --physical-batch auto on one process (plan["shrink"]: under FSDP one rank alone
        would change its passes and its collectives), redone from clean gradients with less memory (shrink)
        while a pass runs out of memory (the failed step changed nothing else: lambda_r is the loop's)."""
        while True:
            self.ref_tokens = 0
            try:
                return self.step(*batch)
            except torch.OutOfMemoryError:
                if not (self.plan["shrink"] and (self.can_recompute_more() or self.rows > self.args.batch_size)):
                    raise
            self.shrink()                       # outside the handler: its frames hold the pass's tensors

    def can_recompute_more(self):
        """Whether a decoder block is not yet recomputed in backward where blocks can be (eager: make_plan)."""
        blocks = decoder_layers(self.compute)
        return not self.plan["compile"] and not all(getattr(b, "recomputed", False) for b in blocks)

    def shrink(self):
        """After running out of memory: first every decoder block recomputed in backward (the same step in one
        pass; several passes would sum their gradients in fp32, 4 bytes a parameter more: Updates), then half
        the rows per forward pass, in whole loss micro-batches."""
        if self.can_recompute_more():
            self.recompute_all = True
            recompute_blocks(self.compute, len(decoder_layers(self.compute)))
            relief = "every decoder block recomputed in backward"
        else:
            batch_size = self.args.batch_size
            self.rows = max(batch_size, self.rows // 2 // batch_size * batch_size)
            self.build_layouts()                # filled rows follow; the frozen model's graphs free their memory
            relief = f"{self.rows} rows per forward pass"
        self.updates.discard()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        print0(f"[{self.stage_name}] out of memory: {relief} from now on")

    def checkpoint(self, step, lambda_r):
        """Save the resumable state after `step`. SUITE_CRASH_AFTER_CHECKPOINT=N stops the process right
        after the checkpoint of step N, as a kill at that moment would (the resume tests' fault injection)."""
        meta = {"stage": self.stage_index, "step": step, "lambda_r": lambda_r, "refusal": self.refusal,
                "rows": self.rows, "recompute_all": self.recompute_all}
        save_checkpoint(self.args.out, self.model, self.optimizer, meta, self.rank)
        if os.environ.get("SUITE_CRASH_AFTER_CHECKPOINT") == str(step):
            raise SystemExit(f"SUITE_CRASH_AFTER_CHECKPOINT: stopping abruptly after the checkpoint of step {step}")

    def export_stage(self, tokenizer, config):
        folder = Path(self.args.out) / self.stage_name
        if self.args.no_save:
            print0(f"[{self.stage_name}] --no-save: model not exported")
            return self.args.model
        export(self.model, tokenizer, config, folder, self.rank)
        print0(f"[{self.stage_name}] saved {folder}")
        return folder


class Updates:
    """Who owns the gradients and how an update is applied, decided once (the plan): the seam between the
    step and the compute copy. `model` holds the fp32 master weights (AdamW, checkpoints, export);
    `compute` runs forward and backward: with a bf16 compute copy (one device) it is refreshed from the
    masters after every step; else it is `model`.
    Under a compute copy no whole fp32 gradient exists in a step of one pass (the default): backward leaves
    bf16 gradients on the copy, clip takes their norm in fp32, and step upcasts and scales them into the
    masters' gradients OPTIMIZER_CHUNK_BYTES at a time, each chunk updated and freed before the next (the
    same update as from whole fp32 gradients: the upcast is exact, the scale the same product). A step of
    several passes sums them in fp32 buffers (each pass's bf16 gradients added in before the next backward),
    as does every step under --compile graphs (a graph's outputs, the gradients too, are overwritten by the
    next replay), there preallocated: the masters' buffers, or the model's own without a compute copy.
    Made after a checkpoint is loaded (DCP leaves an optimizer without state alone when grads exist)."""

    def __init__(self, model, compute, optimizer, plan):
        self.model, self.compute, self.optimizer, self.on_device = model, compute, optimizer, plan["gpu"]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shadow = ([(m, c) for m, c in zip(model.parameters(), compute.parameters()) if m.requires_grad]
                       if compute is not model else [])
        self.graphs = plan["compile"] == "graphs"
        self.kept = self.params if self.graphs else []      # preallocated fp32 buffers that backward adds into
        self.scale = None                                   # clip's factor, applied as step upcasts (one pass)
        self.grad_bytes = 0                                 # gradient bytes at the first step's clip (memory_report)
        self.chunks = chunked(self.shadow, OPTIMIZER_CHUNK_BYTES)  # step_in_chunks' AdamW calls
        copy_masters(self.shadow)
        for m in self.kept:
            m.grad = torch.zeros_like(m)

    def backward(self, loss):
        if self.pending():          # a step's second pass: the first's gradients summed in fp32 from now on
            self.fold()
        loss.backward()
        if self.shadow and self.graphs:
            self.fold()

    def pending(self):
        """Whether bf16 gradients wait on the compute copy (a compute copy's pass, not yet folded)."""
        return bool(self.shadow) and any(c.grad is not None for _, c in self.shadow)

    def fold(self):
        """Add the compute copy's bf16 gradients into the masters' fp32 ones (zeros first where a master has none
        yet), drop them. A master whose copy never got a gradient keeps none, as without a compute copy."""
        used = [(m, c) for m, c in self.shadow if c.grad is not None]
        for m, _ in used:
            if m.grad is None:
                m.grad = torch.zeros_like(m)
        torch._foreach_add_([m.grad for m, _ in used], [c.grad for _, c in used])
        self.compute.zero_grad(set_to_none=True)

    def clip(self, max_norm):
        """clip_grad_norm over the step's gradients; returns the norm. Gradients still on the compute copy
        (a step of one pass) are not scaled here but as step upcasts them."""
        if self.pending() and any(m.grad is not None for m, _ in self.shadow):
            self.fold()             # the last pass of several joins the fp32 sum
        if not self.grad_bytes:     # the first step's (memory_report)
            self.grad_bytes = local_bytes([p.grad for p in self.params] + [c.grad for _, c in self.shadow])
        if not self.pending():
            return clip_grad_norm(self.params, max_norm)
        grads = [c.grad for _, c in self.shadow if c.grad is not None]
        norm = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).square().sum().sqrt()
        self.scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        return norm

    def step(self, grad_norm):
        """AdamW's update unless the gradient norm is not finite (never let one bad batch poison the
        weights), clean gradients, and the compute copy refreshed."""
        if self.on_device:                  # decided on the device: fused AdamW skips where found_inf is 1
            self.optimizer.found_inf = (~torch.isfinite(grad_norm)).float()
        if self.on_device or math.isfinite(grad_norm.item()):
            try:
                if self.pending():
                    self.step_in_chunks()
                else:
                    self.optimizer.step()
            except torch.OutOfMemoryError as e:   # not to be retried: chunks updated before it would be again
                raise RuntimeError("out of memory in the optimizer's update (after the forward and backward "
                                   "passes); run with fewer --physical-batch rows") from e
        self.optimizer.zero_grad(set_to_none=not self.kept)
        if self.shadow:
            self.compute.zero_grad(set_to_none=True)
        self.scale = None
        copy_masters(self.shadow)

    def step_in_chunks(self):
        """The update from the compute copy's bf16 gradients, one chunk of fp32 gradients at a time: AdamW updates
        only the parameters that have a gradient, so each call updates one chunk. A master whose copy got no
        gradient (RMU's layers past its hook) gets none, as without a compute copy: no update, no weight decay."""
        for chunk in self.chunks:
            for m, c in chunk:
                m.grad = c.grad.float().mul_(self.scale) if c.grad is not None else None
                c.grad = None
            self.optimizer.step()
            for m, _ in chunk:
                m.grad = None

    def discard(self):
        """Drop the gradients of a step that failed (out of memory), to redo it."""
        if self.shadow:
            self.compute.zero_grad(set_to_none=True)
        for m in self.kept:
            m.grad.zero_()
        if not self.kept:
            self.model.zero_grad(set_to_none=True)
        self.scale = None


def chunked(shadow, max_bytes):
    """The (master, copy) pairs in consecutive chunks of at most `max_bytes` of fp32 gradients (a larger
    parameter alone)."""
    chunks, size = [], 0
    for m, c in shadow:
        if not chunks or size + 4 * m.numel() > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append((m, c))
        size += 4 * m.numel()
    return chunks


def copy_masters(shadow):
    """Copy the fp32 master weights into the bf16 compute copy (after every optimizer step)."""
    if shadow:
        with torch.no_grad():
            torch._foreach_copy_([c for _, c in shadow], [m for m, _ in shadow])


def global_mean(stats, device):
    """{name: 0-dim tensor or float} averaged over ranks in one all-reduce (unchanged on one process)."""
    if not dist.is_initialized() or not stats:
        return stats
    values = torch.stack([to_device(torch.as_tensor(v, dtype=torch.float32), device) for v in stats.values()])
    dist.all_reduce(values)
    return dict(zip(stats, values / dist.get_world_size()))


class StepLog:
    """log.jsonl and the progress lines, one step late: a step's statistics leave for the host behind its
    kernels (StepReport) and are read after the next step has been launched, so that the host never waits
    for the device. Also the checkpoint clock (its verdict travels with the statistics, so that every rank
    saves at the same step), the updates skipped for a non-finite gradient norm (every rank sees the same
    global norm; MAX_SKIPPED_IN_A_ROW in a row stop the run) and --profile-steps."""

    def __init__(self, trainer, start):
        # A weak reference: the trainer owns its log, and a cycle would keep a finished stage's models (and
        # their GPU memory) alive until the garbage collector runs, past the next stage's start.
        self.t, path = weakref.proxy(trainer), Path(trainer.args.out) / "log.jsonl"
        if trainer.rank == 0:
            truncate_log(path, trainer.stage_name, start)
        self.file = open(path, "a") if trainer.rank == 0 else None
        self.t0 = self.last_save = time.time()
        self.start, self.tokens_seen, self.pending, self.last_print = start, 0, None, 0.0
        self.skipped = self.skipped_in_a_row = 0
        self.profiler = StepProfiler(trainer, start) if trainer.args.profile_steps else None

    def begin(self, step):
        """Before optimizer step `step` (0-based)."""
        if self.profiler:
            self.profiler.begin(step)
        self.step_start = time.time()

    def statistics(self, stats, lambda_r, grad_norm):
        """A step's statistics averaged over ranks, lambda_r, the gradient norm and whether a checkpoint is
        due (--save-minutes since the last), on their way to the host."""
        args, device = self.t.args, self.t.device
        due = args.save_minutes > 0 and time.time() - self.last_save >= 60 * args.save_minutes
        synced = global_mean({**stats, "due": float(due)}, device)
        return StepReport([*synced, "lambda_r", "grad_norm"], torch.stack(
            [to_device(torch.as_tensor(v, dtype=torch.float32), device) for v in synced.values()]
            + [lambda_r.float(), grad_norm.float().to(device)]))

    def end(self, step, epoch, lr, report, tokens):
        """After optimizer step `step` (1-based): the previous step's line is written, whose statistics
        reached the host while this step was launched. Returns whether a checkpoint is due after this step
        (the same on every rank); its line is then written first."""
        t, now = self.t, time.time()
        self.tokens_seen += tokens
        record = {"stage": t.stage_name, "step": step, "epoch": epoch, "lr": lr, "step_time": now - self.step_start,
                  "time": now, "tokens_per_s": self.tokens_seen / (now - self.t0), "tokens": tokens,
                  "ref_tokens": t.ref_tokens, "physical_batch": t.rows, "peak_mem_gb": peak_memory_gb(t.device)}
        if t.ref_graphs:                             # the frozen model's passes so far: captured, replayed
            record["ref_graphs"] = [t.ref_graphs.captures, t.ref_graphs.replays]
        if self.profiler and step - 1 in self.profiler.window:
            record["profiled"] = True                # bench.py leaves these steps out of its means
        due = self.write(*self.pending) if self.pending else False
        self.pending = (record, report)
        if self.profiler:
            self.t0 += self.profiler.end(step - 1)    # its post-processing is not training time
        if step < t.total and due:
            self.write(*self.pending)
            self.pending = None
            return True
        return False

    def close(self):
        if self.pending:
            self.write(*self.pending)
        if self.file:
            self.file.close()

    def write(self, record, report):
        """A step's log.jsonl line and progress line, once its statistics are on the host. Returns whether
        a checkpoint is due."""
        step, t = record["step"], self.t
        launched = time.perf_counter()
        host = report.values()
        sync_wait = time.perf_counter() - launched         # ~0: the host, not the device, bounds the run
        grad_norm, due = host.pop("grad_norm"), host.pop("due") > 0
        if math.isfinite(grad_norm):
            self.skipped_in_a_row = 0
        else:                                               # the update was skipped (Updates.step)
            self.skipped += 1
            self.skipped_in_a_row += 1
            print0(f"[{t.stage_name}] step {step}: non-finite gradient norm, update skipped ({self.skipped} so far)")
        record.update(grad_norm=grad_norm, skipped_updates=self.skipped, sync_wait=sync_wait, **host)
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise RuntimeError(f"[{t.stage_name}] step {step}: {self.skipped_in_a_row} updates in a row "
                               "skipped for a non-finite gradient norm; the run is not training (stopped)")
        if t.rank == 0 and (time.time() - self.last_print > t.args.print_every or step == t.total):
            self.last_print = time.time()
            eta = (time.time() - self.t0) / (step - self.start) * (t.total - step)
            shown = " ".join(f"{k} {v:.4g}" for k, v in host.items())
            print0(f"[{t.stage_name}] step {step}/{t.total} ep {record['epoch'] + 1} lr {record['lr']:.2e} {shown} "
                   f"gnorm {grad_norm:.3g} {record['tokens_per_s']:.0f} tok/s eta {eta / 60:.1f} min")
        return due


class StepReport:
    """A step's statistics on their way to the host: copied into pinned memory behind the step's kernels
    and read (values()) after the next step has been launched, when the copy is long done."""

    def __init__(self, names, values):
        self.names, self.ready = names, None
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.host = values

    def values(self):
        if self.ready is not None:
            self.ready.synchronize()
        return dict(zip(self.names, self.host.tolist()))


def memory_report(trainer):
    """Where this rank's memory goes, after the stage's second step (GiB): what lives all run (fp32 masters,
    AdamW's two moments, the bf16 compute copy, the frozen model), the gradient bytes held when the step
    clipped (Updates.clip), and the peak; the rest of the peak is activations, logits and workspace."""
    def gib(tensors):
        return local_bytes(tensors) / 2**30

    parts = {"masters": gib(trainer.model.parameters()),
             "optimizer": gib(v for state in trainer.optimizer.state.values() for v in state.values()
                              if torch.is_tensor(v) and v.dim() > 0),
             "compute copy": gib(trainer.compute.parameters()) if trainer.compute is not trainer.model else 0.0,
             "frozen model": gib(trainer.ref.parameters()) if trainer.ref is not None else 0.0,
             "gradients": trainer.updates.grad_bytes / 2**30}
    peak = peak_memory_gb(trainer.device)
    where = "GPU peak" if trainer.device.type == "cuda" else "process peak RSS"
    return ("memory (GiB): " + ", ".join(f"{k} {v:.3g}" for k, v in parts.items())
            + f"; {where} {peak:.3g}, of which the rest {peak - sum(parts.values()):.3g}")


def local_tensor(t):
    return t.to_local() if isinstance(t, torch.distributed.tensor.DTensor) else t


def local_bytes(tensors):
    """Bytes of this rank's part of `tensors` (a DTensor's local shard; None left out)."""
    return sum(local_tensor(t).numel() * t.element_size() for t in tensors if t is not None)


def peak_memory_gb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20       # kB -> GiB


FLAG_RULES = {"epochs": data.AT_LEAST_ONE, "global_batch": data.AT_LEAST_ONE, "batch_size": data.AT_LEAST_ONE,
              "lr": data.POSITIVE, "lambda_f": data.NON_NEGATIVE, "lambda_r": data.NON_NEGATIVE,
              "weight_decay": data.NON_NEGATIVE, "clip": data.POSITIVE,
              "max_steps": (lambda v: v >= 1, ">= 1 (leave it out for the whole schedule)"),
              "profile_steps": data.NON_NEGATIVE, "profile_after": data.NON_NEGATIVE,
              "save_minutes": data.NON_NEGATIVE, "print_every": data.NON_NEGATIVE, "refusal": (lambda v: v.strip() != "", "auto, paper or a refusal sentence")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, choices=sorted(losses.METHODS))
    p.add_argument("--model", default="smollm2",
                   help="HF id, local folder, the alias smollm2, or random:<architecture> (random weights, speed tests)")
    p.add_argument("--topics", nargs="+", default=["challenger_disaster"], help="SUITE topic folders, or all")
    p.add_argument("--mode", choices=["single", "sequential", "joint"], default="single")
    p.add_argument("--data-root", default=str(data.DEFAULT_ROOT))
    p.add_argument("--out", default=None, help="run directory (default runs/<method>_<mode>); one that holds a run "
                   "takes only that run's command (to resume it), else an error naming what differs")
    p.add_argument("--recipe", choices=["suite", "lkf"], default="suite",
                   help="lkf: the paper's LKF* runs (appendix): the LKF* root (suite.py lkf), 10 epochs, random "
                        "forget/retain pairs, the hyperparameters of its LKF* table (losses.LKF_HPARAMS)")
    p.add_argument("--epochs", type=int, default=None, help="20 for unlearning, 10 for relearning and LKF* (paper)")
    p.add_argument("--global-batch", type=int, default=32,
                   help="forget/retain pairs per optimizer step over all processes (the authors' runs: 32, relearning too)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="loss micro-batch per process (default 4, relearning 8): the group over which the loss means "
                        "and JensUn++'s alpha are taken; gradients accumulate to --global-batch")
    p.add_argument("--physical-batch", default="auto",
                   help="rows per forward pass per process, a multiple of --batch-size: several loss micro-batches share "
                        "one forward and backward, each keeping its own means and alpha (the same computation, faster). "
                        "auto: the process's whole share of --global-batch; on one device, out of memory, every block recomputed, "
                        "then halved while it still runs out")
    add_objective_flags(p)
    add_run_and_speed_flags(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels where torch has them (torch.use_deterministic_algorithms; others "
                        "warn), so that a rerun reproduces the weights on the same hardware (the small block's injection)")
    p.add_argument("--trust-remote-code", action="store_true")
    return resolve_args(p.parse_args(argv))


def add_objective_flags(p):
    """The optimisation and the objective: learning rate, schedule, loss weights, refusal, ablations."""
    p.add_argument("--lr", type=float, default=None,
                   help="default: losses.HPARAMS for the model family (read from the model's config.json)")
    p.add_argument("--lambda-f", type=float, default=None)
    p.add_argument("--lambda-r", type=float, default=None)
    p.add_argument("--lr-schedule", choices=["linear", "cosine"], default="linear",
                   help="decay after the one-epoch linear warm-up: linear to 0 (the authors' runs) or cosine (the paper's text)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW, on weight matrices only")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--refusal", default="auto", help="auto (ask the model), paper, or a literal string")
    p.add_argument("--system-prompt", default=data.SYSTEM_PROMPT,
                   help="system message of every training sequence (default: the authors'); '' for none")
    p.add_argument("--no-balance", dest="balance", action="store_false", help="JensUn++ without eq. 4")
    # ablations of appendix C.1 (tab:ablation)
    p.add_argument("--no-prefix-mixing", dest="prefix_mixing", action="store_false",
                   help="JensUn++: always refuse from the first answer token (i = 0)")
    p.add_argument("--no-prefix-targets", dest="prefix_targets", action="store_false",
                   help="JensUn++: no loss on the answer-prefix positions")
    p.add_argument("--no-pairing", dest="pairing", action="store_false", help="random forget/retain pairs")
    p.add_argument("--exclude-retain", nargs="*", default=[], choices=["GK", "Syntax", "Lexical"],
                   help="train without these retain categories")
    p.add_argument("--retain-scope", choices=["stage", "seen"], default="stage",
                   help="sequential runs, an ablation (ours): the retain rows of the stage's own topic (the paper), "
                        "or of every topic seen so far, taken in turn with the same number of pairs "
                        "(data.PairedTrainSet's retain_topics)")
    p.add_argument("--relearn-set", default="retain_train",
                   help="what --method nll trains on: " + data.RELEARN_SETS + "; narrower bands are drawn to "
                        "forget_train's size per epoch (equal compute). inject: every question in every wording, "
                        "to give a small model the knowledge to unlearn; inject_train: the training files only "
                        "(forget_train, retain_train), so that evaluation asks wordings it never saw")


def add_run_and_speed_flags(p):
    """How the run goes: its length, checkpoints, precision, profiling, and the speed choices (make_plan)."""
    p.add_argument("--max-steps", type=int, default=None, help="stop each stage after this many steps (smoke runs)")
    p.add_argument("--save-minutes", type=float, default=10.0,
                   help="checkpoint when this many minutes have passed since the last one (0: never). A checkpoint "
                        "holds the fp32 weights and Adam's two moments, 12 bytes per parameter (38 GB for a 3B model)")
    p.add_argument("--print-every", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto", help="bf16 compute over fp32 "
                   "masters, or all fp32; auto: bf16 on a GPU or a CPU with AMX or AVX512-BF16 (model.choose_precision)")
    p.add_argument("--no-save", action="store_true", help="do not export the trained model (benchmarks)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="profile N optimizer steps after the warm-up with torch.profiler and write a summary "
                        "(RUN/profile_rank{r}.txt: kernel time by category, idle time, top kernels)")
    p.add_argument("--profile-after", type=int, default=5, metavar="W",
                   help="--profile-steps: the warm-up, steps done before profiling (the first full steps after it; "
                        "never the first step, which compiles, nor an epoch's short last step)")
    p.add_argument("--compile", nargs="?", const="blocks", choices=["blocks", "graphs"],
                   help="GPU speed: torch.compile each decoder block (blocks, the default of a bare --compile), "
                        "or the whole model for padded fixed shapes, replayed as CUDA graphs (graphs; one GPU)")
    p.add_argument("--no-packing", dest="packing", action="store_false",
                   help="left-pad every sequence to the pass's longest instead of packing several into a row "
                        "(model.packable: models whose every layer is full attention pack; the same losses up to "
                        "rounding, fewer padded positions)")
    p.add_argument("--recompute-blocks", default="0", metavar="N",
                   help="memory: the first N decoder blocks keep only their input for backward and run their forward "
                        "again there (activation checkpointing; the same gradients, slower); one device, eager. auto: "
                        "on one GPU (eager), the fewest that keep a step's estimated peak within --memory-gib: on an "
                        "H100, JensUn++ without back-off and with its graphs captured, 18%% slower a step (BENCHMARKS.md)")
    p.add_argument("--memory-gib", type=float, default=None, metavar="G",
                   help="--recompute-blocks auto: the GiB a step may peak at (default: 0.8 of the GPU's memory, "
                        "train.MEMORY_SHARE; without a GPU, none: no block recomputed unless it is given)")
    p.add_argument("--fsdp-regather", action="store_true",
                   help="under FSDP, gather each group's parameters again for its backward instead of keeping them "
                        "from its forward (less memory, slower)")
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                   help="attention on packed rows: SDPA's memory-efficient kernel (model.packed_sdpa_attention) or "
                        "transformers' eager attention; left-padded rows and --compile run eager")
    p.add_argument("--eager-reference", dest="reference_graphs", action="store_false",
                   help="run the frozen model's passes eagerly on a GPU, not replayed from CUDA graphs "
                        "(model.GraphedForward: a shape is captured the second time it is seen)")


def resolve_args(args):
    """Flag values checked, the method's defaults filled in (epochs, micro-batch, run folder)."""
    data.check_flags(args, FLAG_RULES)
    spec = losses.METHODS[args.method]
    if args.recipe == "lkf":
        if args.data_root == str(data.DEFAULT_ROOT):
            args.data_root = str(data.LKF_ROOT)
        args.pairing = False
    if data.is_lkf_root(args.data_root) and args.pairing and not spec.get("relearn"):
        raise data.UserError(f"--data-root {args.data_root} is an LKF* root: its forget and retain rows are not "
                             "paired; train on it with --recipe lkf (or --no-pairing)")
    args.epochs = args.epochs or (losses.LKF_EPOCHS if args.recipe == "lkf" else 10 if spec.get("relearn") else 20)
    args.batch_size = args.batch_size or (8 if spec.get("relearn") else 4)
    args.out = args.out or f"runs/{args.method}_{args.mode}"
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.global_batch % (args.batch_size * world):
        raise data.UserError(f"--global-batch {args.global_batch} is not a multiple of --batch-size {args.batch_size} x "
                             f"{world} process(es): the gradient accumulation would not be a whole number of micro-batches")
    args.physical_auto = args.physical_batch == "auto"
    args.physical_batch = physical_batch(args.physical_batch, args.batch_size, args.global_batch // world)
    if args.compile == "graphs" and spec.get("hidden"):
        print0(f"--compile graphs: {args.method} reads a hidden layer through a forward hook, which a compiled "
               "whole model cannot keep; compiling its blocks instead (--compile blocks)")
        args.compile = "blocks"
    if args.retain_scope == "seen" and args.mode != "sequential":
        raise data.UserError("--retain-scope seen is for --mode sequential (a joint run's retain set holds every topic)")
    if args.compile == "graphs" and world > 1:
        raise data.UserError("--compile graphs runs on one GPU; under torchrun (FSDP) use --compile blocks")
    if args.recompute_blocks != "auto":
        if not str(args.recompute_blocks).isdigit() or (int(args.recompute_blocks) and (world > 1 or args.compile)):
            raise data.UserError(f"--recompute-blocks {args.recompute_blocks}: auto or N >= 0, and N > 0 only on one "
                                 "device without --compile (the only way it is tested)")
        args.recompute_blocks = int(args.recompute_blocks)
    if args.memory_gib is not None and (args.memory_gib <= 0 or args.recompute_blocks != "auto"):
        raise data.UserError(f"--memory-gib {args.memory_gib}: a positive number of GiB, for --recompute-blocks auto "
                             "(what it sizes, on one device without --compile)")
    return args


def physical_batch(flag, batch_size, share):
    """Rows per forward pass: auto takes the process's whole share of the global batch; a number must
    hold whole loss micro-batches and is capped at the share."""
    if flag == "auto":
        return share
    try:
        rows = int(flag)
    except ValueError:
        raise data.UserError(f"--physical-batch {flag!r}: auto or a number of rows") from None
    if rows < batch_size or rows % batch_size:
        raise data.UserError(f"--physical-batch {rows} is not a multiple of --batch-size {batch_size}: "
                             "a forward pass holds whole loss micro-batches")
    return min(rows, share)


def main(argv=None):
    with data.one_line_errors("train.py"):
        args = parse_args(argv)
        previous = torch.are_deterministic_algorithms_enabled()
        if args.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")      # read when cuBLAS starts
            torch.use_deterministic_algorithms(True, warn_only=True)         # warns for ops that have no such kernel
        try:
            run(args)
        finally:
            torch.use_deterministic_algorithms(previous)


def check_inputs(args, stages):
    """Everything the run reads, checked before the model loads and before the run folder exists: the
    data files of every topic and the shared pools (data.DataError names file, line and field), a
    relearning run's --relearn-set, and the model."""
    data.load_pools(args.data_root)
    relearn = losses.METHODS[args.method].get("relearn")
    for _, topics in stages:
        for topic in topics:
            files = data.load_topic(topic, args.data_root)
            if relearn:
                data.relearn_band(files, args.relearn_set)          # a bad spec or an empty band: one line
    check_model(args.model)


# What a restart in a run's folder may change: how the run computes (another machine, more memory), not what it
# trains. Any other flag that differs from the folder's config.json makes the restart an error (check_same_run).
RESTART_MAY_CHANGE = {"out", "print_every", "save_minutes", "profile_steps", "profile_after", "physical_batch",
                      "physical_auto", "recompute_blocks", "memory_gib", "compile", "attention", "packing",
                      "reference_graphs", "fsdp_regather", "deterministic", "no_save", "trust_remote_code"}


def check_same_run(saved, args):
    """A command given an --out that already holds a run (its config.json) must be that run's (to resume it, or
    to find it done): else an error naming each setting that differs, before anything is read from the folder
    (its checkpoint, its refusal) or written to it."""
    differ = []
    for key, value in vars(args).items():
        here = json.loads(json.dumps(value))             # as config.json holds it (tuples as lists)
        if key in saved and key not in RESTART_MAY_CHANGE and key != "refusal" and saved[key] != here:
            differ.append(f"{key} {saved[key]!r} there, {here!r} here")
    if args.refusal not in ("auto", "paper") and saved.get("refusal") not in (None, args.refusal):
        differ.append(f"refusal {saved['refusal']!r} there, {args.refusal!r} here")
    if differ:
        raise data.UserError(f"--out {args.out} holds another run ({'; '.join(differ)}): give its own command to "
                             "resume or rerun it, or another --out")


def run(args):
    rank, world, device = setup_distributed()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    stages = stages_for(args)
    check_inputs(args, stages)
    args.precision, why = choose_precision(args.precision, device)
    print0(f"precision {args.precision} ({why})")             # the first line of a run that starts
    plan = make_plan(args, device, world)
    print0(describe_plan(plan))
    family = model_family(args.model)                   # from its config.json (no weights loaded)
    hp = hparams_for(args, family)
    out = Path(args.out)
    if (out / "config.json").exists():
        check_same_run(json.loads((out / "config.json").read_text()), args)
    if rank == 0:
        recover_checkpoint(out)
    if dist.is_initialized():
        dist.barrier()
    resume = read_checkpoint_meta(out)
    refusal, loaded = run_refusal(args, family, device, resume)       # loaded: the starting model, if detection loaded it
    config = {**vars(args), "hparams": {k: v for k, v in hp.items() if k != "control_vector"},
              "family": family, "refusal": refusal, "world_size": world,
              "stages": [name for name, _ in stages]}
    out.mkdir(parents=True, exist_ok=True)              # only now: a run that cannot start leaves no folder
    if rank == 0:
        (out / "config.json").write_text(json.dumps(config, indent=1))
    print0(f"method {args.method} ({family}) hp {config['hparams']} refusal {refusal!r}")

    # relief: out of memory, less memory from then on (Trainer.shrink), kept by the checkpoint for a resume
    model_path = args.model
    relief = {"rows": resume.get("rows"), "recompute_all": resume.get("recompute_all", False)} if resume else {}
    for index, (name, topics) in enumerate(stages):
        folder = out / name
        if (folder / "config.json").exists() and not (resume and resume["stage"] == index):
            print0(f"[{name}] already done: {folder}")
            model_path, loaded = str(folder), None
            continue
        trainer = Trainer(args, rank, world, device, plan, **relief)       # one a stage
        model_path = str(trainer.run_stage(index, name, topics, model_path, refusal, hp, resume, loaded))
        relief = {"rows": trainer.rows, "recompute_all": trainer.recompute_all}
        del trainer             # and its models collected now: a recomputed block's or lean MLP's forward refers to
        gc.collect()            # its module (a cycle), which would keep them alive into the next stage's build
        resume = loaded = None
        if args.compile == "graphs":
            torch.compiler.reset()          # free the stage's compiled code and CUDA graph memory
        if rank == 0 and not args.no_save:
            shutil.rmtree(out / "checkpoint", ignore_errors=True)
            (Path(model_path) / "train_config.json").write_text(json.dumps(config, indent=1))
    print0(f"done: checkpoint(s) under {out}: {', '.join(name for name, _ in stages)}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
