"""Evaluation: aggregation against hand-computed numbers, batched generation, an end-to-end run.

    python -m pytest tests/test_evaluate.py -q
"""
import collections
import http.server
import json
import os
import subprocess
import sys

import pytest
import torch

import data
import evaluate
import judge
import train
from model import generate, load_model
from conftest import FIXTURE, ROOT, LocalServer, free_port


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
    assert set(m["undetermined"].values()) == {0} and m["undetermined_facts"] == []
    assert (m["Gib_invalid"], m["Retain_invalid"]) == (0, 1)


def test_undetermined_facts_are_left_out_not_forgotten():
    """A fact with no YES and an INVALID verdict among the queries of a rate is undetermined for that
    rate: left out of its denominator and counted. K1 leaks directly; K2 answers NO directly and INVALID
    indirectly; K3 is INVALID directly but leaks through reverse; K4 answers NO everywhere."""
    def leak(v, gib="NO"):
        return {"leak": v, "gibberish": gib}
    rows = [row("forget", "K1", "direct", leak("YES")),
            row("forget", "K2", "direct", leak("NO")), row("forget", "K2", "indirect", leak("INVALID", "INVALID")),
            row("forget", "K3", "direct", leak("INVALID")), row("forget", "K3", "reverse", leak("YES", "YES")),
            row("forget", "K4", "direct", leak("NO")), row("forget", "K4", "reverse", leak("NO")),
            row("retain", None, "GK", {"knows": "YES"}, label="GK-1 - History - Rome"),
            row("retain", None, "GK", {"knows": "INVALID"}, label="GK-2 - Art - Painting")]
    m = evaluate.topic_metrics(rows)
    assert m["Q_D"] == pytest.approx(100 / 3, abs=0.01) and m["undetermined"]["Q_D"] == 1         # K1 of K1, K2, K4
    assert m["Q_D+I"] == 50.0 and m["undetermined"]["Q_D+I"] == 2                                # K1 of K1, K4
    assert m["Q_R"] == 25.0 and m["undetermined"]["Q_R"] == 0                                    # K3 of all four
    assert m["Q_All"] == m["Q*_All"] == pytest.approx(200 / 3, abs=0.01)                         # K1, K3 of K1, K3, K4
    assert m["undetermined"]["Q_All"] == 1 and m["undetermined_facts"] == ["K2"] and m["Q_adv"] is None
    assert m["Gib"] == pytest.approx(100 / 6, abs=0.01) and m["Gib_invalid"] == 1                 # 1 of 6 judged
    assert m["Retain"] == 100.0 and m["Retain_invalid"] == 1
    assert evaluate.cell(m, "Q_All") == "66.7 (1 undetermined)" and evaluate.cell(m, "Retain") == "100.0 (1 INVALID)"
    assert evaluate.cell(m, "Q_R") == "25.0"
    assert evaluate.compute_metrics(rows, max_invalid=0.3)["warnings"] == []                      # 4 of 16 = 25%
    assert evaluate.compute_metrics(rows, max_invalid=0.2)["warnings"] != []
    # a judge that answered nothing (every fact asked in every query type): no rate at all, never 0.0
    broken = [row("forget", f, q, leak("INVALID", "INVALID")) for f in ("K1", "K2", "K3", "K4")
              for q in ("direct", "indirect", "reverse")] + [dict(r, verdicts={"knows": "INVALID"}) for r in rows[-2:]]
    m = evaluate.topic_metrics(broken)
    assert all(m[k] is None for k in evaluate.FORGET_RATES) and m["Gib"] is None and m["Retain"] is None
    assert m["undetermined"]["Q*_All"] == 4 and m["per_fact"] == {"K1": [], "K2": [], "K3": [], "K4": []}
    metrics = evaluate.compute_metrics(broken)
    assert metrics["invalid"] == {"verdicts": 26, "of": 26} and len(metrics["warnings"]) == 1
    assert "26 of 26 judge verdicts are INVALID" in metrics["warnings"][0]
    text = evaluate.report(metrics, "t")
    assert text.split("\n")[2].startswith("**WARNING: 26 of 26") and "| K2 | undetermined (INVALID verdicts) |" in text
    assert ("| t | -- (4 undetermined) | -- (4 undetermined) | -- (4 undetermined) | -- (4 undetermined) | "
            "-- (12 INVALID) | -- (2 INVALID) |") in text


