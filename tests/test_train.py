"""Training end to end on tiny models: every method, export round trip, resume, accumulation, FSDP.

    python -m pytest tests/test_train.py -q
"""
import json
import math
import os
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
    if method == "rmu":   # only the MLPs of layers l-2..l train
        assert all(".mlp." in k and any(f"layers.{l}." in k for l in (5, 6, 7)) for k in changed), changed


def test_loss_goes_down_and_export_round_trip(tiny_model_path, tmp_path):
    """30 steps of fine-tuning at a high learning rate: the loss falls; the exported folder reloads
    with from_pretrained and gives the trained model's logits."""
    out = tmp_path / "run"
    log = run(tiny_model_path, out, "nll", "--lr", "3e-3", "--max-steps", "30")
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
    assert cfg["epochs"] == 10 and cfg["batch_size"] == 8          # the paper's relearning settings


def test_gradient_accumulation_equivalence(tiny_model_path, tmp_path):
    """2 micro-batches of 2 give the same update as 1 batch of 4 (per-example loss means)."""
    for method in ("graddiff", "npo"):
        run(tiny_model_path, tmp_path / f"a{method}", method, "--lr", "1e-3", "--max-steps", "2",
            "--batch-size", "4", "--grad-accum", "1")
        run(tiny_model_path, tmp_path / f"b{method}", method, "--lr", "1e-3", "--max-steps", "2",
            "--batch-size", "2", "--grad-accum", "2")
        a, b = weights(tmp_path / f"a{method}" / "final"), weights(tmp_path / f"b{method}" / "final")
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-6), (method, k)


def test_kill_and_resume_equals_uninterrupted(tiny_model_path, tmp_path, monkeypatch):
    args = ("--lr", "1e-3", "--max-steps", "6", "--save-every", "2")
    run(tiny_model_path, tmp_path / "full", "pdu", *args)
    monkeypatch.setenv("SUITE_CRASH_AFTER_STEP", "3")          # dies like a killed process at step 3
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert not (tmp_path / "killed" / "final").exists()
    assert json.loads((tmp_path / "killed" / "checkpoint" / "meta.json").read_text())["step"] == 2
    monkeypatch.delenv("SUITE_CRASH_AFTER_STEP")
    log = run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert [r["step"] for r in log] == [1, 2, 3, 3, 4, 5, 6]      # steps 1-3, then 3-6 again from step 2
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
    log = run(tiny_model_path, tmp_path / "run", "nll", "--lr", "1e-3", "--max-steps", "3", "--grad-accum", "1")
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
    full = tok.apply_chat_template([{"role": "user", "content": "Capital of France?"},
                                    {"role": "assistant", "content": "Paris"},
                                    {"role": "user", "content": "What is 2+2?"},
                                    {"role": "assistant", "content": "4"}], tokenize=False)
    assert full.startswith(tok.decode(prompt + answer))


def test_smollm2_jensunpp_forget_loss_falls(smollm2_path, tmp_path):
    """JensUn++ on the real SmolLM2-135M-Instruct: the forget JS falls within a few steps, alpha is
    the logit-gradient ratio (positive, not 1), and the checkpoint is written."""
    log = run(smollm2_path, tmp_path / "smol", "jensunpp", "--max-steps", "6", "--batch-size", "2",
              "--grad-accum", "1", "--lr", "1e-4", "--precision", "bf16")
    assert len(log) == 6 and all(math.isfinite(r["loss"]) for r in log)
    assert log[-1]["js_forget"] < log[0]["js_forget"] - 0.05, [r["js_forget"] for r in log]
    assert all(0 < r["alpha"] != 1.0 for r in log)
    assert (tmp_path / "smol" / "final" / "model.safetensors").exists()


def _gloo_available():
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


@pytest.mark.skipif(not _gloo_available(), reason="this torch build has no gloo backend")
def test_fsdp_two_processes_on_cpu_match_one_process(tiny_model_path, tmp_path):
    """torchrun --nproc_per_node=2 with gloo: FSDP2 (fp32) equals the single-process run with the
    same global batch (2 ranks x 2 vs 1 x 4)."""
    common = ["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--lr", "1e-3",
              "--max-steps", "2", "--precision", "fp32", "--grad-accum", "1", "--refusal", REFUSAL]
    run_args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
                str(ROOT / "train.py"), *common, "--batch-size", "2", "--out", str(tmp_path / "fsdp")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(run_args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train.main(common + ["--batch-size", "4", "--out", str(tmp_path / "single")])
    a, b = weights(tmp_path / "fsdp" / "final"), weights(tmp_path / "single" / "final")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_padding_to_the_stage_shape_leaves_the_loss_unchanged(tiny_model_path):
    """--compile graphs pads every batch to the longest sequence and answer span of the stage (one shape,
    one compile); the padding is masked out, and a batch that does not fit is an error, not a crop."""
    model, tokenizer = train.load_model(tiny_model_path)
    model.set_attn_implementation("eager")
    trainset = data.PairedTrainSet(tokenizer, ["challenger_disaster"], data.DEFAULT_ROOT, refusal=REFUSAL, seed=0,
                                   method="jensunpp", forget_key="forget_train", retain_key="retain_train")
    shape = trainset.longest(("mixed",), True, 20)
    every = [s for epoch in range(20) for view in trainset.views(range(len(trainset)), ("mixed",), True, epoch).values()
             for s in view]
    assert shape == (max(len(s["ids"]) for s in every), max(len(s["targets"]) for s in every))
    seqs = trainset.views(list(range(8)), ("mixed",), True, 0)
    assert max(len(s["ids"]) for view in seqs.values() for s in view) < shape[0]     # so padding happens
    summed = {}
    for fixed in (None, shape):
        out, logits, ntok = train.forward_views(model, seqs, tokenizer.pad_token_id, "jensunpp", "cpu", shape=fixed)
        v = out["mixed"]
        summed[fixed] = float((losses.token_logprobs(v["logits"], v["labels"]) * v["weights"]).sum())
        assert ntok == sum(len(s["ids"]) for view in seqs.values() for s in view)
    assert logits.shape[1] == shape[1]
    assert data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=shape)["input_ids"].shape == (8, shape[0])
    assert summed[shape] == pytest.approx(summed[None], rel=1e-5)
    with pytest.raises(ValueError, match="does not fit the fixed shape"):
        data.collate(seqs["mixed"], tokenizer.pad_token_id, shape=(shape[0], 2))


def test_compile_graphs_matches_eager(tiny_model_path, tmp_path):
    """The whole-model compile (CUDA graphs on a GPU; inductor alone on CPU) trains like eager mode."""
    for method in ("graddiff", "jensunpp"):
        eager = run(tiny_model_path, tmp_path / f"{method}_eager", method, "--lr", "1e-3", "--max-steps", "3")
        graphs = run(tiny_model_path, tmp_path / f"{method}_graphs", method, "--lr", "1e-3", "--max-steps", "3",
                     "--compile", "graphs")
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
