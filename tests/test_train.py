"""Training end to end on tiny models: every method, export round trip, resume, accumulation, FSDP.

    python -m pytest tests/test_train.py -q
"""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import data
import losses
import train
from conftest import FIXTURE, ROOT

REFUSAL = "Unfortunately, I cannot answer that."


def weights(folder):
    return load_file(str(Path(folder) / "model.safetensors"))


def run(tiny, out, method, *extra):
    args = ["--method", method, "--model", tiny, "--data-root", str(FIXTURE), "--out", str(out),
            "--precision", "fp32", "--refusal", REFUSAL, "--print-every", "0", *extra]
    train.main(args)
    return [json.loads(line) for line in open(Path(out) / "log.jsonl")]


@pytest.mark.parametrize("method", sorted(losses.METHODS))
def test_every_method_trains_on_tiny_model(tiny_model_path, tmp_path, method):
    extra = ["--lr", "1e-3", "--max-steps", "3"]
    if method == "rmu":
        extra += ["--lr", "1e-2"]
    log = run(tiny_model_path, tmp_path / method, method, *extra)
    assert len(log) == 3
    for rec in log:
        assert all(math.isfinite(v) for v in rec.values() if isinstance(v, float)), rec
    before, after = weights(tiny_model_path), weights(tmp_path / method / "final")
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert changed, f"{method}: no parameter changed"
    if method == "rmu":   # all parameters train (the authors' runs), not only the MLPs around layer 7
        assert any("layers.0.self_attn" in k for k in changed) and "model.embed_tokens.weight" in changed, changed


def test_loss_goes_down_and_export_round_trip(tiny_model_path, tmp_path):
    """30 steps of fine-tuning at a high learning rate: the loss falls; the exported folder reloads
    with from_pretrained and gives the trained model's logits."""
    out = tmp_path / "run"
    log = run(tiny_model_path, out, "nll", "--lr", "1e-2", "--max-steps", "30", "--global-batch", "8")
    first = sum(r["loss"] for r in log[:5]) / 5
    last = sum(r["loss"] for r in log[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    fresh.load_state_dict(weights(out / "final"), strict=False)
    ids = torch.tensor([[1, 5, 9, 200, 17]])
    assert torch.allclose(model(ids).logits, fresh(ids).logits)
    cfg = json.loads((out / "final" / "train_config.json").read_text())
    assert (cfg["epochs"], cfg["batch_size"], cfg["global_batch"]) == (10, 8, 8)
    defaults = train.parse_args(["--method", "nll"])
    assert (defaults.epochs, defaults.batch_size, defaults.global_batch) == (10, 8, 32)   # the authors' relearning


def test_gradient_accumulation_equivalence(tiny_model_path, tmp_path):
    """Losses that average per example (JensUn++, NPO's forget term) give the same update from 2
    micro-batches of 2 as from 1 of 4 at a global batch of 4. The baselines' token means are per
    micro-batch (the authors' reduction), so for them the micro-batch size is part of the objective."""
    for method, extra in (("jensunpp", []), ("npo", ["--lambda-r", "0"])):
        common = ["--lr", "1e-3", "--max-steps", "2", "--global-batch", "4", *extra]
        run(tiny_model_path, tmp_path / f"a{method}", method, *common, "--batch-size", "4")
        run(tiny_model_path, tmp_path / f"b{method}", method, *common, "--batch-size", "2")
        a, b = weights(tmp_path / f"a{method}" / "final"), weights(tmp_path / f"b{method}" / "final")
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-6), (method, k)
    graddiff = [run(tiny_model_path, tmp_path / f"g{bs}", "graddiff", "--lr", "1e-3", "--max-steps", "1",
                    "--global-batch", "4", "--batch-size", bs)[0]["loss"] for bs in ("4", "2")]
    assert graddiff[0] != pytest.approx(graddiff[1], rel=1e-6)      # a token mean over 4 is not the mean of two over 2


def test_kill_and_resume_equals_uninterrupted(tiny_model_path, tmp_path, monkeypatch):
    args = ("--lr", "1e-3", "--max-steps", "6", "--save-every", "2")
    run(tiny_model_path, tmp_path / "full", "pdu", *args)
    monkeypatch.setenv("SUITE_CRASH_AFTER_STEP", "3")          # dies like a killed process at step 3
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert not (tmp_path / "killed" / "final").exists()
    meta = json.loads((tmp_path / "killed" / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 2 and meta["lambda_r"] == 1.0
    monkeypatch.delenv("SUITE_CRASH_AFTER_STEP")
    log = run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]         # step 3 of the killed run dropped on resume
    full = [json.loads(line) for line in open(tmp_path / "full" / "log.jsonl")]
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full], rel=1e-5)   # one run, as if never killed
    a, b = weights(tmp_path / "full" / "final"), weights(tmp_path / "killed" / "final")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    assert not (tmp_path / "killed" / "checkpoint").exists()


