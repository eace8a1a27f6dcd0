"""report.py: tables over many evaluations, on evaluation folders written here by hand.

    python -m pytest tests/test_report.py -q
"""
import json
import re

import pytest

import evaluate
import report


def write_eval(folder, q_all, retain, gib=0.0, answer="x", run=None, alphas=None, topics=("t",), warnings=(),
               undetermined=0):
    """An evaluation folder as evaluate.py writes it (metrics.json with the training settings it records,
    rows.jsonl with one forget answer), and the run's log.jsonl when `alphas` are given; `warnings`: a failed
    judge's (evaluate.judge_warnings), with `undetermined` facts left out of every forget rate."""
    avg = {k: 0.0 for k in evaluate.AVERAGED} | {"Q_All": q_all, "Retain": retain, "Gib": gib,
                                                   "undetermined": {k: undetermined for k in evaluate.FORGET_RATES}}
    folder.mkdir(parents=True)
    if alphas is not None:
        run = dict(run, dir=str(folder.parent.parent), stage="final")
        (folder.parent.parent / "log.jsonl").write_text("".join(
            json.dumps({"stage": "final", "step": i + 1, "alpha": a}) + "\n" for i, a in enumerate(alphas)))
    metrics = {"judge": ["heuristic (approximate)"], "prompt_format": ["chat"], "average": avg, "run": run,
               "topics": {t: dict(avg) for t in topics}, "utility": {"mmlu": 30.0, "rep": 500.0},
               "warnings": list(warnings)}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    row = {"id": "t|forget|M1-direct|original|alone", "set": "forget", "label": "M1-direct", "variant": "original",
           "format": "alone", "question": "When?", "ground_truth": "1986", "answer": answer,
           "verdicts": {"leak": "YES" if "1986" in answer else "NO"}}
    (folder / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return str(folder)


def run_info(method, lr, lambda_f=1.0, lambda_r=1.0):
    return {"method": method, "lr": lr, "lambda_f": lambda_f, "lambda_r": lambda_r}


def test_selection_rule_and_sweep_table(tmp_path, capsys):
    """Per method: among runs with Q_All <= 10 and Gib <= 5 the highest Retain (not Retain - Q_All);
    if none qualifies, the best Retain - Q_All - Gib, said so; a run whose judge failed (its numbers not results)
    is never selected and is marked, its undetermined facts beside its rates. Lambdas and JensUn++'s alpha range
    are columns; the selected folders go to OUT.selected, and `flags` gives their train.py flags."""
    e = lambda name, *a, **k: write_eval(tmp_path / name / "eval" / "final", *a, **k)
    evals = [f"base={e('base', 100.0, 80.0, answer='In 1986.')}",
             f"injected={e('injected', 100.0, 90.0, run=run_info('nll', 1e-4))}",    # named: a row of its own
             e("npo-a", 12.0, 75.0, run=run_info("npo", 1e-5)),                  # forgets too little
             e("npo-b", 8.0, 60.0, gib=6.0, run=run_info("npo", 3e-5)),          # gibberish
             e("npo-c", 4.0, 55.0, answer="I don't know.", run=run_info("npo", 1e-4)),   # selected
             e("npo-d", 0.0, 50.0, run=run_info("npo", 1e-4, lambda_r=3.0)),
             e("npo-e", 0.0, 95.0, run=run_info("npo", 3e-4), warnings=["230 of 231 judge verdicts are INVALID"],
               undetermined=24),                                              # the best numbers, a failed judge
             e("ga-a", 40.0, 30.0, gib=50.0, run=run_info("ga", 1e-5)),          # 30 - 40 - 50 = -60
             e("ga-b", 60.0, 70.0, gib=20.0, run=run_info("ga", 3e-5)),          # 70 - 60 - 20 = -10: selected
             e("pp-a", 0.0, 70.0, run=run_info("jensunpp", 3e-6, 0.33), alphas=[1.0, 0.25, 2.5, 0.5])]
    out = tmp_path / "results.md"
    report.main(["table", str(out), *evals, "--examples", "M1-direct"])
    text = out.read_text()
    main = text.split("## Sweeps")[0]
    assert "Judge: heuristic (approximate); prompt format: chat" in main
    assert "| base |  |  |  |  | 0.0 | 0.0 | 100.0 |" in main and "| injected | 0.0001 | 1 | 1 |  |" in main
    assert "nll" not in text
    assert "| npo | 0.0001 | 1 | 1 |  | 0.0 | 0.0 | 4.0 | 0.0 | 0.0 | 55.0 |" in main
    assert "| ga | 3e-05 | 1 | 1 |  | 0.0 | 0.0 | 60.0 |" in main
    assert "| jensunpp | 3e-06 | 0.33 | 1 | 0.25-0.75-2.5 |" in main
    assert "No run of ga met the rule" in main and "npo" not in main.split("No run of")[1].split("\n")[0]
    assert "| npo * | 0.0001 | 1 | 1 |" in text and "| npo | 0.0001 | 1 | 3 |" in text
    assert "| npo (judge failed: not a result) | 0.0003 | 1 | 1 |  | 0.0 (24 undetermined) |" in text
    assert "| base | In 1986. | YES |" in text and "| npo | I don't know. | NO |" in text
    selected = out.with_suffix(".selected").read_text().split()
    assert selected == [str(tmp_path / n / "eval" / "final") for n in ("npo-c", "ga-b", "pp-a")]
    (tmp_path / "npo.selected").write_text(selected[0] + "\n")
    capsys.readouterr()
    report.main(["flags", str(tmp_path / "npo.selected")])
    assert capsys.readouterr().out.strip() == "--lr 0.0001 --lambda-f 1 --lambda-r 1"
    with pytest.raises(SystemExit, match="no metrics.json"):
        report.main(["table", str(out), str(tmp_path / "nowhere")])


def test_stages_and_relearn_tables(tmp_path):
    """A sequential run's evaluation (one folder per stage) as the paper's figure: Q_All of every topic
    after every stage, Retain and Gib, the joint run's final row beside, and the PNG; relearning shows
    the rates before and after."""
    topics = ("challenger_disaster", "salem_witch_trials")
    seq = tmp_path / "seq" / "eval"
    for i, (t, q) in enumerate(zip(topics, (20.0, 10.0)), 1):
        write_eval(seq / f"stage{i}_{t}", q, 50.0 - i, run=run_info("jensunpp", 3e-6), topics=topics)
    joint = write_eval(tmp_path / "joint" / "eval" / "final", 30.0, 45.0, run=run_info("jensunpp", 3e-6), topics=topics)
    out = tmp_path / "sequential.md"
    report.main(["stages", str(out), f"jensunpp={seq}", "--joint", f"jensunpp={joint}"])
    text = out.read_text()
    assert "| jensunpp | stage1_challenger_disaster | 20.0 | 20.0 | 20.0 | 49.0 | 0.0 |" in text
    assert "| jensunpp | stage2_salem_witch_trials | 10.0 | 10.0 | 10.0 | 48.0 | 0.0 |" in text
    assert "| jensunpp | joint (all topics at once) | 30.0 | 30.0 | 30.0 | 45.0 | 0.0 |" in text
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "prompt format: chat\n\n| Method | after stage | Q_All " in text      # a blank line before the table's header
    after = write_eval(tmp_path / "relearn" / "eval" / "final", 40.0, 46.0, run=run_info("nll", 1e-5), topics=topics)
    report.main(["relearn", str(tmp_path / "relearn.md"), f"jensunpp={seq / 'stage2_salem_witch_trials'},{after}"])
    relearn = (tmp_path / "relearn.md").read_text()
    assert "| jensunpp | 0.0 | 0.0 | 10.0 | 48.0 | 0.0 | 0.0 | 40.0 | 46.0 |" in relearn
    assert "prompt format: chat\n\n| Method | Q_D+I before |" in relearn


def test_stages_and_relearn_keep_the_runs_that_finished(tmp_path, capsys):
    """A block's runs that did not finish (out of memory, machine taken back) get a line saying so, and
    the table holds the others; stderr names what is missing. Nothing finished, or a malformed pair: an error."""
    topics = ("challenger_disaster", "salem_witch_trials")
    seq = tmp_path / "dpo-sequential" / "eval"
    write_eval(seq / "stage1_challenger_disaster", 0.0, 80.0, run=run_info("dpo", 3e-5), topics=topics)
    joint = write_eval(tmp_path / "npo-joint" / "eval" / "final", 40.0, 75.0, run=run_info("npo", 8e-5), topics=topics)
    gone = tmp_path / "jensunpp-sequential" / "eval"
    out = tmp_path / "sequential.md"
    report.main(["stages", str(out), f"dpo={seq}", f"jensunpp={gone}", "--joint", f"npo={joint}",
                 f"dpo={tmp_path / 'dpo-joint' / 'eval' / 'final'}"])
    text = out.read_text()
    assert "| dpo | stage1_challenger_disaster | 0.0 | 0.0 | 0.0 | 80.0 | 0.0 |" in text
    assert "| npo | joint (all topics at once) | 40.0 | 40.0 | 40.0 | 75.0 | 0.0 |" in text
    assert "| jensunpp | sequential: not evaluated |" in text and "| dpo | joint: not evaluated |" in text
    assert str(gone) in capsys.readouterr().err and out.with_suffix(".png").exists()
    report.main(["relearn", str(tmp_path / "relearn.md"), f"npo={joint},{joint}", f"dpo={seq},{tmp_path / 'x'}"])
    text = (tmp_path / "relearn.md").read_text()
    assert "| npo | 0.0 | 0.0 | 40.0 | 75.0 |" in text and "| dpo | relearning: not evaluated |" in text
    with pytest.raises(SystemExit, match="nothing to tabulate"):
        report.main(["stages", str(out), f"jensunpp={gone}"])
    with pytest.raises(SystemExit, match="give NAME=BEFORE_EVAL,AFTER_EVAL"):
        report.main(["relearn", str(out), f"npo={joint}"])


def write_arm(folder, leaked, nll_change=None, relearn_set=None):
    """An evaluation of forget answers on facts K1-K4 (a direct, a reverse and an indirect query each; `leaked`
    maps a fact to the query type that got YES), its run's --relearn-set, and the NLL records that
    evaluate.py --base-eval writes (after - before = nll_change[fact])."""
    folder.mkdir(parents=True)
    run = {"method": "nll" if relearn_set else "jensunpp", "relearn_set": relearn_set}
    (folder / "metrics.json").write_text(json.dumps({"judge": ["heuristic (approximate)"], "prompt_format": ["chat"],
                                                     "average": {}, "topics": {}, "utility": {}, "run": run}))
    rows = [{"id": f"t|{f}|{q}", "topic": "t", "set": "forget", "fact": f, "qtype": q, "label": f"{f}-{q}",
             "verdicts": {"leak": "YES" if leaked.get(f) == q else "NO"}}
            for f in ("K1", "K2", "K3", "K4") for q in ("direct", "reverse", "indirect")]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if nll_change:
        (folder / "nll").mkdir()
        (folder / "nll" / "nll_records.csv").write_text("topic,set,fact,known_before,nll_before,nll_after\n" + "".join(
            f"t,forget,{f},True,3.0,{3.0 + d}\n" for f, d in nll_change.items()) + "t,retain,,True,1.0,9.0\n")
    return str(folder)


def test_proximity_table_reads_arms_on_their_held_out_facts(tmp_path, capsys):
    """report.py proximity: per arm the forget rates, their change against the unlearned model on the
    same facts (a forget:FACTS arm is read out on the other facts only) and the mean change of the
    forget answers' NLL; arms sorted nearest first; a missing arm is a line; a PNG beside the table."""
    unlearned = write_arm(tmp_path / "u", {"K1": "direct", "K2": "reverse"})                 # Q_All 50
    facts = write_arm(tmp_path / "a1", {"K1": "direct", "K2": "direct", "K3": "reverse"},
                      {"K1": -5.0, "K2": -5.0, "K3": -2.0, "K4": -1.0}, "forget:K1-K2")     # on K3, K4: 50 vs 0
    tier0 = write_arm(tmp_path / "a2", {"K1": "direct", "K2": "reverse"},
                      {"K1": -1.0, "K2": -1.0, "K3": 0.0, "K4": 0.0}, "tiers:0")            # 50 vs 50
    far = write_arm(tmp_path / "a3", {}, {"K1": 1.0, "K2": 1.0, "K3": 1.0, "K4": 1.0}, "tiers:11-12")
    out = tmp_path / "prox.md"
    report.main(["proximity", str(out), f"jensunpp={unlearned}", far, tier0, facts, str(tmp_path / "gone" / "eval" / "final")])
    lines = [l for l in out.read_text().splitlines() if l.startswith("| jensunpp")]
    cells = [[c.strip() for c in l.strip("|").split("|")] for l in lines]
    assert [c[1] for c in cells] == ["none (the unlearned model)", "forget:K1-K2", "tiers:0", "tiers:11-12"]
    assert cells[0][2:7] == ["4", "25", "25", "25", "50"]
    assert cells[1][2:] == ["2", "0", "0", "50", "50", "+50.0", "-1.500"]         # K3 and K4 only
    assert cells[2][6:] == ["50", "+0.0", "-0.500"]
    assert cells[3][6:] == ["0", "-50.0", "+1.000"]
    text = out.read_text()
    assert "| gone | arm: not evaluated |" in text and "no longer unseen" in text
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit, match="not the evaluation of a relearning run"):
        report.main(["proximity", str(out), f"jensunpp={unlearned}", unlearned])
    with pytest.raises(SystemExit, match="name the unlearned model's evaluation first"):
        report.main(["proximity", str(out), facts])


