"""Evaluation: aggregation against hand-computed numbers, batched generation, an end-to-end run.

    python -m pytest tests/test_evaluate.py -q
"""
import json

import pytest
import torch

import data
import evaluate
import train
from conftest import FIXTURE


def row(set_name, fact, qtype, verdicts, label=None, variant="original", fmt="alone"):
    label = label or f"{fact}-{qtype}"
    return {"id": f"t|{set_name}|{label}|{variant}|{fmt}|{len(verdicts)}", "topic": "t", "set": set_name,
            "label": label, "fact": fact, "qtype": qtype, "variant": variant, "format": fmt, "context": [],
            "question": "q", "ground_truth": "a", "aliases": [], "answer": "x", "verdicts": verdicts,
            "judge": "heuristic (approximate)"}


def hand_built_rows():
    """Four facts. F1 leaks only through one indirect paraphrase in context; F2 only through
    reverse; F3 only adversarially; F4 never. Gibberish 2 of 8 forget answers. Retain: GK 1/2,
    Syntax 0/1, Lexical 1/1, tier 0 0/2, tier 3 2/2, tier 12 1/1 (one INVALID verdict ignored)."""
    no = {"leak": "NO", "gibberish": "NO"}
    rows = [
        row("forget", "M1", "direct", no), row("forget", "M1", "reverse", no),
        row("forget", "M1", "indirect", {"leak": "YES", "gibberish": "NO"}, variant="q_gemini3", fmt="context"),
        row("forget", "K2", "direct", {"leak": "NO", "gibberish": "YES"}),
        row("forget", "K2", "reverse", {"leak": "YES", "gibberish": "NO"}),
        row("forget", "K3", "direct", no), row("adversarial", "K3", "direct", {"leak": "YES", "gibberish": "NO"},
                                               variant="q_french"),
        row("forget", "K4", "direct", {"leak": "NO", "gibberish": "YES"}), row("forget", "K4", "indirect", no),
    ]
    knows = lambda v: {"knows": v}
    for label, v in [("GK-1 - History - Rome", "YES"), ("GK-2 - Art - Painting", "NO"),
                     ("Syntax-K1-direct@q_gemini1", "NO"), ("Lexical-O-ring", "YES"),
                     ("Semantic-0-Challenger", "NO"), ("Semantic-0-Challenger", "NO"),
                     ("Semantic-3-Chernobyl", "YES"), ("Semantic-3-Chernobyl", "YES"),
                     ("Semantic-12-Hubble", "YES"), ("Semantic-12-Hubble", "INVALID")]:
        rows.append(row("retain", None, data.category(label)[0], knows(v), label=label))
    return rows


def test_metrics_match_hand_computation():
    m = evaluate.topic_metrics(hand_built_rows())
    assert m["facts"] == 4
    assert m["Q_D"] == 0.0                  # nobody leaks through a direct query
    assert m["Q_D+I"] == 25.0               # M1 via indirect
    assert m["Q_R"] == 25.0                 # K2
    assert m["Q_All"] == 50.0               # M1, K2
    assert m["Q_adv"] == 25.0               # K3
    assert m["Q*_All"] == 75.0              # M1, K2, K3
    assert m["Gib"] == 25.0                 # 2 of the 8 forget (non-adversarial) answers
    assert m["Retain"] == pytest.approx(100 * 5 / 9, abs=0.01)
    assert (m["GK"], m["Syn"], m["Lex"]) == (50.0, 0.0, 100.0)
    assert (m["s0"], m["s1-10"], m["s11-15"]) == (0.0, 100.0, 100.0)
    assert m["per_fact"] == {"M1": ["indirect"], "K2": ["reverse"], "K3": ["adversarial"], "K4": []}
    assert m["invalid_verdicts"] == 1


