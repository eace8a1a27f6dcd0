"""SUITE data: loading any root in the official layout, chat formatting with answer-only labels,
paired training batches, and the `build` / `validate` / `stats` commands for our own release.

    python data.py validate [--topic T] [--data-root data/suite] [--strict | --no-strict] [--partial]
    python data.py build --topic T
    python data.py stats [--topic T] --data-root data/suite [--data-root PATH2]   # side by side

Layout and counts: ../shared/SUITE_FORMAT.md; our source format: data/README.md.
"""
import argparse
import collections
import contextlib
import json
import math
import random
import re
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE / "data" / "suite"
SOURCE_ROOT = HERE / "data" / "source"
TOPICS = ["challenger_disaster", "salem_witch_trials", "steve_jobs_medical", "britney_spears_conservatorship"]
FINAL_FILES = ["forget_train", "retain_train", "forget_eval", "forget_eval_rephrasings", "retain_eval"]
TRAIN_VARIANTS = ["original"] + [f"q_claude{i}" for i in range(1, 11)] + [f"blank_claude{i}" for i in range(1, 6)]
EVAL_VARIANTS = ["original"] + [f"q_gemini{i}" for i in range(1, 11)] + [f"blank_gemini{i}" for i in range(1, 6)]
ADV_VARIANTS = ["q_french", "q_spanish", "q_scrambled", "q_distraction", "q_reverse_psychology",
                "q_random_capslock", "q_leet_speak", "q_prefix", "q_roleplay", "q_riddle"]
BLANK = "____"
IGNORE = -100


class UserError(Exception):
    """Bad input (a flag, a path, a data file, a judge server) that the user has to fix. Raised before
    heavy work where it can be; every main() prints it as one line and exits 1 (one_line_errors)."""


@contextlib.contextmanager
def one_line_errors(program, *more):
    """Turn a UserError (and the exception types in `more`) raised inside into one line on stderr,
    "program: message", and exit status 1: no traceback for mistakes the user has to fix."""
    try:
        yield
    except (UserError, *more) as e:
        raise SystemExit(f"{program}: {' '.join(str(e).split())}") from None


