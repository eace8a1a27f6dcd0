"""Training end to end on tiny models: every method, export round trip, resume, accumulation, FSDP,
the refusal, the model family and its hyperparameters, the ablation flags, and a reference loss curve.

    python -m pytest tests/test_train.py -q                 # -m "not slow" leaves out the four slowest
    python -m pytest tests/test_train.py -k reference_loss_curve --update-reference   # after a numerics change
"""
import json
import math
import os
import copy
import gc
import re
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
from conftest import FIXTURE, ROOT, free_port
from model import Layout, load_model

REFUSAL = "Unfortunately, I cannot answer that."
REFERENCE = ROOT / "tests" / "fixtures" / "reference_loss_curve.json"


def weights(folder):
    return load_file(str(Path(folder) / "model.safetensors"))


def run(tiny, out, method, *extra):
    args = ["--method", method, "--model", tiny, "--data-root", str(FIXTURE), "--out", str(out),
            "--precision", "fp32", "--refusal", REFUSAL, "--print-every", "0", *extra]
    train.main(args)
    return [json.loads(line) for line in open(Path(out) / "log.jsonl")]


def tiny_model(folder, config_class, tokenizer_from, **config):
    """A tiny random model of `config_class` (seed 0) with the SmolLM2 tokenizer, saved to `folder`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, **config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


@pytest.mark.parametrize("method", sorted(losses.METHODS))
def test_every_method_trains_on_tiny_model(tiny_model_path, tmp_path, method):
    extra = ["--lr", "1e-3", "--max-steps", "2", "--global-batch", "4", "--batch-size", "4"]     # step 1: lr 0
    if method == "rmu":
        extra += ["--lr", "1e-2"]
    log = run(tiny_model_path, tmp_path / method, method, *extra)
    assert len(log) == 2
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


def test_export_writes_the_weights_it_is_given(tiny_model_path, tmp_path):
    """train.export builds the clean model on the meta device and takes the state's tensors as its own (no
    random init, no copy): the folder reloads to the same weights, bit for bit, with the embeddings still tied."""
    model, tokenizer = load_model(tiny_model_path)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)                         # weights no fresh init would give
    train.export(model, tokenizer, model.config, tmp_path / "final", 0)
    again, _ = load_model(str(tmp_path / "final"))
    want, got = model.state_dict(), again.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    host = train.host_copy(model.state_dict())          # a tied tensor is copied to the host once
    assert host["lm_head.weight"] is host["model.embed_tokens.weight"]


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


# How far apart two fp32 computations of one step at other shapes (packed rows, shared passes) may be,
# relative to the gradient's norm: about 1e-7 on our CI machine, 3.7e-5 on a 16-core AVX-512 host (its
# kernels reduce in other orders); a wrong mask, mean or alpha is off by far more.
FP32_SHAPES = 1e-4


def last_step(tiny, out, method, physical, batch_size=4, steps=4, *extra):
    """`steps` optimizer steps at a global batch of 16 on the 36 fixture pairs (16, 16, 4, then 16): the
    gradients of the last (read where they are clipped; 0 where a loss leaves a parameter out, as RMU's
    does the layers after its hook) and its alpha of each loss micro-batch (eq. 4; the first step's
    learning rate is 0, so until the third the policy is the frozen model and alpha 1: the fourth has both)."""
    grads, alphas = [], []
    clip, balance = train.clip_grad_norm, train.balance_alpha
    with pytest.MonkeyPatch.context() as m:
        # On the CPU where a GPU exists too: the tolerances below are the CPU's fp32 rounding across shapes
        # (an H200's fp32 kernels differ by up to 1e-5 of the norm, more where gradients nearly cancel).
        m.setattr(torch.cuda, "is_available", lambda: False)
        m.setattr(train, "clip_grad_norm",
                  lambda params, *a, **k: grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                                        for p in params]) or clip(params, *a, **k))
        m.setattr(train, "balance_alpha",
                  lambda *a: alphas.extend((len(grads), x) for x in balance(*a).tolist()) or balance(*a))
        run(tiny, out, method, "--lr", "1e-2", "--max-steps", str(steps), "--global-batch", "16",
            "--batch-size", str(batch_size), "--physical-batch", str(physical), "--no-save", *extra)
    return grads[steps - 1], [x for step, x in alphas if step == steps - 1]


@pytest.mark.parametrize("method", ["graddiff", "npo", "pdu", "rmu", "undial", "jensunpp"])
def test_packed_rows_give_the_gradients_of_left_padding(tiny_model_path, tmp_path, method):
    """Packing several sequences into a row (data.pack, the default where model.packable allows) is the
    same computation as left padding (--no-packing): the gradients agree in fp32 for a method of every
    output a loss reads (answer logits, PDU's own-position logits, RMU's hooked hidden states, UNDIAL's
    every position, the frozen model's logits and sequence scores), and so do JensUn++'s alphas at a step
    where eq. 4 is active. Both on eager attention: SDPA's own rounding (the default on packed rows; its
    outputs: tests/test_model.py) is not packing's, and UNDIAL's gradient at the frozen model cancels
    to 1e-6 of its terms, where fp32 rounding of the logits shows."""
    steps = 4 if method == "jensunpp" else 1
    calls, pack = [], data.pack
    with pytest.MonkeyPatch.context() as m:
        m.setattr(data, "pack", lambda seqs, *a, **k: calls.append(len(seqs)) or pack(seqs, *a, **k))
        packed, alphas_packed = last_step(tiny_model_path, tmp_path / "packed", method, 16, 4, steps, "--attention", "eager")
        packed_calls = len(calls)
        padded, alphas_padded = last_step(tiny_model_path, tmp_path / "padded", method, 16, 4, steps, "--no-packing")
    assert packed_calls >= steps and len(calls) == packed_calls           # the default packs; --no-packing does not
    assert any(g.norm() > 0 for g in padded)
    for a, b in zip(packed, padded):
        assert (a - b).norm() <= FP32_SHAPES * b.norm() + 1e-12, (method, (a - b).norm() / b.norm())
    assert alphas_packed == pytest.approx(alphas_padded, rel=FP32_SHAPES)
    if method == "jensunpp":
        assert len(alphas_packed) == 4 and any(a != 1.0 for a in alphas_packed)


@pytest.mark.parametrize("method", ["jensunpp", "rmu"])
def test_recomputed_blocks_give_the_same_gradients(tiny_model_path, tmp_path, method, capsys):
    """--recompute-blocks (activation checkpointing of the first blocks) changes memory, not the step: the
    gradients and JensUn++'s alphas of a fourth step equal those of the default (fp32), also for RMU, whose
    loss reads a block's output through a forward hook; the plan line names it."""
    kept, alphas_kept = last_step(tiny_model_path, tmp_path / "kept", method, 16)
    capsys.readouterr()
    calls, checkpoint = [], torch.utils.checkpoint.checkpoint
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
        again, alphas_again = last_step(tiny_model_path, tmp_path / "again", method, 16, 4, 4, "--recompute-blocks", "2")
    assert "2 blocks recomputed in backward" in capsys.readouterr().out and len(calls) >= 2 * 4
    assert alphas_again == pytest.approx(alphas_kept, rel=1e-6)
    assert any(g.norm() > 0 for g in kept)
    for a, b in zip(again, kept):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-12)
    with pytest.raises(data.UserError, match="--recompute-blocks"):
        train.resolve_args(train.parse_args(["--method", method, "--model", tiny_model_path,
                                             "--recompute-blocks", "1", "--compile"]))


