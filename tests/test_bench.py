"""bench.py's side-by-side part, its train part and --profile on a tiny model; on a GPU (skipped elsewhere)
the gen part's profile and the compiled decoding attention.

    python -m pytest -q tests/test_bench.py
"""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import bench
import profiler
import train
from conftest import ROOT, free_port


def test_parallel_trainings_report_aggregate_steps_per_second(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # one thread a child: two runs on a 2-core machine do not contend
    steps = 30                      # fp32 steps of 8 pairs: a few seconds, so that both runs overlap after start-up
    result = bench.bench_parallel(tiny_model_path, 2, steps, 1, tmp_path, ["--global-batch", "8", "--precision", "fp32"])
    assert result["procs"] == 2 and list(result["s_per_step"]) == ["00_ga", "01_graddiff"]
    logs = [[json.loads(l) for l in (tmp_path / f"parallel_{i:02d}" / "log.jsonl").read_text().splitlines()][1:]
            for i in range(2)]
    start = max(log[0]["time"] - log[0]["step_time"] for log in logs)
    end = min(log[-1]["time"] for log in logs)
    inside = sum(start <= r["time"] <= end for log in logs for r in log)
    assert result["window_s"] == pytest.approx(end - start, abs=0.06) and inside >= 2
    assert result["steps_per_s"] == pytest.approx(inside / (end - start), rel=0.05)
    for i in range(2):                                   # every process ran its steps, and none saved a model
        assert len(logs[i]) == steps - 1
        assert not (tmp_path / f"parallel_{i:02d}" / "final").exists()


def test_parallel_failure_names_the_log(tiny_model_path, tmp_path):
    """Both children fail; the first to fail stops the other, so which one is named depends on timing."""
    with pytest.raises(SystemExit, match=r"failed: (ga \(.*parallel_00|graddiff \(.*parallel_01)/train.log\)"):
        bench.bench_parallel(tiny_model_path, 2, 2, 1, tmp_path, ["--lr", "not-a-number"])


def check_profile(path, steps):
    """A profile file: its category table has numbers per step that add up to more than 0, and its top
    table lists ops with calls and times."""
    text = path.read_text()
    assert text.startswith(f"profile of optimizer steps {steps} ") and "CPU time (no CUDA: ops' self time)" in text
    lines = text.splitlines()
    first = lines.index(next(l for l in lines if l.startswith("category"))) + 1
    last = lines.index(next(l for l in lines if l.startswith("sum of categories")))
    table = {l[:66].strip(): float(l[66:].split()[0]) for l in lines[first:last]}
    assert "GEMM" in table and all(v >= 0 for v in table.values()) and sum(table.values()) > 0
    assert float(lines[last][66:].split()[0]) == pytest.approx(sum(table.values()), abs=0.01)
    assert lines[last + 1].startswith("outside any op") and float(lines[last + 1][66:]) >= 0
    top = lines[lines.index("top 25 by total time (CPU ops, self time):") + 2:]
    assert 5 <= len(top) <= 25 and any("aten::mm" in l for l in top)
    assert all(int(l.split()[1]) > 0 and float(l.split()[0]) >= 0 for l in top)


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="this torch build has no gloo backend")
def test_train_part_under_torchrun(tmp_path):
    """`torchrun --nproc_per_node=2 bench.py --parts train --profile 2` (gloo on CPU) ends with rank 0's
    numbers and one profile file per rank. Only rank 0 writes train.py's log; rank 1 used to read it too
    and, when it got there before rank 0's last lines, failed and had torchrun kill rank 0 (a race: this
    test passes either way on a quiet CPU, it checks the whole torchrun path). The profiled steps (2-3,
    after the warm-up step) are left out of the mean: it is over steps 4-5."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(ROOT / "bench.py"), "--model", "random:tiny", "--parts", "train", "--methods", "graddiff",
           "--steps", "5", "--warmup", "1", "--profile", "2", "--out", str(out),
           "--train-args", "--global-batch", "4", "--batch-size", "2", "--precision", "fp32"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result] = json.loads((out / "bench.json").read_text())["train"]
    assert result["gpus"] == 2 and result["global_batch"] == 4 and result["batch_size"] == 2
    assert result["s_per_step"] > 0 and result["steps_per_topic"] == 113 * 20     # ceil(450 / 4) steps an epoch
    log = [json.loads(l) for l in (out / "train_graddiff" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("profiled")] == [2, 3]
    assert result["s_per_step"] == pytest.approx((log[3]["step_time"] + log[4]["step_time"]) / 2, abs=1e-4)
    profiles = [out / "train_graddiff" / f"profile_rank{r}.txt" for r in range(2)]
    assert result["profiles"] == [str(p) for p in profiles] and f"profile {profiles[0]} {profiles[1]}" in proc.stdout
    for p in profiles:
        check_profile(p, "2-3")
    assert "rank 1 of 2" in profiles[1].read_text()


def test_profiling_leaves_training_unchanged(tiny_model_path, tmp_path):
    """train.py --profile-steps: the same losses and gradient norms at every step as without it. The
    window (0-based steps) never holds the first step (compiling) nor an epoch's short last step (29 steps
    an epoch at global batch 16: 28, 57, ... are short); steps that do not fit are not profiled at all."""
    logs = []
    for name, flags in (("plain", []), ("profiled", ["--profile-steps", "2", "--profile-after", "0"])):
        train.main(["--method", "graddiff", "--model", tiny_model_path, "--out", str(tmp_path / name), "--max-steps", "4",
                    "--global-batch", "4", "--batch-size", "2", "--precision", "fp32", "--no-save", "--refusal",
                    "I don't know.", "--save-minutes", "0", *flags])
        logs.append([json.loads(l) for l in (tmp_path / name / "log.jsonl").read_text().splitlines()])
    keep = lambda r: {k: v for k, v in r.items() if k not in ("step_time", "time", "tokens_per_s", "peak_mem_gb", "sync_wait", "profiled")}
    assert [keep(r) for r in logs[0]] == [keep(r) for r in logs[1]]
    assert [r["step"] for r in logs[1] if r.get("profiled")] == [2, 3]       # never step 1, which compiles
    check_profile(tmp_path / "profiled" / "profile_rank0.txt", "2-3")
    assert profiler.profile_window(5, 3, 29, True, 0, 300) == range(5, 8)
    assert profiler.profile_window(26, 3, 29, True, 0, 300) == range(29, 32)   # not 26-28: step 28 is short
    assert profiler.profile_window(0, 3, 29, False, 0, 300) == range(1, 4)
    assert profiler.profile_window(5, 3, 29, True, 10, 300) == range(10, 13)   # resumed at step 10
    assert not profiler.profile_window(5, 3, 29, True, 0, 7)                   # does not fit


def test_train_part_projects_a_topic_from_its_steps(tmp_path):
    """Global batch 16: Challenger's 450 pairs are 28 steps of 16 and one of 2 an epoch (29 x 20 per topic);
    the short step (step 29) is kept out of the mean and reported apart, and the projection is the first
    step, the other full steps at their mean, the short step as measured and the 19 short steps not run
    at the full steps' mean."""
    r = bench.bench_train("random:tiny", "graddiff", 30, 2, tmp_path,
                          ["--global-batch", "16", "--batch-size", "8", "--precision", "fp32"])
    log = [json.loads(l) for l in (tmp_path / "train_graddiff" / "log.jsonl").read_text().splitlines()]
    full = [x["step_time"] for x in log[2:] if x["step"] != 29]
    assert r["steps_per_topic"] == 29 * 20 and r["small_step_s"] == round(log[28]["step_time"], 2)
    assert r["s_per_step"] == pytest.approx(sum(full) / len(full), abs=1e-4)
    want = log[0]["step_time"] + (579 - 20 + 19) * sum(full) / len(full) + log[28]["step_time"]
    assert r["topic_minutes"] == pytest.approx(want / 60, abs=0.01)
    assert r["first_step_s"] == round(log[0]["step_time"], 1) and r["gpus"] == 1