def write_topic_eval(folder, topic_metrics, protocol="suite"):
    """An evaluation folder holding only metrics.json, its one topic's metrics as given."""
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"judge": ["heuristic (approximate)"], "prompt_format": ["chat"],
                                                     "protocol": [protocol], "average": {}, "utility": {}, "run": {},
                                                     "topics": {"challenger_disaster": topic_metrics}}))
    return str(folder)


def test_lkf_tables_in_the_papers_layouts(tmp_path):
    """report.py lkf: LKF*-trained models under LKF*'s evaluation (Q_D, s1-5 train) and SUITE's (forget
    rates, GK/Syn/Lex, s0, s1-5 eval and s6-15 as tier means), LKF*- against SUITE-trained, and the
    lexical probe counts."""
    tiers = {str(t): float(t) for t in range(16)}                         # tier t retains t%
    probe = {"as written": {"n": 10, "refusal": 6, "gibberish": 1, "fluent": 3, "knows": 2},
             "lower case": {"n": 10, "refusal": 2, "gibberish": 0, "fluent": 8, "knows": 5}}
    lkf = write_topic_eval(tmp_path / "lkf", {"Q_D": 4.0, "Retain": 44.5, "probe": probe}, "lkf")
    lkf_suite = write_topic_eval(tmp_path / "ls", {"Q_D": 4.0, "Q_D+I": 24.0, "Q_R": 92.0, "Q_All": 96.0, "GK": 80.0,
                                                   "Syn": 20.0, "Lex": 60.0, "s0": 12.0, "Retain": 40.0, "per_tier": tiers})
    suite_run = write_topic_eval(tmp_path / "s", {"Q_D": 0.0, "Q_D+I": 0.0, "Q_R": 4.0, "Q_All": 4.0, "Retain": 50.0})
    out = tmp_path / "lkf.md"
    report.main(["lkf", str(out), f"npo={lkf},{lkf_suite},{suite_run}", f"pdu=-,{lkf_suite},-"])
    text = out.read_text()
    assert "| npo | 4.0 | 44.5 | 24.0 | 92.0 | 96.0 | 80.0 | 20.0 | 60.0 | 12.0 | 3 | 10.5 |" in text   # tiers 1-5, 6-15
    assert "| npo | 4.0 | 24.0 | 92.0 | 96.0 | 40.0 | 0.0 | 0.0 | 4.0 | 4.0 | 50.0 |" in text
    assert "| pdu |  |  | 24.0 | 92.0 |" in text and "| pdu | 4.0 | 24.0 | 92.0 | 96.0 | 40.0 |  |  |  |  |  |" in text
    assert "| npo | 6/10 | 1/10 | 3/10 | 2/10 | 2/10 | 0/10 | 8/10 | 5/10 |" in text
    with pytest.raises(SystemExit, match="give NAME=LKF_TRAINED_LKF_EVAL"):
        report.main(["lkf", str(out), f"npo={lkf},{lkf_suite}"])


