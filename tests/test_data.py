"""SUITE data: the validator on our release and the fixture, planted defects, build determinism.

    python -m pytest tests/test_data.py -q
"""
import json
import shutil
from pathlib import Path

import pytest

import data
import losses
from conftest import FIXTURE

TOPIC = "challenger_disaster"
RELEASED = [t for t in data.TOPICS if (data.DEFAULT_ROOT / t).exists()]


def errors_of(root, partial=True):
    return [str(e) for e in data.validate_topic(TOPIC, root, partial=partial)]


def rewrite(path, fn):
    lines = Path(path).read_text().splitlines()
    rows = [json.loads(l) for l in lines]
    fn(rows)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("topic", RELEASED)
def test_release_validates(topic):
    assert [str(e) for e in data.validate_topic(topic)] == []
    assert [str(e) for e in data.validate_source(topic)] == []
    data.load_pools()


def test_fixture_validates():
    assert errors_of(FIXTURE) == []


@pytest.mark.parametrize("topic", RELEASED)
def test_build_is_deterministic_and_matches_committed_files(tmp_path, topic):
    shutil.copytree(data.DEFAULT_ROOT, tmp_path / "suite")
    data.build_topic(topic, tmp_path / "suite")
    for name in data.FINAL_FILES:
        built = (tmp_path / "suite" / topic / "final" / f"{name}.json").read_text()
        committed = (data.DEFAULT_ROOT / topic / "final" / f"{name}.json").read_text()
        assert built == committed, name
    adv = f"adversarial_questions/{topic}_adv.json"
    assert (tmp_path / "suite" / adv).read_text() == (data.DEFAULT_ROOT / adv).read_text()


def test_salem_counts_without_tier0():
    text = data.stats("salem_witch_trials")
    assert "retain_train                 425  Syntax 75, Semantic tiers 1-10 x [25] = 250, GK 50, Lexical 50" in text
    assert "retain_eval                  625  Syntax 100, Semantic tiers 1-15 x [25] = 375, GK 100, Lexical 50" in text


def test_stats_match_the_counts_table():
    text = data.stats(TOPIC)
    assert "forget_train                 450  375 direct (each question [15] times) + 75 reverse (each [3] times)" in text
    assert "retain_train                 450  Syntax 75, Semantic tiers 0-10 x [25] = 275, GK 50, Lexical 50" in text
    assert "retain_eval                  650  Syntax 100, Semantic tiers 0-15 x [25] = 400, GK 100, Lexical 100" \
        not in text
    assert "retain_eval                  650  Syntax 100, Semantic tiers 0-15 x [25] = 400, GK 100, Lexical 50" in text
    assert "forget_eval                   75  direct 25, reverse 25, indirect 25" in text
    assert "adversarial                   25  each with [10] variants" in text


def test_pairing_follows_appendix_b2():
    d = data.load_topic(TOPIC)
    for f, r in zip(d["forget_train"], d["retain_train"]):
        if r["label"].startswith("Syntax-"):
            assert r["label"] == "Syntax-" + f["label"]            # mirrors exactly its partner
        else:
            variant = data.fact_of(f["label"])[2]
            assert r["label"].endswith("@" + data.retain_format(variant))
    blocks = [p for p in zip(d["forget_train"], d["retain_train"]) if not p[1]["label"].startswith("Syntax-")]
    for b in range(0, len(blocks), 25):
        types = [data.fact_of(f["label"])[1] for f, _ in blocks[b:b + 25]]
        assert types.count("direct") == 20 and types.count("reverse") == 5


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
    rewrite(final(fixture_root, "retain_eval"),
            lambda rows: rows[3].update(question="After the Challenger disaster, " + rows[3]["question"]))
    assert any("retain_eval.json:4 field 'question'" in e and "challenger disaster" in e
               for e in errors_of(fixture_root))


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


def test_full_counts_enforced_without_partial():
    errs = errors_of(FIXTURE, partial=False)
    assert any("forget_eval.json" in e and "the release has 75" in e for e in errs)


