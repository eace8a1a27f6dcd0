"""SUITE for a new topic, written by a model behind any OpenAI-compatible server: the paper's recipe
(Section 3, appendix B.2 pairing, appendix D.1-D.2 and its data-generation prompts), stage by stage.

    python generate.py --topic-name "The 2010 Deepwater Horizon oil spill" --topic deepwater_horizon \\
        --llm-url http://127.0.0.1:8000/v1 --llm-model NAME [--eval-llm-model NAME2] [--tiers FILE] \\
        [--review FILE] [--facts FILE] [--out data/suite] [--source-root data/source] [--work DIR]

Stages, each a batch of chat calls whose system prompt is prompts/gen_<...>.txt (our restatement of the
paper's prompt for that stage) and whose user message is a JSON object of inputs:

  topic        names of the topic (never in a retain row), 10 lexical phrases, 16 retain tiers (or --tiers)
  facts        25 facts (M1-M5, K1-K20), each asked direct, reverse and indirect; aliases, provenance, cue
  train        10 paraphrases + 5 blanks of each direct and reverse question (the train writer)
  eval         10 paraphrases + 5 blanks of all 75 questions, by another voice (--eval-llm-model: another model)
  adversarial  the 7 written variants of each direct question (scrambled, capitals, leet: by code at build)
  semantic     per tier 25 train rows (with paraphrase and blank) for tiers 0-10, 25 eval rows for 0-15
  syntax       mirrors of 3 train wordings and 4 eval wordings of each direct question
  lexical      5 train and 5 eval questions for each lexical phrase

Every reply must parse as one JSON object and pass the stage's checks (the validator's rules applied to
the rows it holds); a reply that fails is asked again with the list of problems, at most --retries times.
Each accepted unit is written to WORK/<stage>/<unit>.json at once, so a killed run or a failed server
resumes where it stopped (and a hand-edited unit file is checked like a reply). Across units, the code
spreads openers over the variant slots and asks again for units that share a question or an opener too
often. Then the source files (data/README.md), `build` (pairing, mechanical adversarial variants, the
shared general-knowledge pool), the strict validator and `stats` run on a staged copy, and the topic is
installed into --source-root and --out only when it validates, with a provenance.json beside it.

--review FILE stops after the facts, writing them as a Markdown table; edit it and pass it back with
--facts FILE (or pass a JSON Lines file of forget rows) to run the remaining stages on your facts.
"""
import argparse
import collections
import concurrent.futures
import datetime
import functools
import hashlib
import json
import os
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import data
import suite
from data import BLANK, UserError, normalise
from judge import ChatClient, ServerUnavailable

PROMPTS = Path(__file__).resolve().parent / "prompts"
FACTS = suite.FACTS                                     # M1-M5, K1-K20
QTYPES = ("direct", "reverse", "indirect")
CUES = ("date", "description", "crew", "number", "person", "combination")
ADVERSARIAL_WRITTEN = ["q_french", "q_spanish", "q_distraction", "q_reverse_psychology", "q_prefix", "q_roleplay",
                       "q_riddle"]
TRAIN_TIERS, ALL_TIERS = range(0, 11), range(0, 16)      # tiers 11-15 are held out for evaluation (Section 3)
PER_TIER, PER_PHRASE = 25, 5                              # rows per tier and split; lexical rows per phrase and split
SYNTAX_TRAIN, SYNTAX_EVAL = 3, 4                          # mirrors per direct question (appendix B.2: 75 + 100)
FIX = ("Your reply broke these rules:\n{problems}\nReturn the whole JSON object again with these problems fixed, "
       "and nothing else.")


class GenerationError(UserError):
    """A stage could not get a reply that follows its rules; finished units stay cached."""


# ----------------------------------------------------------------------------------------------
# Talking to the model: one unit = one JSON object asked for, checked, asked again with the problems

@functools.lru_cache(maxsize=None)
def load_prompt(name):
    path = PROMPTS / f"gen_{name}.txt"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise UserError(f"generation prompt {path} cannot be read: {e.strerror or e}") from None


def parse_reply(text):
    """The one JSON object of a reply (a Markdown fence around it is tolerated), or (None, problem)."""
    if text is None:
        return None, "the server's answer held no completion"
    body = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    body = fence.group(1) if fence else body
    try:
        reply = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"the reply is not valid JSON ({e.msg} at character {e.pos}); send one JSON object only"
    if not isinstance(reply, dict):
        return None, "the reply must be one JSON object"
    return reply, None