def test_recompute_blocks_auto_sizes_the_blocks_from_memory(tiny_model_path, tmp_path, capsys):
    """--recompute-blocks auto (opt-in; sized where a GPU or --memory-gib gives a budget): before step 1
    the largest pass's forward and loss run once, their saved tensors counted; the blocks recomputed are the
    fewest whose estimated peak fits the budget. peak_estimate checked by hand; the measurement against
    its tensors' sizes; nothing of the probe left alive after it; the choice at budgets that need none,
    some (3 of 8) and more than all can give."""
    saved = {"blocks": 80, "rest": 5, "input": 1}
    assert [train.peak_estimate(10, saved, 8, n) for n in (0, 4, 8)] == [10 + 80 + 10 + 10, 10 + 40 + 4 + 10 + 20,
                                                                       10 + 8 + 10 + 20]
    measured, statics, left = [], [], []
    saved_for_backward, static_bytes = train.saved_for_backward, train.static_bytes

    def probe(*a):           # the run's own numbers, returned unchanged; and what the probe left alive
        measured.append(saved_for_backward(*a))
        gc.collect()
        left.append(sum(issubclass(type(o), torch.Tensor) and o.grad_fn is not None for o in gc.get_objects()))
        return measured[-1]

    with pytest.MonkeyPatch.context() as m:          # spies
        m.setattr(train, "saved_for_backward", probe)
        m.setattr(train, "static_bytes", lambda *a: statics.append(static_bytes(*a)) or statics[-1])
        common = ["--lr", "1e-3", "--max-steps", "1", "--global-batch", "16", "--batch-size", "4", "--no-save",
                  "--recompute-blocks", "auto"]
        run(tiny_model_path, tmp_path / "roomy", "jensunpp", *common, "--memory-gib", "1000")
        assert "0 of 8 decoder blocks recomputed" in capsys.readouterr().out
        # no activation outlives the probe (its saved tensors once held themselves through their grad_fn: on an
        # H100 the 3B JensUn++ run kept ~14 GiB of them through every step and ran out of memory, issue 52)
        assert left == [0]
        got, static = measured[0], statics[0]
        hidden, vocab = 32, 49152                    # tiny_model_path's; fp32
        assert got["input"] % (4 * hidden) == 0 and got["blocks"] >= 8 * 4 * got["input"]   # q, k, v, norms, MLP
        assert got["rest"] >= 4 * vocab * 16           # the fp32 logits of 16 positions at least
        n = sum(p.numel() for p in load_model(tiny_model_path)[0].parameters())
        # fp32, no compute copy: masters, two moments, frozen model, fp32 gradients
        assert static == train.WORKSPACE_BYTES + (4 + 8 + 4 + 4) * n
        budget = train.peak_estimate(static, got, 8, 3)
        assert train.peak_estimate(static, got, 8, 2) > budget
        run(tiny_model_path, tmp_path / "three", "jensunpp", *common, "--memory-gib", str(budget / 2**30))
        assert "3 of 8 decoder blocks recomputed" in capsys.readouterr().out and measured[1] == got
        run(tiny_model_path, tmp_path / "short", "jensunpp", *common, "--memory-gib", "0.001")
        assert "8 of 8 decoder blocks recomputed" in capsys.readouterr().out
        # a bf16 compute copy, the step in one pass: its bf16 gradients and one chunk of fp32 ones in the update
        run(tiny_model_path, tmp_path / "bf16", "jensunpp", *common, "--memory-gib", "1000", "--precision", "bf16",
            "--physical-batch", "16")
        assert statics[-1] == train.WORKSPACE_BYTES + (4 + 8 + 2 + 2 + 2) * n + train.OPTIMIZER_CHUNK_BYTES
    auto = train.resolve_args(train.parse_args(["--method", "jensunpp", "--model", tiny_model_path, "--recompute-blocks", "auto"]))
    assert train.make_plan(auto, torch.device("cpu"), 1)["recompute"] == 0      # no GPU, no --memory-gib: none
    assert train.make_plan(auto, torch.device("cuda"), 2)["recompute"] == 0     # FSDP: none
    assert train.make_plan(auto, torch.device("cuda"), 1)["recompute"] == "auto"
    default = train.resolve_args(train.parse_args(["--method", "jensunpp", "--model", tiny_model_path]))
    assert train.make_plan(default, torch.device("cuda"), 1)["recompute"] == 0  # not the default (BENCHMARKS.md)
    with pytest.raises(data.UserError, match="--memory-gib"):
        train.resolve_args(train.parse_args(["--method", "jensunpp", "--model", tiny_model_path, "--recompute-blocks", "2",
                                             "--memory-gib", "9"]))


@pytest.mark.parametrize("method", ["npo", "dpo", "rmu", "undial"])
def test_every_frozen_model_output_splits_by_micro_batch(tiny_model_path, tmp_path, method):
    """The frozen model's outputs (NPO's and DPO's sequence scores, RMU's hooked hidden states, UNDIAL's
    per-token logits) are cut with the pass's rows: one pass of 16 rows gives one pass each's gradients
    (the first step's: no alpha to wait for, and none of these losses has a zero gradient at the frozen model)."""
    one_each, _ = last_step(tiny_model_path, tmp_path / "p4", method, 4, steps=1)
    shared, _ = last_step(tiny_model_path, tmp_path / "p16", method, 16, steps=1)
    assert all(g.norm() > 0 for g in one_each[:1])
    for a, b in zip(shared, one_each):
        assert (a - b).norm() <= FP32_SHAPES * b.norm() + 1e-12, (method, (a - b).norm() / b.norm())


@pytest.mark.parametrize("method", ["jensunpp", "graddiff", "pdu"])
def test_loss_micro_batches_sharing_a_pass_equal_one_pass_each(tiny_model_path, tmp_path, method, monkeypatch):
    """Four loss micro-batches of 4 in one forward pass of 16 rows (or two passes of 8) give the
    gradients and the alphas of one pass each (fp32): each keeps its own token means (GradDiff, PDU's
    retain NLL), its own alpha (JensUn++) and its own dual step (PDU, warm-up cut to 0 so that lambda_r
    moves between micro-batches). One loss micro-batch of 16 is another objective, and the test sees it.
    JensUn++ at its fourth step, the first with eq. 4 active; GradDiff and PDU at their first (no alpha
    to wait for: their per-micro-batch means and dual steps act from step 1)."""
    monkeypatch.setitem(losses.METHOD_CONSTANTS, "pdu", {**losses.METHOD_CONSTANTS["pdu"], "pdu_warmup_epochs": 0})
    steps = 4 if method == "jensunpp" else 1
    grads, alphas = last_step(tiny_model_path, tmp_path / "p4", method, 4, steps=steps)
    assert len(alphas) == (4 if method == "jensunpp" else 0)
    assert len(set(alphas)) == len(alphas) and all(a > 0 for a in alphas)     # four different ratios
    for physical in (8, 16):
        shared_grads, shared_alphas = last_step(tiny_model_path, tmp_path / f"p{physical}", method, physical, steps=steps)
        assert shared_alphas == pytest.approx(alphas, rel=FP32_SHAPES)
        for a, b in zip(shared_grads, grads):          # fp32 rounding of other matmul shapes: ~1e-7 of the norm
            assert (a - b).norm() <= FP32_SHAPES * b.norm(), (physical, (a - b).norm() / b.norm())
    merged, _ = last_step(tiny_model_path, tmp_path / "b16", method, 16, batch_size=16, steps=steps)
    assert any(not torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(merged, grads))


def test_physical_batch_auto_halves_on_running_out_of_memory(tiny_model_path, tmp_path, monkeypatch, capsys):
    """--physical-batch auto starts with the whole global batch in one pass. Running out of memory, the step is
    redone first with every decoder block recomputed in backward (one pass still), then with half the rows:
    where recomputing is enough, the run ends where one with every block recomputed does; where a pass of more
    than 8 rows never fits, where one at 8 rows with every block recomputed does."""
    common = ["--lr", "1e-3", "--max-steps", "3", "--global-batch", "16", "--batch-size", "4"]
    forward = Layout.forward

    def small_memory(recomputed_fits):
        def layout_forward(layout, model, seqs_by_view, *a, **k):
            recomputed = getattr(train.decoder_layers(model)[-1], "recomputed", False)      # the trained model's
            if model.training and len(next(iter(seqs_by_view.values()))) > 8 and not (recomputed_fits and recomputed):
                raise torch.OutOfMemoryError("test: more than 8 rows")
            return forward(layout, model, seqs_by_view, *a, **k)
        return layout_forward

    for name, fits, rows in [("recompute", True, "16"), ("eight", False, "8")]:
        run(tiny_model_path, tmp_path / f"{name}_ref", "jensunpp", *common, "--physical-batch", rows, "--recompute-blocks", "8")
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(Layout, "forward", small_memory(fits))
            log = run(tiny_model_path, tmp_path / name, "jensunpp", *common)
        out = capsys.readouterr().out
        assert "16 rows per forward pass" in out.split("out of memory")[0] and len(log) == 3
        assert "out of memory: every decoder block recomputed in backward from now on" in out
        assert ("out of memory: 8 rows per forward pass from now on" in out) == (not fits)
        a, b = weights(tmp_path / name / "final"), weights(tmp_path / f"{name}_ref" / "final")
        assert all(torch.equal(a[k], b[k]) for k in a)
    monkeypatch.setattr(Layout, "forward", small_memory(False))
    with pytest.raises(torch.OutOfMemoryError):       # a number the user chose is kept, and the error shown
        run(tiny_model_path, tmp_path / "fixed", "jensunpp", *common, "--physical-batch", "16")
    for bad in ("6", "2", "many"):
        with pytest.raises(data.UserError, match="--physical-batch"):
            train.parse_args(["--method", "jensunpp", "--physical-batch", bad])
    assert train.parse_args(["--method", "jensunpp", "--physical-batch", "64"]).physical_batch == 32   # the share