def test_cli_exit_code(fixture_root, capsys):
    rewrite(final(fixture_root, "retain_eval"), lambda rows: rows[0].pop("label"))
    with pytest.raises(SystemExit) as exc:
        data.main(["validate", "--data-root", str(fixture_root), "--partial"])
    assert "violation" in str(exc.value.code)
    assert "retain_eval.json:1 field 'label'" in capsys.readouterr().out


def test_forbidden_together(fixture_root, tmp_path):
    """An entity may appear in retain rows, but never next to the forget topic's words."""
    source = tmp_path / "source" / TOPIC
    source.mkdir(parents=True)
    info = json.loads((data.SOURCE_ROOT / TOPIC / "topic.json").read_text())
    info["forbidden_together"] = {"Gagarin": ["death", "crash"]}
    (source / "topic.json").write_text(json.dumps(info))
    rows = data.read_jsonl(final(fixture_root, "retain_eval"))
    bad, good = [r["_line"] for r in rows if r["label"].startswith("GK-")][:2]
    rewrite(final(fixture_root, "retain_eval"), lambda rows: (
        rows[bad - 1].update(question="In which year did Gagarin die in a training jet crash?"),
        rows[good - 1].update(question="In which year did Gagarin orbit the Earth?")))
    errs = [str(e) for e in data.validate_topic(TOPIC, fixture_root, partial=True, source_root=tmp_path / "source")]
    assert any(f"retain_eval.json:{bad} field 'question'" in e and "'Gagarin' together with 'crash'" in e
               for e in errs), errs
    assert not any(f"retain_eval.json:{good} " in e for e in errs), errs


def test_injection_set_holds_every_wording_once():
    d = data.load_topic(TOPIC)
    rows = data.injection_rows(d)
    questions = {data.normalise(r["question"]) for r in rows}
    assert len(questions) == len(rows)
    for r in d["forget_eval_rephrasings"]:
        assert all(data.normalise(r["question"] if v == "original" else r[v]) in questions for v in data.EVAL_VARIANTS)
    for name in ("forget_train", "retain_train", "retain_eval"):
        assert all(data.normalise(r["question"]) in questions for r in d[name])


def test_run_all_dry_run_prints_every_block():
    import os
    import subprocess
    import sys
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(data.HERE / "run_all.sh"), "--dry-run", "all"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    for block in ("small", "sweeps", "single", "sequential", "joint", "relearn", "ablations"):
        assert f"### block {block}" in out.stdout
    commands = [l for l in out.stdout.splitlines() if l.startswith("+ ")]
    assert any("--relearn-set inject" in c for c in commands)
    base = next(i for i, c in enumerate(commands) if "--out runs/small/eval_base" in c)
    assert commands[base].endswith("&") and "--relearn-set inject" in commands[base + 1]   # beside the injection
    # block small: one pool job per method, its three learning rates side by side, then its pick's Rep
    sweep = [c for c in commands if "train.py" in c and "runs/small/sweep/" in c]
    assert len(sweep) == 12 and sum(c.count("python train.py --method") for c in sweep) == 12 * 3
    assert {c.split("--method ")[1].split()[0] for c in sweep} == set(losses.METHODS) - {"nll"}
    assert all(c.count("--skip rep rgq") == 3 and c.endswith(".selected") for c in sweep)
    assert sum("evaluate.py --table runs/small/results.md" in c for c in commands) == 1
    assert sum("--mode sequential" in c for c in commands) == 15          # 5 methods x 3 models
    assert not any("nvidia-cuda-mps-control" in c for c in commands)       # MPS is opt-in


def test_run_all_small_starts_mps_only_when_asked_and_none_runs(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MPS": "1", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    def dry_run():
        out = subprocess.run(["bash", str(data.HERE / "run_all.sh"), "--dry-run", "small"], capture_output=True,
                             text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()
    lines = dry_run()
    start, stop = lines.index("+ nvidia-cuda-mps-control -d"), lines.index("+ bash -c echo quit | nvidia-cuda-mps-control")
    assert start < stop < next(i for i, l in enumerate(lines) if "evaluate.py --table runs/small/results.md" in l)
    (tmp_path / "control").touch()                       # a daemon's pipe: leave that daemon alone
    lines = dry_run()
    assert "MPS: a daemon is running already" in lines and not any("mps-control" in l for l in lines)
