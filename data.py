"""SUITE data at run time: loading any root in the official layout, chat formatting with answer-only
labels, supervised sequences and paired training batches. The commands for editing our own release
live in suite.py and run from here:

    python suite.py validate [--topic T] [--data-root data/suite] [--strict | --no-strict] [--partial]
    python suite.py build --topic T
    python suite.py stats [--topic T] --data-root data/suite [--data-root PATH2]   # side by side
    python generate.py --topic-name "..." --topic NAME --llm-url URL         # a new topic (generate.py)

Layout and counts: data/SUITE_FORMAT.md; our source format: data/README.md.
"""
import collections
import contextlib
import json
import math
import random
import re
import unicodedata
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE / "data" / "suite"
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
        if not isinstance(row, dict):
            raise DataError(path, i + 1, None, f"element {i + 1} of the array is not a JSON object")
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


def topics_in(root):
    """The topics of a SUITE root: its folders with a final/ folder, the paper's four first (in their
    sequential order), then any other (a topic made with `generate.py`) by name."""
    found = {p.parent.name for p in Path(root).glob("*/final") if p.is_dir()}
    return [t for t in TOPICS if t in found] + sorted(found - set(TOPICS))


def check_topics(names, root):
    """The topic folders a run names, `all` meaning the paper's four (TOPICS); an unknown name is a
    UserError listing the topics of the root."""
    topics = TOPICS if list(names) == ["all"] else list(names)
    present = topics_in(root)
    for t in topics:
        if t not in present:
            raise UserError(f"--topics {t}: no such topic in {root}; choose from {', '.join(present) or '(none)'} or all")
    return topics


LKF_ROOT = HERE / "data" / "lkf"      # the LKF* root (suite.py lkf)
LKF_MARKER = "lkf.json"          # at the top of an LKF* root (suite.py lkf): retain rows are not paired


def is_lkf_root(root):
    """Whether `root` is an LKF* root (the paper's LKF variant built from SUITE: no forget/retain pairing)."""
    return (Path(root) / LKF_MARKER).is_file()


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
    if len(data["forget_train"]) != len(data["retain_train"]) and not is_lkf_root(root):
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


def retain_role(label):
    """What a retain row is to its forget partner, comparable across topics: its category, its tier (semantic
    rows) or the question it mirrors (syntax rows), and its format: 'Syntax-M1-direct@q' -> ('Syntax', 'M1-direct',
    'q'), 'Semantic-3-Title@blank' -> ('Semantic', 3, 'blank'), 'GK-12 - ...' -> ('GK', None, 'original')."""
    head, _, fmt = label.partition("@")
    kind, tier = category(label)
    return kind, head.split("-", 1)[1] if kind == "Syntax" else tier, fmt or "original"


def category(label):
    """'Semantic-3-...' -> ('Semantic', 3); 'GK-12 - ...' -> ('GK', None); etc. (tier None when the
    label does not name one)."""
    kind = label.split("-", 1)[0]
    tier = label.split("-")[1] if kind == "Semantic" and label.count("-") >= 2 else None
    return kind, int(tier) if tier is not None and tier.isdigit() else None


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


