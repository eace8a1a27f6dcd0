"""Tooling for our SUITE release (data/suite, built from the hand-written data/source): build a topic
from its sources, validate any SUITE root against the authors' release grammar and our stricter rules,
and compare releases side by side. For people editing the data; training and evaluation never load it:

    python suite.py validate [--topic T] [--data-root data/suite] [--strict | --no-strict] [--partial]
    python suite.py build --topic T
    python suite.py lkf [--out data/lkf]            # the LKF* root (the paper's LKF variant) from SUITE
    python suite.py stats [--topic T] --data-root data/suite [--data-root PATH2]   # side by side

Layout and counts: data/SUITE_FORMAT.md; our source format and the validator's rules: data/README.md.
"""
import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path

from data import (ADV_VARIANTS, BLANK, DEFAULT_ROOT, EVAL_VARIANTS, FINAL_FILES, HERE, LKF_MARKER, LKF_ROOT,
                  TRAIN_VARIANTS, DataError, category, fact_of, is_lkf_root, load_pools, load_topic, normalise,
                  read_json_array, read_jsonl, topic_paths, topics_in)

SOURCE_ROOT = HERE / "data" / "source"


# ----------------------------------------------------------------------------------------------
# Comparing wordings (the validator and the stats)

def trigrams(text):
    words = normalise(text).split()
    return {tuple(words[i:i + 3]) for i in range(max(1, len(words) - 2))}


def trigram_jaccard(a, b):
    ta, tb = trigrams(a), trigrams(b)
    return len(ta & tb) / max(1, len(ta | tb))


def near_duplicate(a, b, threshold=0.5):
    """Equal after normalisation, or word-trigram Jaccard >= threshold (see data/README.md)."""
    return normalise(a) == normalise(b) or trigram_jaccard(a, b) >= threshold


def opener(text):
    """The first three words of a wording, normalised (the blank shown as ____)."""
    return " ".join(normalise(text).split()[:3]).replace("zzblankzz", BLANK)


# ----------------------------------------------------------------------------------------------
# Building our release from the source files (data/README.md)

FACTS = [f"M{i}" for i in range(1, 6)] + [f"K{i}" for i in range(1, 21)]
LEET = {"a": "4", "e": "3", "i": "1", "o": "0", "s": "5", "t": "7"}