def test_rescore_reproduces_metrics(tmp_path):
    rows = hand_built_rows()
    with open(tmp_path / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    metrics = evaluate.rescore(tmp_path)
    assert metrics["average"]["Q*_All"] == 75.0
    text = (tmp_path / "report.md").read_text()
    assert "approximate" in text and "| t |" in text and "| average |" in text
    whole = (tmp_path / "rows.jsonl").read_text()                 # a row cut short, a row without verdicts: errors
    for broken, message in ((whole[:-20], f"rows.jsonl:{len(rows)}: not valid JSON"),
                            (whole + json.dumps({**rows[0], "verdicts": None}) + "\n",
                             f"rows.jsonl:{len(rows) + 1} field 'verdicts': missing")):
        (tmp_path / "rows.jsonl").write_text(broken)
        with pytest.raises(SystemExit, match=message):
            evaluate.main(["--rescore", str(tmp_path)])


def test_batched_generation_equals_one_by_one(tiny_model_path):
    model, tok = load_model(tiny_model_path, torch.float32)
    prompts = [data.prompt_ids(tok, q) for q in ["What is 2+2?", "Name a colour of the sky on a clear day, please.",
                                                  "Hi", "Who wrote Hamlet, the play about a Danish prince?"]]
    batched = generate(model, tok, prompts, max_new_tokens=12, batch_size=4)
    single = [generate(model, tok, [p], max_new_tokens=12, batch_size=1)[0] for p in prompts]
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
    """The real SmolLM2 through generation, judging, MMLU and the report, then resumed. The retain set only
    (19 answers): the forget set's 96 paper-format answers took 80 s of a 2-core CI machine, and the
    tiny-model tests cover the other sets' rows and rates (and the next one, the chat format)."""
    out = tmp_path / "eval"
    args = [smollm2_path, "--data-root", str(FIXTURE), "--out", str(out), "--limit", "1", "--sets", "retain",
            "--skip", "rep", "rgq", "--mmlu-n", "4", "--batch-size", "32"]
    evaluate.main(args)
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(l) for l in open(out / "rows.jsonl")]
    assert rows and all(r["answer"] is not None and r["verdicts"] for r in rows)
    assert all(r["prompt_format"] == "paper" and "QUESTION:" not in r["answer"] for r in rows)
    correct = metrics["utility"]["mmlu"] * 4 / 100                    # --mmlu-n 4: a whole number of questions
    assert correct == pytest.approx(round(correct)) and 0 <= round(correct) <= 4 and metrics["prompt_format"] == ["paper"]
    report = (out / "report.md").read_text()
    assert "approximate" in report and "Prompt format: paper" in report
    # a rerun generates nothing new: every answer is read back
    n_answers = len(open(out / "answers.jsonl").readlines())
    evaluate.main(args)
    assert len(open(out / "answers.jsonl").readlines()) == n_answers


def test_kept_answers_stand_only_for_their_own_prompt(tiny_model_path, tmp_path):
    """A folder answered in the paper format, asked again in the chat format, generates every answer anew
    (and a rerun in either format reads its own back); under another --seed only the queries whose in-context
    turns changed are generated again. The utility metrics are kept with their settings: a rerun at other
    settings (--mmlu-n) makes them again."""
    out = tmp_path / "eval"
    args = [tiny_model_path, "--data-root", str(FIXTURE), "--out", str(out), "--limit", "1", "--sets", "adversarial",
            "--skip", "mmlu", "rep", "rgq", "--judge", "rules"]
    evaluate.main(args)
    n_answers = len(open(out / "answers.jsonl").readlines())
    assert n_answers > 0 and json.loads((out / "metrics.json").read_text())["prompt_format"] == ["paper"]
    for _ in range(2):
        evaluate.main(args + ["--prompt-format", "chat"])
        assert len(open(out / "answers.jsonl").readlines()) == 2 * n_answers
    assert json.loads((out / "metrics.json").read_text())["prompt_format"] == ["chat"]
    evaluate.main(args)
    assert len(open(out / "answers.jsonl").readlines()) == 2 * n_answers
    rows = [json.loads(l) for l in open(out / "rows.jsonl")]
    evaluate.main(args + ["--seed", "1"])
    moved = [r for r, again in zip(rows, map(json.loads, open(out / "rows.jsonl"))) if r["context"] != again["context"]]
    assert moved and all(r["format"] == "context" for r in moved)
    assert len(open(out / "answers.jsonl").readlines()) == 2 * n_answers + len(moved)
    mmlu = args[:-6] + ["--skip", "rep", "rgq", "--judge", "rules", "--mmlu-n"]
    for n in ("4", "4", "8"):
        evaluate.main(mmlu + [n])
        assert json.loads((out / "utility.json").read_text())["mmlu_settings"]["n"] == int(n)


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
    free = generate(model, tok, prompts, max_new_tokens=3)
    suppressed = generate(model, tok, prompts, max_new_tokens=3, suppress=range(17))
    assert suppressed == [tok.decode([17, 17, 17]).strip()] * 2 and free != suppressed