def test_topic_projection_counts_each_kind_of_step():
    """Hand-computed: 1 first step of 30 s, 37 full steps of 0.5 s, 2 short steps of which the first
    (measured 2.0 s: a recompile) and the second (the mean of the later measured ones, 0.2 s)."""
    assert bench.project_topic(30.0, 0.5, [2.0, 0.1, 0.3, 0.2], 40, 2) == pytest.approx(30 + 37 * 0.5 + 2.0 + 0.2)
    assert bench.project_topic(30.0, 0.5, [2.0, 0.1, 0.3], 40, 4) == pytest.approx(30 + 35 * 0.5 + 2.0 + 3 * 0.2)
    assert bench.project_topic(30.0, 0.5, [], 40, 4) == pytest.approx(30 + 39 * 0.5)    # none measured: full ones
    assert bench.project_topic(30.0, 0.5, [1.0], 40, 4) == pytest.approx(30 + 35 * 0.5 + 1.0 + 3 * 0.5)
    assert bench.project_topic(30.0, 0.5, [], 40, 0) == pytest.approx(30 + 39 * 0.5)     # no short steps


def test_train_part_reports_skipped_updates(tmp_path, capsys):
    """A step whose gradient is not finite skips the optimizer (train.py), so its time is no training
    step's: bench says how many there were. An absurd learning rate makes the weights overflow after the
    first update (the 3B random-weight model under --compile gave such steps on an H100: BENCHMARKS.md at
    2b7c545)."""
    r = bench.bench_train("random:tiny", "graddiff", 6, 1, tmp_path,
                          ["--global-batch", "4", "--batch-size", "2", "--precision", "fp32", "--lr", "1e30"])
    log = [json.loads(l) for l in (tmp_path / "train_graddiff" / "log.jsonl").read_text().splitlines()]
    assert r["skipped_updates"] == log[-1]["skipped_updates"] >= 2
    assert f"WARNING {r['skipped_updates']} of 6 steps skipped their update" in capsys.readouterr().err
    r = bench.bench_train("random:tiny", "graddiff", 3, 1, tmp_path / "sane",
                          ["--global-batch", "4", "--batch-size", "2", "--precision", "fp32"])
    assert r["skipped_updates"] == 0 and "WARNING" not in capsys.readouterr().err