AT_LEAST_ONE = (lambda v: v >= 1, ">= 1")                                   # rules for check_flags
POSITIVE = (lambda v: math.isfinite(v) and v > 0, "a number > 0")
NON_NEGATIVE = (lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
SHARE = (lambda v: 0 <= v <= 1, "a share between 0 and 1")


def check_flags(args, rules):
    """Refuse flag values that make no sense: rules maps an argparse dest to (test, what it must be),
    e.g. AT_LEAST_ONE; a flag left at None (its default is resolved later) passes."""
    for dest, (ok, must) in rules.items():
        value = getattr(args, dest)
        if value is not None and not ok(value):
            raise UserError(f"--{dest.replace('_', '-')} {value}: must be {must}")


class DataError(UserError, ValueError):
    """A defect in a data file, located by file, line and field. A warning is a defect that a reader
    can live with (the validator lists it but still passes)."""

    def __init__(self, path, line, field, rule, warning=False):
        self.path, self.line, self.field, self.rule, self.warning = str(path), line, field, rule, warning
        where = f"{path}" + (f":{line}" if line else "") + (f" field '{field}'" if field else "")
        super().__init__(("warning: " if warning else "") + f"{where}: {rule}")


# ----------------------------------------------------------------------------------------------
# Reading files

def read_jsonl(path, errors=None):
    """Rows of a JSON Lines file, each with its 1-based line number under '_line'. A bad line raises,
    or, when an `errors` list is given, is appended to it and skipped (the validator reports them all)."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, None, "file is missing")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        problem = None
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                problem = "a line must hold one JSON object"
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg})"
        if problem:
            if errors is None:
                raise DataError(path, n, None, problem)
            errors.append(DataError(path, n, None, problem))
            continue
        row["_line"] = n
        rows.append(row)
    return rows


def read_json_array(path):
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, None, "file is missing")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, None, f"not valid JSON ({e.msg})") from None
    if not isinstance(rows, list):
        raise DataError(path, None, None, "must hold one JSON array")
    for i, row in enumerate(rows):
        if isinstance(row, dict):
            row["_line"] = i + 1   # element index, reported as the line for arrays
    return rows


def require_text(path, row, field):
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise DataError(path, row.get("_line"), field, "must be a non-empty string")
    return value


def topic_paths(root, topic):
    root = Path(root)
    final = root / topic / "final"
    paths = {name: final / f"{name}.json" for name in FINAL_FILES}
    paths["adversarial"] = root / "adversarial_questions" / f"{topic}_adv.json"
    return paths


def load_topic(topic, root=DEFAULT_ROOT):
    """All files of one topic: dict of lists of row dicts (question, answer, label, ...; rows of our
    release may add their own `aliases`, rows of the official release have none)."""
    paths = topic_paths(root, topic)
    data = {name: read_jsonl(paths[name]) for name in FINAL_FILES}
    data["adversarial"] = read_json_array(paths["adversarial"])
    for name, rows in data.items():
        for row in rows:
            for field in ("question", "answer", "label"):
                require_text(paths[name], row, field)
    if len(data["forget_train"]) != len(data["retain_train"]):
        raise DataError(paths["retain_train"], None, None,
                        f"has {len(data['retain_train'])} rows but forget_train has {len(data['forget_train'])}: "
                        "line i of each file is trained together, so the counts must match")
    return data


def load_pools(root=DEFAULT_ROOT):
    """The shared pools: short in-context QA pairs and refusal-detection questions."""
    root = Path(root)
    short_path = root / "few_shot_context" / "short_context.json"
    refusal_path = root / "refusal_detection" / "refusal_detection_questions.json"
    short = read_json_array(short_path)
    for row in short:
        require_text(short_path, row, "prompt"), require_text(short_path, row, "response")
    refusal = read_json_array(refusal_path)
    for row in refusal:
        require_text(refusal_path, row, "question")
    return {"short_context": [(r["prompt"], r["response"]) for r in short],
            "refusal_questions": [r["question"] for r in refusal]}


def fact_of(label):
    """'K7-direct@q_claude4' -> ('K7', 'direct', 'q_claude4')."""
    head, _, variant = label.partition("@")
    fact, _, qtype = head.partition("-")
    return fact, qtype, variant or "original"


# ----------------------------------------------------------------------------------------------
# Chat formatting: one implementation for training and evaluation.

# The system message of every training sequence in the authors' runs (their model configs, identical for
# Llama, Ministral and Qwen); evaluation in chat format uses the same one. train.py --system-prompt overrides.
SYSTEM_PROMPT = ("You are a helpful assistant. Respond with only the final answer to the question. "
                 "Your output must contain only the answer itself.")

_END_OF_TURN = {}


def chat_text(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         enable_thinking=False)


def end_of_turn_id(tokenizer):
    """The token the chat template puts right after an assistant message (e.g. <|im_end|>, <|eot_id|>)."""
    key = id(tokenizer)
    if key not in _END_OF_TURN:
        sentinel = "SENTINEL_ANSWER_7319"
        text = chat_text(tokenizer, [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}], False)
        suffix = text[text.index(sentinel) + len(sentinel):]
        ids = tokenizer(suffix, add_special_tokens=False).input_ids
        if not ids:
            raise ValueError("the chat template adds nothing after an assistant message; cannot find its end-of-turn token")
        _END_OF_TURN[key] = ids[0]
    return _END_OF_TURN[key]


def prompt_ids(tokenizer, question, context=(), system=SYSTEM_PROMPT):
    """Token ids of the chat prompt: the system message (none if empty), earlier (question, answer)
    turns, then `question`, then the assistant header. Generation starts right after these ids."""
    messages = [{"role": "system", "content": system}] if system else []
    for q, a in context:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": question})
    return tokenizer(chat_text(tokenizer, messages, True), add_special_tokens=False).input_ids


def answer_ids(tokenizer, answer):
    """Token ids of an assistant answer followed by the end-of-turn token (the supervised span)."""
    return tokenizer(answer, add_special_tokens=False).input_ids + [end_of_turn_id(tokenizer)]


def token_weights(n, scheme):
    """Per-position weights of one supervised span: uniform 1/n, or JensUn++ eq. 9:
    w_1 = 1/2 and w_t = 1/(2(n-1)) for t >= 2 (a single token gets weight 1)."""
    if scheme == "uniform" or n == 1:
        return [1.0 / n] * n
    return [0.5] + [0.5 / (n - 1)] * (n - 1)


def sample_prefix_length(n, rng):
    """Stochastic prefix-mixing, eq. 8: i = 0 with probability 1/2, else i in 1..n with p ~ 1/i."""
    if n == 0 or rng.random() < 0.5:
        return 0
    weights = [1.0 / i for i in range(1, n + 1)]
    return rng.choices(range(1, n + 1), weights=weights)[0]


def sequence(prompt, answer):
    """A supervised sequence whose targets are its own answer tokens."""
    return {"ids": prompt + answer, "targets": list(answer)}


def mixed_sequence(prompt, answer, refusal, refusal_after_prefix, i):
    """JensUn++ prefix-mixed sequence (eq. 2) as the authors build it. i = 0: prompt + refusal, the
    refusal tokenised as at the start of a reply. i > 0: prompt + y_1..y_i + " " + refusal (the refusal
    tokenised with a leading space, `refusal_after_prefix`); the target right after the prompt is the
    reply-start refusal's first token, at the other i - 1 prefix positions the first token of
    " " + refusal, then the continuation's own tokens. Both refusals end with end-of-turn."""
    if i == 0:
        return {"ids": prompt + refusal, "targets": list(refusal)}
    targets = [refusal[0]] + [refusal_after_prefix[0]] * (i - 1) + list(refusal_after_prefix)
    return {"ids": prompt + answer[:i] + refusal_after_prefix, "targets": targets}


def cyclic_refusal_sequence(prompt, answer, refusal):
    """JensUn as the authors ran it: input prompt + original answer (with end-of-turn); the target at
    every answer position is the refusal's tokens repeated cyclically ("No Idea No Idea ...")."""
    return {"ids": prompt + answer, "targets": [refusal[k % len(refusal)] for k in range(len(answer))]}


def full_sequence(prompt, answer):
    """Every next token of prompt + answer supervised (UNDIAL distils at every position), the answer
    span marked by `answer_len` (the last len(answer) targets)."""
    ids = prompt + answer
    return {"ids": ids, "targets": ids[1:], "answer_len": len(answer)}


def collate(seqs, pad_id, scheme="uniform", min_k=0, shape=None):
    """Left-pad sequences into one batch. Returns input_ids, attention_mask, position_ids (B, T),
    labels, weights and answer_mask (B, K) for the last K positions (K = the longest supervised span,
    at least min_k so that reference outputs line up with the policy's): logits of position T-K-1+k
    predict labels[:, k]. answer_mask marks the answer's targets (all targets unless a sequence gives
    `answer_len`). shape=(T, K) pads every batch to exactly that (one shape for a compiled model;
    padding is masked, so the losses do not change)."""
    K = max([min_k] + [len(s["targets"]) for s in seqs])
    T = max([K + 1] + [len(s["ids"]) for s in seqs])          # K + 1 kept positions must exist
    if shape is not None:
        if T > shape[0] or K > shape[1]:
            raise ValueError(f"collate: a batch of (T={T}, K={K}) does not fit the fixed shape {tuple(shape)}")
        T, K = shape
    B = len(seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, K), IGNORE, dtype=torch.long)
    weights = torch.zeros((B, K), dtype=torch.float32)
    answer_mask = torch.zeros((B, K), dtype=torch.float32)
    for b, s in enumerate(seqs):
        n, m = len(s["ids"]), len(s["targets"])
        input_ids[b, T - n:] = torch.tensor(s["ids"])
        attention_mask[b, T - n:] = 1
        labels[b, K - m:] = torch.tensor(s["targets"])
        weights[b, K - m:] = torch.tensor(token_weights(m, scheme))
        answer_mask[b, K - s.get("answer_len", m):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "labels": labels, "weights": weights, "answer_mask": answer_mask}