def test_sequential_run_is_evaluated_stage_by_stage_on_every_topic(tiny_model_path, tmp_path, two_topic_root):
    """A train.py sequential run folder: every stage is evaluated on every topic, and stages.md holds
    the forget rate of each topic after each stage (the paper's figure of forget rate across stages)."""
    root = two_topic_root
    run = tmp_path / "seq"
    train.main(["--method", "graddiff", "--model", tiny_model_path, "--data-root", str(root), "--out", str(run),
                "--topics", "challenger_disaster", "salem_witch_trials", "--mode", "sequential",
                "--precision", "fp32", "--max-steps", "1", "--global-batch", "8"])
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


class StubJudge(LocalServer):
    """A real local OpenAI-style judge server whose reply depends on the rubric asked: `replies` maps
    forget/retain/gibberish/rgq to the verdict text, or to None for garbage (HTTP 200 with a plain-text
    body that is no completion). /models answers garbage too. `asked` records the rubric of every request."""

    def __init__(self, replies):
        self.replies, self.asked = dict(replies), []
        kind_of = {text: kind for kind, text in judge.RUBRICS.items()}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, text, content_type):
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.send("<html>it works</html>", "text/html")

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind = kind_of[request["messages"][0]["content"]]
                outer.asked.append(kind)
                text = outer.replies[kind]
                if text is None:
                    self.send("<html>upstream model crashed</html>", "text/html")
                else:
                    self.send(json.dumps({"choices": [{"message": {"role": "assistant", "content": text},
                                                       "finish_reason": "stop"}]}), "application/json")

        super().__init__(Handler)


def test_a_broken_judge_is_never_reported_as_forgetting(tiny_model_path, tmp_path, capsys):
    """A judge server that answers garbage: evaluate.py exits 1 with the count in one line, the report
    opens with a warning and shows no forget rate (undetermined, not 0.0). Fixed rubric by rubric, each
    rerun asks only what was INVALID (the cache keeps valid verdicts), and RGQ's discarded pairs are
    judged again from the saved generations."""
    stub = StubJudge({"forget": None, "retain": None, "gibberish": None, "rgq": None})
    out = tmp_path / "eval"
    args = [tiny_model_path, "--data-root", str(FIXTURE), "--out", str(out), "--limit", "1", "--skip", "mmlu", "rep",
            "--base", tiny_model_path, "--rgq-n", "2", "--rgq-tokens", "4", "--judge", "http",
            "--judge-url", stub.url, "--judge-model", "stub"]
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], capture_output=True, text=True)
        rows = [json.loads(line) for line in open(out / "rows.jsonl")]
        n = sum(len(r["verdicts"]) for r in rows)
        assert proc.returncode == 1 and n == 231       # adversarial answers get no gibberish verdict
        error = proc.stderr.strip().split("\n")[-1]              # above it: transformers' weight-loading bars
        assert error.startswith("evaluate.py: ") and "Traceback" not in proc.stderr
        assert "231 of 231 judge verdicts are INVALID" in error and "2 of 2 RGQ pairs discarded" in error
        assert "WARNING: 231 of 231" in proc.stdout
        metrics = json.loads((out / "metrics.json").read_text())
        assert all(metrics["average"][k] is None for k in evaluate.FORGET_RATES) and metrics["utility"]["rgq"] is None
        report = (out / "report.md").read_text().split("\n")
        assert report[2].startswith("**WARNING: 231 of 231 judge verdicts are INVALID")
        table = [line for line in report if line.startswith(("| challenger_disaster |", "| average |"))]
        assert len(table) == 2 and all(c.strip().startswith("--") for line in table for c in line.split("|")[2:-1])

        stub.replies.update(forget="NO", retain="YES")          # only the gibberish rubric (and RGQ) still broken
        stub.asked.clear()
        with pytest.raises(SystemExit) as e:
            evaluate.main(args)
        assert "96 of 231 judge verdicts are INVALID" in str(e.value.code)
        assert json.loads((out / "metrics.json").read_text())["average"]["Q_All"] == 0.0     # now determined

        stub.replies.update(gibberish="NO", rgq='{"reason": "the same answer", "winner": "tie"}')
        stub.asked.clear()
        capsys.readouterr()
        evaluate.main(args)
        assert set(stub.asked) == {"gibberish", "rgq"}          # forget and retain verdicts came from the cache
        gibberish_items = {json.dumps(judge.messages("gibberish", {"question": r["question"], "ground_truth": r["ground_truth"],
                                                                   "answer": r["answer"]}))
                           for r in rows if r["set"] == "forget"}
        assert stub.asked.count("gibberish") == len(gibberish_items)
        assert "RGQ generate" not in capsys.readouterr().out       # judged again without generating again
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["warnings"] == [] and metrics["utility"]["rgq"] == 50.0 and metrics["average"]["Gib"] == 0.0
        assert "RGQ 50.0" in (out / "report.md").read_text()
    finally:
        stub.close()