def test_checkpoint_clock_and_deterministic_flag(tiny_model_path, tmp_path, monkeypatch):
    """--save-minutes checkpoints by wall time (a tiny interval: after every step), 0 never;
    --deterministic switches torch's deterministic mode on for the run only."""
    monkeypatch.setenv("SUITE_CRASH_AFTER_STEP", "3")
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "clock", "graddiff", "--max-steps", "5", "--save-minutes", "1e-9",
            "--deterministic")
    assert not torch.are_deterministic_algorithms_enabled()
    assert json.loads((tmp_path / "clock" / "checkpoint" / "meta.json").read_text())["step"] == 3
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "never", "graddiff", "--max-steps", "5", "--save-minutes", "0")
    assert not (tmp_path / "never" / "checkpoint").exists()
    monkeypatch.delenv("SUITE_CRASH_AFTER_STEP")
    log = run(tiny_model_path, tmp_path / "clock", "graddiff", "--max-steps", "5", "--save-minutes", "1e-9")
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5]            # resumed after step 3


def test_bf16_compute_copy_keeps_fp32_masters_and_resumes(tiny_model_path, tmp_path, monkeypatch):
    """--precision bf16 runs forward and backward on a bf16 copy and updates fp32 masters: steps of
    ~1e-7 (far below bf16's spacing at these weights) survive in the exported fp32 weights, and a
    killed-and-resumed bf16 run ends where the uninterrupted one does (the copy is rebuilt from the
    masters)."""
    args = ("--lr", "1e-7", "--max-steps", "4", "--save-every", "2", "--precision", "bf16")
    log = run(tiny_model_path, tmp_path / "full", "jensunpp", *args)
    assert all(math.isfinite(r["loss"]) for r in log)
    before, after = weights(tiny_model_path), weights(tmp_path / "full" / "final")
    step = max((after[k] - before[k]).abs().max().item() for k in after)
    assert 0 < step < 1e-5, step
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    assert any(not torch.equal(after[k], after[k].bfloat16().float()) for k in moved)
    monkeypatch.setenv("SUITE_CRASH_AFTER_STEP", "3")
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "killed", "jensunpp", *args)
    monkeypatch.delenv("SUITE_CRASH_AFTER_STEP")
    run(tiny_model_path, tmp_path / "killed", "jensunpp", *args)
    resumed = weights(tmp_path / "killed" / "final")
    for k in after:
        assert torch.equal(after[k], resumed[k]), k


def test_non_finite_gradient_skips_the_update(tiny_model_path, tmp_path, monkeypatch):
    """A batch whose gradient is NaN (seen on CUDA) is not applied: the step is logged as skipped and
    the weights stay finite."""
    calls = []
    original = losses.METHODS["nll"]["fn"]

    def poisoned(out, hp):
        loss_f, loss_r, stats = original(out, hp)
        calls.append(1)
        return (loss_f * float("nan") if len(calls) == 2 else loss_f), loss_r, stats

    monkeypatch.setitem(losses.METHODS["nll"], "fn", poisoned)
    log = run(tiny_model_path, tmp_path / "run", "nll", "--lr", "1e-3", "--max-steps", "3", "--batch-size", "32")
    assert [r["skipped_updates"] for r in log] == [0, 1, 1]
    assert all(torch.isfinite(w).all() for w in weights(tmp_path / "run" / "final").values())


def test_sequential_two_topics(tiny_model_path, tmp_path, two_topic_root):
    root = two_topic_root
    out = tmp_path / "seq"
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(root), "--out", str(out),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--refusal", REFUSAL, "--max-steps", "2", "--lr", "1e-3"])
    s1, s2 = weights(out / "stage1_challenger_disaster"), weights(out / "stage2_salem_witch_trials")
    assert any(not torch.equal(s1[k], s2[k]) for k in s1)
    stages = [json.loads(l)["stage"] for l in open(out / "log.jsonl")]
    assert stages == ["stage1_challenger_disaster"] * 2 + ["stage2_salem_witch_trials"] * 2
    # rerunning the finished command does nothing new
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(root), "--out", str(out),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--refusal", REFUSAL, "--max-steps", "2", "--lr", "1e-3"])
    assert len(open(out / "log.jsonl").readlines()) == 4