def topic_info(topic, source_root=SOURCE_ROOT):
    path = Path(source_root) / topic / "topic.json"
    if not path.exists():
        raise DataError(path, None, None, "file is missing (every topic needs its topic.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def read_source(topic, name, source_root=SOURCE_ROOT):
    """Rows of source/<topic>/<name>.jsonl, or of its parts <name>.*.jsonl in name order."""
    folder = Path(source_root) / topic
    whole = folder / f"{name}.jsonl"
    parts = sorted(folder.glob(f"{name}.*.jsonl"))
    if whole.exists() and parts:
        raise DataError(whole, None, None, f"both {whole.name} and parts {[p.name for p in parts]} exist; keep one")
    rows = []
    for path in ([whole] if whole.exists() else parts) or [whole]:
        for row in read_jsonl(path):
            row["_path"] = str(path)
            rows.append(row)
    return rows


def read_topic_sources(topic, source_root=SOURCE_ROOT):
    """Everything `build` reads for one topic: its topic.json, its forget and adversarial rows by label,
    its syntax, semantic and lexical rows, and the shared general-knowledge pool."""
    return {"info": topic_info(topic, source_root),
            "forget": {r["label"]: r for r in read_source(topic, "forget", source_root)},
            "adversarial": {r["label"]: r for r in read_source(topic, "adversarial", source_root)},
            "syntax": read_source(topic, "syntax", source_root),
            "semantic": read_source(topic, "semantic", source_root),
            "lexical": read_source(topic, "lexical", source_root),
            "gk": read_jsonl(Path(source_root) / "general_knowledge.jsonl")}


def scrambled(question, rng):
    """Every word of the question exactly once, in an unnatural (shuffled) order."""
    words = question.rstrip("?").split()
    for _ in range(20):
        shuffled = words[:]
        rng.shuffle(shuffled)
        if shuffled != words:
            break
    return " ".join(shuffled) + "?"


def random_capslock(question, rng):
    return "".join(c.upper() if c.isalpha() and rng.random() < 0.4 else c.lower() if c.isalpha() else c
                   for c in question)


def leet_speak(question, rng):
    return "".join(LEET[c.lower()] if c.lower() in LEET and rng.random() < 0.6 else c for c in question)


def variant_text(row, variant):
    """The wording named by a variant label of a source forget row."""
    if variant == "original":
        return row["question"]
    field = {("q", "claude"): "train_paraphrases", ("blank", "claude"): "train_blanks",
             ("q", "gemini"): "eval_paraphrases", ("blank", "gemini"): "eval_blanks"}
    m = re.fullmatch(r"(q|blank)_(claude|gemini)(\d+)", variant)
    items = row[field[(m.group(1), m.group(2))]]
    return items[int(m.group(3)) - 1]


def retain_format(variant):
    """Format suffix of a retain row written to match its forget partner's wording."""
    return "original" if variant == "original" else "q" if variant.startswith("q_") else "blank"


def retain_text(row, fmt):
    return {"original": row["question"], "q": row.get("paraphrase"), "blank": row.get("blank")}[fmt]


def release_row(question, answer, label, source_row):
    """A release row; it carries the aliases of its own source row (never another row's)."""
    row = {"question": question, "answer": answer, "label": label}
    if source_row.get("aliases"):
        row["aliases"] = list(source_row["aliases"])
    return row


def retain_label(kind, row, tiers):
    """The release label of a retain source row: 'Semantic-<tier>-<tier name>', 'GK-<id> - <field> -
    <subfield>' or 'Lexical-<phrase>' (`tiers` maps a tier, as a string, to its name)."""
    if kind == "Semantic":
        return f"Semantic-{row['tier']}-{tiers[str(row['tier'])]}"
    if kind == "GK":
        return f"GK-{row['id']} - {row['field']} - {row['subfield']}"
    return f"Lexical-{row['phrase']}"


def adversarial_rows(src, rng):
    """One adversarial row per direct question: the hand-written variants of source/adversarial.jsonl,
    and q_scrambled, q_random_capslock and q_leet_speak generated from the question with `rng`."""
    forget, rows = src["forget"], []
    for fact in FACTS:
        label = f"{fact}-direct"
        q = forget[label]["question"]
        row = release_row(q, forget[label]["answer"], label, forget[label])
        for v in ADV_VARIANTS:
            row[v] = src["adversarial"][label].get(v)
        row["q_scrambled"] = scrambled(q, rng)
        row["q_random_capslock"] = random_capslock(q, rng)
        row["q_leet_speak"] = leet_speak(q, rng)
        rows.append({k: row[k] for k in ["question", "answer", "label", "aliases"] + ADV_VARIANTS if k in row})
    return rows


def retain_eval_rows(src):
    """retain_eval: Syntax rows, Semantic rows by tier, general knowledge, Lexical rows (eval split)."""
    tiers = src["info"]["tiers"]
    evaluated = lambda kind: [r for r in src[kind] if r["split"] == "eval"]
    rows = [release_row(r["question"], r["answer"], f"Syntax-{r['mirrors']}", r) for r in evaluated("syntax")]
    rows += [release_row(r["question"], r["answer"], retain_label("Semantic", r, tiers), r)
             for r in sorted(evaluated("semantic"), key=lambda r: r["tier"])]
    rows += [release_row(r["question"], r["answer"], retain_label("GK", r, tiers), r) for r in evaluated("gk")]
    rows += [release_row(r["question"], r["answer"], retain_label("Lexical", r, tiers), r)
             for r in evaluated("lexical")]
    return rows


def forget_slots(qtype, count, rng, used):
    """`count` (label, variant) forget slots spread evenly over the 25 questions of one type; each
    question's wordings are drawn without repetition (wordings mirrored by Syntax rows, `used`, last);
    reverse questions start with the original, one paraphrase and one blank."""
    per_question = [count // 25 + (i < count % 25) for i in range(25)]
    out = []
    for fact, n in zip(FACTS, per_question):
        label = f"{fact}-{qtype}"
        q = [v for v in TRAIN_VARIANTS if v.startswith("q_")]
        b = [v for v in TRAIN_VARIANTS if v.startswith("blank_")]
        rng.shuffle(q), rng.shuffle(b)
        if qtype == "reverse":
            order = ["original", q[0], b[0]] + q[1:] + b[1:]
        else:
            order = ["original"] + q + b
            rng.shuffle(order)
            order = [v for v in order if v not in used[label]] + [v for v in order if v in used[label]]
        out += [(label, order[k % len(order)]) for k in range(n)]
    rng.shuffle(out)
    return out


def paired_train_rows(src, rng, folder):
    """forget_train and retain_train, line i of one trained with line i of the other (appendix B.2):
    Syntax rows first, each with the exact wording it mirrors; then blocks of 25 retain rows (semantic
    tiers in order, general knowledge, lexical), each block paired with 20 direct and 5 reverse forget
    rows, every retain row written in its partner's format."""
    forget, tiers = src["forget"], src["info"]["tiers"]
    forget_train, retain_train = [], []
    used = collections.defaultdict(set)
    for r in (r for r in src["syntax"] if r["split"] == "train"):
        label, _, variant = r["mirrors"].partition("@")
        forget_train.append(release_row(variant_text(forget[label], variant), forget[label]["answer"], r["mirrors"],
                                        forget[label]))
        retain_train.append(release_row(r["question"], r["answer"], f"Syntax-{r['mirrors']}", r))
        used[label].add(variant)
    trained = lambda kind: [r for r in src[kind] if r["split"] == "train"]
    blocks_rows = [(retain_label("Semantic", r, tiers), r) for r in sorted(trained("semantic"), key=lambda r: r["tier"])]
    blocks_rows += [(retain_label("GK", r, tiers), r) for r in trained("gk")]
    blocks_rows += [(retain_label("Lexical", r, tiers), r) for r in trained("lexical")]
    n_blocks = len(blocks_rows) // 25
    if len(blocks_rows) % 25:
        raise DataError(folder, None, None,
                        f"{len(blocks_rows)} train retain rows (semantic + GK + lexical) is not a multiple of 25")
    direct, reverse = forget_slots("direct", 20 * n_blocks, rng, used), forget_slots("reverse", 5 * n_blocks, rng, used)
    for b in range(n_blocks):
        block_slots = direct[20 * b:20 * b + 20] + reverse[5 * b:5 * b + 5]
        rng.shuffle(block_slots)
        for (label, variant), (label_of_retain, r) in zip(block_slots, blocks_rows[25 * b:25 * b + 25]):
            fmt = retain_format(variant)
            forget_train.append(release_row(variant_text(forget[label], variant), forget[label]["answer"],
                                            f"{label}@{variant}", forget[label]))
            retain_train.append(release_row(retain_text(r, fmt), r["answer"], f"{label_of_retain}@{fmt}", r))
    return forget_train, retain_train


def build_topic(topic, root=DEFAULT_ROOT, source_root=SOURCE_ROOT, seed=0):
    """Assemble final/*.json and the adversarial file from the sources, deterministically
    (appendix B.2 pairing: Syntax rows with the wording they mirror, then blocks of 25 retain rows
    paired with 20 direct and 5 reverse forget rows, retain rows written in their partner's format)."""
    src = read_topic_sources(topic, source_root)
    forget = src["forget"]
    rng = random.Random(f"{seed}-{topic}")
    labels = [f"{fact}-{qtype}" for fact in FACTS for qtype in ("direct", "reverse", "indirect")]
    missing = [l for l in labels if l not in forget]
    if missing:
        raise DataError(Path(source_root) / topic / "forget.jsonl", None, "label", f"missing questions {missing}")
    forget_eval = [release_row(forget[l]["question"], forget[l]["answer"], l, forget[l]) for l in labels]
    rephrasings = []
    for l in labels:
        row = release_row(forget[l]["question"], forget[l]["answer"], l, forget[l])
        row.update({v: variant_text(forget[l], v) for v in EVAL_VARIANTS[1:]})
        rephrasings.append(row)
    adv_rows = adversarial_rows(src, rng)
    retain_eval = retain_eval_rows(src)
    forget_train, retain_train = paired_train_rows(src, rng, Path(source_root) / topic)
    outputs = {"forget_train": forget_train, "retain_train": retain_train, "forget_eval": forget_eval,
               "forget_eval_rephrasings": rephrasings, "retain_eval": retain_eval}
    return write_topic(root, topic, outputs, adv_rows)


def write_topic(root, topic, outputs, adversarial):
    """A topic's release files: final/<name>.json as JSON Lines and the adversarial JSON array (fields the
    loader adds, `_line`, left out). Returns the row counts."""
    final = Path(root) / topic / "final"
    final.mkdir(parents=True, exist_ok=True)
    for name, rows in outputs.items():
        with open(final / f"{name}.json", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({k: v for k, v in row.items() if k != "_line"}, ensure_ascii=False) + "\n")
    adv_path = topic_paths(root, topic)["adversarial"]
    adv_path.parent.mkdir(parents=True, exist_ok=True)
    adv_path.write_text(json.dumps(adversarial, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return {name: len(rows) for name, rows in outputs.items()} | {"adversarial": len(adversarial)}


# ----------------------------------------------------------------------------------------------
# LKF*: the paper's variant of LKF built from SUITE (appendix "Comparing evaluation and unlearning
# between LKF* and SUITE"), for Challenger: direct forget questions, retain from semantic tiers 1-5.

LKF_TOPIC = "challenger_disaster"
LKF_TIERS = range(1, 6)
LKF_COUNTS = {"forget_train": 400, "retain_train": 375, "forget_eval": 25, "forget_eval_rephrasings": 25,
              "retain_eval": 625, "adversarial": 25}
LKF_EVAL_FORMATS = ["q_lkf1", "q_lkf2", "q_lkf3", "blank_lkf1", "blank_lkf2"]


def build_lkf(out_root, source_root=SOURCE_ROOT, suite_root=DEFAULT_ROOT):
    """The LKF* root in the authors' layout, deterministically: forget_train, the 25 direct questions in
    their 16 training wordings (400 rows); retain_train, the 125 semantic retain-train questions of tiers
    1-5 as written, paraphrased and as a blank (375 rows; LKF* trains them with random pairs, so the two
    files differ in length); forget_eval and forget_eval_rephrasings, the direct questions with their
    evaluation wordings (Q_D, as SUITE asks it); retain_eval, the same 125 questions in the three
    paraphrases and two blanks of source/<topic>/lkf_retain.*.jsonl (625 rows: LKF* tests retain on
    the training questions, reworded). Pools and the direct adversarial rows are SUITE's. Marked by
    lkf.json, which tells the loader and the validator that the root is LKF*."""
    topic, out_root = LKF_TOPIC, Path(out_root)
    src = read_topic_sources(topic, source_root)
    tiers = src["info"]["tiers"]
    direct = [f"{fact}-direct" for fact in FACTS]
    forget = src["forget"]
    forget_train = [release_row(variant_text(forget[l], v), forget[l]["answer"], f"{l}@{v}", forget[l])
                    for l in direct for v in TRAIN_VARIANTS]
    suite = load_topic(topic, suite_root)
    rephrasings = [r for r in suite["forget_eval_rephrasings"] if r["label"] in direct]
    forget_eval = [r for r in suite["forget_eval"] if r["label"] in direct]
    semantic = [r for r in sorted(src["semantic"], key=lambda r: r["tier"]) if r["split"] == "train" and r["tier"] in LKF_TIERS]
    wordings = {r["question"]: r for r in read_source(topic, "lkf_retain", source_root)}
    missing = [r["question"] for r in semantic if r["question"] not in wordings]
    if missing or len(wordings) != len(semantic):
        raise DataError(Path(source_root) / topic / "lkf_retain.jsonl", None, "question",
                        f"{len(wordings)} rows for the {len(semantic)} retain-train questions of tiers 1-5; "
                        f"without evaluation wordings: {missing[:3]}")
    retain_train, retain_eval = [], []
    for r in semantic:
        label = retain_label("Semantic", r, tiers)
        retain_train += [release_row(retain_text(r, fmt), r["answer"], f"{label}@{fmt}", r) for fmt in ("original", "q", "blank")]
        w = wordings[r["question"]]
        texts = w["eval_paraphrases"] + w["eval_blanks"]
        if len(w["eval_paraphrases"]) != 3 or len(w["eval_blanks"]) != 2:
            raise DataError(w["_path"], w, "eval_paraphrases", "needs 3 eval_paraphrases and 2 eval_blanks")
        retain_eval += [release_row(text, r["answer"], f"{label}@{fmt}", r) for fmt, text in zip(LKF_EVAL_FORMATS, texts)]
    suite_root = Path(suite_root)
    for pool in ("few_shot_context/short_context.json", "refusal_detection/refusal_detection_questions.json"):
        (out_root / pool).parent.mkdir(parents=True, exist_ok=True)
        (out_root / pool).write_text((suite_root / pool).read_text(encoding="utf-8"), encoding="utf-8")
    adversarial = [r for r in read_json_array(topic_paths(suite_root, topic)["adversarial"]) if r["label"] in direct]
    counts = write_topic(out_root, topic, {"forget_train": forget_train, "retain_train": retain_train,
                                           "forget_eval": forget_eval, "forget_eval_rephrasings": rephrasings,
                                           "retain_eval": retain_eval}, adversarial)
    (out_root / LKF_MARKER).write_text(json.dumps({
        "protocol": "lkf", "topic": topic, "built_by": "python suite.py lkf",
        "from": "data/source (direct forget questions, semantic retain-train tiers 1-5, lkf_retain.*.jsonl) and "
                "data/suite (forget eval wordings, pools, adversarial rows)"}, indent=1) + "\n")
    return counts


# ----------------------------------------------------------------------------------------------
# Validation. Two levels (data/README.md): the authors' release grammar, which any SUITE root must
# follow (errors), and our stricter rules (--strict, on for data/suite). Without --strict the quality
# rules (blanks, near-duplicates, answers in questions, placeholder rows, openers...) are warnings.

FACT_RE = r"(?:M[1-5]|K(?:20|1[0-9]|[1-9]))"
TRAIN_VARIANT_RE = r"(?:original|q_claude(?:10|[1-9])|blank_claude[1-5])"
EVAL_VARIANT_RE = r"(?:original|q_gemini(?:10|[1-9])|blank_gemini[1-5])"
FORMAT_RE = r"@(?:original|q|blank)"
# The authors' release (SUITE_FORMAT.md): GK and Lexical rows of retain_train carry no format suffix;
# retain_eval Syntax rows name the train wording whose skeleton they copy.
RELEASE_LABEL_RULES = {
    "forget_train": re.compile(rf"{FACT_RE}-(?:direct|reverse)@{TRAIN_VARIANT_RE}"),
    "forget_eval": re.compile(rf"{FACT_RE}-(?:direct|reverse|indirect)"),
    "forget_eval_rephrasings": re.compile(rf"{FACT_RE}-(?:direct|reverse|indirect)"),
    "adversarial": re.compile(rf"{FACT_RE}-direct"),
    "retain_train": re.compile(rf"Syntax-{FACT_RE}-(?:direct|reverse)@{TRAIN_VARIANT_RE}|"
                               rf"Semantic-(?:10|[0-9])-.+{FORMAT_RE}|GK-\d+ - .+ - .+|Lexical-.+"),
    "retain_eval": re.compile(rf"Syntax-{FACT_RE}-(?:direct|reverse)@(?:{TRAIN_VARIANT_RE}|{EVAL_VARIANT_RE})|"
                              r"Semantic-(?:1[0-5]|[0-9])-.+|GK-\d+ - .+ - .+|Lexical-.+"),
}
# Ours: every retain_train row names the format it was written in; eval Syntax rows mirror eval wordings.
STRICT_LABEL_RULES = RELEASE_LABEL_RULES | {
    "retain_train": re.compile(rf"Syntax-{FACT_RE}-(?:direct|reverse)@{TRAIN_VARIANT_RE}|"
                               rf"Semantic-(?:10|[0-9])-.+{FORMAT_RE}|GK-\d+ - .+ - .+{FORMAT_RE}|Lexical-.+{FORMAT_RE}"),
    "retain_eval": re.compile(rf"Syntax-{FACT_RE}-(?:direct|reverse)@{EVAL_VARIANT_RE}|"
                              r"Semantic-(?:1[0-5]|[0-9])-.+|GK-\d+ - .+ - .+|Lexical-.+"),
}
# Counts of the release (SUITE_FORMAT.md); topics without tier 0 have 25 fewer train rows and retain_eval rows.
FULL_COUNTS = {"forget_train": 450, "retain_train": 450, "forget_eval": 75, "forget_eval_rephrasings": 75,
               "retain_eval": 650, "adversarial": 25}
RETAIN_EVAL_COUNTS = {"Syntax": 100, "GK": 100, "Lexical": 50}
RETAIN_TRAIN_COUNTS = {"Syntax": 75, "GK": 50, "Lexical": 50}
# No variant slot carries a house style: at most this share of a slot's wordings open with the same three
# words (slots of fewer rows, e.g. a small fixture, are too small for a share to mean anything).
OPENER_MAX_SHARE = 0.2
OPENER_MIN_ROWS = 10
# A placeholder row ("The answer is ____.") has no word outside these.
PLACEHOLDER_WORDS = {"the", "a", "an", "answer", "is", "was", "are", "it", "this", "here", "question", "blank",
                     "fill", "in", "placeholder", "todo", "tbd", "xxx", "zzblankzz"}


def written_as(name, label):
    """The format a row's label says it was written in: 'blank', 'question', or None when the label
    does not say (GK and Lexical rows of the authors' retain_train)."""
    variant = label.rpartition("@")[2] if "@" in label else ""
    if name in ("forget_eval", "forget_eval_rephrasings", "adversarial"):
        return "question"
    if name == "retain_eval":
        return "blank" if variant.startswith("blank") else "question"
    if not variant:
        return None if name == "retain_train" else "question"
    return "blank" if variant.startswith("blank") else "question"


def answer_in_question(answer, question):
    """The normalised answer occurs as whole words in the normalised question (numbers of one or
    two digits are exempt: they collide with ordinary numerals such as 'Apollo 1')."""
    a, q = normalise(answer), normalise(question)
    if not a or (a.isdigit() and len(a) <= 2):
        return False
    return re.search(rf"(?:^| ){re.escape(a)}(?: |$)", q) is not None


def starts_a_word(phrase, text):
    """`phrase` occurs in `text` (case-insensitive) beginning at the start of a word: 'died' is not in
    'studied', 'liver' not in 'deliver', while a stem such as 'pancrea' still finds 'pancreatic'."""
    return re.search(rf"(?<!\w){re.escape(phrase.lower())}", text.lower()) is not None


def is_placeholder(text):
    """A wording with no content word, e.g. 'The answer is ____.'"""
    return not set(normalise(text).split()) - PLACEHOLDER_WORDS


def is_our_release(root):
    """data/suite, or the LKF* root built from it (data/lkf): our rules apply by default."""
    return Path(root).resolve() in (DEFAULT_ROOT.resolve(), LKF_ROOT.resolve())


class Findings:
    """The violations of one topic, each listed once, in the order found. `error` breaks a rule of the
    release grammar; `flag` a quality rule: an error under --strict, a warning otherwise."""

    def __init__(self, paths, strict):
        self.paths, self.strict, self.list, self.seen = paths, strict, [], set()

    def add(self, error):
        if str(error) not in self.seen:
            self.seen.add(str(error))
            self.list.append(error)

    def error(self, name, row, field, rule):
        self.add(DataError(self.paths[name], row.get("_line") if row else None, field, rule))

    def flag(self, name, row, field, rule):
        self.add(DataError(self.paths[name], row.get("_line") if row else None, field, rule, warning=not self.strict))


def read_topic_files(found):
    """The rows of every file of a topic, and the rows each holds: a line that is not JSON is reported
    once and still counted as a row (so that the counts do not report it a second time)."""
    files, n_rows = {}, {}
    for name in FINAL_FILES + ["adversarial"]:
        bad_lines = []
        try:
            path = found.paths[name]
            files[name] = read_jsonl(path, bad_lines) if name != "adversarial" else read_json_array(path)
            n_rows[name] = len(files[name]) + len(bad_lines)
        except DataError as e:
            bad_lines.append(e)
        for e in bad_lines:
            found.add(e)
    return files, n_rows


def check_fields_and_labels(found, files):
    """Rows are objects with a non-empty question, answer and label, the label in its file's grammar
    (ours under --strict), aliases a list of non-empty strings, and no placeholder answer. Returns the
    usable rows of every file: those with all three fields (the rules below judge only these)."""
    label_rules = STRICT_LABEL_RULES if found.strict else RELEASE_LABEL_RULES
    usable = {}
    for name, rows in files.items():
        usable[name] = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                found.error(name, None, None, f"element {i + 1} must be a JSON object")
                continue
            missing = [f for f in ("question", "answer", "label") if not isinstance(row.get(f), str) or not row[f].strip()]
            for field in missing:
                found.error(name, row, field, "must be a non-empty string")
            if "label" not in missing and not label_rules[name].fullmatch(row["label"]):
                lenient = RELEASE_LABEL_RULES[name].fullmatch(row["label"])
                found.error(name, row, "label", f"'{row['label']}' does not follow the label grammar of {name}"
                            + (" (ours, --strict; the authors' release grammar allows it)" if lenient else ""))
            aliases = row.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
                found.error(name, row, "aliases", "must be a list of non-empty strings")
                row["aliases"] = []
            if not missing:
                usable[name].append(row)
                if BLANK in row["answer"]:
                    found.flag(name, row, "answer", "is a placeholder, not an answer")
    return usable


def check_lkf_counts(found, n_rows, usable):
    """An LKF* root (build_lkf): its counts, semantic tiers 1-5 alone (3 train and 5 eval rows a question)."""
    for name, n in LKF_COUNTS.items():
        if n_rows[name] != n:
            found.error(name, None, None, f"has {n_rows[name]} rows; LKF* has {n}")
    for name, per_tier in (("retain_train", 75), ("retain_eval", 125)):
        by_cat = collections.Counter(category(r["label"]) for r in usable[name])
        for cat, n in by_cat.items():
            if cat[0] != "Semantic" or cat[1] not in LKF_TIERS or n != per_tier:
                found.error(name, None, "label", f"{n} rows of {cat[0]} {cat[1] or ''}; LKF* has {per_tier} rows "
                            f"of each semantic tier 1-5 and nothing else")


def check_lkf_retain(found, usable):
    """LKF*'s retain questions: line 3i-3i+2 of retain_train (as written, paraphrased, blank) and lines
    5i-5i+4 of retain_eval (three paraphrases, two blanks) are one question: one answer, eight wordings
    no two of which are near-duplicates; no eval slot has a house style."""
    rt, re_ = usable["retain_train"], usable["retain_eval"]
    slots = collections.defaultdict(list)
    for i in range(min(len(rt) // 3, len(re_) // 5)):
        train, evals = rt[3 * i:3 * i + 3], re_[5 * i:5 * i + 5]
        for r in train + evals:
            if r["answer"] != train[0]["answer"]:
                found.error("retain_eval" if r in evals else "retain_train", r, "answer",
                            f"differs from its question's answer '{train[0]['answer']}' (retain_train line {train[0]['_line']})")
        wordings = [("retain_train", r) for r in train] + [("retain_eval", r) for r in evals]
        for j, (na, ra) in enumerate(wordings):
            for nb, rb in wordings[j + 1:]:
                if near_duplicate(ra["question"], rb["question"]):
                    found.flag(nb, rb, "question", f"near-duplicate of {na} line {ra['_line']} (the same question's wordings)")
        for r in evals:
            slots[("retain_eval", "question", r["label"].rpartition("@")[2])].append((opener(r["question"]), r))
    flag_house_styles(found, slots)


def check_counts(found, n_rows, usable, partial):
    """forget_train and retain_train pair line by line; without `partial`, every file, fact, retain
    category and semantic tier has the release's count (SUITE_FORMAT.md)."""
    if n_rows["forget_train"] != n_rows["retain_train"]:
        found.error("retain_train", None, None, f"{n_rows['retain_train']} rows but forget_train has "
                    f"{n_rows['forget_train']}: line i of each is a training pair")
    if partial:
        return
    has_tier0 = any(category(r["label"]) == ("Semantic", 0) for r in usable["retain_eval"])
    expected = dict(FULL_COUNTS)
    if not has_tier0:
        for n in ("forget_train", "retain_train", "retain_eval"):
            expected[n] -= 25
    for name, n in expected.items():
        if n_rows[name] != n:
            found.error(name, None, None, f"has {n_rows[name]} rows; the release has {n}")
    facts = {fact_of(r["label"])[0] for r in usable["forget_eval"]}
    if not facts >= set(FACTS):
        found.error("forget_eval", None, "label", f"facts {sorted(set(FACTS) - facts)} are missing")
    for name, counts, tiers in (("retain_eval", RETAIN_EVAL_COUNTS, 16), ("retain_train", RETAIN_TRAIN_COUNTS, 11)):
        by_cat = collections.Counter(category(r["label"]) for r in usable[name])
        for kind, n in counts.items():
            if by_cat[(kind, None)] != n:
                found.error(name, None, "label", f"{by_cat[(kind, None)]} {kind} rows; the release has {n}")
        for tier in range(0 if has_tier0 else 1, tiers):
            if by_cat[("Semantic", tier)] != 25:
                found.error(name, None, "label", f"{by_cat[('Semantic', tier)]} rows of semantic tier {tier}; expected 25")


def check_forget_eval(found, fe, fr, qtypes=("direct", "reverse", "indirect")):
    """Every fact has its direct, reverse and indirect question (LKF*: direct alone), once;
    forget_eval_rephrasings holds the same questions in the same order, each with all its eval variants."""
    eval_labels = collections.Counter(r["label"] for r in fe)
    for label, n in eval_labels.items():
        if n > 1:
            found.error("forget_eval", None, "label", f"'{label}' appears {n} times")
    for fact in sorted({fact_of(l)[0] for l in eval_labels}):
        for qtype in qtypes:
            if f"{fact}-{qtype}" not in eval_labels:
                found.error("forget_eval", None, "label", f"fact {fact} has no {qtype} question")
    if [r["label"] for r in fr] != [r["label"] for r in fe]:
        found.error("forget_eval_rephrasings", None, "label",
                    "must hold the forget_eval questions, same labels in the same order")
    base = {r["label"]: r for r in fe}
    for r in fr:
        if r["label"] in base and (r["question"], r["answer"]) != (base[r["label"]]["question"], base[r["label"]]["answer"]):
            found.flag("forget_eval_rephrasings", r, "question", "differs from the forget_eval row with the same label")
        for v in EVAL_VARIANTS[1:]:
            if not isinstance(r.get(v), str) or not r[v].strip():
                found.error("forget_eval_rephrasings", r, v, "missing eval variant")


def train_wordings_of(ft):
    """'K3-direct' -> {variant: (text, row)}: each forget_train wording of a question, where it first
    appears."""
    wordings = collections.defaultdict(dict)
    for r in ft:
        fact, qtype, variant = fact_of(r["label"])
        wordings[f"{fact}-{qtype}"].setdefault(variant, (r["question"], r))
    return wordings


def check_forget_train(found, ft, fe, train_wordings):
    """forget_train answers agree with forget_eval, every direct and reverse question is trained on, and
    a wording label always carries the same text."""
    base = {r["label"]: r for r in fe}
    for r in ft:
        if r["label"].split("@")[0] in base and r["answer"] != base[r["label"].split("@")[0]]["answer"]:
            found.flag("forget_train", r, "answer", "differs from the answer of the same question in forget_eval")
    for label in dict.fromkeys(r["label"] for r in fe):
        if not label.endswith("indirect") and label not in train_wordings:
            found.error("forget_train", None, "label", f"'{label}' never appears in training")
    first_text = {}
    for r in ft:
        if r["label"] in first_text and first_text[r["label"]] != r["question"]:
            found.flag("forget_train", r, "question", f"'{r['label']}' has different text on another line")
        first_text.setdefault(r["label"], r["question"])


def check_near_duplicates(found, fr, train_wordings):
    """No near-duplicate wordings (data/README.md): inside a question's eval variants, between an eval
    and a train wording of the same question, inside its train wordings."""
    for r in fr:
        wordings = [("original", r["question"])] + [(v, r.get(v)) for v in EVAL_VARIANTS[1:] if isinstance(r.get(v), str)]
        for i, (va, ta) in enumerate(wordings):
            for vb, tb in wordings[i + 1:]:
                if near_duplicate(ta, tb):
                    found.flag("forget_eval_rephrasings", r, vb,
                               f"near-duplicate of {va} (same wording or word-trigram Jaccard >= 0.5)")
        for v, text in wordings[1:]:
            for tv, (tt, trow) in train_wordings.get(r["label"], {}).items():
                if near_duplicate(text, tt):
                    found.flag("forget_eval_rephrasings", r, v, f"near-duplicate of the train wording "
                               f"{r['label']}@{tv} (forget_train line {trow['_line']})")
    for label, variants in train_wordings.items():
        items = list(variants.items())
        for i, (va, (ta, _)) in enumerate(items):
            for vb, (tb, rb) in items[i + 1:]:
                if near_duplicate(ta, tb):
                    found.flag("forget_train", rb, "question", f"{label}@{vb} is a near-duplicate of {label}@{va}")


def distinct_wordings(usable):
    """Every distinct wording once, where it first appears, as (file, row, field, text): the eval
    variants, then forget_eval and forget_train questions not seen yet, then every retain question."""
    wordings, done = [], set()
    for r in usable["forget_eval_rephrasings"]:
        for v in EVAL_VARIANTS:
            text = r["question"] if v == "original" else r.get(v)
            if isinstance(text, str) and text.strip():
                wordings.append(("forget_eval_rephrasings", r, "question" if v == "original" else v, text))
                done.add((r["label"], text))
    for name in ("forget_eval", "forget_train"):
        for r in usable[name]:
            key = (r["label"].split("@")[0] if name == "forget_train" else r["label"], r["question"])
            if key not in done:
                wordings.append((name, r, "question", r["question"]))
                done.add(key)
    return wordings + [(name, r, "question", r["question"]) for name in ("retain_train", "retain_eval")
                       for r in usable[name]]


def check_blanks(found, name, row, field, text):
    """A wording is no placeholder; a fill-in-the-blank wording holds exactly one blank, any other
    wording none (a retain_train row whose label names no format may be either)."""
    fmt = written_as(name, row["label"]) if field == "question" else ("blank" if field.startswith("blank_") else "question")
    n = text.count(BLANK)
    if is_placeholder(text):
        found.flag(name, row, field, "is a placeholder, not a question")
    elif fmt == "blank" and n != 1:
        found.flag(name, row, field, f"a fill-in-the-blank variant must hold exactly one '{BLANK}' (found {n})")
    elif fmt == "question" and n:
        found.flag(name, row, field, f"only fill-in-the-blank variants may hold '{BLANK}'")


def check_giveaways(found, name, row, field, text):
    """The answer and the row's own aliases are not given away by the wording (a Lexical row may need
    its phrase in the answer: the release's Lexical rows are exempt outside --strict)."""
    lexical = name.startswith("retain") and category(row["label"])[0] == "Lexical"
    if answer_in_question(row["answer"], text) and (found.strict or not lexical):
        found.flag(name, row, field, f"contains its own answer '{row['answer']}'")
    for alias in row.get("aliases", []):
        if answer_in_question(alias, text):
            found.flag(name, row, field, f"contains its own alias '{alias}'")


def check_openers(found, fr, train_wordings):
    """No variant slot has a house style: at most OPENER_MAX_SHARE of its wordings open with the same
    three words (slots of fewer than OPENER_MIN_ROWS wordings are not judged)."""
    slots = collections.defaultdict(list)                   # (file, field, variant) -> [(opener, row)]
    for r in fr:
        for v in EVAL_VARIANTS:
            text = r["question"] if v == "original" else r.get(v)
            if isinstance(text, str):
                slots[("forget_eval_rephrasings", "question" if v == "original" else v, v)].append((opener(text), r))
    for variants in train_wordings.values():
        for v, (text, row) in variants.items():
            slots[("forget_train", "question", v)].append((opener(text), row))
    flag_house_styles(found, slots)


def flag_house_styles(found, slots):
    """{(file, field, variant): [(opener, row)]}: flag every opener that more than OPENER_MAX_SHARE of a
    slot's wordings share (slots of fewer than OPENER_MIN_ROWS wordings are not judged)."""
    for (name, field, v), items in slots.items():
        if len(items) < OPENER_MIN_ROWS:
            continue
        for words, n in collections.Counter(o for o, _ in items).most_common():
            if n <= OPENER_MAX_SHARE * len(items):
                break
            lines = sorted(row["_line"] for o, row in items if o == words)
            found.flag(name, None, field, f"{n} of the {len(items)} '{v}' wordings ({n / len(items):.1%}) open with "
                       f"'{words}' (lines {', '.join(map(str, lines[:8]))}{', ...' if len(lines) > 8 else ''}); at most "
                       f"{OPENER_MAX_SHARE:.0%} of a slot may share its first three words")


def check_retain_questions(found, usable, topic, source_root):
    """Retain rows never name the forget topic (the phrases of our topic.json, only where `source_root`
    is given), and no question appears twice across the retain pool."""
    forbidden, together = [], {}
    if source_root is not None:
        try:
            info = topic_info(topic, source_root)
            forbidden, together = info["forbidden_in_retain"], info.get("forbidden_together", {})
        except DataError as e:
            found.add(e)
    seen_q = {}
    for name in ("retain_train", "retain_eval"):
        for r in usable[name]:
            text = f"{r['question']} {r['answer']}"
            for phrase in forbidden:
                if starts_a_word(phrase, text):
                    found.error(name, r, "question", f"contains the forget-topic phrase '{phrase.lower()}'")
            for entity, words in together.items():       # e.g. "Jobs" never next to his illness
                if re.search(rf"\b{re.escape(entity)}\b", text):
                    for word in words:
                        if starts_a_word(word, text):
                            found.error(name, r, "question", f"names '{entity}' together with '{word}' (the forget topic)")
            key = normalise(r["question"])
            if key in seen_q:
                found.flag(name, r, "question", f"duplicates {seen_q[key]}")
            seen_q.setdefault(key, f"{name} line {r['_line']}")


def check_adversarial(found, adv, fe):
    """Adversarial rows hold all their variants and the direct question of forget_eval; every direct
    question has one."""
    base = {r["label"]: r for r in fe}
    for r in adv:
        for v in ADV_VARIANTS:
            if not isinstance(r.get(v), str) or not r[v].strip():
                found.error("adversarial", r, v, "missing adversarial variant")
        if r["label"] in base and r["question"] != base[r["label"]]["question"]:
            found.flag("adversarial", r, "question", "differs from the direct question in forget_eval")
    adv_labels = {r["label"] for r in adv}
    for label in dict.fromkeys(r["label"] for r in fe):
        if label.endswith("-direct") and label not in adv_labels:
            found.error("adversarial", None, "label", f"no adversarial row for {label}")


def check_pairing(found, files):
    """Line i of retain_train is line i of forget_train's partner (appendix B.2): a syntax row mirrors exactly
    its partner's label, any other row that names a format is in its partner's (original, q, blank). A file
    out of order passes the counts, and trains every pair with a wrong hard negative."""
    named = {(e.path, e.line) for e in found.list if e.field == "label"}          # a bad label is named once
    retain = {r["_line"]: r for r in files.get("retain_train", []) if isinstance(r.get("label"), str)}
    for f in files.get("forget_train", []):
        r = retain.get(f["_line"])
        if (r is None or not isinstance(f.get("label"), str) or (str(found.paths["forget_train"]), f["_line"]) in named
                or (str(found.paths["retain_train"]), r["_line"]) in named):
            continue
        if r["label"].startswith("Syntax-"):
            ok, wanted = r["label"] == "Syntax-" + f["label"], repr("Syntax-" + f["label"])
        elif "@" in r["label"]:                # the official release's GK and lexical labels name no format
            fmt = retain_format(fact_of(f["label"])[2])
            ok, wanted = r["label"].endswith("@" + fmt), f"a label ending @{fmt}"
        else:
            continue
        if not ok:
            found.flag("retain_train", r, "label", f"{r['label']!r} does not pair with forget_train line "
                       f"{f['_line']} ({f['label']!r}): expected {wanted}")


def validate_topic(topic, root=DEFAULT_ROOT, partial=False, strict=None, source_root=None):
    """Every violation of one topic of a SUITE root (official layout), each once, as DataErrors;
    those with `.warning` set do not fail validation. `strict` (default: on for our data/suite only)
    adds our label grammar and makes the quality rules errors. `source_root` holds the topic.json
    whose forbidden phrases the retain rows must avoid: by default data/source for our release, and
    nothing for any other root (our topic rules never apply to someone else's data)."""
    ours = is_our_release(root)
    strict = ours if strict is None else strict
    source_root = SOURCE_ROOT if source_root is None and ours else source_root
    found = Findings(topic_paths(root, topic), strict)
    files, n_rows = read_topic_files(found)
    if len(files) < len(FINAL_FILES) + 1:
        return found.list                         # the rules below compare the files with one another
    usable = check_fields_and_labels(found, files)
    lkf = is_lkf_root(root)
    if lkf:
        check_lkf_counts(found, n_rows, usable)
        check_lkf_retain(found, usable)
    else:
        check_counts(found, n_rows, usable, partial)
        check_pairing(found, files)
    ft, fe, fr = usable["forget_train"], usable["forget_eval"], usable["forget_eval_rephrasings"]
    train_wordings = train_wordings_of(ft)
    check_forget_eval(found, fe, fr, ("direct",) if lkf else ("direct", "reverse", "indirect"))
    check_forget_train(found, ft, fe, train_wordings)
    check_near_duplicates(found, fr, train_wordings)
    for name, row, field, text in distinct_wordings(usable):
        check_blanks(found, name, row, field, text)
        check_giveaways(found, name, row, field, text)
    check_openers(found, fr, train_wordings)
    check_retain_questions(found, usable, topic, source_root)
    check_adversarial(found, usable["adversarial"], fe)
    return found.list


def validate_source(topic, source_root=SOURCE_ROOT):
    """Rules that only our source files can check: aliases, answer length, provenance, cue rotation,
    syntax mirrors that exist."""
    errors = []
    folder = Path(source_root) / topic
    if not folder.exists():
        return errors
    forget = read_source(topic, "forget", source_root)
    rows = forget + read_source(topic, "semantic", source_root) + read_source(topic, "lexical", source_root) \
        + read_source(topic, "syntax", source_root)
    for r in rows:
        def err(field, rule):
            errors.append(DataError(r["_path"], r["_line"], field, rule))
        answer = r.get("answer", "")
        if not isinstance(r.get("aliases"), list):
            err("aliases", "must be a list (possibly empty)")
        elif answer.strip() in {a.strip() for a in r["aliases"]}:
            err("aliases", "repeats the answer")
        if r in forget and not 1 <= len(answer.split()) <= 4:
            err("answer", f"forget answers are 1-4 words ('{answer}')")
    by_label = {r["label"]: r for r in forget}
    last_cues = []
    for r in forget:
        qtype = r["label"].split("-")[1]
        if qtype in ("direct", "reverse"):
            if not isinstance(r.get("provenance"), str) and qtype == "direct":
                errors.append(DataError(r["_path"], r["_line"], "provenance", "each fact needs a one-line provenance note"))
            for field, n in (("train_paraphrases", 10), ("train_blanks", 5)):
                if len(r.get(field) or []) != n:
                    errors.append(DataError(r["_path"], r["_line"], field, f"needs {n} entries"))
        for field, n in (("eval_paraphrases", 10), ("eval_blanks", 5)):
            if len(r.get(field) or []) != n:
                errors.append(DataError(r["_path"], r["_line"], field, f"needs {n} entries"))
        if qtype == "indirect":
            last_cues.append(r.get("cue"))
            if len(last_cues) >= 4 and len(set(last_cues[-4:])) == 1:
                errors.append(DataError(r["_path"], r["_line"], "cue",
                                        f"the cue '{r.get('cue')}' is used by four indirect questions in a row"))
    for r in read_source(topic, "syntax", source_root):
        label, _, variant = r["mirrors"].partition("@")
        want = TRAIN_VARIANTS if r["split"] == "train" else EVAL_VARIANTS
        if label not in by_label or variant not in want:
            errors.append(DataError(r["_path"], r["_line"], "mirrors", f"'{r['mirrors']}' names no {r['split']} wording"))
    return errors


# ----------------------------------------------------------------------------------------------
# Comparing releases

def release_stats(topic, root=DEFAULT_ROOT):
    """{measure: value} of one topic of a SUITE root, in print order: rows per file and label category,
    mean lengths, paraphrase diversity (mean pairwise word-trigram Jaccard among the wordings of one
    question: lower is more diverse) and the most common opener of every variant slot."""
    d = load_topic(topic, root)
    out = {f"{name} rows": len(d[name]) for name in FINAL_FILES + ["adversarial"]}
    types = collections.Counter(fact_of(r["label"])[1] for r in d["forget_train"])
    per_q = collections.Counter(r["label"].split("@")[0] for r in d["forget_train"])
    times = lambda qtype: sorted({n for l, n in per_q.items() if l.endswith(f"-{qtype}")})
    out["forget_train direct / reverse rows"] = f"{types['direct']} / {types['reverse']}"
    out["forget_train times per question"] = f"direct {times('direct')}, reverse {times('reverse')}"
    types = collections.Counter(fact_of(r["label"])[1] for r in d["forget_eval"])
    out["forget_eval direct / reverse / indirect"] = f"{types['direct']} / {types['reverse']} / {types['indirect']}"
    for name in ("retain_train", "retain_eval"):
        cats = collections.Counter(category(r["label"]) for r in d[name])
        kinds = collections.Counter(k for k, _ in cats.elements())
        for kind in ("Syntax", "Semantic", "GK", "Lexical"):
            out[f"{name} {kind}"] = kinds[kind]
        tiers = sorted(t for k, t in cats if k == "Semantic" and t is not None)
        if tiers:
            out[f"{name} Semantic tiers"] = f"{tiers[0]}-{tiers[-1]} x {sorted({cats[('Semantic', t)] for t in tiers})}"
    def written_in(label):
        suffix = label.rpartition("@")[2] if "@" in label else "none"
        return "q" if suffix.startswith("q") else "blank" if suffix.startswith("blank") else suffix

    formats = collections.Counter(written_in(r["label"]) for r in d["retain_train"])
    out["retain_train written as"] = ", ".join(f"{k} {formats[k]}" for k in ("original", "q", "blank", "none") if formats[k])
    for name in FINAL_FILES + ["adversarial"]:
        rows = d[name]
        words = lambda field: sum(len(r[field].split()) for r in rows) / max(1, len(rows))
        out[f"{name} question / answer words"] = f"{words('question'):.1f} / {words('answer'):.1f}"
    out["rows with aliases"] = sum(bool(r.get("aliases")) for name in FINAL_FILES + ["adversarial"] for r in d[name])

    def mean_pairwise_jaccard(groups):
        pairs = [trigram_jaccard(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:]]
        return f"{sum(pairs) / len(pairs):.3f}" if pairs else "-"

    eval_groups = [[r["question"]] + [r[v] for v in EVAL_VARIANTS[1:] if r.get(v)] for r in d["forget_eval_rephrasings"]]
    train_groups = collections.defaultdict(dict)
    for r in d["forget_train"]:
        train_groups[r["label"].split("@")[0]][r["label"]] = r["question"]
    out["eval wordings: trigram Jaccard"] = mean_pairwise_jaccard(eval_groups)
    out["train wordings: trigram Jaccard"] = mean_pairwise_jaccard([list(g.values()) for g in train_groups.values()])
    slots = collections.defaultdict(list)
    for r in d["forget_eval_rephrasings"]:
        for v in EVAL_VARIANTS:
            if r.get(v) or v == "original":
                slots[f"eval {v}"].append(opener(r["question"] if v == "original" else r[v]))
    for g in train_groups.values():
        for label, text in g.items():
            slots[f"train {fact_of(label)[2]}"].append(opener(text))
    for slot in [f"eval {v}" for v in EVAL_VARIANTS] + [f"train {v}" for v in TRAIN_VARIANTS]:
        if slots[slot]:
            words, n = collections.Counter(slots[slot]).most_common(1)[0]
            out[f"top opener {slot}"] = f"{n / len(slots[slot]):.0%} of {len(slots[slot])} '{words}'"
    return out


def stats(roots, topics=None):
    """The measures of release_stats for one or more SUITE roots, side by side (one column a root)."""
    roots = [Path(r) for r in ([roots] if isinstance(roots, (str, Path)) else roots)]
    topics = topics or [t for t in topics_in(roots[0]) if all(t in topics_in(r) for r in roots)]
    if not topics:
        raise DataError(roots[0], None, None, "no SUITE topic folder is present in every root given")
    blocks = []
    for topic in topics:
        columns = [release_stats(topic, r) for r in roots]
        keys = list(dict.fromkeys(k for c in columns for k in c))
        table = [[topic] + [str(r) for r in roots]] + [[k] + [str(c.get(k, "-")) for c in columns] for k in keys]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        blocks.append("\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table))
    return "\n\n".join(blocks)


def main(argv=None):
    """The commands `python suite.py validate | build | stats`."""
    p = argparse.ArgumentParser(description="SUITE data: validate a root, build our release, compare releases.")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a SUITE root; exits non-zero on any error (warnings alone pass)")
    v.add_argument("--topic", nargs="*", default=None, help="default: every topic present in the root")
    v.add_argument("--data-root", default=str(DEFAULT_ROOT))
    v.add_argument("--partial", action="store_true", help="a small fixture: check structure, not the release counts")
    v.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="our own rules: our label grammar, quality rules as errors (default: on for data/suite only)")
    k = sub.add_parser("lkf", help="build the LKF* root (the paper's LKF variant, Challenger) from data/source and data/suite")
    k.add_argument("--out", default=str(LKF_ROOT))
    b = sub.add_parser("build", help="assemble data/suite/<topic> from data/source/<topic>")
    b.add_argument("--topic", required=True)
    b.add_argument("--data-root", default=str(DEFAULT_ROOT))
    s = sub.add_parser("stats", help="counts, lengths, paraphrase diversity, openers; two roots side by side")
    s.add_argument("--topic", nargs="*", default=None, help="default: every topic present in all roots")
    s.add_argument("--data-root", action="append", default=None, help="repeat to compare releases (default: data/suite)")
    args = p.parse_args(argv)
    if args.command == "build":
        errors = validate_source(args.topic)
        if errors:
            print("\n".join(str(e) for e in errors))
            sys.exit(f"{len(errors)} violation(s) in the sources of {args.topic}")
        print(json.dumps(build_topic(args.topic, args.data_root)))
        return
    if args.command == "lkf":
        print(json.dumps(build_lkf(args.out)))
        return
    if args.command == "stats":
        print(stats(args.data_root or [DEFAULT_ROOT], args.topic))
        return
    root = Path(args.data_root)
    topics = args.topic or topics_in(root)
    if not topics:
        sys.exit(f"{root}: no SUITE topic folder found")
    strict = is_our_release(root) if args.strict is None else args.strict
    found = []
    try:
        load_pools(root)
    except DataError as e:
        found.append(e)
    for topic in topics:
        found += validate_topic(topic, root, args.partial, strict)
        if is_our_release(root):
            found += validate_source(topic)
    for e in found:
        print(e)
    errors = [e for e in found if not e.warning]
    summary = (f"{root}: {', '.join(topics)} ({'strict: our rules' if strict else 'the release rules; --strict adds ours'}): "
               f"{len(errors)} violation(s), {len(found) - len(errors)} warning(s)")
    if errors:
        sys.exit(summary)
    print(summary)


if __name__ == "__main__":
    main()