def collate(seqs, pad_id, scheme="uniform", min_k=0, shape=None, multiple=1):
    """Left-pad sequences into one batch. Returns input_ids, attention_mask, position_ids (B, T),
    labels, weights and answer_mask (B, K) for the last K positions (K = the longest supervised span,
    at least min_k so that reference outputs line up with the policy's): logits of position T-K-1+k
    predict labels[:, k]. answer_mask marks the answer's targets (all targets unless a sequence gives
    `answer_len`). shape=(T, K) pads every batch to exactly that (one shape for a compiled model;
    padding is masked, so the losses do not change). `multiple`: T rounded up to a multiple of it (8:
    aligned GEMM shapes for attention's bmm on a GPU; more left padding, same losses)."""
    K = max([min_k] + [len(s["targets"]) for s in seqs])
    T = max([K + 1] + [len(s["ids"]) for s in seqs])          # K + 1 kept positions must exist
    if shape is not None:
        if T > shape[0] or K > shape[1]:
            raise ValueError(f"collate: a batch of (T={T}, K={K}) does not fit the fixed shape {tuple(shape)}")
        T, K = shape
    T = -(-T // multiple) * multiple
    B = len(seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    for b, s in enumerate(seqs):
        n = len(s["ids"])
        input_ids[b, T - n:] = torch.tensor(s["ids"])
        attention_mask[b, T - n:] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            **supervision(seqs, K, scheme)}


def pack(seqs, pad_id, scheme="uniform", min_k=0, multiple=8, min_rows=1, keep_multiple=1):
    """Several sequences per row, for training: left padding wastes a third of a pass on SUITE (rows of
    90 tokens on average padded to the longest, about 170; BENCHMARKS.md at 2b7c545). Rows are L = the longest
    sequence rounded up to `multiple`; sequences go first-fit in order of decreasing length, each with
    its own positions from 0. Returns input_ids, position_ids and segments (R, L) (-1 on padding, else
    the sequence's slot in its row: model.packed_attention_mask keeps sequences apart), `keep` (N, K + 1):
    the flat index into the R * L positions of each sequence's last K + 1 positions (collate's kept
    positions, in the input order; clamped to the sequence's first token where it is shorter, which
    only unsupervised positions read), and labels, weights and answer_mask (N, K) as collate gives them.
    `min_rows`: rows of padding added up to it (a compiled block specialises on a batch of one row).
    `keep_multiple`: `keep`'s width K + 1 rounded up to it, its extra positions in front (fewer shapes for
    model.GraphedForward to capture); the labels stay (N, K), so the caller keeps the last K + 1 logits."""
    K = max([min_k] + [len(s["targets"]) for s in seqs])
    width = -(-(K + 1) // keep_multiple) * keep_multiple                   # keep's width, K + 1 rounded up
    L = max([width] + [len(s["ids"]) for s in seqs])
    L = -(-L // multiple) * multiple
    rows, where = [], [None] * len(seqs)                 # rows: [tokens used, sequences placed]
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i]["ids"])):
        n = len(seqs[i]["ids"])
        r = next((r for r, row in enumerate(rows) if row[0] + n <= L), None)
        if r is None:
            r = len(rows)
            rows.append([0, 0])
        where[i] = (r, rows[r][0], rows[r][1])
        rows[r][0] += n
        rows[r][1] += 1
    rows += [[0, 0]] * (min_rows - len(rows))
    input_ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), L), dtype=torch.long)
    segments = torch.full((len(rows), L), -1, dtype=torch.long)
    keep = torch.empty((len(seqs), width), dtype=torch.long)
    for i, (s, (r, start, slot)) in enumerate(zip(seqs, where)):
        n = len(s["ids"])
        input_ids[r, start:start + n] = torch.tensor(s["ids"])
        position_ids[r, start:start + n] = torch.arange(n)
        segments[r, start:start + n] = slot
        keep[i] = r * L + start + (torch.arange(n - width, n)).clamp(min=0)
    return {"input_ids": input_ids, "position_ids": position_ids, "segments": segments, "keep": keep,
            **supervision(seqs, K, scheme)}