def test_labels_cover_answer_and_end_of_turn_only(smollm2_path):
    """Masks come from positions: SmolLM2's pad equals its end-of-turn token, which must stay labelled."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    prompt = data.prompt_ids(tok, "What is 2+2?", [("Capital of France?", "Paris")])
    answer = data.answer_ids(tok, "4")
    assert tok.decode(answer[-1:]) == "<|im_end|>"
    batch = data.collate([data.sequence(prompt, answer), data.sequence(prompt[:5], answer + answer)], tok.pad_token_id)
    labels = batch["labels"]
    assert labels[0].tolist() == [data.IGNORE] * (labels.shape[1] - len(answer)) + answer
    assert labels[1].tolist() == answer + answer
    full = tok.apply_chat_template([{"role": "system", "content": data.SYSTEM_PROMPT},
                                    {"role": "user", "content": "Capital of France?"},
                                    {"role": "assistant", "content": "Paris"},
                                    {"role": "user", "content": "What is 2+2?"},
                                    {"role": "assistant", "content": "4"}], tokenize=False)
    assert full.startswith(tok.decode(prompt + answer))          # the training system message first
    assert data.SYSTEM_PROMPT not in tok.decode(data.prompt_ids(tok, "What is 2+2?", system=""))   # --system-prompt ""


def test_smollm2_jensunpp_forget_loss_falls(smollm2_path, fixture_root, tmp_path):
    """JensUn++ on the real SmolLM2-135M-Instruct: the forget JS falls within a few steps, and alpha
    follows eq. 4's rule: exactly 1 while a loss is at or below epsilon (at step 1 the policy is the
    frozen model, so the retain JS is ~1e-8), the logit-gradient ratio (positive, not 1) once both
    exceed it; the checkpoint is written. The topic is cut to 4 pairs and one step is one epoch, so every
    step sees the same pairs, and one micro-batch per step makes the logged losses alpha's own."""
    final = fixture_root / "challenger_disaster" / "final"
    for name in ("forget_train", "retain_train"):
        lines = (final / f"{name}.json").read_text().splitlines()
        (final / f"{name}.json").write_text("\n".join(lines[:4]) + "\n")
    log = train.main(["--method", "jensunpp", "--model", smollm2_path, "--data-root", str(fixture_root),
                      "--out", str(tmp_path / "smol"), "--refusal", REFUSAL, "--print-every", "0",
                      "--max-steps", "6", "--batch-size", "4", "--global-batch", "4", "--lr", "1e-4"])
    log = [json.loads(line) for line in open(tmp_path / "smol" / "log.jsonl")]
    assert len(log) == 6 and all(math.isfinite(r["loss"]) for r in log)
    assert log[-1]["js_forget"] < log[0]["js_forget"] - 0.05, [r["js_forget"] for r in log]
    for r in log:
        below = min(r["loss_forget"], r["loss_retain"]) <= train.BALANCE_EPS
        assert r["alpha"] == 1.0 if below else 0 < r["alpha"] != 1.0, r
    assert any(min(r["loss_forget"], r["loss_retain"]) > train.BALANCE_EPS for r in log)   # the ratio was exercised
    assert (tmp_path / "smol" / "final" / "model.safetensors").exists()


def _gloo_available():
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