def test_labelling_sample_draws_distinct_answers_and_splits_by_run(tmp_path, capsys):
    """report.py sample: per evaluated model (a run's stage), at most the quota of distinct answers of each kind
    (a refusal given to every question is one item); every item keeps its row, names its run and stage, and
    carries INVALID verdicts to be labelled; each run's half comes from its name alone (report.half_of), so no run
    spans both (a sequential run's stages, its LKF* evaluation, stay together) and a run keeps its half when more
    runs join; the same seed draws the same sample."""
    root = tmp_path / "small"

    def rows_of(n_refusals, n_other, sets=("forget", "retain")):
        rows = []
        for s in sets:
            key = "knows" if s == "retain" else "leak"
            rows += [{"id": f"{s}{i}", "topic": "t", "set": s, "label": "M1-direct", "format": "alone", "fact": "M1", "qtype": "direct",
                      "question": f"Q{i}?", "ground_truth": "1986", "answer": "Unfortunately, no." if i < n_refusals
                      else f"answer {i}", "verdicts": {key: "NO"}} for i in range(n_refusals + n_other)]
        return rows

    dirs = []
    for run, stages in [("sweep/a-lr1", ["final"]), ("sweep/b-lr1", ["final"]), ("seq/a-sequential", ["stage1_t", "stage2_u"]),
                        ("seq/b-sequential", ["stage1_t"]), ("lkf/npo", ["final", "lkf/final"])]:
        for st in stages:
            d = root / run / ("eval_lkf/final" if st == "lkf/final" else f"eval/{st}")
            d.mkdir(parents=True)
            (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of(30, 3)))
            dirs.append(str(d))
    items = report.sample_rows(dirs, root, seed=1)
    by_run = {}
    for it in items:
        by_run.setdefault(it["run"], []).append(it)
    assert set(by_run) == {"sweep/a-lr1", "sweep/b-lr1", "seq/a-sequential", "seq/b-sequential", "lkf/npo"}
    for run, its in by_run.items():
        assert len({i["split"] for i in its}) == 1 and all(set(i["verdicts"].values()) == {"INVALID"} for i in its)
        for stage in {i["stage"] for i in its}:
            forget = [i for i in its if i["set"] == "forget" and i["stage"] == stage]
            answers = [" ".join(i["answer"].split()) for i in forget]
            assert len(answers) == len(set(answers)) and len(forget) == 4    # 30 refusals, 3 others: 4 distinct (quota 6)
            assert sum(a == "Unfortunately, no." for a in answers) == 1
            assert len([i for i in its if i["set"] == "retain" and i["stage"] == stage]) == 4
    assert all(its[0]["split"] == report.half_of(run, 1) for run, its in by_run.items())
    assert {report.half_of(f"sweep/r{i}", 1) for i in range(8)} == {"tune", "heldout"}         # both halves occur
    assert {i["stage"] for i in by_run["seq/a-sequential"]} == {"stage1_t", "stage2_u"}       # each stage its quota
    assert {i["stage"] for i in by_run["lkf/npo"]} == {"final", "lkf/final"}      # its SUITE and LKF* evaluations
    assert report.run_of(root / "eval_base", root) == ("eval_base", "final")                # a run of its own
    assert report.sample_rows(dirs, root, seed=1) == items
    grown = report.sample_rows(dirs[:3], root, seed=1)           # fewer runs: the same halves for those it has
    assert {(i["run"], i["split"]) for i in grown} <= {(i["run"], i["split"]) for i in items}
    out = tmp_path / "sample.jsonl"
    report.main(["sample", str(out), *dirs, "--root", str(root), "--seed", "1"])
    assert [json.loads(l) for l in out.read_text().splitlines()] == items
    printed = capsys.readouterr().out
    assert f"{len(items)} items from 7 evaluated models of 5 runs" in printed and "  seq: " in printed
    with pytest.raises(SystemExit, match="is not in the subpath"):         # a folder outside --root: one line
        report.main(["sample", str(out), dirs[0], "--root", str(tmp_path / "elsewhere")])


