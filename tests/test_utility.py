"""Utility metrics: n-gram entropy by hand, greedy long answers, the stratified MMLU subset, letter scoring on a
tiny model with a known answer, batched == unbatched answer NLL, the RGQ formula and RGQ through the judge,
the NLL summary and plots.

    python -m pytest tests/test_utility.py -q
"""
import importlib.util
import json
import math
from collections import Counter

import pytest
import torch

import data
import heuristic
import utility
from model import load_model


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model, tokenizer = load_model(tiny_model_path)
    return model.eval(), tokenizer


def mmlu_rows(k=8):
    rows = utility.load_mmlu(n=k, seed=1)
    assert len(rows) == k
    return rows


# ----------------------------------------------------------------------------------------------
# Repetitiveness

def h(counts):
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts)


def test_ngram_entropy_by_hand():
    # "a b a b": bigrams {(a,b): 2, (b,a): 1}, trigrams {(a,b,a): 1, (b,a,b): 1}
    expected = (2 / 3 * h([2, 1]) + 4 / 3 * h([1, 1])) / 2
    assert utility.ngram_entropy("a b a b") == pytest.approx(expected)
    assert utility.ngram_entropy("a b a b") == pytest.approx((2 / 3 * 0.918296 + 4 / 3 * 1.0) / 2, abs=1e-6)
    # all distinct: 3 bigrams, 2 trigrams
    assert utility.ngram_entropy("a b c d") == pytest.approx((2 / 3 * math.log2(3) + 4 / 3 * 1.0) / 2)
    # punctuation marks are tokens of their own: "Hi , there ." -> same as the spaced version
    assert utility.words("Hi, there.") == ["Hi", ",", "there", "."]
    assert utility.ngram_entropy("Hi, there.") == utility.ngram_entropy("Hi , there .")
    # too short for any n-gram: 0 (not NaN)
    assert utility.ngram_entropy("word") == 0.0
    assert utility.ngram_entropy("") == 0.0


def test_repetitiveness_lower_for_repeated_text():
    repeated = "the cat sat on the mat. " * 40
    varied = ("Unlearning removes specific knowledge from a trained language model while keeping its general "
              "abilities intact; researchers measure both the forgetting and the utility that remains, for "
              "example with multiple choice questions, long open-ended answers and a judge model.")
    assert utility.ngram_entropy(repeated) < utility.ngram_entropy(varied)
    rep = utility.repetitiveness([repeated, varied])
    assert rep == pytest.approx(100 * (utility.ngram_entropy(repeated) + utility.ngram_entropy(varied)) / 2)
    assert utility.repetitiveness(["yes yes yes yes yes"]) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        utility.repetitiveness([])


def test_load_instructions_both_formats(tmp_path):
    jl = tmp_path / "ins.jsonl"
    jl.write_text("\n".join(json.dumps({"id": i, "category": "c", "instruction": f"Do {i}."}) for i in range(3)))
    assert utility.load_instructions(jl) == ["Do 0.", "Do 1.", "Do 2."]
    arr = tmp_path / "alpaca_eval.json"
    arr.write_text(json.dumps([{"instruction": "Write a poem.", "output": "x", "dataset": "d"},
                               {"instruction": "Explain tides."}]))
    assert utility.load_instructions(arr) == ["Write a poem.", "Explain tides."]
    assert utility.load_instructions(arr, n=1) == ["Write a poem."]
    arr.write_text(json.dumps([{"instruction": "ok"}, {"output": "no instruction"}]))
    with pytest.raises(data.DataError, match="instruction"):
        utility.load_instructions(arr)


def test_generate_long_is_greedy_and_stops_at_end_of_turn(tiny_model_path):
    """A head that is a bias alone makes one token win at every step, whatever the prompt and its left
    padding: each answer is that token max_new_tokens times; when the end-of-turn token wins, each answer
    is empty (generation stops and the stop token is not decoded)."""
    model, tokenizer = load_model(tiny_model_path)
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    sea = tokenizer.encode(" sea", add_special_tokens=False)
    assert len(sea) == 1
    prompts = ["Say hi.", "Write a long story about the sea.", "Name a colour."]
    for winner, want in ((sea[0], "sea sea sea sea"), (data.end_of_turn_id(tokenizer), "")):
        with torch.no_grad():
            model.lm_head.weight.zero_()
            model.lm_head.bias.zero_()
            model.lm_head.bias[winner] = 10.0
        assert utility.generate_long(model, tokenizer, prompts, max_new_tokens=4, batch_size=2) == [want] * 3


def test_static_cache_generation_matches_dynamic(tiny):
    """cache="static" left-pads prompts to a multiple of model.STATIC_PAD and fills the last batch with
    copies: greedy answers must not change, and the filler rows must not come back."""
    model, tokenizer = tiny
    texts = ["Say hi.", "Write a long story about the sea and the ships on it, please.", "Name a colour.",
             "Count to three.", "What is two plus two?"]
    dynamic = utility.generate_long(model, tokenizer, texts, max_new_tokens=6, batch_size=2)
    static = utility.generate_long(model, tokenizer, texts, max_new_tokens=6, batch_size=2, cache="static")
    assert len(static) == len(texts) and static == dynamic
    model._can_compile_fullgraph = False          # an architecture without static-cache support falls back
    try:
        assert utility.generate_long(model, tokenizer, texts[:2], max_new_tokens=6, batch_size=2, cache="static") == dynamic[:2]
    finally:
        del model._can_compile_fullgraph