def supervision(seqs, K, scheme):
    """labels, weights and answer_mask (N, K): each sequence's targets right-aligned in K positions."""
    B = len(seqs)
    labels = torch.full((B, K), IGNORE, dtype=torch.long)
    weights = torch.zeros((B, K), dtype=torch.float32)
    answer_mask = torch.zeros((B, K), dtype=torch.float32)
    for b, s in enumerate(seqs):
        m = len(s["targets"])
        labels[b, K - m:] = torch.tensor(s["targets"])
        weights[b, K - m:] = torch.tensor(token_weights(m, scheme))
        answer_mask[b, K - s.get("answer_len", m):] = 1
    return {"labels": labels, "weights": weights, "answer_mask": answer_mask}


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
    (original wording) answered with the refusal: the authors' runs (issue 15), where appendix B.3's text
    says "all forget-set questions".

    Ablations (appendix C.1): `pairing=False` pairs forget rows with a seeded permutation of the retain
    rows; `exclude` drops the pairs whose retain row is of those categories ("GK", "Syntax", "Lexical"),
    every other pair kept whole (the paper's tab:ablation_c adjusts the epochs so that every run sees as many
    samples: train.py does, by `full_size`); `prefix_mixing=False` always starts the refusal at i = 0;
    `prefix_targets=False` leaves the answer-prefix positions unsupervised.

    `retain_topics` (ours, an ablation of sequential unlearning): pair i takes its retain row from these
    topics in turn, one more each epoch (topic (i + epoch) mod k). From its own topic that is its partner;
    from another, a row of the same role (retain_role: category, tier or mirrored question, format), the
    roles' rows taken in turn, so the pairing's hard negatives keep their kind. One topic alone is the usual
    pairing."""

    def __init__(self, tokenizer, topics, root=DEFAULT_ROOT, refusal=None, seed=0, context_refusals=False,
                 max_context=2, forget_key="forget_train", retain_key="retain_train", system=SYSTEM_PROMPT,
                 pairing=True, exclude=(), prefix_mixing=True, prefix_targets=True, retain_topics=None):
        self.tokenizer, self.seed, self.system, self.max_context = tokenizer, seed, system, max_context
        self.prefix_mixing, self.prefix_targets = prefix_mixing, prefix_targets
        if refusal:
            eot = end_of_turn_id(tokenizer)
            self.refusal_plain = tokenizer(refusal, add_special_tokens=False).input_ids
            self.refusal_ids = self.refusal_plain + [eot]
            self.refusal_after_prefix = tokenizer(" " + refusal, add_special_tokens=False).input_ids + [eot]
        self.short = load_pools(root)["short_context"]
        self.pairs, self.retain_pools, self.full_size = [], {}, 0       # full_size: pairs before `exclude`
        for topic in topics:
            files = load_topic(topic, root)
            forget = files[forget_key] if forget_key == "forget_train" else relearn_rows(files, forget_key, seed)
            direct = direct_originals(files) if context_refusals else []
            if context_refusals and not direct:
                raise DataError(topic_paths(root, topic)["forget_eval"], None, "label", "no '<fact>-direct' label: "
                                "JensUn++'s in-context refusal turns are the topic's direct questions")
            self.retain_pools[topic] = self.short + [(q, refusal) for q in direct]
            if not retain_key:
                self.pairs += [(topic, f, None) for f in forget]
                continue
            retain = list(files[retain_key])
            if not pairing:
                random.Random(f"{seed}-unpaired-{topic}").shuffle(retain)
            pairs = [(topic, f, retain[i % len(retain)]) for i, f in enumerate(forget)]
            self.full_size += len(pairs)
            self.pairs += [pair for pair in pairs if category(pair[2]["label"])[0] not in exclude]
        if retain_key and not self.pairs:
            raise ValueError(f"{', '.join(topics)}: no pairs left after excluding {', '.join(exclude)}")
        self.answers = [(answer_ids(tokenizer, f["answer"]), answer_ids(tokenizer, r["answer"]) if r else None)
                        for _, f, r in self.pairs]
        self.retain_topics = {}                 # topic -> [(pair i's retain row, its answer ids)], under retain_topics
        for topic in retain_topics or []:
            rows = [r for r in load_topic(topic, root)[retain_key] if category(r["label"])[0] not in exclude]
            alike, taken = collections.defaultdict(list), collections.Counter()   # rows by role, then by looser keys
            for r in rows:
                kind, which, fmt = retain_role(r["label"])
                for key in ((kind, which, fmt), (kind, fmt), fmt):
                    alike[key].append(r)
            ids_of = {id(r): answer_ids(tokenizer, r["answer"]) for r in rows}       # each row's answer once
            matched = []
            for (own_topic, _, own), (_, own_ids) in zip(self.pairs, self.answers):
                if own_topic == topic:
                    matched.append((own, own_ids))
                    continue
                kind, which, fmt = retain_role(own["label"])
                key = next((k for k in ((kind, which, fmt), (kind, fmt), fmt) if alike[k]), None)
                same = alike[key] if key is not None else rows       # a role this topic lacks: the nearest it has
                pick = same[taken[key] % len(same)]
                taken[key] += 1
                matched.append((pick, ids_of[id(pick)]))
            self.retain_topics[topic] = matched

    def __len__(self):
        return len(self.pairs)

    def retain_of(self, i, epoch):
        """Pair i's retain row and its answer ids in `epoch` (see retain_topics)."""
        if not self.retain_topics:
            return self.pairs[i][2], self.answers[i][1]
        names = list(self.retain_topics)
        return self.retain_topics[names[(i + epoch) % len(names)]][i]

    def prompts(self, i, epoch):
        """The forget and retain prompt ids of pair i in `epoch`: fresh in-context turns every epoch."""
        topic, f, _ = self.pairs[i]
        r = self.retain_of(i, epoch)[0]
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
            forget_answer, retain_answer = self.answers[i][0], self.retain_of(i, epoch)[1]
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