def test_utility_progress_and_no_heuristic_rgq(tiny_model_path, tmp_path, capsys):
    """MMLU and Rep print progress lines with an ETA; Rep generates --long-batch-size at a time; RGQ with
    the heuristic judge is not computed (no generation spent on it) and the report says why."""
    out = tmp_path / "eval"
    evaluate.main([tiny_model_path, "--data-root", str(FIXTURE), "--out", str(out), "--limit", "1", "--sets", "retain",
                   "--mmlu-n", "8", "--rep-n", "2", "--rep-tokens", "4", "--base", tiny_model_path, "--long-batch-size", "1"])
    printed = capsys.readouterr().out
    for line in ("  MMLU: 8 to do", "  MMLU: 8/8 (100%)", "  Rep generate: 2 to do", "  Rep generate: 2/2 (100%)"):
        assert line in printed
    assert "eta" in printed.split("MMLU: 8/8")[1].split("\n")[0]
    u = json.loads((out / "utility.json").read_text())
    assert u["rep_batch_size"] == 1 and u["rgq"] is None and u["rgq_note"] == evaluate.HEURISTIC_RGQ
    assert not (out / "rgq_generations.jsonl").exists() and "RGQ generate" not in printed
    assert f"RGQ -- ({evaluate.HEURISTIC_RGQ})" in (out / "report.md").read_text()


def test_answers_without_the_shared_prefix_are_the_same(smollm2_path, tmp_path):
    """--no-shared-prefix prefills every prompt whole; a real model's answers (fp32) are those of the shared
    prefix. bf16 rounds the two differently, and SmolLM2's answers flip at rounding noise (as with another
    batch size: BENCHMARKS.md), so this compares fp32 answers through generate_answers."""
    assert evaluate.parse_args(["ckpt", "--no-shared-prefix"]).no_shared_prefix
    model, tok = load_model(smollm2_path)
    queries = evaluate.build_queries("challenger_disaster", FIXTURE, limit=1)[::8]
    answers = {}
    for share in (True, False):
        (tmp_path / str(share)).mkdir()
        answers[share] = evaluate.generate_answers(lambda: (model, tok), queries, tmp_path / str(share), 9,
                                                   max_new_tokens=20, share_prefix=share)
    assert answers[True] == answers[False] and len(answers[True]) == len(queries) > 16
    assert sum(bool(a) for a in answers[True].values()) > len(queries) / 2