def test_relearning_arms_run_the_same_steps(tiny_model_path, tmp_path):
    """Every relearning arm runs the optimizer steps of the paper's attack: an epoch of forget_train's size
    (36 fixture pairs: 3 steps of 16) whatever its band's size; a bad band is one line, before any folder."""
    steps = {}
    for arm in ("retain_train", "tiers:1-2", "forget:M1-M2"):
        log = run(tiny_model_path, tmp_path / arm.replace(":", "-"), "nll", "--relearn-set", arm, "--epochs", "2",
                  "--global-batch", "16", "--batch-size", "8", "--no-save")
        steps[arm] = [r["tokens"] > 0 for r in log]
    assert steps["retain_train"] == steps["tiers:1-2"] == steps["forget:M1-M2"] == [True] * 6
    with pytest.raises(SystemExit, match="^train.py: --relearn-set tiers:16: give tiers:A"):
        train.main(["--method", "nll", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--relearn-set",
                    "tiers:16", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_lkf_recipe(tiny_model_path, tmp_path, capsys):
    """--recipe lkf: the LKF* root (400 forget rows, 375 retain rows, randomly paired), 10 epochs, the
    LKF* table's hyperparameters; the LKF* root without the recipe is refused (it has no pairing)."""
    out = tmp_path / "lkf"
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--recipe", "lkf", "--out", str(out),
                "--precision", "fp32", "--refusal", REFUSAL, "--max-steps", "2", "--no-save", "--print-every", "0"])
    config = json.loads((out / "config.json").read_text())
    assert (config["data_root"], config["epochs"], config["pairing"]) == (str(data.LKF_ROOT), 10, False)
    assert config["hparams"] == {"lr": 5e-6, "lambda_f": 0.33, "lambda_r": 1.0}            # tab:challenger_hparam_utility_llama3b
    assert "400 pairs, 13 steps per epoch of 32" in capsys.readouterr().out
    assert losses.resolve_hparams("satimp", "llama", "lkf") == losses.resolve_hparams("satimp", "llama")   # no LKF* row
    with pytest.raises(data.UserError, match="is an LKF\\* root"):
        train.parse_args(["--method", "jensunpp", "--data-root", str(data.LKF_ROOT)])
    assert train.parse_args(["--method", "jensunpp", "--data-root", str(data.LKF_ROOT), "--no-pairing"]).epochs == 20


def test_kill_and_resume_equals_uninterrupted(tiny_model_path, tmp_path, monkeypatch):
    """A run stopped right after its checkpoint of step 2 and restarted with the same command ends where
    the uninterrupted run does: same weights, same per-step losses, one log. A kill later in step 3
    leaves that step's line and a line cut short in log.jsonl, past the checkpoint; both are dropped."""
    args = ("--lr", "1e-3", "--max-steps", "5", "--global-batch", "8", "--save-minutes", "1e-9")  # save every step
    full = run(tiny_model_path, tmp_path / "full", "pdu", *args)
    monkeypatch.setenv("SUITE_CRASH_AFTER_CHECKPOINT", "2")
    with pytest.raises(SystemExit, match="after the checkpoint of step 2"):
        run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert not (tmp_path / "killed" / "final").exists()
    meta = json.loads((tmp_path / "killed" / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 2 and meta["lambda_r"] == 1.0
    with open(tmp_path / "killed" / "log.jsonl", "a") as log:
        log.write(json.dumps({**full[2], "loss": -1.0}) + "\n" + '{"stage": "final", "st')
    monkeypatch.delenv("SUITE_CRASH_AFTER_CHECKPOINT")
    log = run(tiny_model_path, tmp_path / "killed", "pdu", *args)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full], rel=1e-5)   # one run, as if never killed
    a, b = weights(tmp_path / "full" / "final"), weights(tmp_path / "killed" / "final")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    assert not (tmp_path / "killed" / "checkpoint").exists()


def test_a_kill_inside_the_checkpoint_swap_loses_no_checkpoint(tiny_model_path, tmp_path, capsys):
    """A kill between save_checkpoint's two renames (the old checkpoint moved aside, the new one not yet in place)
    leaves no checkpoint/ folder: the restart takes the new one if it is whole (its meta.json written), else the
    old one, and ends where the uninterrupted run does."""
    import pathlib
    args = ("--lr", "1e-3", "--max-steps", "5", "--global-batch", "8", "--save-minutes", "1e-9")  # save every step
    full = run(tiny_model_path, tmp_path / "full", "pdu", *args)
    rename = pathlib.Path.rename
    for whole in (True, False):
        out, saves = tmp_path / f"killed_{whole}", []

        def killed_mid_swap(path, target):
            if path.name == "checkpoint.tmp":
                saves.append(target)
                if len(saves) == 2:        # the second save: the first checkpoint is already checkpoint.old
                    raise SystemExit("test: killed between the renames")
            return rename(path, target)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(pathlib.Path, "rename", killed_mid_swap)
            with pytest.raises(SystemExit, match="between the renames"):
                run(tiny_model_path, out, "pdu", *args)
        assert not (out / "checkpoint").exists() and (out / "checkpoint.old").exists()
        new_step, old_step = (json.loads((out / d / "meta.json").read_text())["step"]
                              for d in ("checkpoint.tmp", "checkpoint.old"))
        assert new_step > old_step
        if not whole:
            (out / "checkpoint.tmp" / "meta.json").unlink()        # killed before its meta.json: not whole
        capsys.readouterr()
        log = run(tiny_model_path, out, "pdu", *args)
        assert f"resumed final at step {new_step if whole else old_step}/5" in capsys.readouterr().out
        assert [r["step"] for r in log] == [1, 2, 3, 4, 5]
        assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full], rel=1e-5)
        a, b = weights(tmp_path / "full" / "final"), weights(out / "final")
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
        assert not any((out / name).exists() for name in ("checkpoint", "checkpoint.old"))


def test_a_run_folder_takes_only_its_own_command(tiny_model_path, tmp_path, capsys):
    """An --out that holds a run (finished, or killed with a checkpoint) resumes or skips only for that run's own
    command: another learning rate, model or refusal is one line naming each difference, and nothing in the
    folder changes; a flag of how it runs (--print-every, --physical-batch) may differ."""
    common = ("--lr", "1e-3", "--max-steps", "2", "--global-batch", "8")
    run(tiny_model_path, tmp_path / "done", "jensunpp", *common)
    config = (tmp_path / "done" / "config.json").read_text()
    with pytest.raises(SystemExit, match=r"holds another run \(lr 0.001 there, 0.01 here\)"):
        run(tiny_model_path, tmp_path / "done", "jensunpp", "--lr", "1e-2", "--max-steps", "2", "--global-batch", "8")
    with pytest.raises(SystemExit, match="refusal .* there, 'I do not know.' here"):
        run(tiny_model_path, tmp_path / "done", "jensunpp", *common, "--refusal", "I do not know.")
    with pytest.raises(SystemExit, match="method 'jensunpp' there, 'npo' here"):
        run(tiny_model_path, tmp_path / "done", "npo", *common)
    assert (tmp_path / "done" / "config.json").read_text() == config
    capsys.readouterr()
    run(tiny_model_path, tmp_path / "done", "jensunpp", *common, "--print-every", "1", "--physical-batch", "4")
    assert "[final] already done" in capsys.readouterr().out


def test_checkpoint_clock_and_deterministic_flag(tiny_model_path, tmp_path):
    """--save-minutes checkpoints by wall time (a tiny interval: after every step but the last), 0 never
    (--no-save keeps the checkpoint folder that a finished run otherwise removes); --deterministic
    switches torch's deterministic mode on for the run only."""
    common = ("--max-steps", "3", "--global-batch", "8", "--no-save")
    run(tiny_model_path, tmp_path / "clock", "graddiff", *common, "--save-minutes", "1e-9", "--deterministic")
    assert not torch.are_deterministic_algorithms_enabled()
    assert json.loads((tmp_path / "clock" / "checkpoint" / "meta.json").read_text())["step"] == 2
    run(tiny_model_path, tmp_path / "never", "graddiff", *common, "--save-minutes", "0")
    assert not (tmp_path / "never" / "checkpoint").exists()