def injection_rows(files, eval_wordings=True):
    """Every question of a topic once, in every wording (forget train and eval wordings, all retain
    rows): the fine-tuning set that gives a small model the knowledge that unlearning then removes.
    eval_wordings=False keeps the training files (forget_train, retain_train) less every question that
    evaluation asks (a direct or reverse question's original wording is in both forget_train and the
    eval set): evaluation then asks wordings the model never saw, as it does a model that learned the
    facts in pretraining."""
    asked = list(files["retain_eval"])
    for r in files["forget_eval_rephrasings"]:
        asked += [{"question": r["question"] if v == "original" else r[v], "answer": r["answer"],
                   "label": f"{r['label']}@{v}"} for v in EVAL_VARIANTS]
    rows = list(files["forget_train"]) + list(files["retain_train"])
    if eval_wordings:
        rows += asked
    else:
        evaluated = {normalise(r["question"]) for r in asked}
        rows = [r for r in rows if normalise(r["question"]) not in evaluated]
    unique = {}
    for r in rows:
        unique.setdefault(normalise(r["question"]), r)
    return list(unique.values())


RELEARN_SETS = ("retain_train (the paper's attack), forget_train (every fact: the ceiling), inject, inject_train, tiers:A or "
                "tiers:A-B (semantic tiers 0-10 from retain_train, 11-15 from retain_eval), gk, lexical, syntax, "
                "forget:FACTS (those facts' training wordings, e.g. forget:K1-K5 or forget:M1,K3)")


def parse_facts(spec, flag="--relearn-set"):
    """'K1-K5' -> ['K1', ..., 'K5']; 'M1,K3' -> ['M1', 'K3'] (facts M1-M5, K1-K20)."""
    facts = []
    for part in spec.split(","):
        m = re.fullmatch(r"([MK])(\d+)(?:-([MK])?(\d+))?", part.strip())
        if not m or (m.group(3) and m.group(3) != m.group(1)):
            raise UserError(f"{flag} forget:{spec}: '{part}' is not a fact or a range of facts (M1-M5, K1-K20, e.g. K1-K5)")
        first, last = int(m.group(2)), int(m.group(4) or m.group(2))
        top = 5 if m.group(1) == "M" else 20
        if not 1 <= first <= last <= top:
            raise UserError(f"{flag} forget:{spec}: '{part}' is outside {m.group(1)}1-{m.group(1)}{top} or runs backwards")
        facts += [f"{m.group(1)}{i}" for i in range(first, last + 1)]
    return facts


def parse_tiers(arg, flag="--relearn-set"):
    """'1-2' -> (1, 2), '0' -> (0, 0): a band of semantic tiers A <= B within 0-15."""
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", arg)
    low, high = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (1, 0)
    if not low <= high <= 15:
        raise UserError(f"{flag} tiers:{arg}: give tiers:A or tiers:A-B with 0 <= A <= B <= 15 (e.g. tiers:1-2)")
    return low, high