def test_bad_input_is_one_line_and_leaves_no_folder(tiny_model_path, tmp_path, fixture_root, monkeypatch, capsys):
    """Each mistake: exit 1 with one line naming the file, line or flag, before any model loads, and no
    output folder (no CKPT/eval, no runs/eval_<name>, no --out)."""
    (tmp_path / "empty").mkdir()
    bad_file = fixture_root / "challenger_disaster" / "final" / "retain_eval.json"
    lines = bad_file.read_text().splitlines()
    bad_file.write_text("\n".join(lines[:3] + ['{"question": "cut short'] + lines[3:]) + "\n")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "out"
    cases = [([str(tmp_path / "empty")], "CKPT " + str(tmp_path / "empty") + ": not a Hugging Face model folder (no config.json",
              tmp_path / "empty" / "eval"),
             (["no/such/model/folder"], "CKPT no/such/model/folder: no such folder", tmp_path / "runs"),
             (["someone/no-such-model"], "not in the Hugging Face cache (HF_HUB_OFFLINE is set)", tmp_path / "runs"),
             ([tiny_model_path, "--topics", "no_such_topic", "--out", str(out)], "--topics no_such_topic: no such topic in", out),
             ([tiny_model_path, "--data-root", str(fixture_root), "--out", str(out)], f"{bad_file}:4: not valid JSON", out),
             ([tiny_model_path, "--judge", "http", "--judge-url", dead, "--out", str(out)],
              f"no judge server answers at {dead}", out),
             ([tiny_model_path, "--batch-size", "0", "--out", str(out)], "--batch-size 0: must be >= 1", out)]
    # The Hub id (HF_HUB_OFFLINE is read at import) and the bad data file as the user runs them, a process whose
    # whole stderr is that line; the rest in this process: the message main() exits with, nothing printed before.
    as_process = {"someone/no-such-model", str(fixture_root)}
    for argv, message, absent in cases:
        if as_process & set(argv):
            proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *argv], capture_output=True, text=True,
                                  cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            returncode, error = proc.returncode, proc.stderr.strip().split("\n")
        else:
            monkeypatch.chdir(tmp_path)
            with pytest.raises(SystemExit) as e:
                evaluate.main(argv)
            code = e.value.code
            returncode = 1 if isinstance(code, str) else code           # Python exits 1 with a message
            error = [line for line in capsys.readouterr().err.splitlines() if line] + [str(code)]
        assert returncode == 1 and len(error) == 1 and error[0].startswith("evaluate.py: "), (argv, error)
        assert message in error[0], (message, error[0])
        assert not absent.exists(), argv


def test_lkf_protocol_with_the_lexical_probe(tiny_model_path, tmp_path):
    """--protocol lkf: the LKF* root's direct questions in their eval wordings (Q_D; no reverse, indirect
    or adversarial rates), its reworded tiers 1-5 as retain, and the lexical probe: SUITE's ten Lexical
    questions with 'Challenger', as written and with the word in lower case, counted by kind."""
    out = tmp_path / "lkf"
    evaluate.main([tiny_model_path, "--protocol", "lkf", "--limit", "1", "--skip", "mmlu", "rep", "rgq",
                   "--batch-size", "64", "--out", str(out)])
    rows = [json.loads(line) for line in open(out / "rows.jsonl")]
    by_set = collections.Counter(r["set"] for r in rows)
    assert by_set == {"forget": 16 * 2, "retain": 5, "probe": 20}            # one fact, one row per tier
    assert {r["qtype"] for r in rows if r["set"] == "forget"} == {"direct"}
    probe = [r for r in rows if r["set"] == "probe"]
    assert sum("Challenger" in r["question"] for r in probe) == 10
    assert all("challenger" in r["question"] and "Challenger" not in r["question"] for r in probe if r["variant"] == "lower case")
    assert all(set(r["verdicts"]) == {"refusal", "gibberish", "knows"} for r in probe)
    metrics = json.loads((out / "metrics.json").read_text())
    m = metrics["topics"]["challenger_disaster"]
    assert metrics["protocol"] == ["lkf"] and m["Q_D"] is not None and m["Q_R"] is m["Q_All"] is m["Q_adv"] is None
    for counts in m["probe"].values():
        assert counts["n"] == 10 and counts["refusal"] + counts["gibberish"] + counts["fluent"] == 10
    with pytest.raises(SystemExit, match="an LKF\\* root goes with --protocol lkf"):
        evaluate.main([tiny_model_path, "--data-root", str(data.LKF_ROOT), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="an LKF\\* root goes with --protocol lkf"):
        evaluate.main([tiny_model_path, "--protocol", "lkf", "--data-root", str(FIXTURE), "--out", str(tmp_path / "y")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