def test_bf16_compute_copy_keeps_fp32_masters_and_resumes(tiny_model_path, tmp_path, monkeypatch):
    """--precision bf16 runs forward and backward on a bf16 copy and updates fp32 masters: steps of
    ~1e-7 (far below bf16's spacing at these weights) survive in the exported fp32 weights, and a
    killed-and-resumed bf16 run ends where the uninterrupted one does (the copy is rebuilt from the
    masters)."""
    args = ("--lr", "1e-7", "--max-steps", "4", "--global-batch", "4", "--save-minutes", "1e-9", "--precision", "bf16")
    log = run(tiny_model_path, tmp_path / "full", "jensunpp", *args)
    assert all(math.isfinite(r["loss"]) for r in log)
    before, after = weights(tiny_model_path), weights(tmp_path / "full" / "final")
    step = max((after[k] - before[k]).abs().max().item() for k in after)
    assert 0 < step < 1e-5, step
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    assert any(not torch.equal(after[k], after[k].bfloat16().float()) for k in moved)
    monkeypatch.setenv("SUITE_CRASH_AFTER_CHECKPOINT", "2")
    with pytest.raises(SystemExit):
        run(tiny_model_path, tmp_path / "killed", "jensunpp", *args)
    monkeypatch.delenv("SUITE_CRASH_AFTER_CHECKPOINT")
    run(tiny_model_path, tmp_path / "killed", "jensunpp", *args)
    resumed = weights(tmp_path / "killed" / "final")
    for k in after:
        assert torch.equal(after[k], resumed[k]), k


def test_a_parameter_without_gradient_is_left_alone_under_a_compute_copy(tiny_model_path):
    """A loss that reaches one weight matrix only (as RMU's leaves the layers past its hook): with a bf16 compute
    copy, in one pass or two, every other master stays as it was (AdamW skips it: no weight decay), as without
    a compute copy, where autograd leaves those parameters without a gradient."""
    from model import with_parameters_in
    reached = "model.layers.0.mlp.down_proj.weight"
    for copy_kind, passes in (("bf16", 1), ("bf16", 2), ("none", 1)):
        model, _ = load_model(tiny_model_path)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        compute = with_parameters_in(copy.deepcopy(model), torch.bfloat16) if copy_kind == "bf16" else model
        optimizer = train.build_optimizer(model, 1e-2, 0.5)
        updates = train.Updates(model, compute, optimizer, {"gpu": False, "compile": None})
        for _ in range(passes):
            updates.backward(dict(compute.named_parameters())[reached].float().square().sum())
        updates.step(updates.clip(1.0))
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert moved == {reached}, (copy_kind, passes, moved)


def test_compute_copy_updates_in_chunks_as_from_whole_fp32_gradients(tiny_model_path, monkeypatch):
    """Under a bf16 compute copy a step of one pass never holds a whole fp32 gradient: after backward the
    masters have none, and the update upcasts the bf16 gradients chunk by chunk (each optimizer call sees at
    most OPTIMIZER_CHUNK_BYTES of them). It is the update of the earlier way (every bf16 gradient added into
    zeroed fp32 buffers, clipped, one AdamW call), clipping active; so is a step of two passes, which sums
    them in fp32. The norms agree to fp32 rounding (bf16 gradients' norm taken in fp32 against their upcast).
    Running out of memory in the update is an error, not a pass to redo at fewer rows (chunks done would
    be updated twice)."""
    from model import with_parameters_in
    ids = [torch.tensor([[1, 5, 9, 14, 3, 7, 2, 8] * 3]), torch.tensor([[4, 2, 11, 6, 9, 1] * 4])]

    def setup():
        model, _ = load_model(tiny_model_path)
        compute = with_parameters_in(copy.deepcopy(model), torch.bfloat16)
        return model, compute, train.build_optimizer(model, 1e-3, 0.01)

    def loss(compute, x):
        return compute(input_ids=x).logits.float().log_softmax(-1)[0, :-1].gather(-1, x[0, 1:, None]).mean()

    monkeypatch.setattr(train, "OPTIMIZER_CHUNK_BYTES", 40_000)        # several chunks for this tiny model
    largest = max(4 * p.numel() for p in load_model(tiny_model_path)[0].parameters())
    for passes in (ids[:1], ids):
        model, compute, optimizer = setup()
        updates = train.Updates(model, compute, optimizer, {"gpu": False, "compile": None})
        seen, given, step = [], {}, optimizer.step        # per call: fp32 gradient bytes; the gradients given

        def recording_step():
            seen.append(sum(4 * p.numel() for p in model.parameters() if p.grad is not None))
            given.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            step()
        monkeypatch.setattr(optimizer, "step", recording_step)
        for x in passes:
            updates.backward(loss(compute, x))
        assert all(p.grad is None for p in model.parameters()) == (len(passes) == 1)
        norm = updates.clip(0.05)
        updates.step(norm)
        if len(passes) == 1:
            assert len(seen) > 1 and max(seen) <= max(40_000, largest), seen
        ref_model, ref_compute, ref_optimizer = setup()
        for p in ref_model.parameters():
            p.grad = torch.zeros_like(p)
        for x in passes:
            loss(ref_compute, x).backward()
            for m, c in zip(ref_model.parameters(), ref_compute.parameters()):
                m.grad += c.grad
            ref_compute.zero_grad(set_to_none=True)
        ref_norm = train.clip_grad_norm(list(ref_model.parameters()), 0.05)
        assert ref_norm > 0.05 and norm.item() == pytest.approx(ref_norm.item(), rel=1e-6)
        ref_optimizer.step()
        assert len(given) == len(list(model.parameters()))
        for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
            assert torch.allclose(given[name], q.grad, rtol=1e-6, atol=0), name        # clipped alike
            assert torch.allclose(p, q, rtol=0, atol=1e-7), name
        assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), setup()[0].parameters()))
        assert all(torch.equal(c, p.bfloat16()) for c, p in zip(compute.parameters(), model.parameters()))
    # running out of memory in the update (some chunks already updated) is no pass's: never redone at fewer rows
    updates.backward(loss(compute, ids[0]))

    def out_of_memory():
        raise torch.OutOfMemoryError("test")
    monkeypatch.setattr(optimizer, "step", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory in the optimizer's update") as e:
        updates.step(updates.clip(0.05))
    assert not isinstance(e.value, torch.OutOfMemoryError)


def test_memory_report_names_where_the_memory_goes(tiny_model_path, tmp_path, capsys):
    """The first step prints the memory line: fp32 masters, AdamW's two fp32 moments (twice the masters), the
    bf16 compute copy and frozen model (half the masters each) and, under the compute copy, gradients the
    size of the copy's (bf16: no whole fp32 gradient); in fp32 the gradients are the masters' size."""
    def report(*flags):
        capsys.readouterr()
        run(tiny_model_path, tmp_path / flags[-1], "jensunpp", "--max-steps", "1", "--global-batch", "4", *flags)
        line = next(l for l in capsys.readouterr().out.splitlines() if "memory (GiB):" in l)
        return {k.strip(): float(v) for k, v in re.findall(r"([a-z][a-z ]+) (-?[0-9.e+-]+)", line.split(":", 1)[1])}

    bf16 = report("--precision", "bf16")       # three significant digits printed
    assert bf16["masters"] > 0 and bf16["optimizer"] == pytest.approx(2 * bf16["masters"], rel=0.01)
    for part in ("compute copy", "frozen model", "gradients"):
        assert bf16[part] == pytest.approx(bf16["masters"] / 2, rel=0.01), part
    fp32 = report("--precision", "fp32")
    assert fp32["compute copy"] == 0 and fp32["gradients"] == pytest.approx(fp32["masters"], rel=0.01)
    assert fp32["frozen model"] == pytest.approx(fp32["masters"], rel=0.01)


def test_bf16_copies_keep_the_models_rotary_frequencies(tiny_model_path):
    """Under bf16 the compute copy and the frozen model hold bf16 parameters but the fp32 buffers the model
    was built with (the rotary inv_freq), as from_pretrained(dtype=bf16) and FSDP's mixed precision leave
    them: a bf16 inv_freq moves RoPE's angles (up to 0.3 rad at 170 tokens), and an FSDP policy keeps its
    fp32 buffers, so the frozen model was another function than the policy it anchors. The copies are the
    same function: equal logits."""
    args = train.parse_args(["--method", "jensunpp", "--model", tiny_model_path, "--precision", "bf16"])
    trainer = train.Trainer(args, 0, 1, torch.device("cpu"))
    model, compute, ref, _, _ = train.build_models(args, trainer.plan, trainer.spec, {}, tiny_model_path, trainer.device, 1)
    masters = dict(model.named_buffers())
    assert masters and all(b.dtype == torch.float32 for b in masters.values())
    for copy in (compute, ref):
        assert all(p.dtype == torch.bfloat16 for p in copy.parameters())
        for name, buffer in copy.named_buffers():
            assert buffer.dtype == torch.float32 and torch.equal(buffer, masters[name]), name
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 8] * 4])
    with torch.no_grad():
        assert torch.equal(compute(input_ids=ids).logits, ref(input_ids=ids).logits)


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