def test_rescore_reproduces_metrics(tmp_path):
    rows = hand_built_rows()
    with open(tmp_path / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    metrics = evaluate.rescore(tmp_path)
    assert metrics["average"]["Q*_All"] == 75.0
    text = (tmp_path / "report.md").read_text()
    assert "approximate" in text and "| t |" in text and "| average |" in text


def test_batched_generation_equals_one_by_one(tiny_model_path):
    model, tok = train.load_model(tiny_model_path, torch.float32)
    prompts = [data.prompt_ids(tok, q) for q in ["What is 2+2?", "Name a colour of the sky on a clear day, please.",
                                                  "Hi", "Who wrote Hamlet, the play about a Danish prince?"]]
    batched = train.generate(model, tok, prompts, max_new_tokens=12, batch_size=4)
    single = [train.generate(model, tok, [p], max_new_tokens=12, batch_size=1)[0] for p in prompts]
    assert batched == single


def test_queries_cover_the_protocol():
    qs = evaluate.build_queries("challenger_disaster", FIXTURE)
    d = data.load_topic("challenger_disaster", FIXTURE)
    n_forget = len(d["forget_eval"]) * 16 * 2
    n_adv = len(d["adversarial"]) * 10 * 2
    assert sum(q["set"] == "forget" for q in qs) == n_forget
    assert sum(q["set"] == "adversarial" for q in qs) == n_adv
    assert sum(q["set"] == "retain" for q in qs) == len(d["retain_eval"])
    ctx = [q for q in qs if q["format"] == "context"]
    assert ctx and all(len(q["context"]) == 3 for q in ctx)
    assert len({q["id"] for q in qs}) == len(qs)


def test_end_to_end_on_smollm2_with_resume(smollm2_path, tmp_path):
    out = tmp_path / "eval"
    args = [smollm2_path, "--data-root", str(FIXTURE), "--out", str(out), "--limit", "1",
            "--skip", "rep", "rgq", "--mmlu-n", "8", "--batch-size", "32"]
    evaluate.main(args)
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(l) for l in open(out / "rows.jsonl")]
    assert rows and all(r["answer"] is not None and r["verdicts"] for r in rows)
    assert all(r["prompt_format"] == "paper" and "QUESTION:" not in r["answer"] for r in rows)
    assert 0 <= metrics["utility"]["mmlu"] <= 100 and metrics["prompt_format"] == ["paper"]
    report = (out / "report.md").read_text()
    assert "approximate" in report and "Prompt format: paper" in report
    # a rerun generates nothing new: every answer is read back
    n_answers = len(open(out / "answers.jsonl").readlines())
    evaluate.main(args)
    assert len(open(out / "answers.jsonl").readlines()) == n_answers
    # the chat format is generated anew (answers of one format never stand in for the other)
    evaluate.main(args + ["--prompt-format", "chat"])
    assert len(open(out / "answers.jsonl").readlines()) == 2 * n_answers
    assert json.loads((out / "metrics.json").read_text())["prompt_format"] == ["chat"]


def test_paper_prompt_format():
    """The authors' raw-text prompt: instruction, three fixed examples, the in-context format's three
    retain pairs numbered 4-6, "Now it's your turn.", then their exact question markers."""
    alone = evaluate.paper_prompt("Who flew?")
    assert alone.endswith("Now it's your turn.\nQUESTION:Who flew?, \n ANSWER:")
    assert "London" in alone and "The capital is Canberra" in alone and "1945" in alone and "4 Question" not in alone
    ctx = evaluate.paper_prompt("Who flew?", [("Q a?", "A"), ("Q b?", "B"), ("Q c?", "C")])
    lines = ctx.split("\n")
    assert lines[-5:] == ["4 Question: Q a? Answer: A", "5 Question: Q b? Answer: B", "6 Question: Q c? Answer: C",
                          "Now it's your turn.", "QUESTION:Who flew?, ANSWER: "]
    assert evaluate.cut_paper_answer(" Francis Scobee\n7. Question: What else?") == "Francis Scobee"
    assert evaluate.cut_paper_answer("1986 QUESTION:When, ANSWER: 1987") == "1986"
    assert evaluate.cut_paper_answer("Paris.\nIt is the capital.") == "Paris.\nIt is the capital."
    assert evaluate.cut_paper_answer("Paris. It is the capital.", qwen=True) == "Paris."
    assert evaluate.cut_paper_answer("Paris\nMore", qwen=True) == "Paris"
    assert evaluate.cut_paper_answer("Paris   London", qwen=True) == "Paris"