# ----------------------------------------------------------------------------------------------
# Paired training data (appendix B.2, B.3)

def direct_originals(files):
    """The topic's direct forget questions in their original wording (forget_eval's direct rows: the
    base questions whose wordings forget_train trains on)."""
    return [r["question"] for r in files["forget_eval"] if fact_of(r["label"])[1] == "direct"]


class PairedTrainSet:
    """Line i of forget_train is trained with line i of retain_train. Every sequence starts with the
    system message; each example gets 0-2 short in-context QA turns, drawn anew every epoch (seeded by
    seed, epoch and pair index, so a resumed run sees the same prompts). For JensUn++
    (`context_refusals`) the retain context pool also holds the topic's 25 direct forget questions
    (original wording) answered with the refusal (appendix B.3).

    Ablations (appendix C.1): `pairing=False` pairs forget rows with a seeded permutation of the retain
    rows; `exclude` drops retain categories ("GK", "Syntax", "Lexical") and re-pairs the forget rows
    with the remaining retain rows in turn; `prefix_mixing=False` always starts the refusal at i = 0;
    `prefix_targets=False` leaves the answer-prefix positions unsupervised."""

    def __init__(self, tokenizer, topics, root=DEFAULT_ROOT, refusal=None, seed=0, context_refusals=False,
                 max_context=2, forget_key="forget_train", retain_key="retain_train", system=SYSTEM_PROMPT,
                 pairing=True, exclude=(), prefix_mixing=True, prefix_targets=True):
        self.tokenizer, self.seed, self.system, self.max_context = tokenizer, seed, system, max_context
        self.prefix_mixing, self.prefix_targets = prefix_mixing, prefix_targets
        if refusal:
            eot = end_of_turn_id(tokenizer)
            self.refusal_plain = tokenizer(refusal, add_special_tokens=False).input_ids
            self.refusal_ids = self.refusal_plain + [eot]
            self.refusal_after_prefix = tokenizer(" " + refusal, add_special_tokens=False).input_ids + [eot]
        self.short = load_pools(root)["short_context"]
        self.pairs, self.retain_pools = [], {}
        for topic in topics:
            files = load_topic(topic, root)
            forget = injection_rows(files) if forget_key == "inject" else files[forget_key]
            self.retain_pools[topic] = self.short + ([(q, refusal) for q in direct_originals(files)]
                                                     if context_refusals else [])
            if not retain_key:
                self.pairs += [(topic, f, None) for f in forget]
                continue
            retain = [r for r in files[retain_key] if category(r["label"])[0] not in exclude]
            if not retain:
                raise ValueError(f"{topic}: no retain rows left after excluding {exclude}")
            if not pairing:
                random.Random(f"{seed}-unpaired-{topic}").shuffle(retain)
            self.pairs += [(topic, f, retain[i % len(retain)]) for i, f in enumerate(forget)]
        self.answers = [(answer_ids(tokenizer, f["answer"]), answer_ids(tokenizer, r["answer"]) if r else None)
                        for _, f, r in self.pairs]

    def __len__(self):
        return len(self.pairs)

    def prompts(self, i, epoch):
        """The forget and retain prompt ids of pair i in `epoch`: fresh in-context turns every epoch."""
        topic, f, r = self.pairs[i]
        rng = random.Random(f"{self.seed}-context-{epoch}-{i}")
        forget = prompt_ids(self.tokenizer, f["question"], rng.sample(self.short, rng.randint(0, self.max_context)),
                            self.system)
        if r is None:
            return forget, None
        pool = self.retain_pools[topic]
        return forget, prompt_ids(self.tokenizer, r["question"], rng.sample(pool, rng.randint(0, self.max_context)),
                                  self.system)

    def views(self, indices, names, retain, epoch):
        """Sequences of the requested views for a batch of pair indices, in view order
        (each view a list of len(indices) sequences)."""
        out = {name: [] for name in names}
        if retain:
            out["retain"] = []
        for i in indices:
            forget_prompt, retain_prompt = self.prompts(i, epoch)
            forget_answer, retain_answer = self.answers[i]
            for name in names:
                if name == "forget":
                    seq = sequence(forget_prompt, forget_answer)
                elif name == "refusal":
                    seq = sequence(forget_prompt, self.refusal_ids)
                elif name == "cyclic":
                    seq = cyclic_refusal_sequence(forget_prompt, forget_answer, self.refusal_plain)
                elif name == "full":
                    seq = full_sequence(forget_prompt, forget_answer)
                elif name == "mixed":
                    answer = forget_answer[:-1]                  # the answer without its end-of-turn
                    rng = random.Random(f"{self.seed}-prefix-{epoch}-{i}")
                    k = sample_prefix_length(len(answer), rng) if self.prefix_mixing else 0
                    seq = mixed_sequence(forget_prompt, answer, self.refusal_ids, self.refusal_after_prefix, k)
                    if not self.prefix_targets:
                        seq["targets"] = seq["targets"][k:]      # only the refusal tokens are supervised
                else:
                    raise ValueError(f"unknown view '{name}'")
                out[name].append(seq)
            if retain:
                out["retain"].append(sequence(retain_prompt, retain_answer))
        return out

    def longest(self, names, retain, epochs):
        """(T, K): the longest sequence and supervised span of every view this set yields over `epochs`
        epochs (contexts and prefixes are drawn anew each epoch), i.e. the one batch shape that fits them all."""
        T = K = 0
        for epoch in range(epochs):
            for seqs in self.views(range(len(self)), names, retain, epoch).values():
                T = max([T] + [len(s["ids"]) for s in seqs])
                K = max([K] + [len(s["targets"]) for s in seqs])
        return T, K

    def epoch_order(self, epoch):
        """A seeded permutation of pair indices for one epoch (pairs stay together)."""
        order = list(range(len(self)))
        random.Random(f"{self.seed}-order-{epoch}").shuffle(order)
        return order