@pytest.mark.skipif(not _gloo_available(), reason="this torch build has no gloo backend")
def test_fsdp_two_processes_on_cpu_match_one_process(tiny_model_path, tmp_path):
    """torchrun --nproc_per_node=2 with gloo: FSDP2 (fp32) equals the single-process run with the
    same global batch and micro-batches (2 ranks x 2 vs 1 process x 2 micro-batches of 2)."""
    common = ["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--lr", "1e-3",
              "--max-steps", "2", "--precision", "fp32", "--global-batch", "4", "--batch-size", "2",
              "--refusal", REFUSAL]
    run_args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
                str(ROOT / "train.py"), *common, "--out", str(tmp_path / "fsdp")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(run_args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train.main(common + ["--out", str(tmp_path / "single")])          # one process, 2 micro-batches of 2
    a, b = weights(tmp_path / "fsdp" / "final"), weights(tmp_path / "single" / "final")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_padding_to_the_stage_shape_leaves_the_loss_unchanged(tiny_model_path):
    """--compile graphs pads every view to the stage's shape (rows, T, K): the longest sequence and answer
    span of the stage, and the micro-batch size in rows (filler rows for the smaller last step of an
    epoch, so that no new graph is compiled). Padding and filler rows leave the loss unchanged; a batch
    that does not fit is an error, not a crop."""
    model, tokenizer = train.load_model(tiny_model_path)
    model.set_attn_implementation("eager")
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], data.DEFAULT_ROOT, refusal=REFUSAL, seed=0,
                                   context_refusals=True)
    T, K = trainset.longest(("mixed",), True, 20)
    every = [s for epoch in range(20) for view in trainset.views(range(len(trainset)), ("mixed",), True, epoch).values()
             for s in view]
    assert (T, K) == (max(len(s["ids"]) for s in every), max(len(s["targets"]) for s in every))
    seqs = trainset.views(list(range(6)), ("mixed",), True, 0)
    assert max(len(s["ids"]) for view in seqs.values() for s in view) < T     # so padding happens
    summed = {}
    for fixed in (None, (8, T, K)):                                          # 6 real rows of 8
        out, logits, ntok = train.forward_views(model, seqs, tokenizer.pad_token_id, "jensunpp", "cpu", shape=fixed)
        v = out["mixed"]
        assert v["logits"].shape[0] == 6
        summed[fixed] = float((losses.token_logprobs(v["logits"], v["labels"]) * v["weights"]).sum())
        assert ntok == sum(len(s["ids"]) for view in seqs.values() for s in view)
    assert logits.shape[:2] == (16, K + 1)                       # 2 views x 8 rows; K predicting positions + 1
    assert data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=(T, K))["input_ids"].shape == (6, T)
    assert summed[(8, T, K)] == pytest.approx(summed[None], rel=1e-5)
    with pytest.raises(ValueError, match="does not fit the fixed shape"):
        data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=(T, 2))


def test_compile_graphs_matches_eager(tiny_model_path, tmp_path):
    """The whole-model compile (CUDA graphs on a GPU; inductor alone on CPU) trains like eager mode, also
    through the smaller last step of an epoch (36 pairs: a step of 32, then one of 4 in filler-padded rows of 8)."""
    for method in ("graddiff", "jensunpp"):
        common = ["--lr", "1e-3", "--max-steps", "3", "--batch-size", "8"]
        eager = run(tiny_model_path, tmp_path / f"{method}_eager", method, *common)
        graphs = run(tiny_model_path, tmp_path / f"{method}_graphs", method, *common, "--compile", "graphs")
        assert [r["loss"] for r in graphs] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
        assert [r["grad_norm"] for r in graphs] == pytest.approx([r["grad_norm"] for r in eager], rel=1e-3)
    assert train.parse_args(["--method", "rmu", "--compile", "graphs"]).compile == "blocks"   # its hook
    assert train.parse_args(["--method", "npo", "--compile"]).compile == "blocks"


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path, monkeypatch):
    """A tokenizer converted from SmolLM2's GGUF by some transformers versions has no pad token; the
    random-weight models of bench.py share that tokenizer and must pad with end-of-turn too (a run on
    an H200 with transformers 5.17 failed in data.collate with pad_id None before this)."""
    import json
    import shutil
    folder = tmp_path / "tok"
    shutil.copytree(train.smollm2_folder(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(folder).pad_token_id is None
    monkeypatch.setattr(train, "smollm2_folder", lambda: folder)
    model, tokenizer = train.load_model("random:tiny")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_schedule_linear_from_zero_and_cosine():
    """Hugging Face's schedules as the authors' trainer ran them: step 0 at lr 0, the peak after one
    epoch of warm-up, then linear decay to 0 (default) or cosine (--lr-schedule cosine)."""
    peak, warmup, total = 1.0, 15, 300
    assert [train.lr_at(s, total, warmup, peak) for s in (0, 5, 15)] == [0.0, pytest.approx(1 / 3), 1.0]
    assert train.lr_at(15 + 285 // 2, total, warmup, peak) == pytest.approx(1 - 142 / 285)
    assert train.lr_at(299, total, warmup, peak) == pytest.approx(1 / 285)
    assert train.lr_at(15 + 95, total, warmup, peak, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 3)))
    assert train.parse_args(["--method", "jensunpp"]).lr_schedule == "linear"


def test_step_micro_batches_cover_each_pair_once_per_epoch():
    """450 pairs at a global batch of 32: 15 steps a topic-epoch (14 x 32 + one of 2, so 300 steps in 20
    epochs); micro-batches of 4 with equal weights; under FSDP the last step is padded to the world
    size from the start of the permutation."""
    order = list(range(450))
    steps = [train.step_micro_batches(order, s, 32, 4, 0, 1) for s in range(math.ceil(450 / 32))]
    assert len(steps) == 15 and sorted(i for step in steps for mb, _ in step for i in mb) == order
    assert [(len(mb), w) for mb, w in steps[0]] == [(4, 1 / 8)] * 8
    assert steps[-1] == [([448, 449], 1.0)]
    ranks = [train.step_micro_batches(order, 14, 32, 4, r, 4) for r in range(4)]
    assert ranks == [[([448], 1.0)], [([449], 1.0)], [([0], 1.0)], [([1], 1.0)]]
    full = [train.step_micro_batches(order, 0, 32, 4, r, 4) for r in range(4)]
    assert sorted(i for r in full for mb, _ in r for i in mb) == list(range(32)) and all(len(r) == 2 for r in full)
    with pytest.raises(data.UserError, match="--global-batch 30 is not a multiple of --batch-size 4"):
        train.parse_args(["--method", "jensunpp", "--global-batch", "30", "--batch-size", "4"])


def test_weight_decay_on_weight_matrices_only(tiny_model_path):
    args = train.parse_args(["--method", "graddiff"])
    trainer = train.Trainer(args, 0, 1, torch.device("cpu"))
    model, _ = train.load_model(tiny_model_path)
    _, optimizer = trainer.build_optimizer(model, 1e-3)
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("norm.weight") for p in no_decay["params"]) and no_decay["params"]
    assert any(names[id(p)].endswith("q_proj.weight") for p in decay["params"])