def test_a_run_whose_every_update_is_skipped_stops(tiny_model_path, tmp_path):
    """Non-finite gradients MAX_SKIPPED_IN_A_ROW steps running stop the run with a clear error, rather
    than logging hundreds of skipped steps as training (an overflowing learning rate: the first real
    update makes every later gradient non-finite)."""
    with pytest.raises(RuntimeError, match=r"10 updates in a row skipped for a non-finite gradient norm"):
        run(tiny_model_path, tmp_path / "run", "graddiff", "--lr", "1e30", "--max-steps", "14",
            "--global-batch", "4", "--batch-size", "2")
    log = [json.loads(line) for line in open(tmp_path / "run" / "log.jsonl")]
    assert log[-1]["skipped_updates"] == 10 and not (tmp_path / "run" / "final").exists()


def test_sequential_two_topics(tiny_model_path, tmp_path, two_topic_root):
    root = two_topic_root
    out = tmp_path / "seq"
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(root), "--out", str(out),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--refusal", REFUSAL, "--max-steps", "2", "--global-batch", "8", "--lr", "1e-3"])
    s1, s2 = weights(out / "stage1_challenger_disaster"), weights(out / "stage2_salem_witch_trials")
    assert any(not torch.equal(s1[k], s2[k]) for k in s1)
    stages = [json.loads(l)["stage"] for l in open(out / "log.jsonl")]
    assert stages == ["stage1_challenger_disaster"] * 2 + ["stage2_salem_witch_trials"] * 2
    # rerunning the finished command does nothing new
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(root), "--out", str(out),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--refusal", REFUSAL, "--max-steps", "2", "--global-batch", "8", "--lr", "1e-3"])
    assert len(open(out / "log.jsonl").readlines()) == 4
    with pytest.raises(SystemExit, match="--no-save: a sequential run's stage starts from the model the stage before"):
        train.main(["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(root), "--out",
                    str(tmp_path / "unsaved"), "--topics", "challenger_disaster", "salem_witch_trials", "--mode",
                    "sequential", "--no-save"])
    assert not (tmp_path / "unsaved").exists()


def test_out_of_memory_relief_carries_to_later_stages(tiny_model_path, tmp_path, two_topic_root, capsys):
    """A sequential run whose first stage runs out of memory until every decoder block is recomputed and the
    pass halved keeps both in the second stage (a new Trainer, new models) and across a kill (its checkpoint
    keeps them): the two reliefs once in the whole run, and both stages end where a run with that memory from
    the start ends (bit for bit)."""
    common = ["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(two_topic_root), "--precision",
              "fp32", "--refusal", REFUSAL, "--topics", "challenger_disaster", "salem_witch_trials", "--mode",
              "sequential", "--lr", "1e-3", "--max-steps", "3", "--global-batch", "16", "--batch-size", "4"]
    forward = Layout.forward

    def small_memory(layout, model, seqs_by_view, *a, **k):
        recomputed = getattr(train.decoder_layers(model)[-1], "recomputed", False)          # the trained model's
        if model.training and (not recomputed or len(next(iter(seqs_by_view.values()))) > 8):
            raise torch.OutOfMemoryError("test: every block recomputed and at most 8 rows, or out of memory")
        return forward(layout, model, seqs_by_view, *a, **k)

    train.main([*common, "--out", str(tmp_path / "ref"), "--recompute-blocks", "2", "--physical-batch", "8"])
    capsys.readouterr()
    reliefs = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Layout, "forward", small_memory)
        m.setenv("SUITE_CRASH_AFTER_CHECKPOINT", "2")                    # killed in stage 1, after step 2
        with pytest.raises(SystemExit, match="after the checkpoint of step 2"):
            train.main([*common, "--out", str(tmp_path / "auto"), "--save-minutes", "1e-9"])
        m.delenv("SUITE_CRASH_AFTER_CHECKPOINT")
        reliefs.append([line for line in capsys.readouterr().out.splitlines() if "out of memory:" in line])
        train.main([*common, "--out", str(tmp_path / "auto"), "--save-minutes", "1e-9"])
        reliefs.append([line for line in capsys.readouterr().out.splitlines() if "out of memory:" in line])
    first = ("every decoder block recomputed in backward from now on", "8 rows per forward pass from now on")
    assert reliefs == [["[stage1_challenger_disaster] out of memory: " + relief for relief in first], []]
    for stage in ("stage1_challenger_disaster", "stage2_salem_witch_trials"):
        a, b = weights(tmp_path / "auto" / stage), weights(tmp_path / "ref" / stage)
        assert all(torch.equal(a[k], b[k]) for k in a), stage


def test_a_stage_s_models_are_freed_before_the_next_stage_builds(tiny_model_path, tmp_path, two_topic_root,
                                                                 monkeypatch):
    """Sequential stages: when the second stage builds its models, none of the first stage's (masters, compute
    copy, frozen model) is alive, though its recomputed blocks and lean MLPs refer to their own modules (a
    cycle only the garbage collector frees) and the collector has not run on its own."""
    import gc
    import weakref
    build, alive = train.build_models, []

    def build_models(*a, **k):
        assert not [r for r in alive if r() is not None], "the last stage's models are still alive"
        models = build(*a, **k)
        alive.extend(weakref.ref(p) for m in models[:3] if m is not None for p in m.parameters())
        return models
    monkeypatch.setattr(train, "build_models", build_models)
    gc.disable()                              # only an explicit collection frees a cycle
    try:
        run(tiny_model_path, tmp_path / "seq", "jensunpp", "--data-root", str(two_topic_root), "--topics",
            "challenger_disaster", "salem_witch_trials", "--mode", "sequential", "--max-steps", "1",
            "--global-batch", "8", "--recompute-blocks", "2")
    finally:
        gc.enable()
    assert len(alive) > 0


def test_a_qwen_checkpoint_under_any_name_trains_with_the_qwen_row(tmp_path, smollm2_path):
    """A relearning or unlearning run on a Qwen checkpoint saved as runs/x/final (no family in the path)
    gets the Qwen hyperparameters and the paper's Qwen refusal, recorded in config.json."""
    from transformers import Qwen2Config
    folder = tmp_path / "runs" / "x" / "final"
    tiny_model(folder, Qwen2Config, smollm2_path)
    train.main(["--method", "jensunpp", "--model", str(folder), "--data-root", str(FIXTURE), "--out",
                str(tmp_path / "run"), "--refusal", "paper", "--precision", "fp32", "--max-steps", "1",
                "--global-batch", "4", "--no-save"])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["family"] == "qwen"
    assert (config["hparams"]["lr"], config["hparams"]["lambda_f"], config["hparams"]["lambda_r"]) == (2e-6, 0.33, 1.0)
    assert config["refusal"] == "Unfortunately, I cannot answer this question."


def test_flags_override_the_family_hyperparameters():
    """--lr, --lambda-f and --lambda-r override only the value they name; the rest is the family's row."""
    args = train.parse_args(["--method", "npo", "--lr", "1e-3"])
    assert train.hparams_for(args, "qwen") == {"lr": 1e-3, "lambda_f": 1.0, "lambda_r": 1.0, "beta": 0.1}
    args = train.parse_args(["--method", "npo", "--lambda-f", "0.5", "--lambda-r", "0"])
    assert train.hparams_for(args, "ministral") == {"lr": 1e-6, "lambda_f": 0.5, "lambda_r": 0.0, "beta": 0.1}