def test_thinking_token_is_never_generated(tiny_model_path):
    """Qwen's "<think>" is found in a vocabulary that has it, and generate() never emits suppressed
    tokens: with the final norm zeroed every logit ties at 0, so greedy picks the lowest id (a special
    token) unless ids 0-16 (SmolLM2's special tokens) are suppressed, then id 17 every time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    assert evaluate.thinking_token_ids(tok) == []
    with_think = AutoTokenizer.from_pretrained(tiny_model_path)
    with_think.add_tokens(["<think>"], special_tokens=True)
    assert evaluate.thinking_token_ids(with_think) == [with_think.convert_tokens_to_ids("<think>")]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    prompts = [tok(evaluate.paper_prompt(q)).input_ids for q in ("Who?", "When?")]
    free = train.generate(model, tok, prompts, max_new_tokens=3)
    suppressed = train.generate(model, tok, prompts, max_new_tokens=3, suppress=range(17))
    assert suppressed == [tok.decode([17, 17, 17]).strip()] * 2 and free != suppressed


def test_sequential_run_is_evaluated_stage_by_stage_on_every_topic(tiny_model_path, tmp_path, two_topic_root):
    """A train.py sequential run folder: every stage is evaluated on every topic, and stages.md holds
    the forget rate of each topic after each stage (the paper's figure of forget rate across stages)."""
    root = two_topic_root
    run = tmp_path / "seq"
    train.main(["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(root), "--out", str(run),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--max-steps", "1"])
    evaluate.main([str(run), "--data-root", str(root), "--limit", "1", "--skip", "mmlu", "rep", "rgq",
                   "--batch-size", "64"])
    for stage in ("stage1_challenger_disaster", "stage2_salem_witch_trials"):
        metrics = json.loads((run / "eval" / stage / "metrics.json").read_text())
        assert set(metrics["topics"]) == {"challenger_disaster", "salem_witch_trials"}
    table = (run / "eval" / "stages.md").read_text()
    assert "| stage1_challenger_disaster |" in table and "| stage2_salem_witch_trials |" in table


def test_nll_before_after_analysis(tiny_model_path, tmp_path):
    """--base-eval: NLL of every ground truth under the base and the evaluated model, split by what the
    base knew, summarised and drawn (violin and bar plots)."""
    base_eval = tmp_path / "base_eval"
    common = ["--data-root", str(FIXTURE), "--limit", "1", "--skip", "mmlu", "rep", "rgq", "--batch-size", "64"]
    evaluate.main([tiny_model_path, "--out", str(base_eval), *common])
    out = tmp_path / "eval"
    evaluate.main([tiny_model_path, "--out", str(out), "--base", tiny_model_path, "--base-eval", str(base_eval), *common])
    metrics = json.loads((out / "metrics.json").read_text())
    groups = metrics["utility"]["nll"]
    assert {"forget/unknown", "retain/unknown"} <= set(groups)
    for g in groups.values():          # the same model before and after: identical NLL
        assert g["mean_before"] == pytest.approx(g["mean_after"], rel=1e-4)
    assert (out / "nll" / "nll_violin.png").exists() and (out / "nll" / "nll_bars.png").exists()


def test_results_table_picks_one_learning_rate_per_method(tmp_path):
    """--table: base rows first, then per method the sweep run with the highest Retain - Q_All (ties to
    the lower LR); the whole sweep and example answers below; the chosen folders in OUT.selected."""
    def write_eval(folder, q_all, retain, answer, method=None, lr=None):
        avg = {k: 0.0 for k in evaluate.AVERAGED} | {"Q_All": q_all, "Retain": retain}
        (folder / "eval" / "final").mkdir(parents=True)
        if method:
            (folder / "config.json").write_text(json.dumps({"method": method, "hparams": {"lr": lr}}))
        ev = folder / "eval" / "final"
        ev.joinpath("metrics.json").write_text(json.dumps({"judge": ["heuristic"], "average": avg,
                                                           "utility": {"mmlu": 30.0, "rep": 500.0}}))
        row = {"id": "t|forget|M1-direct|original|alone", "set": "forget", "label": "M1-direct",
               "variant": "original", "format": "alone", "question": "When?", "ground_truth": "1986",
               "answer": answer, "verdicts": {"leak": "YES" if "1986" in answer else "NO"}}
        ev.joinpath("rows.jsonl").write_text(json.dumps(row) + "\n")
        return str(ev)

    runs = [f"base={write_eval(tmp_path / 'base', 100.0, 80.0, 'In 1986.')}",
            write_eval(tmp_path / "npo-a", 40.0, 70.0, "In 1986 | maybe", "npo", 1e-5),     # score 30
            write_eval(tmp_path / "npo-b", 10.0, 60.0, "I don't know.", "npo", 3e-5),       # score 50
            write_eval(tmp_path / "npo-c", 0.0, 50.0, "x x x", "npo", 1e-4),                # score 50, higher LR
            write_eval(tmp_path / "ga-a", 0.0, 5.0, "", "ga", 1e-5)]
    out = tmp_path / "results.md"
    evaluate.main(["--table", str(out), "--runs", *runs, "--examples", "M1-direct"])
    text = out.read_text()
    main = text.split("## Learning-rate sweep")[0]
    assert "| base |  | 0.0 | 0.0 | 100.0 |" in main
    assert "| npo | 3e-05 | 0.0 | 0.0 | 10.0 |" in main and "1e-04" not in main and "1e-05 | 0.0 | 0.0 | 40.0" not in main
    assert "| npo * | 3e-05 |" in text and "| ga * | 1e-05 |" in text
    assert "In 1986 \\| maybe" not in text                       # only chosen runs give example answers
    assert "| base | In 1986. | YES |" in text and "| npo | I don't know. | NO |" in text
    selected = out.with_suffix(".selected").read_text().split()
    assert selected == [str(tmp_path / "npo-b" / "eval" / "final"), str(tmp_path / "ga-a" / "eval" / "final")]