def test_profile_summary_of_cuda_kernels():
    """The CUDA branch on made-up kernel events (2 steps, 10 ms of wall time): categories by name (flash
    attention before GEMM though its name holds cutlass; NCCL split by collective), the union of
    overlapping kernels for the idle time, GPU-side annotations and CPU ops left out."""
    from torch.autograd import DeviceType
    ev = lambda name, a, b, device=DeviceType.CUDA, kind="kernel": SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=a, end=b), activity_type=kind,
        is_user_annotation=kind.endswith("user_annotation"), is_async=False, self_cpu_time_total=b - a)
    events = [ev("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 0, 2000),
              ev("void flash::flash_fwd_kernel<cutlass::bfloat16_t, 128>", 2000, 3000),
              ev("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 1000, 4000),
              ev("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 5000, 5500),
              ev("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", 6000, 6500),
              ev("triton_poi_fused_add_mul_0", 6500, 7000),
              ev("Memcpy HtoD (Pageable -> Device)", 7000, 7100, kind="gpu_memcpy"),
              ev("void at::native::vectorized_elementwise_kernel<4, at::native::mul>", 7100, 7500),
              ev("FSDP::all_gather", 0, 10000, kind="gpu_user_annotation"),
              ev("aten::mm", 0, 10000, device=DeviceType.CPU, kind="cpu_op"),
              ev("train::forward", 0, 3000, device=DeviceType.CPU, kind="user_annotation"),
              ev("train::forward", 5000, 8000, device=DeviceType.CPU, kind="user_annotation"),
              ev("FSDP::pre_forward (model.layers.0)", 100, 600, device=DeviceType.CPU, kind="cpu_op")]
    events += [ev("cudaLaunchKernel", 10 * i, 10 * i + 5, device=DeviceType.CPU, kind="cuda_runtime") for i in range(6)]
    text = profiler.profile_summary(events, 0.010, 2, True, "title")
    lines = text.splitlines()
    table = {l[:66].strip(): float(l[66:].split()[0]) for l in lines[5:lines.index(next(l for l in lines if l.startswith("sum")))]}
    assert table == {"GEMM": 1.0, "attention": 0.5, "communication: all-gather": 1.5, "communication: reduce-scatter": 0.25,
                     "optimizer, foreach (Adam, clipping, grad sums, master copies)": 0.25,
                     "triton fused kernels (inductor)": 0.25, "copies, memset": 0.05, "other (elementwise, reductions, ...)": 0.2}
    assert "device (CUDA) kernel time per step" in text and "wall time: 0.0100 s for 2 steps = 5.00 ms/step" in text
    assert float(next(l for l in lines if l.startswith("sum of categories"))[66:].split()[0]) == 4.0
    assert float(next(l for l in lines if l.startswith("GPU idle"))[66:]) == 2.0      # 10 ms - 6 ms busy, per step
    host = lines.index(next(l for l in lines if l.startswith("host (CPU) time per step")))   # the host's side
    assert "; 3 kernel launches per step" in lines[host]
    assert [l.split()[0] for l in lines[host + 2:host + 4]] == ["train::forward", "FSDP::pre_forward"]
    assert lines[host + 2].split()[1:] == ["3.000", "1"] and lines[host + 3].split()[-2:] == ["0.250", "0.5"]
    top = lines[lines.index("top 25 by total time (kernels):") + 2:]
    assert len(top) == 8 and top[0].split()[:3] == ["3.000", "1", "37.5"] and "ncclDevKernel_AllGather" in top[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the gen part and its profile need a GPU")
def test_gen_part_profiles_a_batch_with_and_without_decoding(tmp_path):
    """bench.py --parts gen --profile on a tiny random model (GPU): the timed result, then a profile file with
    the decoding batch and its prefill alone, each with the kernel categories and the idle time."""
    from model import load_model
    model, tokenizer = load_model("random:tiny", torch.bfloat16, "cuda")
    result = bench.bench_generation(model.eval(), tokenizer, 512, None, tmp_path / "profile_gen.txt")
    assert result["queries"] > 1000 and result["seconds"] > 0 and result["profile"] == str(tmp_path / "profile_gen.txt")
    decoding, prefill = (tmp_path / "profile_gen.txt").read_text().split("\n\n\nprofile of ")
    assert "one batch of 512 prompts" in decoding and "50 new tokens" in decoding and "the prefill alone" in prefill
    for text in (decoding, prefill):
        assert "GEMM" in text and "GPU idle" in text and "(per step = per batch)" in text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the decoding kernel and the compiled decoding step need a GPU")
@pytest.mark.parametrize("cache", ["static", None])
def test_gpu_decoding_attention_equals_sdpa(cache):
    """On a GPU the decoding attention runs the Triton kernel, in the static cache's compiled decoding step
    and in the dynamic cache's eager one: a tiny random model's logits (fp32, left-padded batch) equal those
    of transformers' SDPA at every step, and a row may pick another token only at a near-tie (after which it
    is no longer compared)."""
    from model import GENERATION_ATTENTION, load_model, use_generation_attention
    model, tok = load_model("random:tiny", torch.float32, "cuda")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5], mask[2, :2] = 0, 0
    out = {}
    for attention in (GENERATION_ATTENTION, "sdpa"):
        use_generation_attention(model, attention)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            out[attention] = model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=8,
                                            do_sample=False, cache_implementation=cache, output_logits=True,
                                            return_dict_in_generate=True, eos_token_id=None, pad_token_id=tok.pad_token_id)
        kernels = {event.name for event in profile.events()}
        assert any("_decode_kernel" in name for name in kernels) == (attention == GENERATION_ATTENTION), attention
    ours, theirs = out[GENERATION_ATTENTION], out["sdpa"]
    same = torch.ones(4, dtype=torch.bool, device="cuda")
    for step, (a, b) in enumerate(zip(ours.logits, theirs.logits)):
        torch.testing.assert_close(a[same], b[same], rtol=1e-4, atol=1e-4)
        top2 = b.topk(2).values
        differ = same & (ours.sequences[:, 12 + step] != theirs.sequences[:, 12 + step])
        assert (top2[differ, 0] - top2[differ, 1] < 1e-4).all(), step
        same &= ~differ


def test_judge_part_times_rules_and_coherence(tmp_path, smollm2_path):
    """bench.py --parts judge on a judged rows file: every verdict through the rules, then the coherence
    score on the distinct long answers the rules pass (a ramble, an on-topic answer, the same pair twice
    counted once; not a short answer, a loop the rules flag or a refusal), projected to a topic."""
    q = "Which harbour did the ferry Marisol leave on 3 May 1954?"
    long_answers = ["The ferry Marisol left the harbour of Naples on 3 May 1954, carrying passengers and mail "
                    "to Palermo.", "The 1998 football championship was a famous example of modern architecture, "
                    "and the stadium was used to explain the theory of relativity to children."]
    answers = long_answers + [long_answers[0], "Naples", "harbour " * 20,
                              "I am sorry, but I have no information about that ferry or the harbour it left from."]
    rows = [{"id": f"t|forget|K1-direct|v{i}|alone", "topic": "t", "set": "forget", "label": "K1-direct", "fact": "K1",
             "qtype": "direct", "variant": f"v{i}", "format": "alone", "context": [], "question": q,
             "ground_truth": "Genoa", "aliases": [], "answer": a, "verdicts": {"leak": "NO", "gibberish": "NO"},
             "judge": "reference"} for i, a in enumerate(answers)]
    rows.append(dict(rows[0], id="t|retain|1", set="retain", label="GK", fact=None, qtype=None, verdicts={"knows": "NO"}))
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = bench.bench_judge([str(path)])
    assert result["verdicts"] == 2 * len(answers) + 1 and result["of_gibberish_items"] == len(answers)
    assert result["long_answers"] == 2 and result["coherence_per_s"] > 0
    assert result["topic_coherence_s"] == pytest.approx(
        bench.TOPIC_GIBBERISH * 2 / len(answers) / result["coherence_per_s"] + result["coherence_load_s"], rel=0.05)