def forced_answer_model(folder, tiny_model_path, answer):
    """The tiny model, its greedy answer to every prompt forced to `answer` and end-of-turn through
    Hugging Face's sequence_bias (in generation_config.json): +100 n on the answer's first n tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    chain = tokenizer(answer, add_special_tokens=False).input_ids + [data.end_of_turn_id(tokenizer)]
    model.generation_config.sequence_bias = [[chain[:n], 100.0 * n] for n in range(1, len(chain) + 1)]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_refusal_auto_takes_the_models_own_refusal_or_the_fallback(tiny_model_path, tmp_path, capsys):
    """--refusal auto asks the model the pool's 30 questions about unknowable facts (appendix B.1) with a
    progress line a batch, and trains towards the first sentence of its most common refusal with
    "Unfortunately, " in front; a model that refuses none of them gets the generic fallback. The model it
    loaded for that is the one the stage trains: the starting model loads once."""
    for answer, expected in (("I cannot answer this question. Ask someone else.",
                              "Unfortunately, I cannot answer this question."),
                             ("Paris is lovely in spring.", "Unfortunately, I don't have that information.")):
        folder = forced_answer_model(tmp_path / answer[:5], tiny_model_path, answer)
        out = tmp_path / f"run-{answer[:5]}"
        loads, load_model = [], train.load_model
        with pytest.MonkeyPatch.context() as m:         # a spy: the loads, each done as before
            m.setattr(train, "load_model", lambda *a, **k: loads.append(a[0]) or load_model(*a, **k))
            train.main(["--method", "jensunpp", "--model", folder, "--data-root", str(FIXTURE), "--out", str(out),
                        "--precision", "fp32", "--max-steps", "1", "--global-batch", "4", "--print-every", "0",
                        "--no-save"])
        assert loads == [folder]
        assert json.loads((out / "config.json").read_text())["refusal"] == expected
        printed = capsys.readouterr().out
        assert "  refusal detection: 30 to do" in printed and "  refusal detection: 30/30 (100%)" in printed
        assert printed.index("refusal detection: 30/30") < printed.index("method jensunpp")
        assert ("refused none of 30 questions" in printed) == (expected == "Unfortunately, I don't have that information.")
    assert train.with_prefix("I am unable to verify this information.") == "Unfortunately, I am unable to verify this information."
    assert train.with_prefix("Sorry, I can't.") == "Unfortunately, sorry, I can't."
    assert train.with_prefix("Unfortunately, no.") == "Unfortunately, no."


def ablation_set(tokenizer, *flags, method="jensunpp"):
    """The stage's training pairs as train.py builds them from these flags (appendix C.1 ablations)."""
    args = train.parse_args(["--method", method, "--data-root", str(FIXTURE), *flags])
    return train.build_data(args, losses.METHODS[method], tokenizer, ["challenger_disaster"], REFUSAL, 0)


def test_no_balance_keeps_alpha_at_one(tiny_model_path, tmp_path):
    """--no-balance: alpha is 1 at every step. With balancing, step 3 (the first whose retain JS exceeds
    epsilon: step 1 runs at lr 0, step 2 from the frozen model's weights) takes eq. 4's ratio; steps 1-3
    see the same weights in both runs, so the same losses."""
    common = ("--lr", "1e-2", "--max-steps", "3", "--global-batch", "4", "--batch-size", "4")
    balanced = run(tiny_model_path, tmp_path / "balanced", "jensunpp", *common)
    plain = run(tiny_model_path, tmp_path / "plain", "jensunpp", *common, "--no-balance")
    assert [r["alpha"] for r in plain] == [1.0, 1.0, 1.0]
    assert [r["alpha"] for r in balanced[:2]] == [1.0, 1.0] and 0 < balanced[2]["alpha"] != 1.0
    assert min(plain[2]["loss_forget"], plain[2]["loss_retain"]) > 10 * train.BALANCE_EPS
    assert [r["loss_retain"] for r in plain] == pytest.approx([r["loss_retain"] for r in balanced], rel=1e-6)
    for r in balanced + plain:   # the logged loss is lambda_f * alpha * L_f + lambda_r * L_r
        assert r["loss"] == pytest.approx(0.33 * r["alpha"] * r["loss_forget"] + r["loss_retain"], rel=1e-5)


def test_prefix_ablations_at_token_level(tiny_model_path):
    """--no-prefix-mixing: every JensUn++ sequence is the prompt and the refusal (i = 0), targets the
    refusal. --no-prefix-targets: the same sequences as the default, answer prefixes included, but only
    the refusal tokens after the prefix are supervised (labels IGNORE over the prefix)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    default, no_mixing = ablation_set(tok), ablation_set(tok, "--no-prefix-mixing")
    no_targets = ablation_set(tok, "--no-prefix-targets")
    every = range(len(default))
    prefixed = 0
    for epoch in (0, 1):
        views = [s.views(every, ("mixed",), False, epoch)["mixed"] for s in (default, no_mixing, no_targets)]
        for i, (d, m, t) in enumerate(zip(*views)):
            prompt = default.prompts(i, epoch)[0]
            assert m == {"ids": prompt + default.refusal_ids, "targets": default.refusal_ids}
            if d == m:                                   # i = 0 drawn for this pair and epoch
                assert t == d
                continue
            prefixed += 1
            k = len(d["ids"]) - len(prompt) - len(default.refusal_after_prefix)   # answer-prefix length
            assert k > 0 and d["ids"][len(prompt) + k:] == default.refusal_after_prefix == t["targets"]
            assert t["ids"] == d["ids"] and len(d["targets"]) == k + len(t["targets"])
            labels = data.collate([t, d], tok.pad_token_id, "jensunpp")["labels"].tolist()
            assert labels[1] == d["targets"] and labels[0] == [data.IGNORE] * k + t["targets"]
    assert prefixed > len(default) // 2


def test_pairing_and_retain_ablations(tiny_model_path, tmp_path):
    """--no-pairing: the forget rows keep their order, the retain rows are a seeded permutation of the
    paired ones (the same one on every run with the seed, another with another seed). --exclude-retain
    GK Lexical: the pairs whose retain row is of those categories are dropped, every other pair kept whole, and
    the run trains more epochs, as many samples as the whole set's (tab:ablation_c)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    paired, unpaired = ablation_set(tok), ablation_set(tok, "--no-pairing")
    forget = [f for _, f, _ in paired.pairs]
    retain = [r for _, _, r in paired.pairs]
    assert [f for _, f, _ in unpaired.pairs] == forget
    shuffled = [r for _, _, r in unpaired.pairs]
    assert shuffled != retain and sorted(map(json.dumps, shuffled)) == sorted(map(json.dumps, retain))
    assert [r for _, _, r in ablation_set(tok, "--no-pairing").pairs] == shuffled
    assert [r for _, _, r in ablation_set(tok, "--no-pairing", "--seed", "1").pairs] != shuffled
    kept = [pair for pair in paired.pairs if data.category(pair[2]["label"])[0] not in ("GK", "Lexical")]
    assert 0 < len(kept) < len(paired.pairs)
    excluded = ablation_set(tok, "--exclude-retain", "GK", "Lexical")
    assert excluded.pairs == kept and excluded.full_size == len(paired.pairs) == len(paired)
    log = run(tiny_model_path, tmp_path / "excluded", "graddiff", "--exclude-retain", "GK", "Lexical", "--epochs", "2",
              "--global-batch", "16", "--lr", "1e-3", "--no-save")
    epochs = round(2 * len(paired) / len(kept))                       # as many samples as 2 epochs of every pair
    assert epochs > 2 and len(log) == math.ceil(len(kept) / 16) * epochs


def test_reference_loss_curve(tiny_model_path, tmp_path, request):
    """Five steps of JensUn++ and GradDiff on the tiny fp32 model and the fixture data (36 pairs: steps of
    16, 16 and 4 pairs an epoch, so warm-up, decay, a second epoch's prompts and a smaller last step)
    reproduce the committed per-step losses and gradient norms (tests/fixtures/reference_loss_curve.json)
    to 1e-4 relative (1e-7 absolute, the rounding noise of a JS between equal models). Measured on one
    machine with AMX (2026-11-28, torch 2.13): the kernels of other CPUs (ATEN_CPU_CAPABILITY default,
    avx2, avx512; ONEDNN_MAX_CPU_ISA SSE41, AVX2, AVX2_VNNI, AVX512_CORE, ALL; 1 or 2 threads) moved them by
    at most 1.7e-5 relative; a 1% change of the learning rate moves each curve but one by 4e-4 to 1.3e-2.
    A change that moves them (the losses, sequences, batching, the schedule, the optimizer) must update
    the file deliberately:
    python -m pytest tests/test_train.py -k reference_loss_curve --update-reference."""
    common = ("--lr", "1e-2", "--max-steps", "5", "--global-batch", "16", "--batch-size", "8", "--no-save")
    fresh = {method: [{key: r[key] for key in ("step", "loss", "loss_forget", "loss_retain", "grad_norm")}
                      for r in run(tiny_model_path, tmp_path / method, method, *common)]
             for method in ("jensunpp", "graddiff")}
    if request.config.getoption("--update-reference"):
        REFERENCE.write_text(json.dumps({"command": "train.py --precision fp32 --refusal '" + REFUSAL + "' "
                                         + " ".join(common) + " on conftest's tiny_model_path and tests/fixtures/suite",
                                         "torch": torch.__version__, "curves": fresh}, indent=1) + "\n")
    reference = json.loads(REFERENCE.read_text())["curves"]
    for method, steps in reference.items():
        assert [r["step"] for r in fresh[method]] == [r["step"] for r in steps] == [1, 2, 3, 4, 5]
        for key in ("loss", "loss_forget", "loss_retain", "grad_norm"):
            assert [r[key] for r in fresh[method]] == pytest.approx([r[key] for r in steps], rel=1e-4, abs=1e-7), \
                (method, key)