# ----------------------------------------------------------------------------------------------
# MMLU

def test_load_mmlu_stratified_and_deterministic():
    all_rows = utility.read_mmlu()
    assert len(all_rows) == 14042                        # 14,044 lines minus the two header copies
    sizes = Counter(r["topic"] for r in all_rows)
    rows = utility.load_mmlu()
    assert len(rows) == 2000
    assert all(r["correct_answer"] in "ABCD" and r["question"] != "question" for r in rows)
    counts = Counter(r["topic"] for r in rows)
    assert set(counts) == set(sizes)                     # 57 subjects, all present at n = 2000
    for subject, size in sizes.items():
        assert abs(counts[subject] - 2000 * size / len(all_rows)) < 1, subject
    assert len({r["_line"] for r in rows}) == 2000       # no row drawn twice (MMLU itself has duplicates)
    keys = [utility._row_key(r) for r in rows]
    assert keys == [utility._row_key(r) for r in utility.load_mmlu()]
    assert keys != [utility._row_key(r) for r in utility.load_mmlu(seed=1)]
    assert len(utility.load_mmlu(n=101)) == 101


def test_allocate_largest_remainders():
    assert utility.allocate({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    alloc = utility.allocate({"x": 7, "y": 5, "z": 3}, 10)
    assert sum(alloc.values()) == 10 and alloc == {"x": 5, "y": 3, "z": 2}


def test_mmlu_user_file_errors_name_the_line(tmp_path):
    good = {"question": "2+2?", "answer_a": "3", "answer_b": "4", "answer_c": "5", "answer_d": "6",
            "correct_answer": "B", "topic": "math"}
    header = {k: k for k in good} | {"correct_answer": "answer"}
    path = tmp_path / "mmlu.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [header, good, {**good, "answer_c": ""}]))
    with pytest.raises(data.DataError, match=r"mmlu.jsonl:3 field 'answer_c'"):
        utility.load_mmlu(path)
    path.write_text("\n".join(json.dumps(r) for r in [good, good, {**good, "correct_answer": "E"}]))
    with pytest.raises(data.DataError, match=r":3 field 'correct_answer'"):
        utility.load_mmlu(path)
    path.write_text("\n".join(json.dumps(r) for r in [header, good, {**good, "topic": "bio"}]))
    rows = utility.load_mmlu(path, n=5)                  # n larger than the file: every valid row
    assert [r["topic"] for r in rows] == ["bio", "math"]


def test_mmlu_accuracy_on_tiny_model(tiny):
    model, tokenizer = tiny
    rows = mmlu_rows(8)
    acc, preds = utility.mmlu_accuracy(model, tokenizer, rows, batch_size=3)
    assert 0.0 <= acc <= 1.0 and len(preds) == 8 and set(preds) <= set("ABCD")
    assert acc == sum(p == r["correct_answer"] for p, r in zip(preds, rows)) / 8
    batched = utility.mmlu_scores(model, tokenizer, rows, batch_size=8)
    single = utility.mmlu_scores(model, tokenizer, rows, batch_size=1)
    assert batched.shape == (8, 4)
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=0)


def test_mmlu_letter_scoring_with_known_answer(tiny_model_path):
    """Replace the head by a bias alone: the biased token wins at every position, so every prediction
    must be its letter, whichever of the two encodings ("B" or " B") carries the bias."""
    model, tokenizer = load_model(tiny_model_path)
    ids = utility.letter_ids(tokenizer)                  # (4, 2): "L" and " L"
    assert ids[:, 0].unique().numel() == 4
    rows = mmlu_rows(6)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    model.lm_head = head
    for letter, column in (("B", 1), ("D", 0), ("A", 1)):
        with torch.no_grad():
            head.weight.zero_()
            head.bias.zero_()
            head.bias[ids[utility.LETTERS.index(letter), column]] = 10.0
        acc, preds = utility.mmlu_accuracy(model, tokenizer, rows, batch_size=4)
        assert preds == [letter] * len(rows)
        assert acc == sum(r["correct_answer"] == letter for r in rows) / len(rows)


# ----------------------------------------------------------------------------------------------
# NLL of ground-truth answers

QA = [{"question": "In what year was Julius Caesar assassinated?", "answer": "44 BC"},
      {"question": "Capital of France?", "answer": "Paris"},
      {"question": "Who wrote the novel that begins with 'Call me Ishmael'?", "answer": "Herman Melville"},
      {"question": "How deep is the Challenger Deep, approximately, in feet?", "answer": "About 36,000 feet"},
      {"question": "2+2?", "answer": "4"}]


def test_answer_nll_batched_equals_one_at_a_time(tiny):
    model, tokenizer = tiny
    batched = utility.answer_nll(model, tokenizer, QA, batch_size=3)
    assert len(batched) == len(QA)
    for row, value in zip(QA, batched):
        prompt = data.prompt_ids(tokenizer, row["question"], system="")
        answer = data.answer_ids(tokenizer, row["answer"])
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)   # (T, V)
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1)
        expected = -logp[positions, torch.tensor(answer)].mean().item()
        assert value == pytest.approx(expected, abs=1e-4)
    assert utility.answer_nll(model, tokenizer, QA, batch_size=1) == pytest.approx(batched, abs=1e-4)


