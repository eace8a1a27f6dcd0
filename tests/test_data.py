"""SUITE data: the validator on our release, on our fixture (--strict) and on a fixture in the authors'
release grammar (warnings only), planted defects, aliases per row, stats, build determinism.

    python -m pytest tests/test_data.py -q
"""
import collections
import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

import data
import evaluate
import suite
from conftest import FIXTURE

TOPIC = "challenger_disaster"
RELEASED = [t for t in data.TOPICS if (data.DEFAULT_ROOT / t).exists()]
OFFICIAL = FIXTURE.parent / "official_suite"      # the authors' grammar, with their kinds of defects planted


def errors_of(root, partial=True, strict=True, **kw):
    """The errors (not warnings) of the fixture topic; our fixture follows our own rules, hence --strict."""
    return [str(e) for e in suite.validate_topic(TOPIC, root, partial=partial, strict=strict, **kw) if not e.warning]


def warnings_of(root, partial=True, **kw):
    return [str(e) for e in suite.validate_topic(TOPIC, root, partial=partial, strict=False, **kw) if e.warning]


def rewrite(path, fn):
    lines = Path(path).read_text().splitlines()
    rows = [json.loads(l) for l in lines]
    fn(rows)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("topic", RELEASED)
def test_release_validates(topic):
    assert [str(e) for e in suite.validate_topic(topic)] == []
    assert [str(e) for e in suite.validate_source(topic)] == []
    data.load_pools()


def test_fixture_validates():
    assert errors_of(FIXTURE) == []


@pytest.mark.parametrize("topic", RELEASED)
def test_build_is_deterministic_and_matches_committed_files(tmp_path, topic):
    shutil.copytree(data.DEFAULT_ROOT, tmp_path / "suite")
    suite.build_topic(topic, tmp_path / "suite")
    for name in data.FINAL_FILES:
        built = (tmp_path / "suite" / topic / "final" / f"{name}.json").read_text()
        committed = (data.DEFAULT_ROOT / topic / "final" / f"{name}.json").read_text()
        assert built == committed, name
    adv = f"adversarial_questions/{topic}_adv.json"
    assert (tmp_path / "suite" / adv).read_text() == (data.DEFAULT_ROOT / adv).read_text()


def test_salem_counts_without_tier0():
    s = suite.release_stats("salem_witch_trials")
    assert (s["retain_train rows"], s["retain_train Syntax"], s["retain_train Semantic"], s["retain_train GK"],
            s["retain_train Lexical"], s["retain_train Semantic tiers"]) == (425, 75, 250, 50, 50, "1-10 x [25]")
    assert (s["retain_eval rows"], s["retain_eval Syntax"], s["retain_eval Semantic"], s["retain_eval GK"],
            s["retain_eval Lexical"], s["retain_eval Semantic tiers"]) == (625, 100, 375, 100, 50, "1-15 x [25]")


def test_stats_match_the_counts_table():
    s = suite.release_stats(TOPIC)
    assert (s["forget_train rows"], s["forget_train direct / reverse rows"]) == (450, "375 / 75")
    assert s["forget_train times per question"] == "direct [15], reverse [3]"
    assert (s["retain_train rows"], s["retain_train Syntax"], s["retain_train Semantic"], s["retain_train GK"],
            s["retain_train Lexical"], s["retain_train Semantic tiers"]) == (450, 75, 275, 50, 50, "0-10 x [25]")
    assert (s["retain_eval rows"], s["retain_eval Syntax"], s["retain_eval Semantic"], s["retain_eval GK"],
            s["retain_eval Lexical"], s["retain_eval Semantic tiers"]) == (650, 100, 400, 100, 50, "0-15 x [25]")
    assert s["forget_eval direct / reverse / indirect"] == "25 / 25 / 25"
    assert (s["forget_eval_rephrasings rows"], s["adversarial rows"]) == (75, 25)


def test_format_description_in_the_repo_states_the_validators_counts():
    """data/SUITE_FORMAT.md's counts table (rows per file) is the one the validator enforces."""
    text = (data.HERE / "data" / "SUITE_FORMAT.md").read_text()
    table = dict(re.findall(r"^\| (\w+) \| (\d+) \|", text, flags=re.M))
    assert {name: int(n) for name, n in table.items()} == suite.FULL_COUNTS