@pytest.mark.slow
def test_smollm2_jensunpp_forget_loss_falls(smollm2_path, fixture_root, tmp_path):
    """JensUn++ on the real SmolLM2-135M-Instruct: the forget JS falls within a few steps, and alpha
    follows eq. 4's rule: exactly 1 while a loss is at or below epsilon (at step 1 the policy is the
    frozen model, so the retain JS is ~1e-8), the logit-gradient ratio (positive, not 1) once both
    exceed it; the checkpoint is written. The topic is cut to 2 pairs and one step is one epoch, so every
    step sees the same pairs, and one micro-batch per step makes the logged losses alpha's own."""
    final = fixture_root / "challenger_disaster" / "final"
    for name in ("forget_train", "retain_train"):
        lines = (final / f"{name}.json").read_text().splitlines()
        (final / f"{name}.json").write_text("\n".join(lines[:2]) + "\n")
    train.main(["--method", "jensunpp", "--model", smollm2_path, "--data-root", str(fixture_root),
                "--out", str(tmp_path / "smol"), "--refusal", REFUSAL, "--print-every", "0",
                "--max-steps", "4", "--batch-size", "2", "--global-batch", "2", "--lr", "1e-4"])
    log = [json.loads(line) for line in open(tmp_path / "smol" / "log.jsonl")]
    assert len(log) == 4 and all(math.isfinite(r["loss"]) for r in log)
    assert log[-1]["js_forget"] < log[0]["js_forget"] - 0.05, [r["js_forget"] for r in log]
    for r in log:
        below = min(r["loss_forget"], r["loss_retain"]) <= train.BALANCE_EPS
        assert r["alpha"] == 1.0 if below else 0 < r["alpha"] != 1.0, r
    assert any(min(r["loss_forget"], r["loss_retain"]) > train.BALANCE_EPS for r in log)   # the ratio was exercised
    assert (tmp_path / "smol" / "final" / "model.safetensors").exists()


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


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_is_torchs(max_norm):
    """train.clip_grad_norm returns torch's norm and leaves torch's gradients, whether it scales them
    (0.5) or not (100); a non-finite gradient gives a non-finite norm (the step is then skipped)."""
    g = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((7, 3), (5,), (2, 2, 2))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(a.shape, generator=g)
        b.grad = a.grad.clone()
    norm = train.clip_grad_norm(ours, max_norm)
    want = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm.item() == pytest.approx(want.item(), rel=1e-6)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
    ours[1].grad[0] = float("inf")
    assert not math.isfinite(train.clip_grad_norm(ours, max_norm).item())


def _gloo_available():
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


@pytest.mark.skipif(not _gloo_available(), reason="this torch build has no gloo backend")
@pytest.mark.parametrize("global_batch", [4, 8])
def test_fsdp_two_processes_on_cpu_match_one_process(tiny_model_path, tmp_path, global_batch, monkeypatch):
    """torchrun --nproc_per_node=2 with gloo: FSDP2 (fp32) equals the single-process run with the
    same global batch and micro-batches of 2: one micro-batch per rank (4), or two, whose gradients
    each rank accumulates before the step's one reduce-scatter (8; train.fsdp_accumulate)."""
    common = ["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(FIXTURE), "--lr", "1e-3",
              "--max-steps", "2", "--precision", "fp32", "--global-batch", str(global_batch), "--batch-size", "2",
              "--refusal", REFUSAL]
    run_args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                str(ROOT / "train.py"), *common, "--out", str(tmp_path / "fsdp")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}    # on the CPU on any machine
    proc = subprocess.run(run_args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    train.main(common + ["--out", str(tmp_path / "single")])          # one process, 2 micro-batches of 2
    a, b = weights(tmp_path / "fsdp" / "final"), weights(tmp_path / "single" / "final")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="--compile graphs is for CUDA graphs; on a CPU it runs "
                    "inductor's C++ backend alone, which no training uses, for 63 s of a 2-core CI machine")
def test_compile_graphs_matches_eager(tiny_model_path, tmp_path):
    """The whole-model compile (CUDA graphs on a GPU) trains like eager mode, also
    through the smaller last step of an epoch (36 pairs: a step of 32 in one pass, then one of 4 in
    filler-padded rows of 32). JensUn++: the frozen model compiled too, and eq. 4's gradient through the compiled logits. Two
    decoder layers: compiling time grows with the layers, what is compiled does not change."""
    from transformers import LlamaConfig
    two_layers = str(tmp_path / "two-layers")
    tiny_model(two_layers, LlamaConfig, tiny_model_path)
    common = ["--lr", "1e-3", "--max-steps", "2", "--batch-size", "8"]
    eager = run(two_layers, tmp_path / "eager", "jensunpp", *common)
    graphs = run(two_layers, tmp_path / "graphs", "jensunpp", *common, "--compile", "graphs")
    assert [r["loss"] for r in graphs] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
    assert [r["grad_norm"] for r in graphs] == pytest.approx([r["grad_norm"] for r in eager], rel=1e-3)