def records():
    out = []
    for topic in ("challenger_disaster", "salem_witch_trials"):
        for s, shift in (("forget", 3.0), ("retain", -0.2)):
            for i in range(6):
                out.append({"topic": topic, "set": s, "known_before": i % 2 == 0,
                            "nll_before": 1.0 + 0.1 * i, "nll_after": 1.0 + 0.1 * i + shift})
    return out


def test_nll_plots_summary(tmp_path):
    recs = records()
    result = utility.nll_plots(recs, tmp_path / "nll")
    g = result["summary"]["groups"]["forget/known"]          # i = 0, 2, 4 in each of two topics
    values = [1.0, 1.2, 1.4] * 2
    mean = sum(values) / 6
    sem = math.sqrt(sum((v - mean) ** 2 for v in values) / 5 / 6)
    assert g["n"] == 6 and g["mean_before"] == pytest.approx(mean) and g["sem_before"] == pytest.approx(sem)
    assert g["mean_after"] == pytest.approx(mean + 3.0)
    assert result["summary"]["topics"]["salem_witch_trials/retain/unknown"]["n"] == 3
    assert (tmp_path / "nll" / "nll_records.csv").read_text().count("\n") == len(recs) + 1
    assert json.loads((tmp_path / "nll" / "nll_summary.json").read_text()) == result["summary"]
    if importlib.util.find_spec("matplotlib") is None:
        assert "skipped" in result["note"] and not list((tmp_path / "nll").glob("*.png"))
    else:
        assert result["note"] is None
        assert all((tmp_path / "nll" / name).stat().st_size > 0 for name in ("nll_violin.png", "nll_bars.png"))
    with pytest.raises(ValueError, match="set"):
        utility.nll_plots([{**recs[0], "set": "other"}], tmp_path / "bad")


# ----------------------------------------------------------------------------------------------
# RGQ

def test_rgq_counts():
    # forward: unlearned model is A; backward: it is B
    fwd = ["A", "A", "B", "B", "tie", "A", "tie", "INVALID", "A"]
    bwd = ["B", "A", "A", "B", "tie", "tie", "B", "B", "INVALID"]
    # win, disagree(tie), loss, disagree(tie), tie, tie, tie, discarded, discarded
    r = utility.rgq(fwd, bwd)
    assert r == {"rgq": (1 + 0.5 * 5) / 7, "wins": 1, "losses": 1, "ties": 5, "discarded": 2}
    assert utility.rgq(["A", "A"], ["B", "B"])["rgq"] == 1.0
    assert utility.rgq(["B"], ["A"])["rgq"] == 0.0
    assert utility.rgq(["tie"], ["tie"])["rgq"] == 0.5
    assert utility.rgq(["INVALID"], ["A"]) == {"rgq": None, "wins": 0, "losses": 0, "ties": 0, "discarded": 1}
    with pytest.raises(ValueError):
        utility.rgq(["A"], [])


def test_rgq_eval_with_heuristic_judge():
    instructions = ["Name a fruit.", "Describe the sea.", "Say hello."]
    base = ["An apple is a fruit.", "The sea is large and blue.", "Hello there, friend."]
    new = ["fjdk 3#@ kd9!x ##", "The sea is vast and salty.", "Hello to you too."]
    out = utility.rgq_eval(heuristic.HeuristicJudge(), instructions, base, new)
    assert out == {"rgq": pytest.approx(1 / 3), "wins": 0, "losses": 1, "ties": 2, "discarded": 0}
    out = utility.rgq_eval(heuristic.HeuristicJudge(), instructions, new, base)   # roles swapped
    assert out["wins"] == 1 and out["losses"] == 0 and out["rgq"] == pytest.approx(2 / 3)


def test_rgq_eval_puts_the_unlearned_model_first_then_second():
    class PrefersNew:
        def __init__(self):
            self.seen = []

        def compare(self, items, progress=None):
            self.seen += items
            return ["A" if it["response_a"].startswith("new") else "B" for it in items]

    j = PrefersNew()
    out = utility.rgq_eval(j, ["i1", "i2"], ["base1", "base2"], ["new1", "new2"])
    assert out["wins"] == 2 and out["rgq"] == 1.0
    assert [it["response_a"] for it in j.seen] == ["new1", "new2", "base1", "base2"]
    with pytest.raises(ValueError, match="lengths differ"):
        utility.rgq_eval(j, ["i1"], ["b1", "b2"], ["n1"])