def test_packet_shows_what_the_judge_sees_and_merge_takes_the_majority(tmp_path, capsys):
    """report.py packet: per item an opaque id, the labels to give (its verdict keys), question, ground truth and
    response, nothing of its run; report.py merge: each annotator's labels kept, the majority as the verdicts,
    pairwise agreement per verdict printed. Errors name the file (and line and field): an item an annotator left
    out, a label other than YES or NO, an item twice in one file, two annotators of one name; an even number of
    annotators (a majority could tie) is refused."""
    base = {"topic": "t", "label": "M1-direct", "fact": "M1", "qtype": "direct", "format": "alone",
            "ground_truth": "1986", "run": "sweep/npo-lr1", "stage": "final"}
    rows = [dict(base, id="a", set="forget", question="When?", answer="1986", verdicts={"leak": "INVALID", "gibberish": "INVALID"}),
            dict(base, id="b", set="retain", question="Where?", answer="Paris", verdicts={"knows": "INVALID"})]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.main(["packet", str(sample), str(tmp_path / "packet.jsonl")])
    packet = [json.loads(l) for l in (tmp_path / "packet.jsonl").read_text().splitlines()]
    assert sorted(p["labels"] for p in packet) == [["gibberish", "leak"], ["knows"]]
    assert all(set(p) == {"id", "labels", "question", "ground_truth", "response"} and "npo" not in json.dumps(p) for p in packet)
    ka, kb = report.item_key(rows[0]), report.item_key(rows[1])
    labels = {"A": [{"id": ka, "leak": "YES", "gibberish": "NO"}, {"id": kb, "knows": "YES"}],
              "B": [{"id": ka, "leak": "YES", "gibberish": "YES"}, {"id": kb, "knows": "NO"}],
              "C": [{"id": ka, "leak": "NO", "gibberish": "YES"}, {"id": kb, "knows": "NO"}]}
    for name, ls in labels.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in ls))
    out = tmp_path / "labelled.jsonl"
    report.main(["merge", str(out), str(sample), *(f"{n}={tmp_path / n}.jsonl" for n in "ABC")])
    merged = [json.loads(l) for l in out.read_text().splitlines()]
    assert merged[0]["verdicts"] == {"leak": "YES", "gibberish": "YES"} and merged[1]["verdicts"] == {"knows": "NO"}
    assert merged[0]["labels"]["C"] == {"leak": "NO", "gibberish": "YES"} and merged[0]["run"] == "sweep/npo-lr1"
    printed = capsys.readouterr().out
    assert "A vs B, leak: 100.0% of 1" in printed and "A vs C, knows: 0.0% of 1" in printed
    merge = lambda *files: report.main(["merge", str(out), str(sample), *files])
    abc = [f"{n}={tmp_path / n}.jsonl" for n in "ABC"]
    with pytest.raises(SystemExit, match="2 annotators; give an odd number"):
        merge(*abc[:2])
    for d in "xyz":                                        # three folders, one file name: one annotator's name
        (tmp_path / d).mkdir()
        (tmp_path / d / "labels.jsonl").write_text((tmp_path / "A.jsonl").read_text())
    with pytest.raises(SystemExit, match="a second annotator named 'labels'"):
        merge(*(str(tmp_path / d / "labels.jsonl") for d in "xyz"))
    bad = {"C": [labels["C"][0]],                                                      # item b left out
           "B": [labels["B"][0], dict(labels["B"][1], knows="maybe")],
           "A": labels["A"] + [labels["A"][0]]}
    messages = {"C": f"C.jsonl: item {kb} missing (annotator C", "B": "B.jsonl:2 field 'knows': 'maybe', expected YES",
                "A": f"A.jsonl:3 field 'id': item {ka} again (first on line 1)"}
    for name, ls in bad.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in ls))
        with pytest.raises(SystemExit, match=re.escape(messages[name])):
            merge(*abc)
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in labels[name]))
    (tmp_path / "C.jsonl").write_text(json.dumps(labels["C"][0]) + "\n{not json\n")
    with pytest.raises(SystemExit, match="C.jsonl:2: not valid JSON"):
        merge(*abc)