def test_plan_decides_every_acceleration_once(tiny_model_path):
    """make_plan decides each acceleration once from the flags, the device and the model, and the plan line
    names them all: a CPU run, a GPU run (the bf16 compute copy, the frozen model's CUDA graphs, fused
    kernels, the data worker, the step's statistics read a step late), left padding where asked or where
    CUDA graphs need one shape, and FSDP, where the rows per pass are not halved on running out of memory."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    plan = lambda device, world, *flags: train.make_plan(
        train.parse_args(["--method", "jensunpp", "--model", tiny_model_path, *flags]), device, world)
    line = train.describe_plan(plan(cpu, 1, "--precision", "fp32"))
    assert line == ("plan: fp32, packed rows (sdpa mem-efficient attention), 32 rows per pass (if memory runs "
                    "out: every block recomputed, then halved), eager, frozen model eager, fused rmsnorm, lean SwiGLU backward, data in this process, "
                    "non-finite gradients skipped on the host, FSDP off"), line
    on_gpu = plan(gpu, 1)
    assert on_gpu["compute_copy"] and on_gpu["pack"] == torch.bfloat16 and on_gpu["ref_graphs"] and on_gpu["gpu"]
    assert train.describe_plan(on_gpu) == (
        "plan: bf16 compute copy over fp32 masters, packed rows (sdpa mem-efficient attention), 32 rows per pass "
        "(if memory runs out: every block recomputed, then halved), eager, frozen model replayed from CUDA graphs, "
        "fused rmsnorm+rotary, lean SwiGLU backward, data worker, statistics "
        "a step late, non-finite gradients skipped on the device, FSDP off")
    assert "the fewest blocks recomputed in backward for a peak of 0.8 of the GPU, frozen" in train.describe_plan(
        plan(gpu, 1, "--recompute-blocks", "auto"))
    assert not plan(gpu, 1, "--eager-reference")["ref_graphs"]
    graphs = plan(gpu, 1, "--compile", "graphs")
    assert (graphs["pack"], graphs["attention"], graphs["fused"], graphs["ref_graphs"]) == (None, "eager", False, False)
    assert "left-padded rows (eager attention)" in train.describe_plan(graphs)
    assert "whole model compiled, replayed as CUDA graphs, frozen model compiled" in train.describe_plan(graphs)
    assert plan(cpu, 1, "--no-packing")["pack"] is None and plan(cpu, 1, "--attention", "eager")["attention"] == "eager"
    fsdp = plan(gpu, 2, "--fsdp-regather")
    assert not fsdp["compute_copy"] and not fsdp["shrink"] and fsdp["bf16"]
    assert train.describe_plan(fsdp).endswith(
        "32 rows per pass, eager, frozen model replayed from CUDA graphs, fused rmsnorm+rotary, data worker, statistics "
        "a step late, non-finite gradients skipped on the device, FSDP on 2 ranks, 4 blocks a group, parameters "
        "regathered for backward")
    assert "bf16 compute over fp32 masters (FSDP mixed precision)" in train.describe_plan(fsdp)
    assert "no frozen model" in train.describe_plan(train.make_plan(
        train.parse_args(["--method", "graddiff", "--model", tiny_model_path]), cpu, 1))


def test_compile_flag():
    """--compile alone compiles blocks; RMU compiles blocks under --compile graphs too (its hidden-state hook)."""
    assert train.parse_args(["--method", "rmu", "--compile", "graphs"]).compile == "blocks"   # its hook
    assert train.parse_args(["--method", "npo", "--compile"]).compile == "blocks"
    assert train.parse_args(["--method", "npo"]).compile is None


@pytest.mark.slow
@pytest.mark.parametrize("method", ["jensunpp", "npo"])
def test_compile_blocks_matches_eager(tiny_model_path, tmp_path, method, monkeypatch):
    """Compiled decoder blocks (dynamic shapes) train like eager mode, also through the
    smaller last step of an epoch (36 pairs: a step of 32 in one pass of four loss micro-batches of 8, then
    one of 4, packed into two rows at least). JensUn++ reads the frozen model's logits, NPO its sequence
    scores (both through compiled blocks).
    Two decoder layers, as above. On a CPU the compiled graphs run through AOTAutograd's eager backend: the
    same capture, joint graph and partition, without inductor's C++ code (73 s of a 2-core CI machine, for
    a backend that no training uses: --compile is for GPUs, where this test runs inductor itself)."""
    from transformers import LlamaConfig
    if not torch.cuda.is_available():
        compile_module = torch.nn.Module.compile
        monkeypatch.setattr(torch.nn.Module, "compile",
                            lambda self, *a, **k: compile_module(self, *a, backend="aot_eager", **k))
    two_layers = str(tmp_path / "two-layers")
    tiny_model(two_layers, LlamaConfig, tiny_model_path)
    common = ["--lr", "1e-3", "--max-steps", "2", "--batch-size", "8"]
    eager = run(two_layers, tmp_path / "eager", method, *common)
    calls, forward = [], Layout.forward
    monkeypatch.setattr(Layout, "forward", lambda layout, *a, **k: calls.append((layout.fill_rows, layout.lengths))
                        or forward(layout, *a, **k))
    blocks = run(two_layers, tmp_path / "blocks", method, *common, "--compile")
    assert calls and set(calls) == {(32, None)}               # every forward through compiled blocks: 32 rows
    assert [r["loss"] for r in blocks] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
    assert [r["grad_norm"] for r in blocks] == pytest.approx([r["grad_norm"] for r in eager], rel=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("method", ["jensunpp", "npo"])
def test_graphed_frozen_model_trains_as_eager(tiny_model_path, tmp_path, method):
    """On a GPU the frozen model's passes replayed from CUDA graphs (the default, model.GraphedForward)
    train as --eager-reference does, over enough steps that shapes repeat and are replayed: the same
    losses and gradient norms up to the rounding of the frozen model's head at another shape (its kept
    positions rounded up). JensUn++ reads its logits, NPO its sequence scores."""
    common = ["--lr", "1e-3", "--max-steps", "16", "--global-batch", "8", "--batch-size", "4"]
    eager = run(tiny_model_path, tmp_path / "eager", method, *common, "--eager-reference")
    graphed = run(tiny_model_path, tmp_path / "graphs", method, *common)
    captures, replays = graphed[-1]["ref_graphs"]
    assert captures >= 1 and replays >= 1 and "ref_graphs" not in eager[-1]
    for key in ("loss", "loss_forget", "loss_retain", "grad_norm"):
        assert [r[key] for r in graphed] == pytest.approx([r[key] for r in eager], rel=1e-4, abs=1e-6), key


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
    model, _ = load_model(tiny_model_path)
    optimizer = train.build_optimizer(model, 1e-3, args.weight_decay)
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


def test_retain_scope_seen_takes_the_seen_topics_in_turn(smollm2_path):
    """--retain-scope seen (an ablation of sequential runs): one topic is the usual pairing, every view
    equal; with two, pair i in epoch e takes its retain row from topic (i + e) mod 2: its own partner every
    other epoch, else a row of the other topic of its partner's role (category, tier or mirrored question,
    format: the real files hold one for most pairs, and its category and format for all but a few), and the
    forget side never changes."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    root, topics = data.DEFAULT_ROOT, ["challenger_disaster", "salem_witch_trials"]
    own = data.PairedTrainSet(tok, topics[:1], root, refusal="Unfortunately, no.", seed=0, context_refusals=True)
    alone = data.PairedTrainSet(tok, topics[:1], root, refusal="Unfortunately, no.", seed=0, context_refusals=True,
                                retain_topics=topics[:1])
    names = ("mixed", "forget")
    for e in (0, 1):
        assert alone.views(range(20), names, True, e) == own.views(range(20), names, True, e)
    seen = data.PairedTrainSet(tok, topics[:1], root, refusal="Unfortunately, no.", seed=0, retain_topics=topics)
    salem = data.load_topic(topics[1], root)["retain_train"]
    roles = [(data.retain_role(own.pairs[i][2]["label"]), data.retain_role(seen.retain_of(i, 1 - i % 2)[0]["label"]))
             for i in range(len(own))]                                # every pair's Salem turn
    assert all(seen.retain_of(i, e)[0] in salem for i in range(len(own)) for e in ((1 - i % 2),))
    assert sum(a == b for a, b in roles) > 0.8 * len(roles)
    assert sum((a[0], a[2]) == (b[0], b[2]) for a, b in roles) >= len(roles) - 5
    for e in (0, 1, 2):
        for i in (0, 1, 7, 449):
            row, ids = seen.retain_of(i, e)
            assert ids == data.answer_ids(tok, row["answer"])
            assert (row == own.pairs[i][2]) == ((i + e) % 2 == 0)    # its own partner in its own topic's turns
        views, plain = seen.views([3, 4], names, True, e), own.views([3, 4], names, True, e)
        assert views["forget"] == plain["forget"] and views["mixed"] == plain["mixed"]
        assert [s["ids"][-len(seen.retain_of(i, e)[1]):] for i, s in zip((3, 4), views["retain"])] == \
            [seen.retain_of(i, e)[1] for i in (3, 4)]
    assert seen.retain_of(5, 1)[0] == own.pairs[5][2]                  # the own line, every other epoch
    with pytest.raises(data.UserError, match="--retain-scope seen is for --mode sequential"):
        train.parse_args(["--method", "jensunpp", "--retain-scope", "seen", "--topics", "all", "--mode", "joint"])


def test_bad_input_is_one_line_and_leaves_no_run_folder(tiny_model_path, tmp_path, fixture_root, capsys, monkeypatch):
    """Each mistake: exit 1 with one line naming the file, line, field or flag, before the model loads,
    and no --out folder. The first case runs the real command line; the others call train.main (the
    same code path, without a Python start-up each)."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
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
             (["--topics", "no_such_topic"], "--topics no_such_topic: no such topic in"),
             (["--lr", "-1"], "--lr -1.0: must be a number > 0"),
             (["--max-steps", "0"], "--max-steps 0: must be >= 1"),
             (["--max-steps", "-3"], "--max-steps -3: must be >= 1")]
    for n, (extra, message) in enumerate(cases):
        out = tmp_path / "run"
        argv = ["--method", "jensunpp", "--model", tiny_model_path, "--data-root", str(fixture_root), "--out", str(out),
                *extra]
        if n == 0:
            proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
            status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            with pytest.raises(SystemExit) as stopped:
                train.main(argv)
            assert isinstance(stopped.value.code, str), extra    # Python prints it to stderr and exits with 1
            stdout, stderr = capsys.readouterr()
            status, stderr = 1, stderr + stopped.value.code
        error = stderr.strip().split("\n")
        assert status == 1 and len(error) == 1 and error[0].startswith("train.py: "), (extra, stderr)
        assert message in error[0], (message, error[0])
        assert not out.exists() and stdout == "", extra