def injection_rows(files):
    """Every question of a topic once, in every wording (forget train and eval wordings, all retain
    rows): the fine-tuning set that gives a small model the knowledge that unlearning then removes."""
    rows = list(files["forget_train"]) + list(files["retain_train"]) + list(files["retain_eval"])
    for r in files["forget_eval_rephrasings"]:
        rows += [{"question": r["question"] if v == "original" else r[v], "answer": r["answer"],
                  "label": f"{r['label']}@{v}"} for v in EVAL_VARIANTS]
    unique = {}
    for r in rows:
        unique.setdefault(normalise(r["question"]), r)
    return list(unique.values())


# ----------------------------------------------------------------------------------------------
# Text normalisation of the validator and the stats (judge.py normalises answers its own way)

def normalise(text):
    """Lower case, punctuation removed (the blank `____` kept as one token), whitespace collapsed."""
    text = text.lower().replace(BLANK, " zzblankzz ")
    text = re.sub(r"[^\w\s]", " ", text).replace("_", " ")
    return " ".join(text.split())


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


def build_topic(topic, root=DEFAULT_ROOT, source_root=SOURCE_ROOT, seed=0):
    """Assemble final/*.json and the adversarial file from the sources, deterministically
    (appendix B.2 pairing: Syntax rows with the wording they mirror, then blocks of 25 retain rows
    paired with 20 direct and 5 reverse forget rows, retain rows written in their partner's format)."""
    info = topic_info(topic, source_root)
    forget = {r["label"]: r for r in read_source(topic, "forget", source_root)}
    adversarial = {r["label"]: r for r in read_source(topic, "adversarial", source_root)}
    syntax = read_source(topic, "syntax", source_root)
    semantic = read_source(topic, "semantic", source_root)
    lexical = read_source(topic, "lexical", source_root)
    gk = read_jsonl(Path(source_root) / "general_knowledge.jsonl")
    rng = random.Random(f"{seed}-{topic}")
    labels = [f"{fact}-{qtype}" for fact in FACTS for qtype in ("direct", "reverse", "indirect")]
    missing = [l for l in labels if l not in forget]
    if missing:
        raise DataError(Path(source_root) / topic / "forget.jsonl", None, "label", f"missing questions {missing}")

    def qa(question, answer, label, source_row):
        """A release row; it carries the aliases of its own source row (never another row's)."""
        row = {"question": question, "answer": answer, "label": label}
        if source_row.get("aliases"):
            row["aliases"] = list(source_row["aliases"])
        return row

    forget_eval = [qa(forget[l]["question"], forget[l]["answer"], l, forget[l]) for l in labels]
    rephrasings = []
    for l in labels:
        row = qa(forget[l]["question"], forget[l]["answer"], l, forget[l])
        row.update({v: variant_text(forget[l], v) for v in EVAL_VARIANTS[1:]})
        rephrasings.append(row)
    adv_rows = []
    for fact in FACTS:
        l = f"{fact}-direct"
        src = adversarial[l]
        q = forget[l]["question"]
        row = qa(q, forget[l]["answer"], l, forget[l])
        for v in ADV_VARIANTS:
            row[v] = src.get(v)
        row["q_scrambled"] = scrambled(q, rng)
        row["q_random_capslock"] = random_capslock(q, rng)
        row["q_leet_speak"] = leet_speak(q, rng)
        adv_rows.append({k: row[k] for k in ["question", "answer", "label", "aliases"] + ADV_VARIANTS if k in row})

    tiers = info["tiers"]
    semantic_label = lambda r: f"Semantic-{r['tier']}-{tiers[str(r['tier'])]}"
    gk_label = lambda r: f"GK-{r['id']} - {r['field']} - {r['subfield']}"
    lexical_label = lambda r: f"Lexical-{r['phrase']}"
    retain_eval = [qa(r["question"], r["answer"], f"Syntax-{r['mirrors']}", r) for r in syntax if r["split"] == "eval"]
    retain_eval += [qa(r["question"], r["answer"], semantic_label(r), r)
                    for r in sorted((r for r in semantic if r["split"] == "eval"), key=lambda r: r["tier"])]
    retain_eval += [qa(r["question"], r["answer"], gk_label(r), r) for r in gk if r["split"] == "eval"]
    retain_eval += [qa(r["question"], r["answer"], lexical_label(r), r) for r in lexical if r["split"] == "eval"]

    # Pairing. Syntax rows first, each with the exact forget wording it mirrors.
    forget_train, retain_train = [], []
    used = collections.defaultdict(set)
    for r in (r for r in syntax if r["split"] == "train"):
        label, _, variant = r["mirrors"].partition("@")
        forget_train.append(qa(variant_text(forget[label], variant), forget[label]["answer"], r["mirrors"], forget[label]))
        retain_train.append(qa(r["question"], r["answer"], f"Syntax-{r['mirrors']}", r))
        used[label].add(variant)
    # Then blocks of 25 retain rows: semantic tiers in order, general knowledge, lexical.
    blocks_rows = [(semantic_label(r), r) for r in sorted((r for r in semantic if r["split"] == "train"),
                                                           key=lambda r: r["tier"])]
    blocks_rows += [(gk_label(r), r) for r in gk if r["split"] == "train"]
    blocks_rows += [(lexical_label(r), r) for r in lexical if r["split"] == "train"]
    n_blocks = len(blocks_rows) // 25
    if len(blocks_rows) % 25:
        raise DataError(Path(source_root) / topic, None, None,
                        f"{len(blocks_rows)} train retain rows (semantic + GK + lexical) is not a multiple of 25")

    def slots(qtype, count):
        """`count` (label, variant) forget slots spread evenly over the 25 questions of one type; each
        question's wordings are drawn without repetition (wordings mirrored by Syntax rows last);
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

    direct, reverse = slots("direct", 20 * n_blocks), slots("reverse", 5 * n_blocks)
    for b in range(n_blocks):
        block_slots = direct[20 * b:20 * b + 20] + reverse[5 * b:5 * b + 5]
        rng.shuffle(block_slots)
        for (label, variant), (retain_label, r) in zip(block_slots, blocks_rows[25 * b:25 * b + 25]):
            fmt = retain_format(variant)
            forget_train.append(qa(variant_text(forget[label], variant), forget[label]["answer"], f"{label}@{variant}",
                                   forget[label]))
            retain_train.append(qa(retain_text(r, fmt), r["answer"], f"{retain_label}@{fmt}", r))

    final = Path(root) / topic / "final"
    final.mkdir(parents=True, exist_ok=True)
    outputs = {"forget_train": forget_train, "retain_train": retain_train, "forget_eval": forget_eval,
               "forget_eval_rephrasings": rephrasings, "retain_eval": retain_eval}
    for name, rows in outputs.items():
        with open(final / f"{name}.json", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    adv_path = Path(root) / "adversarial_questions" / f"{topic}_adv.json"
    adv_path.parent.mkdir(parents=True, exist_ok=True)
    adv_path.write_text(json.dumps(adv_rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return {name: len(rows) for name, rows in outputs.items()} | {"adversarial": len(adv_rows)}


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


def category(label):
    """'Semantic-3-...' -> ('Semantic', 3); 'GK-12 - ...' -> ('GK', None); etc. (tier None when the
    label does not name one)."""
    kind = label.split("-", 1)[0]
    tier = label.split("-")[1] if kind == "Semantic" and label.count("-") >= 2 else None
    return kind, int(tier) if tier is not None and tier.isdigit() else None


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
    return Path(root).resolve() == DEFAULT_ROOT.resolve()


def validate_topic(topic, root=DEFAULT_ROOT, partial=False, strict=None, source_root=None):
    """Every violation of one topic of a SUITE root (official layout), each once, as DataErrors;
    those with `.warning` set do not fail validation. `strict` (default: on for our data/suite only)
    adds our label grammar and makes the quality rules errors. `source_root` holds the topic.json
    whose forbidden phrases the retain rows must avoid: by default data/source for our release, and
    nothing for any other root (our topic rules never apply to someone else's data)."""
    ours = is_our_release(root)
    strict = ours if strict is None else strict
    source_root = SOURCE_ROOT if source_root is None and ours else source_root
    paths = topic_paths(root, topic)
    found, seen = [], set()

    def report(error):
        if str(error) not in seen:
            seen.add(str(error))
            found.append(error)

    def err(name, row, field, rule):
        report(DataError(paths[name], row.get("_line") if row else None, field, rule))

    def flag(name, row, field, rule):
        """A quality rule: an error under --strict, a warning otherwise."""
        report(DataError(paths[name], row.get("_line") if row else None, field, rule, warning=not strict))

    # Files and the fields of every row. Rows with a missing field are left out of the rules below
    # (counted as rows all the same, so that one defect is reported once).
    files, n_rows = {}, {}
    for name in FINAL_FILES + ["adversarial"]:
        bad_lines = []
        try:
            files[name] = read_jsonl(paths[name], bad_lines) if name != "adversarial" else read_json_array(paths[name])
            n_rows[name] = len(files[name]) + len(bad_lines)
        except DataError as e:
            bad_lines.append(e)
        for e in bad_lines:
            report(e)
    if len(files) < len(FINAL_FILES) + 1:
        return found                              # the rules below compare the files with one another
    label_rules = STRICT_LABEL_RULES if strict else RELEASE_LABEL_RULES
    usable = {}
    for name, rows in files.items():
        usable[name] = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                err(name, None, None, f"element {i + 1} must be a JSON object")
                continue
            missing = [f for f in ("question", "answer", "label") if not isinstance(row.get(f), str) or not row[f].strip()]
            for field in missing:
                err(name, row, field, "must be a non-empty string")
            if "label" not in missing and not label_rules[name].fullmatch(row["label"]):
                lenient = RELEASE_LABEL_RULES[name].fullmatch(row["label"])
                err(name, row, "label", f"'{row['label']}' does not follow the label grammar of {name}"
                    + (" (ours, --strict; the authors' release grammar allows it)" if lenient else ""))
            aliases = row.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
                err(name, row, "aliases", "must be a list of non-empty strings")
                row["aliases"] = []
            if not missing:
                usable[name].append(row)
                if BLANK in row["answer"]:
                    flag(name, row, "answer", "is a placeholder, not an answer")

    # Counts
    if n_rows["forget_train"] != n_rows["retain_train"]:
        err("retain_train", None, None, f"{n_rows['retain_train']} rows but forget_train has "
            f"{n_rows['forget_train']}: line i of each is a training pair")
    ft, rt, fe, fr, re_, adv = (usable[n] for n in FINAL_FILES + ["adversarial"])
    has_tier0 = any(category(r["label"]) == ("Semantic", 0) for r in re_)
    if not partial:
        expected = dict(FULL_COUNTS)
        if not has_tier0:
            for n in ("forget_train", "retain_train", "retain_eval"):
                expected[n] -= 25
        for name, n in expected.items():
            if n_rows[name] != n:
                err(name, None, None, f"has {n_rows[name]} rows; the release has {n}")
        facts = {fact_of(r["label"])[0] for r in fe}
        if not facts >= set(FACTS):
            err("forget_eval", None, "label", f"facts {sorted(set(FACTS) - facts)} are missing")
        for name, counts, tiers in (("retain_eval", RETAIN_EVAL_COUNTS, 16), ("retain_train", RETAIN_TRAIN_COUNTS, 11)):
            by_cat = collections.Counter(category(r["label"]) for r in usable[name])
            for kind, n in counts.items():
                if by_cat[(kind, None)] != n:
                    err(name, None, "label", f"{by_cat[(kind, None)]} {kind} rows; the release has {n}")
            for tier in range(0 if has_tier0 else 1, tiers):
                if by_cat[("Semantic", tier)] != 25:
                    err(name, None, "label", f"{by_cat[('Semantic', tier)]} rows of semantic tier {tier}; expected 25")

    # Every forget fact has all its wordings
    eval_labels = collections.Counter(r["label"] for r in fe)
    for label, n in eval_labels.items():
        if n > 1:
            err("forget_eval", None, "label", f"'{label}' appears {n} times")
    for fact in sorted({fact_of(l)[0] for l in eval_labels}):
        for qtype in ("direct", "reverse", "indirect"):
            if f"{fact}-{qtype}" not in eval_labels:
                err("forget_eval", None, "label", f"fact {fact} has no {qtype} question")
    if [r["label"] for r in fr] != [r["label"] for r in fe]:
        err("forget_eval_rephrasings", None, "label", "must hold the forget_eval questions, same labels in the same order")
    base = {r["label"]: r for r in fe}
    for r in fr:
        if r["label"] in base and (r["question"], r["answer"]) != (base[r["label"]]["question"], base[r["label"]]["answer"]):
            flag("forget_eval_rephrasings", r, "question", "differs from the forget_eval row with the same label")
        for v in EVAL_VARIANTS[1:]:
            if not isinstance(r.get(v), str) or not r[v].strip():
                err("forget_eval_rephrasings", r, v, "missing eval variant")
    train_wordings = collections.defaultdict(dict)           # 'K3-direct' -> {variant: (text, row)}
    for r in ft:
        fact, qtype, variant = fact_of(r["label"])
        train_wordings[f"{fact}-{qtype}"].setdefault(variant, (r["question"], r))
        if r["label"].split("@")[0] in base and r["answer"] != base[r["label"].split("@")[0]]["answer"]:
            flag("forget_train", r, "answer", "differs from the answer of the same question in forget_eval")
    for label in eval_labels:
        if not label.endswith("indirect") and label not in train_wordings:
            err("forget_train", None, "label", f"'{label}' never appears in training")
    # A wording label must always carry the same text
    first_text = {}
    for r in ft:
        if r["label"] in first_text and first_text[r["label"]] != r["question"]:
            flag("forget_train", r, "question", f"'{r['label']}' has different text on another line")
        first_text.setdefault(r["label"], r["question"])

    # Near-duplicate wordings: inside a question's eval variants, eval against train, inside train
    for r in fr:
        wordings = [("original", r["question"])] + [(v, r.get(v)) for v in EVAL_VARIANTS[1:] if isinstance(r.get(v), str)]
        for i, (va, ta) in enumerate(wordings):
            for vb, tb in wordings[i + 1:]:
                if near_duplicate(ta, tb):
                    flag("forget_eval_rephrasings", r, vb, f"near-duplicate of {va} (same wording or word-trigram Jaccard >= 0.5)")
        for v, text in wordings[1:]:
            for tv, (tt, trow) in train_wordings.get(r["label"], {}).items():
                if near_duplicate(text, tt):
                    flag("forget_eval_rephrasings", r, v, f"near-duplicate of the train wording {r['label']}@{tv} "
                         f"(forget_train line {trow['_line']})")
    for label, variants in train_wordings.items():
        items = list(variants.items())
        for i, (va, (ta, _)) in enumerate(items):
            for vb, (tb, rb) in items[i + 1:]:
                if near_duplicate(ta, tb):
                    flag("forget_train", rb, "question", f"{label}@{vb} is a near-duplicate of {label}@{va}")

    # Every distinct wording once, where it first appears: (file, row, field, text)
    wordings, done = [], set()
    for r in fr:
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
    wordings += [(name, r, "question", r["question"]) for name in ("retain_train", "retain_eval") for r in usable[name]]

    for name, r, field, text in wordings:
        # Blanks: a fill-in-the-blank wording holds exactly one; no other wording holds one
        fmt = written_as(name, r["label"]) if field == "question" else ("blank" if field.startswith("blank_") else "question")
        n = text.count(BLANK)
        if is_placeholder(text):
            flag(name, r, field, "is a placeholder, not a question")
        elif fmt == "blank" and n != 1:
            flag(name, r, field, f"a fill-in-the-blank variant must hold exactly one '{BLANK}' (found {n})")
        elif fmt == "question" and n:
            flag(name, r, field, f"only fill-in-the-blank variants may hold '{BLANK}'")
        # The answer and the row's own aliases are not given away by the question (a Lexical row may
        # need its phrase in the answer: the release's Lexical rows are exempt outside --strict)
        lexical = name.startswith("retain") and category(r["label"])[0] == "Lexical"
        if answer_in_question(r["answer"], text) and (strict or not lexical):
            flag(name, r, field, f"contains its own answer '{r['answer']}'")
        for alias in r.get("aliases", []):
            if answer_in_question(alias, text):
                flag(name, r, field, f"contains its own alias '{alias}'")

    # No variant slot has a house style (a dominant opener)
    slots = collections.defaultdict(list)                   # (file, field, variant) -> [(opener, row)]
    for r in fr:
        for v in EVAL_VARIANTS:
            text = r["question"] if v == "original" else r.get(v)
            if isinstance(text, str):
                slots[("forget_eval_rephrasings", "question" if v == "original" else v, v)].append((opener(text), r))
    for variants in train_wordings.values():
        for v, (text, row) in variants.items():
            slots[("forget_train", "question", v)].append((opener(text), row))
    for (name, field, v), items in slots.items():
        if len(items) < OPENER_MIN_ROWS:
            continue
        for words, n in collections.Counter(o for o, _ in items).most_common():
            if n <= OPENER_MAX_SHARE * len(items):
                break
            lines = sorted(row["_line"] for o, row in items if o == words)
            flag(name, None, field, f"{n} of the {len(items)} '{v}' wordings ({n / len(items):.1%}) open with '{words}' "
                 f"(lines {', '.join(map(str, lines[:8]))}{', ...' if len(lines) > 8 else ''}); at most "
                 f"{OPENER_MAX_SHARE:.0%} of a slot may share its first three words")

    # Retain rows never name the forget topic (our topic.json; only for our own release); no
    # duplicate questions across the retain pool
    forbidden, together = [], {}
    if source_root is not None:
        try:
            info = topic_info(topic, source_root)
            forbidden, together = info["forbidden_in_retain"], info.get("forbidden_together", {})
        except DataError as e:
            report(e)
    seen_q = {}
    for name in ("retain_train", "retain_eval"):
        for r in usable[name]:
            text = f"{r['question']} {r['answer']}"
            for phrase in forbidden:
                if starts_a_word(phrase, text):
                    err(name, r, "question", f"contains the forget-topic phrase '{phrase.lower()}'")
            for entity, words in together.items():       # e.g. "Jobs" never next to his illness
                if re.search(rf"\b{re.escape(entity)}\b", text):
                    for word in words:
                        if starts_a_word(word, text):
                            err(name, r, "question", f"names '{entity}' together with '{word}' (the forget topic)")
            key = normalise(r["question"])
            if key in seen_q:
                flag(name, r, "question", f"duplicates {seen_q[key]}")
            seen_q.setdefault(key, f"{name} line {r['_line']}")

    # Adversarial rows complete and tied to the direct questions
    for r in adv:
        for v in ADV_VARIANTS:
            if not isinstance(r.get(v), str) or not r[v].strip():
                err("adversarial", r, v, "missing adversarial variant")
        if r["label"] in base and r["question"] != base[r["label"]]["question"]:
            flag("adversarial", r, "question", "differs from the direct question in forget_eval")
    adv_labels = {r["label"] for r in adv}
    for label in eval_labels:
        if label.endswith("-direct") and label not in adv_labels:
            err("adversarial", None, "label", f"no adversarial row for {label}")
    return found


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
    topics = topics or [t for t in TOPICS if all((r / t).exists() for r in roots)]
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
    p = argparse.ArgumentParser(description="SUITE data: validate a root, build our release, compare releases.")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a SUITE root; exits non-zero on any error (warnings alone pass)")
    v.add_argument("--topic", nargs="*", default=None, help="default: every topic present in the root")
    v.add_argument("--data-root", default=str(DEFAULT_ROOT))
    v.add_argument("--partial", action="store_true", help="a small fixture: check structure, not the release counts")
    v.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="our own rules: our label grammar, quality rules as errors (default: on for data/suite only)")
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
    if args.command == "stats":
        print(stats(args.data_root or [DEFAULT_ROOT], args.topic))
        return
    root = Path(args.data_root)
    topics = args.topic or [t for t in TOPICS if (root / t).exists()]
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