def relearn_band(files, spec, flag="--relearn-set"):
    """The rows of one relearning arm (`spec`, one of RELEARN_SETS) in a topic's files; a clear error
    for a malformed spec or an empty band."""
    kind, _, arg = spec.partition(":")
    if spec in ("retain_train", "forget_train"):
        return list(files[spec])
    if spec in ("inject", "inject_train"):
        return injection_rows(files, eval_wordings=spec == "inject")
    if spec in ("gk", "lexical", "syntax"):
        rows = [r for r in files["retain_train"] if category(r["label"])[0].lower() == spec]
    elif kind == "tiers":
        low, high = parse_tiers(arg, flag)
        rows = [r for name, tiers in (("retain_train", range(0, 11)), ("retain_eval", range(11, 16)))
                for r in files[name] if (c := category(r["label"]))[0] == "Semantic"
                and c[1] in tiers and low <= c[1] <= high]
    elif kind == "forget" and arg:
        facts = set(parse_facts(arg, flag))
        rows = [r for r in files["forget_train"] if fact_of(r["label"])[0] in facts]
    else:
        raise UserError(f"{flag} {spec}: not a relearning set; choose from {RELEARN_SETS}")
    if not rows:
        raise UserError(f"{flag} {spec}: no such rows in this topic's data")
    return rows


def relearn_rows(files, spec, seed=0):
    """What one relearning arm trains on in a topic. retain_train, forget_train and the injection sets are
    taken as they are; every narrower band is drawn to as many rows as forget_train has (the paper's attack's
    epoch: 450 draws on a SUITE topic), so that every arm runs the same optimizer steps and schedule and
    band size only changes how often a question repeats. The draws are stratified (each band row
    floor(n / size) times, the remainder drawn without replacement, seeded), uniform in expectation."""
    rows = relearn_band(files, spec)
    if spec in ("retain_train", "forget_train", "inject", "inject_train"):
        return rows
    n = len(files["forget_train"])
    rng = random.Random(f"{seed}-relearn-{spec}")
    return rows * (n // len(rows)) + rng.sample(rows, n % len(rows))


# ----------------------------------------------------------------------------------------------
# Text normalisation and refusals (the validator's comparisons, the judge, refusal detection)

def normalise(text, keep_blank=True):
    """Lower case (NFKC), punctuation replaced by spaces, whitespace collapsed, digit groups joined
    ('1,000' -> '1000'). keep_blank: the blank `____` stays one token, 'zzblankzz', for the validator,
    which compares wordings with their blanks; keep_blank=False drops it like any other punctuation, for
    the judge's rules on answers (an answer of underscores has no words: gibberish)."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    if keep_blank:
        text = text.replace(BLANK, " zzblankzz ")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    return " ".join("".join(c if c.isalnum() else " " for c in text).split())


# Refusal and don't-know markers, matched as whole words in normalised text.
REFUSAL_MARKERS = [
    "i'm sorry", "i am sorry", "sorry, but", "i apologize", "i cannot", "i can't", "i can not", "i won't",
    "unable to", "i'm not able", "i am not able", "i don't know", "i do not know", "i'm not sure",
    "i am not sure", "not sure", "no idea", "no information", "i do not have", "i don't have",
    "unfortunately", "not aware", "cannot verify", "can't verify", "unable to verify", "cannot answer",
    "can't answer", "cannot provide", "can't provide", "can't assist", "cannot assist", "can't help",
    "cannot help", "no knowledge", "not familiar", "don't have access", "no record", "i'm afraid",
]
_REFUSALS = [normalise(m, keep_blank=False) for m in REFUSAL_MARKERS]


def is_refusal(text):
    """True when the text contains a refusal / don't-know marker (case-insensitive, whole words)."""
    t = f" {normalise(text, keep_blank=False)} "
    return any(f" {m} " in t for m in _REFUSALS)