def test_training_sequences_at_token_level(smollm2_path):
    """The authors' sequences on the real SmolLM2 tokenizer: the system message first; JensUn++ after an
    answer prefix continues with " Unfortunately, ..." (leading space) whose first token is also the
    target at the later prefix positions, while right after the prompt the target is the reply-start
    "Unfortunately"; JensUn trains question + original answer towards "No Idea No Idea ..."; the
    JensUn++ retain context pool is the short QA pool plus the topic's 25 direct questions answered with
    the refusal; in-context turns are drawn anew each epoch, reproducibly."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    refusal = "Unfortunately, I cannot answer that."
    ts = data.PairedTrainSet(tok, ["challenger_disaster"], data.DEFAULT_ROOT, refusal=refusal, seed=0,
                             context_refusals=True)
    eot = data.end_of_turn_id(tok)
    start, spaced = tok(refusal).input_ids, tok(" " + refusal).input_ids
    assert start[0] != spaced[0] and tok.decode(spaced[:1]) == " Unfortunately"
    i = next(i for i in range(len(ts)) if len(ts.answers[i][0]) > 3)
    forget_prompt, retain_prompt = ts.prompts(i, 0)
    assert data.SYSTEM_PROMPT in tok.decode(forget_prompt) and data.SYSTEM_PROMPT in tok.decode(retain_prompt)
    answer = ts.answers[i][0][:-1]
    s = data.mixed_sequence(forget_prompt, answer, ts.refusal_ids, ts.refusal_after_prefix, 3)
    assert s["ids"] == forget_prompt + answer[:3] + spaced + [eot]
    assert s["targets"] == [start[0], spaced[0], spaced[0]] + spaced + [eot]
    assert tok.decode(s["ids"][len(forget_prompt):]).endswith(tok.decode(answer[:3]) + " " + refusal + "<|im_end|>")
    jensun = data.PairedTrainSet(tok, ["challenger_disaster"], data.DEFAULT_ROOT, refusal=losses.METHODS["jensun"]["refusal"])
    cyc = jensun.views([i], ("cyclic",), False, 0)["cyclic"][0]
    no_idea = tok("No Idea", add_special_tokens=False).input_ids
    assert cyc["ids"] == forget_prompt + ts.answers[i][0] and len(no_idea) == 2
    assert cyc["targets"] == [no_idea[k % 2] for k in range(len(ts.answers[i][0]))]
    direct = data.direct_originals(data.load_topic("challenger_disaster"))
    assert len(direct) == 25
    assert ts.retain_pools["challenger_disaster"] == ts.short + [(q, refusal) for q in direct]
    assert data.PairedTrainSet(tok, ["challenger_disaster"], data.DEFAULT_ROOT, refusal=refusal).retain_pools[
        "challenger_disaster"] == ts.short                                # other methods: the short pool only
    epochs = [[ts.prompts(j, e) for j in range(40)] for e in (0, 1)]
    assert epochs[0] != epochs[1] and epochs[0] == [ts.prompts(j, 0) for j in range(40)]


def test_bad_input_is_one_line_and_leaves_no_run_folder(tiny_model_path, tmp_path, fixture_root):
    """Each mistake: exit 1 with one line naming the file, line, field or flag, before the model loads,
    and no --out folder."""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(fixture_root, corrupt)
    bad_file = corrupt / "challenger_disaster" / "final" / "forget_train.json"
    bad_file.write_text(bad_file.read_text() + '{"question": "cut short\n')
    n_lines = len(bad_file.read_text().splitlines())
    missing = tmp_path / "missing"
    shutil.copytree(fixture_root, missing)
    (missing / "challenger_disaster" / "final" / "retain_train.json").unlink()
    no_answer = tmp_path / "no_answer"
    shutil.copytree(fixture_root, no_answer)
    rows = (no_answer / "challenger_disaster" / "final" / "retain_train.json").read_text().splitlines()
    rows[1] = json.dumps({k: v for k, v in json.loads(rows[1]).items() if k != "answer"})
    (no_answer / "challenger_disaster" / "final" / "retain_train.json").write_text("\n".join(rows) + "\n")
    (tmp_path / "empty").mkdir()
    cases = [(["--data-root", str(corrupt)], f"{bad_file}:{n_lines}: not valid JSON"),
             (["--data-root", str(missing)], f"{missing / 'challenger_disaster' / 'final' / 'retain_train.json'}: file is missing"),
             (["--data-root", str(no_answer)], "retain_train.json:2 field 'answer': must be a non-empty string"),
             (["--model", str(tmp_path / "nowhere" / "model")], f"--model {tmp_path / 'nowhere' / 'model'}: no such folder"),
             (["--model", str(tmp_path / "empty")], "not a Hugging Face model folder (no config.json"),
             (["--model", "someone/no-such-model"], "--model someone/no-such-model: no such local folder, and not in the "
                                                    "Hugging Face cache (HF_HUB_OFFLINE is set)"),
             (["--topics", "no_such_topic"], "--topics no_such_topic: unknown topic"),
             (["--lr", "-1"], "--lr -1.0: must be a number > 0"),
             (["--max-steps", "0"], "--max-steps 0: must be >= 1"),
             (["--max-steps", "-3"], "--max-steps -3: must be >= 1")]
    for extra, message in cases:
        out = tmp_path / "run"
        argv = ["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(fixture_root), "--out", str(out),
                *extra]
        proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        error = proc.stderr.strip().split("\n")
        assert proc.returncode == 1 and len(error) == 1 and error[0].startswith("train.py: "), (extra, proc.stderr)
        assert message in error[0], (message, error[0])
        assert not out.exists() and proc.stdout == "", extra


def test_refusal_detection_prints_progress(tiny_model_path, tmp_path, capsys):
    """--refusal auto asks the model 30 questions (appendix B.1) with a progress line a batch."""
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--out",
                str(tmp_path / "run"), "--precision", "fp32", "--max-steps", "1", "--print-every", "0", "--no-save"])
    printed = capsys.readouterr().out
    assert "  refusal detection: 30 to do" in printed and "  refusal detection: 30/30 (100%)" in printed
    assert printed.index("refusal detection: 30/30") < printed.index("method jensunpp")


def test_smollm2_conversion_is_safe_when_two_processes_race(tmp_path):
    """Two processes converting SmolLM2 at once into an empty cache (parallel blocks at the first use of
    --model smollm2): both succeed with the same folder, and no temporary folder is left behind."""
    code = "import train; print(train.smollm2_folder())"
    env = {**os.environ, "SUITE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    folders = {out.strip().split("\n")[-1] for out, _ in results}
    assert folders == {str(tmp_path / "smollm2-135m-instruct")}
    assert sum("converting" in out for out, _ in results) == 2            # both converted: a real race
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct"]
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2-135m-instruct").num_parameters() > 1e8