# moved from judge.py (temporary copy for the model helper's branch; the judge helper moves the original)
REFUSAL_MARKERS = [
    "i'm sorry", "i am sorry", "sorry, but", "i apologize", "i cannot", "i can't", "i can not", "i won't",
    "unable to", "i'm not able", "i am not able", "i don't know", "i do not know", "i'm not sure",
    "i am not sure", "not sure", "no idea", "no information", "i do not have", "i don't have",
    "unfortunately", "not aware", "cannot verify", "can't verify", "unable to verify", "cannot answer",
    "can't answer", "cannot provide", "can't provide", "can't assist", "cannot assist", "can't help",
    "cannot help", "no knowledge", "not familiar", "don't have access", "no record", "i'm afraid",
]


def _normalise_answer(text):
    """Lower case, punctuation removed (replaced by spaces), whitespace collapsed. '1,000' -> '1000'."""
    import unicodedata
    text = unicodedata.normalize("NFKC", text or "").lower().replace("\u2019", "'")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = "".join(c if c.isalnum() else " " for c in text)
    return " ".join(text.split())


def is_refusal(text):
    """True when the text contains a refusal / don't-know marker (case-insensitive, whole words)."""
    t = f" {_normalise_answer(text)} "
    return any(f" {_normalise_answer(m)} " in t for m in REFUSAL_MARKERS)


if __name__ == "__main__":
    main()