def test_stats_side_by_side(capsys):
    """Two roots: one column each; the fixture's values counted by hand from its files."""
    suite.main(["stats", "--topic", TOPIC, "--data-root", str(FIXTURE), "--data-root", str(OFFICIAL)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [TOPIC, str(FIXTURE), str(OFFICIAL)]
    row = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", l) for l in lines[1:])}
    assert row["retain_eval rows"] == ["57", "57"]
    assert row["retain_train GK"] == ["5", "5"]
    # GK and Lexical train rows carry no format suffix in the authors' grammar (5 + 5 of the 36)
    assert row["retain_train written as"] == ["original 4, q 21, blank 11", "original 4, q 13, blank 9, none 10"]
    assert row["forget_train times per question"] == ["direct [15], reverse [3]"] * 2
    assert row["rows with aliases"] == ["0", "0"]
    assert row["top opener eval q_gemini1"] == ["100% of 6 'do you happen'"] * 2   # the house style of issue 16


def test_trigram_jaccard_and_opener_by_hand():
    # "a b c d" has trigrams {abc, bcd}; "a b c e" has {abc, bce}: one shared of three
    assert suite.trigram_jaccard("A b, c d.", "a b c e") == pytest.approx(1 / 3)
    assert suite.opener("I'm trying to recall: ...") == "i m trying"
    assert suite.opener("____ was the commander.") == "____ was the"


def test_pairing_follows_appendix_b2():
    d = data.load_topic(TOPIC)
    for f, r in zip(d["forget_train"], d["retain_train"]):
        if r["label"].startswith("Syntax-"):
            assert r["label"] == "Syntax-" + f["label"]            # mirrors exactly its partner
        else:
            variant = data.fact_of(f["label"])[2]
            assert r["label"].endswith("@" + suite.retain_format(variant))
    blocks = [p for p in zip(d["forget_train"], d["retain_train"]) if not p[1]["label"].startswith("Syntax-")]
    for b in range(0, len(blocks), 25):
        types = [data.fact_of(f["label"])[1] for f, _ in blocks[b:b + 25]]
        assert types.count("direct") == 20 and types.count("reverse") == 5


@pytest.mark.parametrize("spec, wanted", [
    ("tiers:0", lambda r, name: name == "retain_train" and data.category(r["label"]) == ("Semantic", 0)),
    ("tiers:1-2", lambda r, name: name == "retain_train" and data.category(r["label"])[1] in (1, 2)),
    ("tiers:11-12", lambda r, name: name == "retain_eval" and data.category(r["label"])[1] in (11, 12)),
    ("gk", lambda r, name: name == "retain_train" and r["label"].startswith("GK")),
    ("lexical", lambda r, name: name == "retain_train" and r["label"].startswith("Lexical")),
    ("forget:K1-K5", lambda r, name: name == "forget_train" and data.fact_of(r["label"])[0] in {"K1", "K2", "K3", "K4", "K5"}),
])
def test_relearning_bands_draw_an_epoch_of_the_attacks_size(spec, wanted):
    """A relearning arm's band is exactly its rows (tiers 0-10 from retain_train, 11-15 from retain_eval;
    forget facts from forget_train) and is drawn to forget_train's 450 rows: every band row floor or
    ceil(450 / band) times, the same draws for the same seed."""
    d = data.load_topic(TOPIC)
    band = data.relearn_band(d, spec)
    assert band == [r for name in ("retain_train", "retain_eval", "forget_train") for r in d[name] if wanted(r, name)]
    rows = data.relearn_rows(d, spec, seed=0)
    assert len(rows) == len(d["forget_train"]) == 450
    counts = {id(r): 0 for r in band}
    for r in rows:
        counts[id(r)] += 1
    assert set(counts.values()) <= {450 // len(band), -(-450 // len(band))}
    assert data.relearn_rows(d, spec, seed=0) == rows
    assert data.relearn_rows(d, "retain_train") == d["retain_train"]       # the paper's attack, as it is


@pytest.mark.parametrize("spec, message", [
    ("tiers:3-1", "0 <= A <= B <= 15"), ("tiers:16", "0 <= A <= B <= 15"), ("tiers:", "tiers:A-B"),
    ("forget:K0-K3", "outside K1-K20"), ("forget:K1-M3", "not a fact"), ("forget:M4-M6", "outside M1-M5"),
    ("forget:", "not a relearning set"), ("retain", "not a relearning set")])
def test_bad_relearning_sets_are_named(spec, message):
    with pytest.raises(data.UserError, match=re.escape(f"--relearn-set {spec}") + ".*" + re.escape(message)):
        data.relearn_band(data.load_topic(TOPIC), spec)


def test_a_band_the_topic_lacks_is_an_error():
    with pytest.raises(data.UserError, match="tiers:0: no such rows"):
        data.relearn_band(data.load_topic("salem_witch_trials"), "tiers:0")     # Salem has no tier 0


def test_lkf_root_is_built_from_suite_and_validates(tmp_path):
    """LKF* (appendix "Comparing evaluation and unlearning between LKF* and SUITE"): `suite.py lkf` rebuilds
    the committed data/lkf exactly; it validates under our rules; its files hold the direct questions in
    their 16 training wordings and their eval wordings (SUITE's own), and the 125 semantic retain-train
    questions of tiers 1-5, three ways for training and five new ways for evaluation."""
    counts = suite.build_lkf(tmp_path / "lkf")
    assert counts == suite.LKF_COUNTS
    for path in sorted((tmp_path / "lkf").rglob("*.json")):
        assert path.read_bytes() == (data.LKF_ROOT / path.relative_to(tmp_path / "lkf")).read_bytes(), path
    assert suite.validate_topic(TOPIC, data.LKF_ROOT, strict=True) == []
    lkf, full = data.load_topic(TOPIC, data.LKF_ROOT), data.load_topic(TOPIC)
    assert {data.fact_of(r["label"])[1] for r in lkf["forget_train"]} == {"direct"}
    strip = lambda rows: [{k: v for k, v in r.items() if k != "_line"} for r in rows]
    assert strip(lkf["forget_eval_rephrasings"]) == strip(r for r in full["forget_eval_rephrasings"] if r["label"].endswith("-direct"))
    tiers = lambda rows: collections.Counter(data.category(r["label"]) for r in rows)
    assert tiers(lkf["retain_train"]) == {("Semantic", t): 75 for t in range(1, 6)}
    assert tiers(lkf["retain_eval"]) == {("Semantic", t): 125 for t in range(1, 6)}
    trained = {r["question"] for r in lkf["retain_train"]}
    assert not trained & {r["question"] for r in lkf["retain_eval"]}         # reworded, never the same text
    assert trained >= {r["question"] for r in full["retain_train"] if data.category(r["label"])[1] in range(1, 6)}
    assert data.is_lkf_root(data.LKF_ROOT) and not data.is_lkf_root(data.DEFAULT_ROOT)


def test_lkf_validator_finds_a_near_duplicate_eval_wording(tmp_path):
    shutil.copytree(data.LKF_ROOT, tmp_path / "lkf")
    path = tmp_path / "lkf" / TOPIC / "final" / "retain_eval.json"
    lines = path.read_text().splitlines()
    first = json.loads((tmp_path / "lkf" / TOPIC / "final" / "retain_train.json").read_text().splitlines()[0])
    row = json.loads(lines[1])
    row["question"] = first["question"].replace("?", " exactly?")
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    found = [str(e) for e in suite.validate_topic(TOPIC, tmp_path / "lkf", strict=True)]
    assert found == [f"{path}:2 field 'question': near-duplicate of retain_train line 1 (the same question's wordings)"]


# ---- planted defects: the validator must name file, line, field and rule

def final(root, name):
    return root / TOPIC / "final" / f"{name}.json"


def test_bad_json_line(fixture_root):
    path = final(fixture_root, "forget_train")
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-5]
    path.write_text("\n".join(lines) + "\n")
    (e,) = errors_of(fixture_root)
    assert "forget_train.json:3" in e and "not valid JSON" in e


def test_missing_field(fixture_root):
    rewrite(final(fixture_root, "retain_eval"), lambda rows: rows[4].pop("answer"))
    (e,) = errors_of(fixture_root)
    assert "retain_eval.json:5 field 'answer'" in e and "non-empty string" in e


def test_label_grammar(fixture_root):
    rewrite(final(fixture_root, "forget_train"), lambda rows: rows[0].update(label="K99-direct@original"))
    assert any("forget_train.json:1 field 'label'" in e and "label grammar" in e for e in errors_of(fixture_root))


def test_eval_wording_equal_to_a_train_wording(fixture_root):
    train_q = {}
    for r in data.read_jsonl(final(fixture_root, "forget_train")):
        train_q.setdefault(r["label"].split("@")[0], r["question"])
    rewrite(final(fixture_root, "forget_eval_rephrasings"),
            lambda rows: rows[0].update(q_gemini4=train_q[rows[0]["label"]] + " "))
    errs = errors_of(fixture_root)
    assert any("forget_eval_rephrasings.json:1 field 'q_gemini4'" in e and "train wording" in e for e in errs), errs


def test_eval_wordings_nearly_equal(fixture_root):
    def plant(rows):
        words = rows[1]["q_gemini2"].split()
        words[-2] = "zebra"                                    # one word swapped
        rows[1]["q_gemini7"] = " ".join(words)
    rewrite(final(fixture_root, "forget_eval_rephrasings"), plant)
    errs = errors_of(fixture_root)
    assert any("forget_eval_rephrasings.json:2 field 'q_gemini7'" in e and "near-duplicate of q_gemini2" in e
               for e in errs), errs


def test_blank_needs_exactly_one_gap(fixture_root):
    rewrite(final(fixture_root, "forget_eval_rephrasings"),
            lambda rows: rows[2].update(blank_gemini3=rows[2]["blank_gemini3"] + " Also ____."))
    assert any("forget_eval_rephrasings.json:3 field 'blank_gemini3'" in e and "exactly one" in e
               for e in errors_of(fixture_root))


def test_answer_in_question(fixture_root):
    rewrite(final(fixture_root, "retain_eval"),
            lambda rows: rows[0].update(question=rows[0]["question"] + f" Is it {rows[0]['answer']}?"))
    assert any("retain_eval.json:1 field 'question'" in e and "contains its own answer" in e
               for e in errors_of(fixture_root))


def test_forget_topic_phrase_in_retain(fixture_root):
    """Our topic.json applies when asked for (as it is for data/suite), never by default to another root."""
    rewrite(final(fixture_root, "retain_eval"),
            lambda rows: rows[3].update(question="After the Challenger disaster, " + rows[3]["question"]))
    assert any("retain_eval.json:4 field 'question'" in e and "challenger disaster" in e
               for e in errors_of(fixture_root, source_root=suite.SOURCE_ROOT))
    assert not any("forget-topic phrase" in e for e in errors_of(fixture_root))


def test_duplicate_retain_question(fixture_root):
    rewrite(final(fixture_root, "retain_eval"), lambda rows: rows[6].update(question=rows[5]["question"]))
    assert any("retain_eval.json:7 field 'question'" in e and "duplicates retain_eval line 6" in e
               for e in errors_of(fixture_root))


def test_adversarial_row_incomplete(fixture_root):
    path = fixture_root / "adversarial_questions" / f"{TOPIC}_adv.json"
    rows = json.loads(path.read_text())
    rows[1]["q_riddle"] = ""
    path.write_text(json.dumps(rows))
    assert any(f"{TOPIC}_adv.json:2 field 'q_riddle'" in e and "missing adversarial variant" in e
               for e in errors_of(fixture_root))


def test_fact_missing_a_question_type(fixture_root):
    drop = lambda rows: rows.__delitem__(next(i for i, r in enumerate(rows) if r["label"].endswith("indirect")))
    rewrite(final(fixture_root, "forget_eval"), drop)
    rewrite(final(fixture_root, "forget_eval_rephrasings"), drop)
    assert any("has no indirect question" in e for e in errors_of(fixture_root))


def test_train_files_must_pair(fixture_root):
    rewrite(final(fixture_root, "retain_train"), lambda rows: rows.pop())
    assert any("retain_train.json" in e and "training pair" in e for e in errors_of(fixture_root))


def test_train_files_pair_line_by_line(fixture_root):
    """retain_train in another order keeps its count but not its pairs: every pair it breaks is named."""
    rewrite(final(fixture_root, "retain_train"), lambda rows: rows.insert(0, rows.pop()))
    broken = [e for e in errors_of(fixture_root) if "does not pair with forget_train line" in e]
    assert broken and all("retain_train.json:" in e and "field 'label'" in e for e in broken)


def test_a_json_array_of_other_than_objects_is_named(fixture_root):
    path = fixture_root / "few_shot_context" / "short_context.json"
    path.write_text(json.dumps(json.loads(path.read_text()) + ["a string"]))
    with pytest.raises(data.DataError, match=r"short_context.json:\d+: element \d+ of the array is not a JSON object"):
        data.load_pools(fixture_root)


def test_jensunpp_context_refusals_need_the_direct_questions(fixture_root, smollm2_path):
    """JensUn++'s in-context refusal turns are the topic's direct questions: a forget_eval without a
    '<fact>-direct' label is an error naming the file, not a run that silently trains without them."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    pool = data.PairedTrainSet(tok, [TOPIC], fixture_root, refusal="No.", context_refusals=True).retain_pools[TOPIC]
    assert len(pool) > len(data.load_pools(fixture_root)["short_context"])
    rewrite(final(fixture_root, "forget_eval"), lambda rows: [r.update(label=r["label"].replace("-direct", "_direct"))
                                                               for r in rows])
    with pytest.raises(data.DataError, match="forget_eval.json field 'label': no '<fact>-direct' label"):
        data.PairedTrainSet(tok, [TOPIC], fixture_root, refusal="No.", context_refusals=True)


def test_full_counts_enforced_without_partial():
    errs = errors_of(FIXTURE, partial=False)
    assert any("forget_eval.json" in e and "the release has 75" in e for e in errs)


def test_cli_exit_code(fixture_root, capsys):
    rewrite(final(fixture_root, "retain_eval"), lambda rows: rows[0].pop("label"))
    with pytest.raises(SystemExit) as exc:
        suite.main(["validate", "--data-root", str(fixture_root), "--partial"])
    assert "violation" in str(exc.value.code)
    assert "retain_eval.json:1 field 'label'" in capsys.readouterr().out


def test_forbidden_together(fixture_root, tmp_path):
    """An entity may appear in retain rows, but never next to the forget topic's words."""
    source = tmp_path / "source" / TOPIC
    source.mkdir(parents=True)
    info = json.loads((suite.SOURCE_ROOT / TOPIC / "topic.json").read_text())
    info["forbidden_together"] = {"Gagarin": ["death", "crash", "died", "liver"]}
    (source / "topic.json").write_text(json.dumps(info))
    rows = data.read_jsonl(final(fixture_root, "retain_eval"))
    bad, good, studied, deliver = [r["_line"] for r in rows if r["label"].startswith(("GK-", "Lexical-"))][:4]
    rewrite(final(fixture_root, "retain_eval"), lambda rows: (
        rows[bad - 1].update(question="In which year did Gagarin die in a training jet crash?"),
        rows[good - 1].update(question="In which year did Gagarin orbit the Earth?"),
        # whole words: 'studied' does not hold 'died', 'deliver' does not hold 'liver'
        rows[studied - 1].update(question="In which Russian city had Gagarin studied at an industrial technical school?"),
        rows[deliver - 1].update(question="Which rocket family did the Soviets use to deliver Gagarin into orbit?")))
    errs = errors_of(fixture_root, source_root=tmp_path / "source")
    assert any(f"retain_eval.json:{bad} field 'question'" in e and "'Gagarin' together with 'crash'" in e
               for e in errs), errs
    for line in (good, studied, deliver):
        assert not any(f"retain_eval.json:{line} " in e for e in errs), errs


def test_injection_set_holds_every_wording_once():
    d = data.load_topic(TOPIC)
    rows = data.injection_rows(d)
    questions = {data.normalise(r["question"]) for r in rows}
    assert len(questions) == len(rows)
    for r in d["forget_eval_rephrasings"]:
        assert all(data.normalise(r["question"] if v == "original" else r[v]) in questions for v in data.EVAL_VARIANTS)
    for name in ("forget_train", "retain_train", "retain_eval"):
        assert all(data.normalise(r["question"]) in questions for r in d[name])


def test_injection_of_the_training_files_never_sees_an_evaluation_wording():
    """inject_train: forget_train and retain_train once each, less every question that evaluation asks
    (forget_eval wordings, retain_eval): the original wordings, which forget_train shares with the eval
    set, are left out; checked on the real topic files."""
    d = data.load_topic(TOPIC)
    rows = data.relearn_rows(d, "inject_train")
    questions = {data.normalise(r["question"]) for r in rows}
    asked = {data.normalise(r["question"] if v == "original" else r[v])
             for r in d["forget_eval_rephrasings"] for v in data.EVAL_VARIANTS}
    asked |= {data.normalise(r["question"]) for r in d["retain_eval"]}
    trained = {data.normalise(r["question"]) for name in ("forget_train", "retain_train") for r in d[name]}
    assert questions == trained - asked and len(questions) == len(rows)
    shared = [r for r in d["forget_train"] if data.normalise(r["question"]) in asked]
    assert shared and all(r["label"].endswith("@original") for r in shared)      # the originals: 50 on Challenger
    assert len(rows) < len(data.relearn_rows(d, "inject"))


# ---- the authors' release grammar: their defects are warnings, ours are errors under --strict

OFFICIAL_WARNINGS = [   # the defects planted in tests/fixtures/official_suite (see its README.md)
    "forget_eval_rephrasings.json:2 field 'blank_gemini4': a fill-in-the-blank variant must hold exactly one '____' (found 0)",
    "forget_eval_rephrasings.json:3 field 'q_gemini5': only fill-in-the-blank variants may hold '____'",
    "retain_train.json:12 field 'question': a fill-in-the-blank variant must hold exactly one '____' (found 0)",
    "retain_eval.json:35 field 'question': contains its own answer 'Washington'",
    "retain_eval.json:54 field 'question': is a placeholder, not a question",
]


def test_official_layout_validates_with_warnings(capsys):
    """GK/Lexical train labels without a format suffix and eval Syntax rows naming train wordings are the
    release's grammar; its defects are listed with file:line and the exit status is 0."""
    suite.main(["validate", "--data-root", str(OFFICIAL), "--partial"])
    out = capsys.readouterr().out.splitlines()
    prefix = f"warning: {OFFICIAL / TOPIC / 'final'}/"
    assert out[:-1] == [prefix + w for w in OFFICIAL_WARNINGS]
    assert out[-1].endswith("0 violation(s), 5 warning(s)")


def test_official_layout_under_strict_breaks_our_rules():
    errs = errors_of(OFFICIAL)
    grammar = [e for e in errs if "label grammar" in e]
    assert len(grammar) == 13 and all("the authors' release grammar allows it" in e for e in grammar)
    assert any("retain_train.json:27 field 'label': 'GK-1 - History - Ancient Carthage'" in e for e in grammar)
    assert any("retain_eval.json:1 field 'label': 'Syntax-M1-direct@q_claude9'" in e for e in grammar)
    rest = [e.split("/final/")[1] for e in errs if "label grammar" not in e]
    # the warnings become errors, and a Lexical row holding its own answer is ours to refuse too
    assert rest == OFFICIAL_WARNINGS[:4] + [OFFICIAL_WARNINGS[4],
                                            "retain_eval.json:55 field 'question': contains its own answer 'HMS Challenger'"]
    with pytest.raises(SystemExit):
        suite.main(["validate", "--data-root", str(OFFICIAL), "--partial", "--strict"])


def test_release_in_official_grammar_full_counts(tmp_path, capsys):
    """Our release rewritten in the authors' grammar (no aliases, no suffix on GK/Lexical train labels,
    eval Syntax labels naming a train wording) passes without --partial: the full counts hold."""
    root = tmp_path / "official"
    shutil.copytree(data.DEFAULT_ROOT, root)
    for path in (root / TOPIC / "final").glob("*.json"):
        def to_official(rows, name=path.stem):
            for r in rows:
                r.pop("aliases", None)
                if name == "retain_train" and r["label"].startswith(("GK-", "Lexical-")):
                    r["label"] = r["label"].rsplit("@", 1)[0]
                if name == "retain_eval" and r["label"].startswith("Syntax-"):
                    r["label"] = r["label"].replace("gemini", "claude")
        rewrite(path, to_official)
    suite.main(["validate", "--data-root", str(root), "--topic", TOPIC])
    assert " 0 violation(s)" in capsys.readouterr().out.splitlines()[-1]


def test_every_violation_reported_once(fixture_root):
    """A label error no longer hides the deeper rules, and no defect is listed twice."""
    rewrite(final(fixture_root, "forget_train"), lambda rows: rows[0].update(label="K99-direct@original"))
    rewrite(final(fixture_root, "retain_eval"), lambda rows: (rows[5].update(label="Semantic-99"),
                                                             rows[6].update(question=rows[4]["question"])))
    rewrite(final(fixture_root, "forget_eval_rephrasings"),
            lambda rows: rows[0].update(q_gemini2=rows[0]["q_gemini1"]))
    errs = errors_of(fixture_root)
    assert len(errs) == len(set(errs))
    assert [e.split("/final/")[1] for e in errs] == [
        "forget_train.json:1 field 'label': 'K99-direct@original' does not follow the label grammar of forget_train",
        "retain_eval.json:6 field 'label': 'Semantic-99' does not follow the label grammar of retain_eval",
        "forget_eval_rephrasings.json:1 field 'q_gemini2': near-duplicate of q_gemini1 (same wording or word-trigram "
        "Jaccard >= 0.5)",
        "retain_eval.json:7 field 'question': duplicates retain_eval line 5",
    ]


def test_opener_dominance(tmp_path):
    """At most 20% of a slot's wordings may open with the same three words: 15 of 75 pass, 16 fail."""
    root = tmp_path / "suite"
    shutil.copytree(data.DEFAULT_ROOT, root)
    plant = lambda rows: rows.update(q_gemini5="Tell me plainly: " + rows["q_gemini5"])
    rewrite(final(root, "forget_eval_rephrasings"), lambda rows: [plant(r) for r in rows[:15]])
    assert not any("'tell me plainly'" in e for e in errors_of(root, partial=False))
    rewrite(final(root, "forget_eval_rephrasings"), lambda rows: plant(rows[15]))
    (e,) = [e for e in errors_of(root, partial=False) if "'tell me plainly'" in e]
    assert e.endswith("forget_eval_rephrasings.json field 'q_gemini5': 16 of the 75 'q_gemini5' wordings (21.3%) "
                      "open with 'tell me plainly' (lines 1, 2, 3, 4, 5, 6, 7, 8, ...); at most 20% of a slot may "
                      "share its first three words")
    assert any("'tell me plainly'" in w for w in warnings_of(root, partial=False))   # outside --strict: a warning


def test_alias_in_its_own_question(fixture_root):
    """No alias may occur (normalised, as whole words) in its own question."""
    rewrite(final(fixture_root, "retain_eval"), lambda rows: (
        rows[3].update(aliases=["OV-99", "Space Shuttle Challenger"]),   # the second is in its question
        rows[6].update(aliases=["Willie McCool", "Colum"])))             # 'Colum' is part of a word only
    assert [e.split("/final/")[1] for e in errors_of(fixture_root)] == [
        "retain_eval.json:4 field 'question': contains its own alias 'Space Shuttle Challenger'"]


def test_aliases_belong_to_their_own_row(tmp_path):
    """Two rows with the same answer keep their own aliases in the release and in the queries (the
    answer-string merge once gave every such row the union); a root without aliases gets none."""
    source = tmp_path / "source"
    shutil.copytree(suite.SOURCE_ROOT / TOPIC, source / TOPIC)
    shutil.copy(suite.SOURCE_ROOT / "general_knowledge.jsonl", source)
    path = sorted((source / TOPIC).glob("semantic*.jsonl"))[0]
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    a, b = [r for r in rows if r["split"] == "eval"][:2]
    a.update(answer=b["answer"], aliases=["an alias of row a only"])
    b.update(aliases=[])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    suite.build_topic(TOPIC, tmp_path / "suite", source)
    built = {r["question"]: r for r in data.read_jsonl(final(tmp_path / "suite", "retain_eval"))}
    assert built[a["question"]]["aliases"] == ["an alias of row a only"] and "aliases" not in built[b["question"]]
    queries = {q["question"]: q for q in evaluate.build_queries(TOPIC, tmp_path / "suite") if q["set"] == "retain"}
    assert queries[a["question"]]["aliases"] == ["an alias of row a only"]
    assert queries[b["question"]]["aliases"] == []
    assert all(q["aliases"] == [] for q in evaluate.build_queries(TOPIC, OFFICIAL))


def test_release_rows_carry_their_source_rows_aliases():
    forget = {r["label"]: r for r in suite.read_source(TOPIC, "forget")}
    d = data.load_topic(TOPIC)
    for r in d["forget_train"] + d["forget_eval"] + d["adversarial"]:
        assert r.get("aliases", []) == forget[r["label"].split("@")[0]]["aliases"]
    retain_source = {r["question"]: r for name in ("semantic", "lexical", "syntax") for r in suite.read_source(TOPIC, name)}
    retain_source.update({r["question"]: r for r in data.read_jsonl(suite.SOURCE_ROOT / "general_knowledge.jsonl")})
    for r in d["retain_eval"]:
        assert r.get("aliases", []) == retain_source[r["question"]]["aliases"]


def test_pack_places_every_sequence_once_and_keeps_collates_positions():
    """data.pack: rows as long as the longest sequence (rounded up), every token once at its own position,
    fewer rows than sequences when short ones fit together; `keep` points at the tokens whose logits
    collate's last K + 1 positions hold (clamped to the first token where a sequence is shorter), and the
    labels, weights and answer masks are collate's."""
    import random
    import torch
    rng = random.Random(0)
    seqs = []
    for n in [40, 7, 33, 12, 5, 28, 3, 19, 40, 9]:
        ids = [rng.randrange(1, 500) for _ in range(n)]
        m = min(n - 1, rng.randrange(1, 6))
        seqs.append({"ids": ids, "targets": ids[n - m:], "answer_len": max(1, m - 1)})
    packed, padded = data.pack(seqs, 0, "jensunpp", min_k=6), data.collate(seqs, 0, "jensunpp", min_k=6)
    R, L = packed["input_ids"].shape
    assert L == 40 and R < len(seqs) and R * L < padded["input_ids"].numel()
    segs = packed["segments"]
    for r in range(R):                                        # a row: its sequences back to back, then padding
        used = int((segs[r] >= 0).sum())
        assert (segs[r, :used] >= 0).all() and (segs[r, used:] == -1).all()
        assert (packed["input_ids"][r, used:] == 0).all()
    flat_ids, flat_pos = packed["input_ids"].flatten(), packed["position_ids"].flatten()
    K = padded["labels"].shape[1]
    assert packed["keep"].shape == (len(seqs), K + 1)
    for i, s in enumerate(seqs):
        n = len(s["ids"])
        for k in range(K + 1):
            t = n - K - 1 + k                                # the token collate has at position T - K - 1 + k
            assert int(flat_pos[packed["keep"][i, k]]) == max(t, 0)
            assert int(flat_ids[packed["keep"][i, k]]) == s["ids"][max(t, 0)]
    placed = sorted(int(x) for x in packed["keep"][:, -1])    # every sequence's last token at its own place
    assert len(set(placed)) == len(seqs)
    assert int((segs >= 0).sum()) == sum(len(s["ids"]) for s in seqs)
    for key in ("labels", "weights", "answer_mask"):
        assert torch.equal(packed[key], padded[key]), key
    rounded = data.pack(seqs, 0, "jensunpp", min_k=6, keep_multiple=8)     # keep's width K + 1 = 7 -> 8
    assert rounded["keep"].shape == (len(seqs), 8)
    assert torch.equal(flat_ids[rounded["keep"][:, -(K + 1):]], flat_ids[packed["keep"]])
    assert torch.equal(flat_pos[rounded["keep"][:, -(K + 1):]], flat_pos[packed["keep"]])
    for key in ("input_ids", "position_ids", "segments", "labels", "weights", "answer_mask"):
        assert torch.equal(rounded[key], packed[key]), key
    assert data.pack(seqs[:1], 0, min_rows=2)["input_ids"].shape[0] == 2        # a padding row added
    assert data.pack(seqs, 0, multiple=16)["input_ids"].shape[1] == 48