class Unit:
    """One call of a stage: the prompt to use, the inputs (`payload`, the user message), and the check of
    a reply (a function returning a list of problems, each a sentence the model can act on). `inputs` is
    the part of the payload that defines the unit (default: all of it): a cached reply made for other
    inputs (a question edited through --facts, say) is stale and asked again, while lists of things to
    avoid that a repair round adds do not make it stale."""

    def __init__(self, stage, name, prompt, payload, check, inputs=None, eval_writer=False, max_tokens=4096):
        self.stage, self.name, self.prompt, self.payload, self.check = stage, name, prompt, payload, check
        self.inputs = payload if inputs is None else inputs
        self.eval_writer, self.max_tokens = eval_writer, max_tokens

    @property
    def key(self):
        """What a cached reply must have been asked with: the prompt's text (an edited prompt asks again)
        and the defining inputs."""
        blob = json.dumps([load_prompt(self.prompt), self.inputs], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class Writer:
    """The stages' access to the model servers and to the work folder (the cache of accepted units)."""

    def __init__(self, work, train_client, eval_client, retries=3, workers=8, temperature=0.7, max_tokens=None):
        self.work, self.retries, self.workers, self.temperature = Path(work), retries, workers, temperature
        self.max_tokens = max_tokens                  # a cap on every unit's own limit (small servers)
        self.train_client, self.eval_client = train_client, eval_client
        self.log_lock = threading.Lock()
        self.calls = 0

    def path(self, stage, name):
        return self.work / stage / f"{name}.json"

    def log(self, unit, attempt, text, problems):
        with self.log_lock:
            with open(self.work / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(), "stage": unit.stage, "unit": unit.name, "attempt": attempt,
                                    "reply": text, "problems": problems}, ensure_ascii=False) + "\n")

    def cached(self, unit):
        """The accepted reply of a unit from an earlier run, checked again; None when there is none or it
        was made for other inputs. A file holding only a reply (written by hand) is taken as it is."""
        path = self.path(unit.stage, unit.name)
        if not path.exists():
            return None
        saved, problem = parse_reply(path.read_text(encoding="utf-8"))
        ours = saved is not None and "reply" in saved and "inputs" in saved
        if ours:
            if saved["inputs"] != unit.key:
                return None
            saved = saved["reply"]
        problems = [problem] if problem else unit.check(saved)
        if problems and ours:      # accepted once, but a rule now depends on something that changed: ask again
            return None
        if problems:
            raise GenerationError(f"{path}: a unit written by hand breaks its rules ({'; '.join(problems[:3])}); "
                                  "fix the file or delete it to ask again")
        if not ours:               # a hand-written reply that passes: kept, from now on tied to these inputs
            self.save(unit, saved)
        return saved

    def save(self, unit, reply):
        path = self.path(unit.stage, unit.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": unit.key, "reply": reply}, ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, path)              # a unit file is whole or absent, even after a kill

    def ask(self, unit):
        """Ask until a reply passes unit.check (1 + retries tries); accepted replies are saved at once."""
        client = self.eval_client if unit.eval_writer else self.train_client
        messages = [{"role": "system", "content": load_prompt(unit.prompt)},
                    {"role": "user", "content": json.dumps(unit.payload, ensure_ascii=False)}]
        problems = []
        for attempt in range(1 + self.retries):
            limit = min(unit.max_tokens, self.max_tokens or unit.max_tokens)
            text, finish = client.chat(messages, limit, self.temperature)
            with self.log_lock:
                self.calls += 1
            reply, problem = parse_reply(text)
            problems = [problem] if problem else unit.check(reply)
            if problem and finish == "length":
                problems = [f"the reply was cut off at {limit} tokens; write it more compactly"]
            self.log(unit, attempt, text, problems)
            if not problems:
                self.save(unit, reply)
                return reply
            # the next try sees the request, the last reply and its problems (not every earlier try: a long
            # reply asked again several times would outgrow the server's context)
            messages = messages[:2] + [{"role": "assistant", "content": text or ""},
                                       {"role": "user", "content": FIX.format(problems="\n".join(f"- {p}" for p in problems[:20]))}]
        raise GenerationError(f"stage {unit.stage}, unit {unit.name}: no reply followed the rules in "
                              f"{1 + self.retries} tries; the last broke: {'; '.join(problems[:5])}"
                              f"{' ...' if len(problems) > 5 else ''}. The replies are in {self.work / 'log.jsonl'}; finished units are "
                              f"cached in {self.work}: rerun to resume, or write the unit's reply to "
                              f"{self.path(unit.stage, unit.name)} by hand")

    def run(self, stage, units):
        """{unit name: accepted reply} for every unit, asking the missing ones in parallel."""
        out = {u.name: self.cached(u) for u in units}
        todo = [u for u in units if out[u.name] is None]
        if not todo:
            return out
        print(f"generate: {stage}: {len(units) - len(todo)}/{len(units)} cached, asking {len(todo)}", flush=True)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers)
        failures = []
        try:
            futures = {pool.submit(self.ask, u): u for u in todo}
            for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                try:
                    out[futures[fut].name] = fut.result()
                except GenerationError as e:      # the other units go on and are cached
                    failures.append(e)
                if i % 10 == 0 or i == len(todo):
                    print(f"generate: {stage}: {i}/{len(todo)} asked", flush=True)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failures:
            raise failures[0]
        return out

    def forget(self, stage, names):
        """Delete cached units so that the next run() asks them again."""
        for name in names:
            self.path(stage, name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# Checks shared by the stages: the validator's row rules, stated for the model

def has_text(x):
    return isinstance(x, str) and x.strip() != ""


def check_aliases(where, answer, aliases, texts):
    """Aliases are a list of strings, never the answer again, never inside the row's own wordings."""
    if not isinstance(aliases, list) or not all(has_text(a) for a in aliases):
        return [f"{where}: 'aliases' must be a list of non-empty strings (the list may be empty)"]
    out = []
    for a in aliases:
        if normalise(a) == normalise(answer):
            out.append(f"{where}: the alias '{a}' repeats the answer")
        elif any(suite.answer_in_question(a, t) for t in texts):
            out.append(f"{where}: the alias '{a}' occurs inside the row's own question")
    return out


def check_wording(where, text, answer, aliases=(), blank=False, forbidden=()):
    """One question or fill-in-the-blank statement: text, the blank rule, no answer or alias given away,
    no forbidden name (the forget topic's names, for retain rows and indirect questions)."""
    if not has_text(text):
        return [f"{where}: must be a non-empty string"]
    out = []
    n = text.count(BLANK)
    if suite.is_placeholder(text):
        out.append(f"{where}: '{text}' is a placeholder, not a question")
    elif blank and n != 1:
        out.append(f"{where}: a fill-in-the-blank statement holds exactly one '{BLANK}' (found {n}): '{text}'")
    elif not blank and n:
        out.append(f"{where}: only fill-in-the-blank statements may hold '{BLANK}': '{text}'")
    for a in [answer, *aliases]:
        if has_text(a) and suite.answer_in_question(a, text):
            out.append(f"{where}: gives away its own answer '{a}': '{text}'")
            break
    for name in forbidden:
        if suite.starts_a_word(name, text):
            out.append(f"{where}: names the forget topic ('{name}'): '{text}'")
            break
    return out


def check_answer(where, answer, max_words=4):
    if not has_text(answer):
        return [f"{where}: 'answer' must be a non-empty string"]
    if not 1 <= len(answer.split()) <= max_words:
        return [f"{where}: answers are 1-{max_words} words ('{answer}')"]
    return []


def check_distinct(where, texts):
    """No two wordings of one question are near-duplicates (equal after normalising, or word-trigram
    Jaccard >= 0.5, data/README.md)."""
    out = []
    for i, a in enumerate(texts):
        for b in texts[:i]:
            if has_text(a) and has_text(b) and suite.near_duplicate(a, b):
                out.append(f"{where}: '{a}' is too close to '{b}' (they share {suite.trigram_jaccard(a, b):.0%} of "
                           "their three-word sequences; under 50% is needed); write a genuinely different sentence")
                break
    return out


def check_list(reply, key, n, where):
    items = reply.get(key)
    if not isinstance(items, list) or len(items) != n:
        got = len(items) if isinstance(items, list) else type(items).__name__
        return None, [f"{where}: '{key}' must be a list of exactly {n} entries (got {got})"]
    return items, []


def opener_share(texts):
    """The most common first three words among texts and their share."""
    counts = collections.Counter(suite.opener(t) for t in texts if has_text(t))
    if not counts:
        return None, 0.0
    words, n = counts.most_common(1)[0]
    return words, n / len(texts)


# ----------------------------------------------------------------------------------------------
# Stage topic: names, lexical phrases, tiers

def check_topic(reply, tiers_given, gk_texts=()):
    """The topic stage: names, 10 lexical phrases, 16 tiers. No name may occur in a tier name, a phrase
    or the shared general-knowledge pool: every retain row must avoid the names."""
    out = []
    names = reply.get("names")
    if not isinstance(names, list) or not 1 <= len(names) <= 20 or not all(has_text(n) for n in names):
        out.append("'names' must be a list of 1-20 non-empty strings (the topic's names and direct synonyms)")
        names = []
    phrases, problems = check_list(reply, "lexical_phrases", 10, "topic")
    out += problems
    for p in phrases or []:
        if not has_text(p) or len(p.split()) > 4:
            out.append(f"lexical phrase {p!r}: must be a short phrase of 1-4 words")
        elif any(normalise(p) == normalise(n) for n in names):
            out.append(f"lexical phrase '{p}' is one of the topic's own names; choose words with meanings outside it")
    if phrases and len({normalise(p) for p in phrases if has_text(p)}) != len(phrases):
        out.append("the 10 lexical phrases must be distinct")
    for n in names:
        hit = next((t for t in [*(phrases or []), *gk_texts] if has_text(t) and suite.starts_a_word(n, t)), None)
        if hit:
            out.append(f"the name '{n}' occurs in '{hit}' (a lexical phrase or a shared general-knowledge question); "
                       "names are never allowed in retain rows, so give only names specific to the topic itself")
    if not tiers_given:
        tiers = reply.get("tiers")
        if not isinstance(tiers, dict) or sorted(tiers, key=str) != sorted(map(str, ALL_TIERS), key=str):
            out.append("'tiers' must map each of \"0\" ... \"15\" to a domain name")
        elif not all(has_text(v) for v in tiers.values()) or len({normalise(v) for v in tiers.values()}) != 16:
            out.append("the 16 tier names must be distinct non-empty strings")
        else:
            for t, v in tiers.items():
                n = next((n for n in names if suite.starts_a_word(n, v)), None)
                if n:
                    out.append(f"tier {t} '{v}' contains the topic name '{n}', which no retain row may use")
    return out


def read_tiers(path):
    """--tiers FILE: a JSON object {"0": name, ...} or lines 'N: name' (tier 0 may be left out, as the
    paper's Salem witch trials topic does); tiers 1-15 are required."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"--tiers {path}: {e.strerror or e}") from None
    try:
        tiers = {str(k): v for k, v in json.loads(text).items()}
    except (json.JSONDecodeError, AttributeError):
        tiers = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            m = re.fullmatch(r"\s*(\d+)\s*[:\t]\s*(.+?)\s*", line)
            if not m:
                raise data.DataError(path, n, None, "expected 'N: tier name'")
            tiers[m.group(1)] = m.group(2)
    want = {str(t) for t in ALL_TIERS}
    if not {str(t) for t in range(1, 16)} <= set(tiers) <= want or not all(has_text(v) for v in tiers.values()):
        raise data.DataError(path, None, None, "needs a name for each tier 1-15 (tier 0 optional), and no other keys")
    return dict(sorted(tiers.items(), key=lambda kv: int(kv[0])))


# ----------------------------------------------------------------------------------------------
# Stage facts: 25 facts x direct, reverse, indirect

def check_facts(reply, names):
    facts, out = check_list(reply, "facts", 25, "facts")
    if facts is None:
        return out
    ids = [f.get("id") if isinstance(f, dict) else None for f in facts]
    if ids != FACTS:
        return [f"'facts' must hold the ids {', '.join(FACTS)} in this order (got {ids})"]
    questions, cues = [], []
    for f in facts:
        for key in ("statement", "provenance"):
            if not has_text(f.get(key)):
                out.append(f"{f['id']}: '{key}' must be a non-empty string")
        for qtype in QTYPES:
            q, where = f.get(qtype), f"{f['id']} {qtype}"
            if not isinstance(q, dict):
                out.append(f"{where}: must be an object with question, answer, aliases")
                continue
            out += check_answer(where, q.get("answer"))
            out += check_wording(f"{where} question", q.get("question"), q.get("answer"), q.get("aliases") or [],
                                 forbidden=names if qtype == "indirect" else ())
            out += check_aliases(where, q.get("answer"), q.get("aliases"), [q.get("question") or ""])
            questions.append((where, q.get("question"), qtype))
        ind, dire = f.get("indirect"), f.get("direct")
        if isinstance(ind, dict) and isinstance(dire, dict):
            if has_text(ind.get("answer")) and normalise(ind["answer"]) != normalise(dire.get("answer") or ""):
                out.append(f"{f['id']}: the indirect question asks for the same fact as the direct one, so its "
                           f"answer must be the same ('{dire.get('answer')}', not '{ind['answer']}')")
            if ind.get("cue") not in CUES:
                out.append(f"{f['id']} indirect: 'cue' must be one of {', '.join(CUES)}")
            cues.append(ind.get("cue"))
    for i in range(3, len(cues)):
        if cues[i] is not None and len(set(cues[i - 3:i + 1])) == 1:
            out.append(f"{FACTS[i]} indirect: four indirect questions in a row ({', '.join(FACTS[i - 3:i + 1])}) use "
                       f"the cue '{cues[i]}'; rotate the context triggers")
    texts = [q for _, q, _ in questions]
    out += check_distinct("facts", texts)
    for label, group in (("the 75 questions", texts), ("the 50 direct and reverse questions",
                                                        [q for _, q, t in questions if t != "indirect"])):
        words, share = opener_share(group)
        if share > suite.OPENER_MAX_SHARE:
            out.append(f"{share:.0%} of {label} open with '{words}'; at most "
                       f"{suite.OPENER_MAX_SHARE:.0%} may share their first three words")
    return out


def facts_to_rows(reply):
    """The 75 forget source rows (without variants) of a facts reply."""
    rows = []
    for f in reply["facts"]:
        for qtype in QTYPES:
            q = f[qtype]
            row = {"label": f"{f['id']}-{qtype}", "question": q["question"].strip(), "answer": q["answer"].strip(),
                   "aliases": [a.strip() for a in q.get("aliases") or []], "provenance": f["provenance"].strip()}
            if qtype == "indirect":
                row["cue"] = q["cue"]
            rows.append(row)
    return rows


def rows_to_facts(rows, statements):
    """The inverse of facts_to_rows, for a --facts file."""
    by_label = {r["label"]: r for r in rows}
    facts = []
    for fact in FACTS:
        f = {"id": fact, "statement": statements.get(fact, ""), "provenance": ""}
        for qtype in QTYPES:
            r = by_label.get(f"{fact}-{qtype}", {})
            f[qtype] = {"question": r.get("question"), "answer": r.get("answer"), "aliases": r.get("aliases", [])}
            if qtype == "indirect":
                f[qtype]["cue"] = r.get("cue")
            f["provenance"] = f["provenance"] or r.get("provenance", "")
        facts.append(f)
    return {"facts": facts}


REVIEW_COLUMNS = ["label", "question", "answer", "aliases", "cue", "provenance", "statement"]


def write_review(path, topic_name, reply):
    """The facts and questions as a Markdown table, one row a question, for reading and editing."""
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = [f"# Facts for: {topic_name}", "",
             "Edit any cell (aliases are separated by ';'), keep the labels, then run the same command with "
             f"`--facts {path}` instead of `--review`.", "",
             "| " + " | ".join(REVIEW_COLUMNS) + " |", "|" + "---|" * len(REVIEW_COLUMNS)]
    statements = {f["id"]: f["statement"] for f in reply["facts"]}
    for r in facts_to_rows(reply):
        values = [r["label"], r["question"], r["answer"], "; ".join(r["aliases"]), r.get("cue", ""),
                  r["provenance"], statements[r["label"].split("-")[0]] if r["label"].endswith("-direct") else ""]
        lines.append("| " + " | ".join(cell(v) for v in values) + " |")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_facts_file(path):
    """--facts FILE: the review table (Markdown) or JSON Lines forget rows (the statements of the facts
    from the topic.json beside them, as in data/source/<topic>/); returns a facts reply."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"--facts {path}: no such file")
    if path.suffix == ".jsonl":
        info = path.parent / "topic.json"
        statements = json.loads(info.read_text(encoding="utf-8")).get("facts", {}) if info.exists() else {}
        return rows_to_facts(data.read_jsonl(path), statements)
    rows, statements = [], {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| label"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != len(REVIEW_COLUMNS):
            raise data.DataError(path, n, None, f"a table row needs {len(REVIEW_COLUMNS)} cells ({', '.join(REVIEW_COLUMNS)})")
        r = dict(zip(REVIEW_COLUMNS, cells))
        r["aliases"] = [a.strip() for a in r["aliases"].split(";") if a.strip()]
        if r.pop("statement"):
            statements[r["label"].split("-")[0]] = cells[-1]
        rows.append({k: v for k, v in r.items() if v != "" or k == "aliases"})
    return rows_to_facts(rows, statements)


# ----------------------------------------------------------------------------------------------
# Stages train and eval: 10 paraphrases + 5 blanks of a question, by two writers

def check_variants(reply, row, names, train_wordings, avoid_openers=()):
    """A train or eval variants reply of one forget question (`train_wordings`: for an eval reply, the
    train wordings of the same question, which no eval wording may echo)."""
    label, out = row["label"], []
    paraphrases, problems = check_list(reply, "paraphrases", 10, label)
    blanks, more = check_list(reply, "blanks", 5, label)
    out += problems + more
    if out:
        return out
    forbidden = names if label.endswith("indirect") else ()
    for i, text in enumerate(paraphrases, 1):
        out += check_wording(f"{label} paraphrase {i}", text, row["answer"], row["aliases"], forbidden=forbidden)
    for i, text in enumerate(blanks, 1):
        out += check_wording(f"{label} blank {i}", text, row["answer"], row["aliases"], blank=True, forbidden=forbidden)
    if out:
        return out
    out += check_distinct(label, [row["question"], *paraphrases, *blanks])
    for text in [*paraphrases, *blanks]:
        near = next((t for t in train_wordings if suite.near_duplicate(text, t)), None)
        if near:
            out.append(f"{label}: '{text}' is too close to the existing wording '{near}' (they share "
                       f"{suite.trigram_jaccard(text, near):.0%} of their three-word sequences); write it another way")
    for text in [*paraphrases, *blanks]:
        if suite.opener(text) in avoid_openers:
            out.append(f"{label}: '{text}' starts with '{suite.opener(text)}', which the input asks to avoid")
    return out


def variant_units(stage, rows, topic_name, names, train=None, avoid_openers=None):
    """One unit a question: train variants for direct and reverse questions, eval variants for all 75."""
    units = []
    for row in rows:
        qtype = row["label"].split("-")[1]
        if stage == "train" and qtype == "indirect":
            continue
        earlier = [*train[row["label"]]["paraphrases"], *train[row["label"]]["blanks"]] if train and qtype != "indirect" else []
        payload = {"topic": topic_name, "type": qtype, "question": row["question"], "answer": row["answer"],
                   "aliases": row["aliases"], "paraphrases": 10, "blanks": 5, "avoid": earlier}
        if qtype == "indirect":
            payload["forbidden"] = names
        avoided = (avoid_openers or {}).get(row["label"], [])
        if avoided:
            payload["avoid_openers"] = avoided
        check = lambda reply, row=row, earlier=earlier, avoided=avoided: check_variants(reply, row, names, earlier, avoided)
        inputs = {k: v for k, v in payload.items() if k != "avoid_openers"}
        units.append(Unit(stage, row["label"], f"paraphrase_{stage}", payload, check, inputs, eval_writer=stage == "eval",
                          max_tokens=2048))
    return units


def spread_openers(groups):
    """Reorder the wordings of each question ({label: [k wordings]}) over the k variant slots so that no
    slot collects one opener (the validator's opener rule is per slot: q_gemini1 across all questions):
    the wordings with the commonest openers are placed first, each into the free slot holding that
    opener least often. Deterministic. Returns ({label: reordered}, [per-slot Counter of openers])."""
    k = len(next(iter(groups.values())))
    total = collections.Counter(suite.opener(t) for ws in groups.values() for t in ws)
    slots = [collections.Counter() for _ in range(k)]
    out = {}
    for label, wordings in groups.items():
        free, placed = list(range(k)), [None] * k
        for text in sorted(wordings, key=lambda t: (-total[suite.opener(t)], t)):
            o = suite.opener(text)
            j = min(free, key=lambda j: (slots[j][o], j))
            free.remove(j)
            placed[j], slots[j][o] = text, slots[j][o] + 1
        out[label] = placed
    return out, slots


# Openers are spread with a margin below the validator's limit: the paired train file uses a subset of
# the train wordings, where a share can come out a little higher than over all questions.
OPENER_TARGET = 0.75 * suite.OPENER_MAX_SHARE


def crowded_openers(replies):
    """{label: [openers to avoid]} for the units to ask again because an opener fills too much of a slot
    even after spreading: the questions using it most, until it would fit."""
    redo = collections.defaultdict(set)
    for key in ("paraphrases", "blanks"):
        groups = {label: r[key] for label, r in replies.items()}
        _, slots = spread_openers(groups)
        limit = OPENER_TARGET * len(groups)
        for o in {o for c in slots for o, n in c.items() if n > limit}:
            excess = sum(c[o] for c in slots) - int(limit) * len(slots)
            users = sorted(groups, key=lambda l: -sum(suite.opener(t) == o for t in groups[l]))
            for label in users:
                if excess <= 0:
                    break
                excess -= sum(suite.opener(t) == o for t in groups[label])
                redo[label].add(o)
    return {label: sorted(os_) for label, os_ in redo.items()}


def add_openers(avoid, redo):
    """Merge {label: [openers]} to ask again into the openers each question must avoid from now on."""
    for label, openers in redo.items():
        avoid[label] = sorted(set(avoid.get(label, [])) | set(openers))


def variants_stage(writer, stage, rows, topic_name, names, train=None, avoid=None):
    """Run a variants stage, asking again (at most --retries rounds) the questions whose openers crowd a slot;
    `avoid` ({label: [openers]}) carries openers to avoid from earlier rounds and is updated."""
    avoid = {} if avoid is None else avoid
    for _ in range(1 + writer.retries):
        replies = writer.run(stage, variant_units(stage, rows, topic_name, names, train, avoid))
        redo = crowded_openers(replies)
        if not redo:
            return replies
        print(f"generate: {stage}: openers {sorted({o for v in redo.values() for o in v})} crowd their slots; "
              f"asking {len(redo)} questions again", flush=True)
        writer.forget(stage, redo)
        add_openers(avoid, redo)
    raise GenerationError(f"stage {stage}: openers still crowd the variant slots after {writer.retries} rounds; "
                          f"finished units are cached in {writer.work}")


# ----------------------------------------------------------------------------------------------
# Stage adversarial: the seven written variants of each direct question (appendix D.2)

def check_adversarial(reply, row):
    out = []
    for key in ADVERSARIAL_WRITTEN:
        out += check_wording(f"{row['label']} {key}", reply.get(key), row["answer"], row["aliases"])
    return out


def adversarial_units(rows, topic_name):
    return [Unit("adversarial", r["label"], "adversarial",
                 {"topic": topic_name, "question": r["question"], "answer": r["answer"], "aliases": r["aliases"]},
                 lambda reply, r=r: check_adversarial(reply, r), max_tokens=1536)
            for r in rows if r["label"].endswith("-direct")]


# ----------------------------------------------------------------------------------------------
# Retain stages: semantic tiers, syntax mirrors, lexical phrases

def check_retain_row(where, item, forbidden, rewrites, phrase=None, blank=False):
    """One retain row: question (a fill-in-the-blank statement with `blank`: a syntax mirror of a blank
    wording), 1-4 word answer, aliases; with `rewrites` its paraphrase and blank; no forbidden name
    anywhere; a lexical row uses its phrase in every wording."""
    if not isinstance(item, dict):
        return [f"{where}: must be an object"]
    answer, aliases = item.get("answer"), item.get("aliases") or []
    out = check_answer(where, answer)
    wordings = [("question", item.get("question"), blank)]
    if rewrites:
        wordings += [("paraphrase", item.get("paraphrase"), False), ("blank", item.get("blank"), True)]
    for key, text, blank in wordings:
        out += check_wording(f"{where} {key}", text, answer, aliases, blank=blank, forbidden=forbidden)
        if phrase and has_text(text) and not suite.starts_a_word(phrase, text):
            out.append(f"{where} {key}: must use the phrase '{phrase}': '{text}'")
    for name in forbidden:
        if has_text(answer) and suite.starts_a_word(name, answer):
            out.append(f"{where}: the answer names the forget topic ('{name}')")
    out += check_aliases(where, answer, item.get("aliases"), [t for _, t, _ in wordings if has_text(t)])
    if rewrites and has_text(item.get("paraphrase")) and has_text(item.get("question")) \
            and normalise(item["paraphrase"]) == normalise(item["question"]):
        out.append(f"{where}: the paraphrase repeats the question")
    return out


def check_retain_list(where, items, forbidden, rewrites, avoid, phrase=None):
    out, seen = [], {normalise(q) for q in avoid}
    for i, item in enumerate(items, 1):
        out += check_retain_row(f"{where} #{i}", item, forbidden, rewrites, phrase)
        q = item.get("question") if isinstance(item, dict) else None
        if has_text(q):
            if normalise(q) in seen:
                out.append(f"{where} #{i}: the question '{q}' is already used; ask about another fact")
            seen.add(normalise(q))
    return out


def semantic_units(split, tiers, topic_name, names, train=None, avoid=None):
    """One unit a tier: train rows (tiers 0-10, with paraphrase and blank), or eval rows (tiers 0-15),
    which avoid the facts of the tier's train rows."""
    units = []
    for tier, domain in tiers.items():
        if split == "train" and int(tier) not in TRAIN_TIERS:
            continue
        given = [x["question"] for x in train.get(f"tier{tier}-train", {"questions": []})["questions"]] if train else []
        earlier = given + (avoid or {}).get(f"tier{tier}-{split}", [])
        inputs = {"forget_topic": topic_name, "forbidden": names, "domain": domain, "count": PER_TIER,
                  "split": split, "avoid": given}
        payload = inputs | {"avoid": earlier}

        def check(reply, earlier=earlier, split=split, tier=tier):
            items, out = check_list(reply, "questions", PER_TIER, f"tier {tier}")
            return out or check_retain_list(f"tier {tier}", items, names, split == "train", earlier)
        units.append(Unit("semantic", f"tier{tier}-{split}", "semantic", payload, check, inputs, max_tokens=6144))
    return units


def syntax_choices(topic, label):
    """The wordings of a direct question that syntax rows mirror: train, the original, one paraphrase and
    one blank; eval, three paraphrases and one blank (fixed per topic and question)."""
    rng = random.Random(f"{topic}-{label}-syntax")
    train = ["original", f"q_claude{rng.randint(1, 10)}", f"blank_claude{rng.randint(1, 5)}"]
    evals = [f"q_gemini{i}" for i in sorted(rng.sample(range(1, 11), 3))] + [f"blank_gemini{rng.randint(1, 5)}"]
    return train, evals


def check_syntax(reply, row, wordings, names, avoid):
    mirrors = reply.get("mirrors")
    if not isinstance(mirrors, dict) or set(mirrors) != set(wordings):
        return [f"'mirrors' must be an object with exactly the keys {', '.join(wordings)}"]
    out = []
    for key, source in wordings.items():
        m = mirrors[key]
        out += check_retain_row(f"{key}", m, names, rewrites=False, blank=BLANK in source)
        if not isinstance(m, dict):
            continue
        if not has_text(m.get("domain")):
            out.append(f"{key}: 'domain' must name the new fact's subject")
        q = m.get("question")
        if has_text(q) and (BLANK in q) != (BLANK in source):
            out.append(f"{key}: keep the form of the source wording ({'a blank statement' if BLANK in source else 'a question'})")
        if has_text(q) and normalise(q) == normalise(source):
            out.append(f"{key}: copies the source wording; replace its entities with another fact's")
        if has_text(m.get("answer")) and normalise(m["answer"]) == normalise(row["answer"]):
            out.append(f"{key}: repeats the forget answer '{row['answer']}'; a mirror has a different fact and answer")
    answers = [normalise(m.get("answer") or "") for m in mirrors.values() if isinstance(m, dict)]
    domains = [normalise(m.get("domain") or "") for m in mirrors.values() if isinstance(m, dict)]
    if len(set(answers)) != len(answers) or len(set(domains)) != len(domains):
        out.append("every mirror needs its own subject and its own answer (two share one)")
    seen = {normalise(q) for q in avoid}
    for key, m in mirrors.items():
        if isinstance(m, dict) and has_text(m.get("question")) and normalise(m["question"]) in seen:
            out.append(f"{key}: the question '{m['question']}' is already used; mirror another fact")
    return out


def syntax_units(topic, topic_name, rows, train, evals, names, avoid=None):
    units = []
    for row in rows:
        if not row["label"].endswith("-direct"):
            continue
        train_keys, eval_keys = syntax_choices(topic, row["label"])
        for split, keys in (("train", train_keys), ("eval", eval_keys)):
            wordings = {k: suite.variant_text(forget_source_row(row, train, evals), k) for k in keys}
            name = f"{row['label']}-{split}"
            earlier = (avoid or {}).get(name, [])
            payload = {"forget_topic": topic_name, "forbidden": names, "label": row["label"], "answer": row["answer"],
                       "wordings": wordings, "avoid": earlier}
            check = lambda reply, row=row, wordings=wordings, earlier=earlier: check_syntax(reply, row, wordings, names, earlier)
            units.append(Unit("syntax", name, "syntax", payload, check, payload | {"avoid": []}, max_tokens=2048))
    return units


def forget_source_row(row, train, evals):
    """A forget source row (data/README.md) from its facts row and its variants in their spread (final)
    order: direct and reverse rows carry train variants, every row eval variants."""
    out = dict(row)
    if not row["label"].endswith("indirect"):
        out |= {"train_paraphrases": train[row["label"]]["paraphrases"], "train_blanks": train[row["label"]]["blanks"]}
    return out | {"eval_paraphrases": evals[row["label"]]["paraphrases"], "eval_blanks": evals[row["label"]]["blanks"]}


def lexical_units(phrases, topic_name, names, avoid=None):
    units = []
    for i, phrase in enumerate(phrases, 1):
        earlier = (avoid or {}).get(f"phrase{i}", [])
        payload = {"forget_topic": topic_name, "forbidden": names, "phrase": phrase, "train": PER_PHRASE,
                   "eval": PER_PHRASE, "avoid": earlier}

        def check(reply, phrase=phrase, earlier=earlier):
            train, out = check_list(reply, "train", PER_PHRASE, f"phrase '{phrase}'")
            evals, more = check_list(reply, "eval", PER_PHRASE, f"phrase '{phrase}'")
            if out or more:
                return out + more
            return (check_retain_list(f"'{phrase}' train", train, names, True, earlier, phrase)
                    + check_retain_list(f"'{phrase}' eval", evals, names, False,
                                        earlier + [x.get("question", "") for x in train if isinstance(x, dict)], phrase))
        units.append(Unit("lexical", f"phrase{i}", "lexical", payload, check, payload | {"avoid": []}, max_tokens=3072))
    return units


def retain_stages(writer, topic, topic_name, names, tiers, phrases, facts_rows, train, evals, gk_questions):
    """Semantic, syntax and lexical rows; then any question that another retain row (or the shared
    general-knowledge pool) already asks is asked again with that question to avoid, at most --retries
    rounds (the validator refuses duplicate retain questions)."""
    avoid = collections.defaultdict(list)
    for _ in range(1 + writer.retries):
        sem_train = writer.run("semantic", semantic_units("train", tiers, topic_name, names, avoid=avoid))
        sem_eval = writer.run("semantic", semantic_units("eval", tiers, topic_name, names, sem_train, avoid))
        semantic = sem_train | sem_eval
        syntax = writer.run("syntax", syntax_units(topic, topic_name, facts_rows, train, evals, names, avoid))
        lexical = writer.run("lexical", lexical_units(phrases, topic_name, names, avoid))
        seen, redo = {normalise(q): "general knowledge" for q in gk_questions}, collections.defaultdict(set)
        for stage, unit, text in retain_texts(semantic, syntax, lexical):
            key = normalise(text)
            if key in seen and seen[key] != unit:
                redo[(stage, unit)].add(text)
            seen.setdefault(key, unit)
        if not redo:
            return semantic, syntax, lexical
        print(f"generate: {len(redo)} retain units repeat a question of another; asking them again", flush=True)
        for (stage, unit), texts in redo.items():
            writer.forget(stage, [unit])
            avoid[unit] += sorted(texts)
    raise GenerationError(f"retain questions still repeat one another after {writer.retries} rounds; finished units "
                          f"are cached in {writer.work}")


def retain_texts(semantic, syntax, lexical):
    """(stage, unit, wording) of every retain wording: questions, paraphrases and blanks."""
    for unit, reply in semantic.items():
        for x in reply["questions"]:
            yield from (("semantic", unit, x[k]) for k in ("question", "paraphrase", "blank") if has_text(x.get(k)))
    for unit, reply in syntax.items():
        yield from (("syntax", unit, m["question"]) for m in reply["mirrors"].values())
    for unit, reply in lexical.items():
        for x in reply["train"] + reply["eval"]:
            yield from (("lexical", unit, x[k]) for k in ("question", "paraphrase", "blank") if has_text(x.get(k)))


# ----------------------------------------------------------------------------------------------
# The topic's source files (data/README.md), staged, built, validated, then installed

def retain_row(x, **fields):
    row = fields | {"question": x["question"].strip(), "answer": x["answer"].strip(),
                    "aliases": [a.strip() for a in x.get("aliases") or []]}
    for key in ("paraphrase", "blank"):
        if has_text(x.get(key)):
            row[key] = x[key].strip()
    return row


def write_sources(folder, topic, topic_name, topic_reply, tiers, facts, rows, train, evals, adversarial,
                  semantic, syntax, lexical):
    """data/source/<topic>/*.jsonl and topic.json from the accepted replies."""
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = lambda name, items: (folder / f"{name}.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items), encoding="utf-8")
    info = {"topic": topic, "name": topic_name,
            "forbidden_in_retain": sorted({n.strip().lower() for n in topic_reply["names"]}),
            "tiers": tiers, "lexical_phrases": topic_reply["lexical_phrases"],
            "meta_fact": facts.get("meta_fact", ""), "facts": {f["id"]: f["statement"] for f in facts["facts"]}}
    (folder / "topic.json").write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    jsonl("forget", [forget_source_row(r, train, evals) for r in rows])
    jsonl("adversarial", [{"label": label, **{k: reply[k].strip() for k in ADVERSARIAL_WRITTEN}}
                          for label, reply in sorted(adversarial.items(), key=lambda kv: FACTS.index(kv[0].split("-")[0]))])
    sem = []
    for tier in tiers:
        for split in ("train", "eval"):
            for x in semantic.get(f"tier{tier}-{split}", {"questions": []})["questions"]:
                sem.append(retain_row(x, tier=int(tier), split=split))
    jsonl("semantic", sem)
    syn = []
    for split in ("train", "eval"):
        for r in rows:
            reply = syntax.get(f"{r['label']}-{split}")
            for key, m in (reply["mirrors"].items() if reply else []):
                syn.append(retain_row(m, split=split, mirrors=f"{r['label']}@{key}") | {"domain": m["domain"].strip()})
    jsonl("syntax", syn)
    lex = []
    for i, phrase in enumerate(topic_reply["lexical_phrases"], 1):
        for split in ("train", "eval"):
            lex += [retain_row(x, phrase=phrase, split=split) for x in lexical[f"phrase{i}"][split]]
    jsonl("lexical", lex)


def stage_and_validate(work, topic, write):
    """Write the sources into WORK/staged, build the release rows there and validate them (strict, our
    rules); returns the staged (source root, release root) and the errors found (printed)."""
    staged = Path(work) / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    source, release = staged / "source", staged / "suite"
    write(source / topic)
    shutil.copy(suite.SOURCE_ROOT / "general_knowledge.jsonl", source / "general_knowledge.jsonl")
    counts = suite.build_topic(topic, release, source)
    found = suite.validate_topic(topic, release, strict=True, source_root=source) + suite.validate_source(topic, source)
    for e in found:
        print(e)
    errors = [e for e in found if not e.warning]
    if not errors:
        print(f"generate: built and validated {json.dumps(counts)}", flush=True)
    return source, release, errors


def openers_to_redo(errors, train, evals):
    """{stage: {label: [openers]}}: for each opener-dominance error of the validator (a slot of the paired
    forget_train, or of the eval variants, where one opener is too common), the questions whose wording
    in that slot opens with it, to be asked again avoiding it."""
    redo = {"train": {}, "eval": {}}
    for e in errors:
        m = re.search(r"the \d+ '((q|blank)_(claude|gemini)(\d+))' wordings \([^)]*\) open with '([^']*)'", e.rule)
        if not m:
            continue
        stage, replies = ("train", train) if m.group(3) == "claude" else ("eval", evals)
        key, index, words = "paraphrases" if m.group(2) == "q" else "blanks", int(m.group(4)) - 1, m.group(5)
        for label, r in replies.items():
            if suite.opener(r[key][index]) == words:
                redo[stage].setdefault(label, []).append(words)
    return {stage: labels for stage, labels in redo.items() if labels}


def install(topic, staged_source, staged_release, source_root, out_root, provenance):
    """Copy the validated topic into the source tree and the release root, provenance beside each."""
    targets = [(staged_source / topic, Path(source_root) / topic), (staged_release / topic, Path(out_root) / topic)]
    for src, dest in targets:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)
        (dest / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    adv = Path(out_root) / "adversarial_questions" / f"{topic}_adv.json"
    adv.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(staged_release / "adversarial_questions" / f"{topic}_adv.json", adv)
    for pool in ("few_shot_context", "refusal_detection"):   # a new root gets the shared pools of ours
        if not (Path(out_root) / pool).exists():
            shutil.copytree(data.DEFAULT_ROOT / pool, Path(out_root) / pool)
    if Path(source_root).resolve() != suite.SOURCE_ROOT.resolve() and not (Path(source_root) / "general_knowledge.jsonl").exists():
        shutil.copy(suite.SOURCE_ROOT / "general_knowledge.jsonl", Path(source_root) / "general_knowledge.jsonl")


def provenance_of(args, writer, clients):
    prompts = sorted(PROMPTS.glob("gen_*.txt"))
    return {"topic": args.topic, "topic_name": args.topic_name,
            "writers": {"train": clients[0].model, "eval": clients[1].model},
            "endpoints": {"train": clients[0].url, "eval": clients[1].url},
            "prompts": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in prompts},
            "temperature": args.temperature, "retries": args.retries, "facts_file": args.facts, "tiers_file": args.tiers,
            "calls_this_run": writer.calls, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python generate.py " + " ".join(sys.argv[1:])}


# ----------------------------------------------------------------------------------------------
# The command

def generate(args):
    """All stages in order (each resumes from the cache), then stage, validate, install, stats."""
    if not re.fullmatch(r"[a-z0-9_]+", args.topic):
        raise UserError(f"--topic {args.topic}: a folder name of lower-case letters, digits and '_'")
    work = Path(args.work or data.HERE / "runs" / "generate" / args.topic)
    interrupted = (work / "installing").exists()        # a run killed while installing: finish its install
    for folder in (Path(args.out) / args.topic, Path(args.source_root) / args.topic):
        if folder.exists() and not (args.overwrite or interrupted):
            raise UserError(f"{folder} exists; pass --overwrite to replace it, or choose another --topic")
    tiers_given = read_tiers(args.tiers) if args.tiers else None
    facts_given = read_facts_file(args.facts) if args.facts else None
    client = lambda url, model: ChatClient(url, model, api_key_env=args.api_key_env, timeout=args.timeout,
                                           max_retries=args.server_retries, backoff=args.backoff,
                                           no_thinking=not args.thinking, role="generator")
    train_client = client(args.llm_url, args.llm_model)
    eval_client = (client(args.eval_llm_url or args.llm_url, args.eval_llm_model)
                   if args.eval_llm_model or args.eval_llm_url else train_client)
    work.mkdir(parents=True, exist_ok=True)             # only once a server answers: a failed start leaves nothing
    writer = Writer(work, train_client, eval_client, args.retries, args.workers, args.temperature, args.max_tokens)
    print(f"generate: {args.topic} ('{args.topic_name}'), writers {train_client.label} / {eval_client.label}, "
          f"work folder {work}", flush=True)

    gk_rows = data.read_jsonl(suite.SOURCE_ROOT / "general_knowledge.jsonl")     # the shared pool, read once
    gk = [r.get(k) or "" for r in gk_rows for k in ("question", "answer", "paraphrase", "blank")]
    topic_reply = writer.run("topic", [Unit("topic", "topic", "topic", {"topic": args.topic_name},
                                            lambda r: check_topic(r, tiers_given is not None, gk),
                                            {"topic": args.topic_name, "tiers": tiers_given}, max_tokens=2048)])["topic"]
    names, tiers = topic_reply["names"], tiers_given or dict(sorted(topic_reply["tiers"].items(), key=lambda kv: int(kv[0])))
    facts_unit = Unit("facts", "facts", "facts", {"topic": args.topic_name, "forbidden": names},
                      lambda r: check_facts(r, names), max_tokens=16384)
    if facts_given is not None:
        problems = check_facts(facts_given, names)
        if problems:
            raise data.DataError(args.facts, None, None, f"{len(problems)} problem(s): " + "; ".join(problems[:10]))
        writer.save(facts_unit, facts_given)              # later runs go on with these facts
    facts = writer.run("facts", [facts_unit])["facts"]
    if args.review:
        write_review(args.review, args.topic_name, facts)
        print(f"generate: the facts are in {args.review}; edit them and run again with --facts {args.review} "
              "(or run again without --review to go on with them as they are)")
        return None
    return write_topic(writer, args, work, topic_reply, tiers, facts, gk_rows, (train_client, eval_client))


def write_topic(writer, args, work, topic_reply, tiers, facts, gk_rows, clients):
    """The stages after the facts, then stage, validate, install and stats. Openers that crowd a slot of
    the paired train file (which only the built release shows) send their questions back to the writer,
    at most --retries rounds."""
    rows, names = facts_to_rows(facts), topic_reply["names"]
    gk = [r[k] for r in gk_rows for k in ("question", "paraphrase", "blank") if has_text(r.get(k))]  # every GK wording
    avoid = {"train": {}, "eval": {}}
    for round_ in range(1 + args.retries):
        train_raw = variants_stage(writer, "train", rows, args.topic_name, names, avoid=avoid["train"])
        evals_raw = variants_stage(writer, "eval", rows, args.topic_name, names, train_raw, avoid=avoid["eval"])
        train, evals = spread(train_raw), spread(evals_raw)
        adversarial = writer.run("adversarial", adversarial_units(rows, args.topic_name))
        semantic, syntax, lexical = retain_stages(writer, args.topic, args.topic_name, names, tiers,
                                                  topic_reply["lexical_phrases"], rows, train, evals, gk)
        write = lambda folder: write_sources(folder, args.topic, args.topic_name, topic_reply, tiers, facts, rows,
                                             train, evals, adversarial, semantic, syntax, lexical)
        staged_source, staged_release, errors = stage_and_validate(work, args.topic, write)
        if not errors:
            break
        redo = openers_to_redo(errors, train, evals)
        if not redo or round_ == args.retries:
            raise GenerationError(f"the staged topic breaks {len(errors)} rule(s) of the validator (listed above); "
                                  f"it stays in {work / 'staged'} and is not installed. Delete the units concerned in "
                                  f"{work} (or fix them by hand) and rerun")
        for stage, labels in redo.items():
            print(f"generate: {stage}: openers crowd slots of the built release; asking {len(labels)} questions again")
            writer.forget(stage, labels)
            add_openers(avoid[stage], labels)
    provenance = provenance_of(args, writer, clients)
    (work / "installing").touch()
    install(args.topic, staged_source, staged_release, args.source_root, args.out, provenance)
    (work / "installing").unlink()
    print(suite.stats([args.out], [args.topic]))
    print(f"generate: {args.topic} installed in {Path(args.out) / args.topic} (sources in "
          f"{Path(args.source_root) / args.topic}); {writer.calls} calls this run")
    return Path(args.out) / args.topic


def spread(replies):
    """The variants of every question with their openers spread over the slots (spread_openers)."""
    labels = sorted(replies, key=lambda l: (FACTS.index(l.split("-")[0]), QTYPES.index(l.split("-")[1])))
    paraphrases, _ = spread_openers({l: replies[l]["paraphrases"] for l in labels})
    blanks, _ = spread_openers({l: replies[l]["blanks"] for l in labels})
    return {l: {"paraphrases": [t.strip() for t in paraphrases[l]], "blanks": [t.strip() for t in blanks[l]]}
            for l in labels}


def main(argv=None):
    p = argparse.ArgumentParser(prog="generate.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topic-name", required=True, help='what to forget, in words: "The 2010 Deepwater Horizon oil spill"')
    p.add_argument("--topic", required=True, help="the topic's folder name, e.g. deepwater_horizon")
    p.add_argument("--llm-url", default="http://127.0.0.1:8000/v1", help="OpenAI-compatible endpoint of the writer")
    p.add_argument("--llm-model", default=None, help="model name on that server (default: the one it lists)")
    p.add_argument("--eval-llm-url", default=None, help="a second server for the eval variants (default: --llm-url)")
    p.add_argument("--eval-llm-model", default=None,
                   help="a second model for the eval variants, as the paper used (default: --llm-model)")
    p.add_argument("--api-key-env", default="LLM_API_KEY", help="environment variable holding the API key, if any")
    p.add_argument("--tiers", default=None, help="retain tier names: JSON {\"0\": name, ...} or lines 'N: name'")
    p.add_argument("--review", default=None, help="stop after the facts and write them to this Markdown file")
    p.add_argument("--facts", default=None, help="the facts to use: an edited --review file, or forget rows (.jsonl)")
    p.add_argument("--out", default=str(data.DEFAULT_ROOT), help="the SUITE root to install the topic into")
    p.add_argument("--source-root", default=str(suite.SOURCE_ROOT), help="where the topic's source files go")
    p.add_argument("--work", default=None, help="cache of accepted replies and the log (default runs/generate/TOPIC)")
    p.add_argument("--overwrite", action="store_true", help="replace an installed topic of the same name")
    p.add_argument("--retries", type=int, default=3, help="asks again per unit when a reply breaks the rules")
    p.add_argument("--workers", type=int, default=8, help="requests in flight")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=None, help="cap on each reply's length (small servers)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument("--server-retries", type=int, default=6, help="retries of a request the server failed")
    p.add_argument("--backoff", type=float, default=1.0, help="first wait before retrying a failed request (doubles)")
    p.add_argument("--thinking", action="store_true", help="leave the model's thinking on (off by default)")
    args = p.parse_args(argv)
    with data.one_line_errors("generate.py", ServerUnavailable):
        data.check_flags(args, {"retries": data.NON_NEGATIVE, "workers": data.AT_LEAST_ONE, "timeout": data.POSITIVE,
                                "server_retries": data.NON_NEGATIVE, "backoff": data.NON_NEGATIVE,
                                "temperature": data.NON_NEGATIVE, "max_tokens": data.AT_LEAST_ONE})
        generate(args)


if __name__ == "__main__":
    main()