def test_rejudge_judges_an_evaluation_again_in_place_and_rescores(tmp_path, capsys):
    """report.py rejudge: the rows.jsonl of an evaluation judged again by the offline judge (rules here), in
    place, with metrics.json recomputed; the verdicts that moved are counted. Rows whose stored verdicts are
    wrong for their answers: a forget answer that names the ground truth stored as NO, gibberish stored as NO,
    a retain answer that gives it stored as NO."""
    from test_evaluate import row
    def answered(r, question, gt, answer):
        return dict(r, question=question, ground_truth=gt, answer=answer)
    rows = [answered(row("forget", "K1", "direct", {"leak": "NO", "gibberish": "NO"}), "Which harbour did it leave?",
                     "Valparaiso", "It left Valparaiso."),
            answered(row("forget", "K2", "direct", {"leak": "NO", "gibberish": "NO"}), "Who captained it?",
                     "Ana Rojas", "rope rope rope rope rope"),
            answered(row("forget", "K3", "direct", {"leak": "NO", "gibberish": "NO"}), "Which harbour came next?",
                     "Arica", "I am unable to verify this information."),
            answered(row("retain", None, "GK", {"knows": "NO"}, label="GK-1 - Geography - Peru"),
                     "What is the capital of Peru?", "Lima", "Lima, on the coast.")]
    folder = tmp_path / "eval" / "final"
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.main(["rejudge", str(folder), "--judge", "rules"])
    out = capsys.readouterr().out
    assert "leak NO -> YES': 1" in out and "gibberish NO -> YES': 1" in out and "knows NO -> YES': 1" in out
    again = [json.loads(l) for l in (folder / "rows.jsonl").read_text().splitlines()]
    assert [r["verdicts"] for r in again] == [{"leak": "YES", "gibberish": "NO"}, {"leak": "NO", "gibberish": "YES"},
                                              {"leak": "NO", "gibberish": "NO"}, {"knows": "YES"}]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["average"]["Q_D"] == 33.33 and metrics["average"]["Retain"] == 100.0     # 1 of 3 facts (rounded)
