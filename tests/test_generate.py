"""Tests for generate.py (`python generate.py`): a whole topic written by a scripted "writer" server
(a real local HTTP server speaking the OpenAI chat protocol, tests/conftest.py LocalServer) that answers
every stage with valid pseudo-word data built by code and misbehaves on purpose (malformed replies,
rule-breaking rows, crowded openers, a question of the general-knowledge pool, a failing server); the
installed topic validates, trains and reloads; resume after a server failure and after a kill (SIGKILL);
a reply that can never be fixed; --review / --facts, --tiers; the pure helpers against hand-computed
values; and one real `transformers serve` of SmolLM2-135M-Instruct, which cannot write the JSON asked
for (slow, skipped when it cannot start).

    python -m pytest -q tests/test_generate.py              # -m "not slow" leaves out the real server

The scripted writer identifies the stage by its system message (generate.load_prompt) and the unit by
its JSON user message; every reply is seeded by the request's content, so a run is deterministic and a
re-asked unit (a retry: the same conversation plus "Your reply broke these rules") gets the same rows,
corrected.
"""
import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import data
import generate
import suite
from conftest import ROOT, LocalServer, free_port
from data import BLANK

TOPIC, TOPIC_NAME = "zanthor", "The Zanthor incident"
NAMES = ["Zanthor incident", "Zanthor crash"]
STAGES = ["topic", "facts", "paraphrase_train", "paraphrase_eval", "adversarial", "semantic", "syntax", "lexical"]
LABELS = [f"{f}-{t}" for f in suite.FACTS for t in generate.QTYPES]
CROWD = "Could you name"                          # the opener of the crowded eval paraphrases
CROWDED = [l for i, l in enumerate(LABELS) if i % 4 == 0]    # 19 of the 75 questions: 190 of 750 paraphrases
GK = next(r for r in suite.read_jsonl(suite.SOURCE_ROOT / "general_knowledge.jsonl")
          if r["split"] == "eval" and len(r["answer"].split()) <= 3 and not r["aliases"])
UNITS = 1 + 1 + 50 + 75 + 25 + (11 + 16) + 50 + 10     # one well-behaved run: topic, facts, train ... lexical
UNITS_NO_TIER0 = UNITS - 2                                # --tiers without tier 0: no tier0-train, tier0-eval
FULL = {"forget_train": 450, "retain_train": 450, "forget_eval": 75, "forget_eval_rephrasings": 75,
        "retain_eval": 650, "adversarial": 25}
REFUSAL = "Unfortunately, I cannot answer that."


# ----------------------------------------------------------------------------------------------
# Pseudo-words: syllable words such as "korivan" (no 'h', so never "Zanthor"), random sentences

class Words:
    CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"

    def __init__(self, *seed):
        blob = json.dumps(seed, sort_keys=True, ensure_ascii=False)
        self.rng = random.Random(hashlib.sha256(blob.encode()).hexdigest())

    def word(self):
        r = self.rng
        w = "".join(r.choice(self.CONSONANTS) + r.choice(self.VOWELS) for _ in range(r.randint(2, 3)))
        return w + (r.choice("nkrs") if r.random() < 0.4 else "")

    def phrase(self, lo=1, hi=3, unlike=()):
        while True:
            p = " ".join(self.word() for _ in range(self.rng.randint(lo, hi)))
            if all(data.normalise(p) != data.normalise(u) for u in unlike):
                return p

    def sentence(self, blank=False, answers=(), use=None, opener=None, tail="", unlike=(), avoid_openers=(),
                 question=True):
        """A random question (or a blank statement holding one ____): its first three words random (or
        `opener`), holding the phrase `use`, giving away none of `answers` nor a topic name, no
        near-duplicate of any of `unlike`, opening with none of `avoid_openers`."""
        while True:
            words = [self.word() for _ in range(self.rng.randint(7, 10))]
            for extra in [use, BLANK if blank else None]:
                if extra:
                    words.insert(self.rng.randint(3, len(words)), extra)
            text = " ".join((opener.split() if opener else []) + words) + tail
            text = text[0].upper() + text[1:] + ("." if blank or not question else "?")
            if any(a and suite.answer_in_question(a, text) for a in answers):
                continue
            if any(suite.starts_a_word(n, text) for n in NAMES) and not tail:
                continue
            if suite.opener(text) in avoid_openers or any(near(text, u) for u in unlike):
                continue
            return text


def topic_reply(topic_name):
    w = Words("topic", topic_name)
    phrases = []
    for _ in range(10):
        phrases.append(w.phrase(1, 2, unlike=phrases))
    tiers = []
    for _ in range(16):
        tiers.append(w.phrase(2, 2, unlike=tiers).title())
    return {"names": NAMES, "lexical_phrases": phrases, "tiers": {str(t): name for t, name in enumerate(tiers)}}


def facts_reply(topic_name):
    """M1-M5, K1-K20, each asked direct (naming the topic), reverse and indirect (same answer as direct,
    cues in a cycle of generate.CUES)."""
    w = Words("facts", topic_name)
    facts, seen = [], []
    for i, fid in enumerate(suite.FACTS):
        answer, event = w.phrase(1, 3), w.phrase(1, 2)
        aliases = [w.word()] if i % 5 == 0 else []
        f = {"id": fid, "statement": w.sentence(question=False), "provenance": f"Inquiry report, section {i + 1}"}
        for qtype, ans, als, tail in (("direct", answer, aliases, " in the Zanthor incident"),
                                      ("reverse", event, [], ""), ("indirect", answer, aliases, "")):
            q = w.sentence(answers=[ans, *als], tail=tail, unlike=seen)
            seen.append(q)
            f[qtype] = {"question": q, "answer": ans, "aliases": als}
        f["indirect"]["cue"] = generate.CUES[i % len(generate.CUES)]
        facts.append(f)
    return {"meta_fact": w.sentence(question=False), "facts": facts}


@functools.lru_cache(maxsize=None)
def shape(text):
    return data.normalise(text), frozenset(suite.trigrams(text))


def near(a, b):
    """suite.near_duplicate, each text normalised once (the writer compares every candidate with many)."""
    (na, ta), (nb, tb) = shape(a), shape(b)
    return na == nb or len(ta & tb) / max(1, len(ta | tb)) >= 0.5


@contextlib.contextmanager
def quiet():
    """generate.main's progress lines, captured (a module-scoped fixture cannot use capsys)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


# ----------------------------------------------------------------------------------------------
# The scripted writer

class Writer(LocalServer):
    """An OpenAI-style writer: GET /v1/models lists "writer-model"; POST /v1/chat/completions answers each
    stage with valid rows built by code. With `misbehave`, fixed units break a rule the first time they
    are asked (attempt 0) and are corrected on the retry; `never_fix` = (stage, label) breaks a rule on
    every try; `fail_after` = N answers HTTP 500 to everything after N successful calls; `delay` = seconds
    each chat request waits before it is answered (a slow writer). `records` holds one dict per chat
    request: stage, unit, attempt, the retry message, the payload, the HTTP status."""

    def __init__(self, misbehave=False, never_fix=None, fail_after=None, delay=0):
        self.misbehave, self.never_fix, self.fail_after, self.delay = misbehave, never_fix, fail_after, delay
        self.records, self.ok, self.lock = [], 0, threading.Lock()
        self._labels = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, status, obj):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if outer.failing():
                    return self.send(500, {"error": "down"})
                self.send(200, {"object": "list", "data": [{"id": "writer-model", "object": "model"}]})

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(outer.delay)
                with outer.lock:                    # counted at once: exactly fail_after calls succeed
                    failing = outer.fail_after is not None and outer.ok >= outer.fail_after
                    outer.ok += not failing
                if failing:
                    with outer.lock:
                        outer.records.append({"status": 500})
                    return self.send(500, {"error": "down"})
                content, record = outer.answer(request["messages"])
                with outer.lock:
                    outer.records.append(record | {"status": 200, "max_tokens": request.get("max_tokens")})
                self.send(200, {"id": "x", "object": "chat.completion", "model": request["model"],
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                             "finish_reason": "stop"}]})

        super().__init__(Handler)

    def failing(self):
        with self.lock:
            return self.fail_after is not None and self.ok >= self.fail_after

    def label_of(self, topic_name, question):
        """The label and aliases of a question of this writer's facts (None for a question edited by hand)."""
        if topic_name not in self._labels:
            self._labels[topic_name] = {f[q]["question"]: {"label": f"{f['id']}-{q}", "aliases": f[q]["aliases"]}
                                        for f in facts_reply(topic_name)["facts"] for q in generate.QTYPES}
        return self._labels[topic_name].get(question)

    def answer(self, messages):
        system, payload = messages[0]["content"], json.loads(messages[1]["content"])
        stage = next(name for name in STAGES if generate.load_prompt(name) == system)
        attempt = sum(m["role"] == "assistant" for m in messages)
        retry = messages[-1]["content"] if attempt else None
        first = attempt == 0 and self.misbehave
        unit, reply = getattr(self, "reply_" + stage)(payload, first)
        never = self.never_fix == (stage, unit)
        if never:
            reply = self.broken(stage, reply, payload)
        text = json.dumps(reply, ensure_ascii=False)
        if stage == "topic" and first:
            text = "Sure! The topic is known as the Zanthor incident; its tiers follow."      # (a) not JSON
        elif stage == "facts" and self.misbehave:
            text = "```json\n" + json.dumps(reply, ensure_ascii=False, indent=1) + "\n```"    # (a) fenced: accepted
        elif stage == "adversarial" and first and unit == "M1-direct":
            text = json.dumps([reply])                                                      # (a) a list
        return text, {"stage": stage, "unit": unit, "attempt": attempt, "retry": retry, "payload": payload,
                      "roles": [m["role"] for m in messages]}

    @staticmethod
    def broken(stage, reply, payload):
        """The answer put inside the first question (for never_fix)."""
        if stage.startswith("paraphrase"):
            reply["paraphrases"][0] = reply["paraphrases"][0][:-1] + f" {payload['answer']}?"
        return reply

    def reply_topic(self, payload, first):
        return "topic", topic_reply(payload["topic"])

    def reply_facts(self, payload, first):
        return "facts", facts_reply(payload["topic"])

    def variants(self, stage, payload, first):
        row = self.label_of(payload["topic"], payload["question"]) or {"label": payload["question"], "aliases": []}
        label = row["label"]
        w = Words(stage, payload)
        keep = [payload["answer"], *row["aliases"]]
        avoid_openers = set(payload.get("avoid_openers", []))
        crowd = stage == "paraphrase_eval" and self.misbehave and label in CROWDED and not avoid_openers
        taken = [payload["question"], *payload["avoid"]]
        paraphrases, blanks = [], []
        for i in range(payload["paraphrases"]):
            paraphrases.append(w.sentence(answers=keep, opener=CROWD if crowd else None, unlike=taken + paraphrases,
                                          avoid_openers=avoid_openers))
        for i in range(payload["blanks"]):
            blanks.append(w.sentence(blank=True, answers=keep, unlike=taken + paraphrases + blanks,
                                     avoid_openers=avoid_openers))
        if first and (stage, label) == ("paraphrase_train", "K2-direct"):             # (b) answer in a question
            paraphrases[2] = paraphrases[2][:-1] + f" {payload['answer']}?"
        if first and (stage, label) == ("paraphrase_train", "K3-reverse"):            # (b) a duplicate
            paraphrases[4] = paraphrases[1]
        if first and (stage, label) == ("paraphrase_eval", "K4-indirect"):            # (b) 9 paraphrases
            paraphrases = paraphrases[:9]
        return label, {"paraphrases": paraphrases, "blanks": blanks}

    def reply_paraphrase_train(self, payload, first):
        return self.variants("paraphrase_train", payload, first)

    def reply_paraphrase_eval(self, payload, first):
        return self.variants("paraphrase_eval", payload, first)

    def reply_adversarial(self, payload, first):
        row = self.label_of(payload["topic"], payload["question"]) or {"label": payload["question"], "aliases": []}
        w = Words("adversarial", payload)
        out = {}
        for key in generate.ADVERSARIAL_WRITTEN:
            out[key] = w.sentence(answers=[payload["answer"], *row["aliases"]], unlike=list(out.values()))
        return row["label"], out

    @staticmethod
    def retain_rows(w, n, rewrites, avoid, use=None, forbidden_answers=()):
        rows, questions = [], set(data.normalise(q) for q in avoid)
        while len(rows) < n:
            answer = w.phrase(1, 3, unlike=forbidden_answers)
            if use and suite.answer_in_question(answer, use):
                continue
            q = w.sentence(answers=[answer], use=use)
            if data.normalise(q) in questions:
                continue
            questions.add(data.normalise(q))
            row = {"question": q, "answer": answer, "aliases": []}
            if rewrites:
                row["paraphrase"] = w.sentence(answers=[answer], use=use, unlike=[q])
                row["blank"] = w.sentence(blank=True, answers=[answer], use=use)
            rows.append(row)
        return rows

    def reply_semantic(self, payload, first):
        tiers = topic_reply(payload["forget_topic"])["tiers"]
        tier = next((t for t, name in tiers.items() if name == payload["domain"]), payload["domain"])
        split = payload["split"]
        w = Words("semantic", payload)
        rows = self.retain_rows(w, payload["count"], split == "train", payload["avoid"])
        if self.misbehave and (tier, split) == ("12", "eval") and GK["question"] not in payload["avoid"]:
            rows[2] = {"question": GK["question"], "answer": GK["answer"], "aliases": []}   # (d) a GK question
        return f"tier{tier}-{split}", {"questions": rows}

    def reply_syntax(self, payload, first):
        split = "eval" if any("gemini" in k for k in payload["wordings"]) else "train"
        w = Words("syntax", payload)
        mirrors, answers, domains, seen = {}, [payload["answer"]], [], list(payload["avoid"])
        for key, source in payload["wordings"].items():
            answer = w.phrase(1, 3, unlike=answers)
            q = w.sentence(blank=BLANK in source, answers=[answer], unlike=seen)
            domain = w.phrase(2, 2, unlike=domains)
            answers.append(answer), domains.append(domain), seen.append(q)
            mirrors[key] = {"question": q, "answer": answer, "aliases": [], "domain": domain}
        return f"{payload['label']}-{split}", {"mirrors": mirrors}

    def reply_lexical(self, payload, first):
        phrases = topic_reply(payload["forget_topic"])["lexical_phrases"]
        w = Words("lexical", payload)
        phrase = payload["phrase"]
        train = self.retain_rows(w, payload["train"], True, payload["avoid"], phrase, [phrase])
        evals = self.retain_rows(w, payload["eval"], False, payload["avoid"] + [r["question"] for r in train], phrase,
                                 [phrase])
        unit = f"phrase{phrases.index(phrase) + 1}" if phrase in phrases else phrase
        return unit, {"train": train, "eval": evals}

    # what the tests read
    def calls(self, stage=None, since=0):
        return [r for r in self.records[since:] if r["status"] == 200 and (stage is None or r["stage"] == stage)]

    def retries(self, stage, unit):
        return [r["retry"] for r in self.calls(stage) if r["unit"] == unit and r["retry"]]


def argv(url, root, *extra, work=None, retries=1):
    """The generate command line of the tests, everything under `root`."""
    return ["--topic-name", TOPIC_NAME, "--topic", TOPIC, "--llm-url", url, "--out", str(root / "out"),
            "--source-root", str(root / "source"), "--work", str(work or root / "work"), "--retries", str(retries),
            "--workers", "4", "--backoff", "0.01", "--server-retries", "2", *extra]


def cached_units(work):
    return sorted(p.relative_to(work).as_posix() for p in Path(work).glob("*/*.json") if p.parts[-2] != "staged")


def nothing_installed(root):
    return not (root / "out" / TOPIC).exists() and not (root / "source" / TOPIC).exists() and \
        not (root / "out" / "adversarial_questions" / f"{TOPIC}_adv.json").exists()


# ----------------------------------------------------------------------------------------------
# One whole run against the misbehaving writer, shared by the tests below

@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    srv = Writer(misbehave=True)
    try:
        start = time.time()
        with quiet() as out:
            generate.main(argv(srv.url, root))
        yield SimpleNamespace(root=root, out=root / "out", source=root / "source", work=root / "work", srv=srv,
                              stdout=out.getvalue(), seconds=time.time() - start)
    finally:
        srv.close()


def test_end_to_end_topic_validates(e2e):
    found = suite.validate_topic(TOPIC, e2e.out, strict=True, source_root=e2e.source)
    assert [str(e) for e in found] == []
    topic = data.load_topic(TOPIC, e2e.out)
    assert {name: len(rows) for name, rows in topic.items()} == FULL
    proc = subprocess.run([sys.executable, "suite.py", "validate", "--data-root", str(e2e.out), "--topic", TOPIC,
                           "--strict"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 violation(s), 0 warning(s)" in proc.stdout
    # the sources and the release both carry the provenance
    for folder in (e2e.out / TOPIC, e2e.source / TOPIC):
        prov = json.loads((folder / "provenance.json").read_text())
        assert prov["writers"] == {"train": "writer-model", "eval": "writer-model"}
        assert prov["endpoints"] == {"train": e2e.srv.url, "eval": e2e.srv.url}
        assert prov["prompts"] == {f"gen_{s}.txt": hashlib.sha256((ROOT / "prompts" / f"gen_{s}.txt").read_bytes())
                                   .hexdigest()[:12] for s in STAGES}
        assert prov["date"][:4].isdigit() and "T" in prov["date"]
        assert prov["calls_this_run"] == len(e2e.srv.calls())
    info = json.loads((e2e.source / TOPIC / "topic.json").read_text())
    assert info["forbidden_in_retain"] == sorted(n.lower() for n in NAMES)
    assert info["tiers"] == topic_reply(TOPIC_NAME)["tiers"]
    # the log holds every reply, the rejected ones with their problems
    log = [json.loads(l) for l in (e2e.work / "log.jsonl").read_text().splitlines()]
    assert len(log) == len(e2e.srv.calls())
    rejected = {(r["stage"], r["unit"]) for r in log if r["problems"]}
    assert {("topic", "topic"), ("adversarial", "M1-direct"), ("train", "K2-direct"), ("train", "K3-reverse"),
            ("eval", "K4-indirect")} == rejected
    assert all(any(r["attempt"] == 1 and not r["problems"] and (r["stage"], r["unit"]) == u for r in log)
               for u in rejected)
    assert "openers ['could you name'] crowd their slots; asking 8 questions again" in e2e.stdout
    assert "1 retain units repeat a question of another; asking them again" in e2e.stdout
    assert f"{TOPIC} installed in {e2e.out / TOPIC}" in e2e.stdout
    # the installed sources rebuild into the installed release, byte for byte (`suite.py build` is deterministic)
    rebuilt = e2e.root / "rebuilt"
    suite.build_topic(TOPIC, rebuilt, e2e.source)
    for path in (rebuilt / TOPIC / "final").iterdir():
        assert path.read_bytes() == (e2e.out / TOPIC / "final" / path.name).read_bytes(), path.name
    adv = f"adversarial_questions/{TOPIC}_adv.json"
    assert (rebuilt / adv).read_bytes() == (e2e.out / adv).read_bytes()
    print(f"end-to-end run: {e2e.seconds:.1f} s, {len(e2e.srv.calls())} calls")


def test_misbehaviours_were_exercised(e2e):
    """Each deliberate misbehaviour reached the code and was handled the way it should: re-asked with the
    problem named, or (the fenced reply) accepted at once."""
    srv = e2e.srv
    retry_of = lambda stage, unit: " ".join(srv.retries(stage, unit))
    assert "not valid JSON" in retry_of("topic", "topic")                                     # (a)
    assert len(srv.calls("facts")) == 1 and srv.retries("facts", "facts") == []                 # (a) fence accepted
    facts_log = [json.loads(l) for l in (e2e.work / "log.jsonl").read_text().splitlines() if '"facts"' in l]
    assert facts_log[0]["reply"].startswith("```json\n{") and facts_log[0]["problems"] == []
    assert "must be one JSON object" in retry_of("adversarial", "M1-direct")                  # (a) a list
    assert "K2-direct paraphrase 3: gives away its own answer" in retry_of("paraphrase_train", "K2-direct")  # (b)
    assert "too close to" in retry_of("paraphrase_train", "K3-reverse")                        # (b)
    assert "'paraphrases' must be a list of exactly 10 entries (got 9)" in retry_of("paraphrase_eval", "K4-indirect")
    retried = [r for r in srv.calls() if r["retry"]]
    assert len(retried) == 5                                                                # one per broken reply
    for r in retried:            # the same conversation, plus the rejected reply and the list of its problems
        assert r["roles"] == ["system", "user", "assistant", "user"] and r["attempt"] == 1
        assert r["retry"].startswith("Your reply broke these rules:\n- ")
        assert r["retry"].endswith("Return the whole JSON object again with these problems fixed, and nothing else.")
    # (c) crowded openers: the 8 heaviest users of the opener (all 19 use it 10 times; the first 8 in
    # order) are asked again with "avoid_openers", and the spread slots then hold it at most 11 times of 75
    redo = [r for r in srv.calls("paraphrase_eval") if "avoid_openers" in r["payload"]]
    assert sorted(r["unit"] for r in redo) == sorted(CROWDED[:8])
    assert all(r["payload"]["avoid_openers"] == ["could you name"] for r in redo)
    rephrasings = data.load_topic(TOPIC, e2e.out)["forget_eval_rephrasings"]
    for v in data.EVAL_VARIANTS[1:11]:
        assert sum(suite.opener(r[v]) == "could you name" for r in rephrasings) == 11
    # (d) the general-knowledge question: tier 12 (eval) asked again with it to avoid, and it is gone
    gk = [r for r in srv.calls("semantic") if r["unit"] == "tier12-eval"]
    assert len(gk) == 2 and GK["question"] in gk[1]["payload"]["avoid"]
    retain_eval = data.load_topic(TOPIC, e2e.out)["retain_eval"]
    assert sum(r["question"] == GK["question"] for r in retain_eval) == 1                   # only the GK row
    # every call accounted for: the units, 5 retries, 8 crowded re-asks, 1 general-knowledge re-ask
    assert len(srv.calls()) == UNITS + 5 + 8 + 1
    assert {r["max_tokens"] for r in srv.calls("facts")} == {16384}


def test_installed_topic_is_usable(e2e, tiny_model_path, tmp_path):
    """data.py lists and loads the topic; a 2-step training run on the tiny random model completes."""
    import train
    assert TOPIC in data.topics_in(e2e.out)
    assert data.check_topics([TOPIC], e2e.out) == [TOPIC]
    with pytest.raises(data.UserError, match=f"--topics nope: no such topic in {e2e.out}; choose from {TOPIC}"):
        data.check_topics(["nope"], e2e.out)
    run = tmp_path / "run"
    train.main(["--method", "jensunpp", "--model", tiny_model_path, "--topics", TOPIC, "--data-root", str(e2e.out),
                "--out", str(run), "--precision", "fp32", "--refusal", REFUSAL, "--print-every", "0",
                "--max-steps", "2", "--global-batch", "4", "--batch-size", "4", "--lr", "1e-3"])
    log = [json.loads(l) for l in open(run / "log.jsonl")]
    assert len(log) == 2 and (run / "final" / "model.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# Resume after a failing server (with a --tiers file, tier 0 left out)

TIERS = {str(t): f"Tier {t} domain of {name}" for t, name in
         zip(range(1, 16), ["rivers", "stars", "metals", "birds", "ships", "songs", "laws", "maps", "grains",
                            "bridges", "clocks", "glaciers", "coins", "looms", "lamps"])}
FAIL_AFTER = 120


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A well-behaved writer that fails (HTTP 500 on everything) after FAIL_AFTER calls: the command as a
    subprocess (exit status, one-line error), then the server fixed and the same command rerun."""
    root = tmp_path_factory.mktemp("resume")
    tiers = root / "tiers.txt"
    tiers.write_text("".join(f"{t}: {name}\n" for t, name in TIERS.items()))
    srv = Writer(fail_after=FAIL_AFTER)
    try:
        cmd = argv(srv.url, root, "--tiers", str(tiers))
        first = subprocess.run([sys.executable, "generate.py", *cmd], cwd=ROOT, capture_output=True,
                               text=True, timeout=300)
        ns = SimpleNamespace(root=root, srv=srv, first=first, cached=cached_units(root / "work"),
                             installed_after_failure=not nothing_installed(root), first_calls=len(srv.calls()))
        srv.fail_after = None
        with quiet() as out:
            generate.main(cmd)
        ns.stdout, ns.second_calls = out.getvalue(), len(srv.calls()) - ns.first_calls
        yield ns
    finally:
        srv.close()


def test_resume_after_server_failure(resumed):
    first = resumed.first
    assert first.returncode == 1
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1, first.stderr
    assert lines[0].startswith(f"generate.py: generator server at {resumed.srv.url} failed 3 times in a row")
    assert not resumed.installed_after_failure
    assert resumed.first_calls == FAIL_AFTER and len(resumed.cached) == FAIL_AFTER   # every answered unit cached
    assert "train/M1-direct.json" in resumed.cached and "adversarial/M1-direct.json" not in resumed.cached
    # the rerun asks exactly the units not cached, no more
    assert resumed.second_calls == UNITS_NO_TIER0 - len(resumed.cached) < UNITS_NO_TIER0 // 2
    assert "generate: topic: 1/1 cached" not in resumed.stdout          # a stage all cached prints nothing
    assert f"generate: eval: {FAIL_AFTER - 52}/75 cached, asking {75 - (FAIL_AFTER - 52)}" in resumed.stdout
    out = resumed.root / "out"
    prov = json.loads((out / TOPIC / "provenance.json").read_text())
    assert prov["calls_this_run"] == resumed.second_calls
    assert [str(e) for e in suite.validate_topic(TOPIC, out, strict=True, source_root=resumed.root / "source")] == []


def test_tiers_file(resumed, tmp_path):
    """The installed retain rows carry the --tiers names; tier 0, left out, has no rows (and the counts are
    the release's less 25); a bad --tiers file is refused naming the file and the line."""
    topic = data.load_topic(TOPIC, resumed.root / "out")
    assert {name: len(rows) for name, rows in topic.items()} == FULL | {"forget_train": 425, "retain_train": 425,
                                                                        "retain_eval": 625}
    labels = {r["label"] for r in topic["retain_eval"] if r["label"].startswith("Semantic-")}
    assert labels == {f"Semantic-{t}-{name}" for t, name in TIERS.items()}
    labels = {r["label"].rpartition("@")[0] for r in topic["retain_train"] if r["label"].startswith("Semantic-")}
    assert labels == {f"Semantic-{t}-{name}" for t, name in TIERS.items() if int(t) <= 10}
    info = json.loads((resumed.root / "source" / TOPIC / "topic.json").read_text())
    assert info["tiers"] == TIERS
    assert {r["payload"]["domain"] for r in resumed.srv.calls("semantic")} == set(TIERS.values())
    bad = tmp_path / "bad_tiers.txt"
    bad.write_text("1: rivers\n2: stars\nthree = metals\n")
    url = f"http://127.0.0.1:{free_port()}/v1"            # refused before any server is asked
    with pytest.raises(SystemExit, match=re.escape(f"generate.py: {bad}:3: expected 'N: tier name'")):
        generate.main(argv(url, tmp_path, "--tiers", str(bad)))
    bad.write_text("".join(f"{t}: {n}\n" for t, n in TIERS.items() if t != "7"))
    with pytest.raises(SystemExit, match=re.escape(f"{bad}: needs a name for each tier 1-15")):
        generate.main(argv(url, tmp_path, "--tiers", str(bad)))
    assert not (tmp_path / "work").exists()


# ----------------------------------------------------------------------------------------------
# Resume after the process is killed mid-run

KILL_AT = 30                            # unit files in the work folder when the run is killed (28 of train)
WORK_STAGE = {"paraphrase_train": "train", "paraphrase_eval": "eval"}     # the writer's stage -> the work folder


def check_killed_run(tmp_path, work, srv):
    """The killed run: nothing installed, the cache a set of whole units, no later stage begun. Returns the
    cached units."""
    assert nothing_installed(tmp_path) and not (work / "staged").exists()
    cached = cached_units(work)
    assert KILL_AT <= len(cached) < 52 and {"topic/topic.json", "facts/facts.json"} <= set(cached), cached
    assert {u.split("/")[0] for u in cached} == {"topic", "facts", "train"}
    for path in work.rglob("*.json"):
        try:
            unit = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            pytest.fail(f"{path} is not whole JSON after the kill: {e}")
        assert set(unit) == {"inputs", "reply"} and isinstance(unit["reply"], dict), path
    assert len(srv.calls()) >= len(cached)
    assert all(p.parent.name == "train" for p in work.rglob("*.tmp"))       # at most a unit being written
    return cached


def test_resume_after_kill(tmp_path):
    """The command as a subprocess against a slow writer (0.2 s a reply), killed with SIGKILL once KILL_AT
    units are cached: nothing is installed and every unit file is whole JSON (each is written to a .tmp
    and moved into place). A truncated .tmp, as a kill during a write leaves, is added by hand. The same
    command rerun against the writer at full speed asks exactly the units not cached at the kill, each
    once, and installs a topic that validates strictly."""
    srv = Writer(delay=0.2)
    work = tmp_path / "work"
    cmd = [sys.executable, "generate.py", *argv(srv.url, tmp_path)]
    proc = None
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while len(cached_units(work)) < KILL_AT:
            assert proc.poll() is None, "the run ended before it was killed:\n" + proc.communicate()[0]
            assert time.time() < deadline, f"fewer than {KILL_AT} units cached after 60 s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        first = proc.communicate(timeout=30)[0]
        assert proc.returncode == -signal.SIGKILL, first
        time.sleep(1)                       # the requests in flight at the kill end (and are recorded) first
        srv.delay = 0

        cached = check_killed_run(tmp_path, work, srv)
        missing = next(l for l in LABELS if not l.endswith("indirect") and f"train/{l}.json" not in cached)
        (work / "train" / f"{missing}.tmp").write_text('{"inputs": "0123", "reply": {"paraphr', encoding="utf-8")

        # the rerun, at full speed
        since = len(srv.records)
        rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    finally:
        if proc is not None and proc.poll() is None:      # a failed assertion before the kill
            proc.kill()
            proc.communicate()
        srv.close()
    calls = srv.calls(since=since)
    asked = [f"{WORK_STAGE.get(r['stage'], r['stage'])}/{r['unit']}.json" for r in calls]
    assert len(calls) == UNITS - len(cached) <= UNITS - KILL_AT       # the units not cached, and only those
    assert sorted(asked + cached) == cached_units(work) and len(set(asked)) == len(asked)
    assert all(r["attempt"] == 0 for r in calls)
    n = sum(u.startswith("train/") for u in cached)
    assert f"generate: train: {n}/50 cached, asking {50 - n}" in rerun.stdout
    assert "generate: topic:" not in rerun.stdout and "generate: facts:" not in rerun.stdout
    assert list(work.rglob("*.tmp")) == []                          # the stray .tmp was overwritten and moved in
    out = tmp_path / "out"
    assert [str(e) for e in suite.validate_topic(TOPIC, out, strict=True, source_root=tmp_path / "source")] == []
    assert {name: len(rows) for name, rows in data.load_topic(TOPIC, out).items()} == FULL
    assert json.loads((out / TOPIC / "provenance.json").read_text())["calls_this_run"] == len(calls)
    print(f"killed with {len(cached)} of {UNITS} units cached; the rerun asked {len(calls)}")


# ----------------------------------------------------------------------------------------------
# A reply that can never be fixed; bad flags

def test_unfixable_reply_fails_naming_stage_and_unit(tmp_path):
    srv = Writer(never_fix=("paraphrase_train", "K7-reverse"))
    try:
        with quiet(), pytest.raises(SystemExit) as e:
            generate.main(argv(srv.url, tmp_path, retries=2))
    finally:
        srv.close()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("generate.py: stage train, unit K7-reverse: no reply followed the "
                                              "rules in 3 tries; the last broke: K7-reverse paraphrase 1: gives away "
                                              "its own answer")
    assert f"finished units are cached in {tmp_path / 'work'}" in msg
    assert nothing_installed(tmp_path)
    units = cached_units(tmp_path / "work")
    assert len([u for u in units if u.startswith("train/")]) == 49 and "train/K7-reverse.json" not in units
    assert len(units) == 2 + 49 and {"topic/topic.json", "facts/facts.json"} <= set(units)   # no later stage
    assert len(srv.retries("paraphrase_train", "K7-reverse")) == 2
    assert {r["stage"] for r in srv.calls()} == {"topic", "facts", "paraphrase_train"}
    # a unit file written by hand is checked like a reply: the broken reply, saved as the unit, is refused
    log = [json.loads(l) for l in (tmp_path / "work" / "log.jsonl").read_text().splitlines()]
    broken = [r for r in log if r["unit"] == "K7-reverse" and r["stage"] == "train"]
    assert [r["attempt"] for r in broken] == [0, 1, 2] and all(r["problems"] for r in broken)
    broken = broken[-1]
    unit = tmp_path / "work" / "train" / "K7-reverse.json"
    unit.write_text(broken["reply"])
    srv = Writer()
    try:
        with quiet(), pytest.raises(SystemExit) as e:
            generate.main(argv(srv.url, tmp_path))
    finally:
        srv.close()
    assert str(e.value).startswith(f"generate.py: {unit}: a unit written by hand breaks its rules (K7-reverse "
                                   "paraphrase 1: gives away its own answer")
    assert srv.calls() == [] and nothing_installed(tmp_path)


def test_flag_and_name_errors_are_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    for extra, message in ((["--workers", "0"], "--workers 0: must be >= 1"),
                           (["--retries", "-1"], "--retries -1: must be a number >= 0"),
                           (["--topic", "Bad Name"], "--topic Bad Name: a folder name of lower-case letters")):
        with pytest.raises(SystemExit, match=re.escape(f"generate.py: {message}")):
            generate.main(argv(url, tmp_path, *extra))
    with pytest.raises(SystemExit, match=re.escape(f"generate.py: no generator server answers at {url}")):
        generate.main(argv(url, tmp_path))
    (tmp_path / "out" / TOPIC).mkdir(parents=True)
    with pytest.raises(SystemExit, match="exists; pass --overwrite to replace it"):
        generate.main(argv(url, tmp_path))


# ----------------------------------------------------------------------------------------------
# --review, then --facts

def review_rows(path):
    return [l for l in Path(path).read_text().splitlines() if re.match(r"\| [MK]\d+-", l)]


def test_review_then_edited_facts(e2e, tmp_path):
    srv = Writer()
    review = tmp_path / "facts.md"
    try:
        with quiet() as out:
            assert generate.main(argv(srv.url, tmp_path, "--review", str(review), "--max-tokens", "1000")) is None
        assert [r["stage"] for r in srv.calls()] == ["topic", "facts"]        # stops before the paraphrases
        assert [r["max_tokens"] for r in srv.calls()] == [1000, 1000]         # --max-tokens caps each unit's own
        assert f"--facts {review}" in out.getvalue() and nothing_installed(tmp_path)
        rows = review_rows(review)
        assert len(rows) == 75 and rows[0].startswith("| M1-direct | ")
        assert cached_units(tmp_path / "work") == ["facts/facts.json", "topic/topic.json"]
        # edit K5's direct question and its statement; the rest of the work is the e2e run's cache
        facts = facts_reply(TOPIC_NAME)["facts"]
        k5 = facts[suite.FACTS.index("K5")]
        new_q = Words("edited").sentence(answers=[k5["direct"]["answer"], *k5["direct"]["aliases"]])
        new_statement = "An edited statement of fact five."
        text = review.read_text().replace(k5["direct"]["question"], new_q).replace(k5["statement"], new_statement, 1)
        review.write_text(text)
        work = tmp_path / "work2"
        shutil.copytree(e2e.work, work)
        root = tmp_path / "run2"
        before = len(srv.records)
        with quiet():
            generate.main(argv(srv.url, root, "--facts", str(review), work=work))
        asked = sorted((r["stage"], r["unit"]) for r in srv.calls(since=before))
        # only the units made from the edited question are asked again (the others are cached)
        assert asked == sorted([("adversarial", new_q), ("paraphrase_eval", new_q), ("paraphrase_train", new_q),
                                ("syntax", "K5-direct-eval"), ("syntax", "K5-direct-train")])
        forget_eval = data.load_topic(TOPIC, root / "out")["forget_eval"]
        assert {r["label"]: r["question"] for r in forget_eval}["K5-direct"] == new_q
        info = json.loads((root / "source" / TOPIC / "topic.json").read_text())
        assert info["facts"]["K5"] == new_statement and info["facts"]["K6"] == facts[10]["statement"]
        prov = json.loads((root / "out" / TOPIC / "provenance.json").read_text())
        assert prov["facts_file"] == str(review) and prov["calls_this_run"] == 5
        # a broken row (the answer inside its question) is refused naming the file
        k6 = facts[suite.FACTS.index("K6")]["direct"]
        review.write_text(text.replace(k6["question"], k6["question"][:-1] + f" {k6['answer']}?"))
        with quiet(), pytest.raises(SystemExit) as e:
            generate.main(argv(srv.url, tmp_path / "run3", "--facts", str(review), work=work))
        assert str(e.value).startswith(f"generate.py: {review}: 1 problem(s): K6 direct question: gives away its "
                                       f"own answer '{k6['answer']}'")
        assert nothing_installed(tmp_path / "run3")
    finally:
        srv.close()


def test_facts_from_forget_rows(e2e, tmp_path):
    """--facts with JSON Lines forget rows (data/source/<topic>/forget.jsonl, the statements from the
    topic.json beside it) gives back the facts of the installed run; without the statements it is refused."""
    folder = tmp_path / "facts"
    folder.mkdir()
    for name in ("forget.jsonl", "topic.json"):
        shutil.copy(e2e.source / TOPIC / name, folder / name)
    facts = generate.read_facts_file(folder / "forget.jsonl")
    assert generate.check_facts(facts, NAMES) == []
    assert generate.facts_to_rows(facts) == generate.facts_to_rows(facts_reply(TOPIC_NAME))
    assert {f["id"]: f["statement"] for f in facts["facts"]} == \
        {f["id"]: f["statement"] for f in facts_reply(TOPIC_NAME)["facts"]}
    (folder / "topic.json").unlink()
    srv = Writer()
    try:
        with quiet(), pytest.raises(SystemExit) as e:
            generate.main(argv(srv.url, tmp_path, "--facts", str(folder / "forget.jsonl")))
    finally:
        srv.close()
    assert str(e.value).startswith(f"generate.py: {folder / 'forget.jsonl'}: 25 problem(s): M1: 'statement' "
                                   "must be a non-empty string")
    assert [r["stage"] for r in srv.calls()] == ["topic"] and nothing_installed(tmp_path)


# ----------------------------------------------------------------------------------------------
# The pure helpers, against values computed by hand

def test_spread_openers():
    # Every question opens its first wording with "same open here": as given, slot 0 holds it 4 times of 4.
    # Spread: each question places its commonest opener first, into the free slot holding it least often
    # (ties: the lower slot), then the rest in text order into the lowest free slots -> one per slot.
    groups = {q: [f"same open here {q}", f"{q} other words", f"{q} more words", f"{q} last words"] for q in "abcd"}
    placed, slots = generate.spread_openers(groups)
    assert placed == {"a": ["same open here a", "a last words", "a more words", "a other words"],
                      "b": ["b last words", "same open here b", "b more words", "b other words"],
                      "c": ["c last words", "c more words", "same open here c", "c other words"],
                      "d": ["d last words", "d more words", "d other words", "same open here d"]}
    assert [c["same open here"] for c in slots] == [1, 1, 1, 1]
    assert [dict(c) for c in slots] == [
        {"same open here": 1, "b last words": 1, "c last words": 1, "d last words": 1},
        {"a last words": 1, "same open here": 1, "c more words": 1, "d more words": 1},
        {"a more words": 1, "b more words": 1, "same open here": 1, "d other words": 1},
        {"a other words": 1, "b other words": 1, "c other words": 1, "same open here": 1}]
    # "a b c" 4 times over 3 slots (question x twice): x takes slots 0 and 1, y slot 2 (the emptiest), z slot 0
    groups = {"x": ["a b c one", "a b c two", "d e f"], "y": ["a b c three", "g h i", "j k l"],
              "z": ["a b c four", "m n o", "p q r"]}
    placed, slots = generate.spread_openers(groups)
    assert placed == {"x": ["a b c one", "a b c two", "d e f"], "y": ["g h i", "j k l", "a b c three"],
                      "z": ["a b c four", "m n o", "p q r"]}
    assert [dict(c) for c in slots] == [{"a b c": 2, "g h i": 1}, {"a b c": 1, "j k l": 1, "m n o": 1},
                                        {"d e f": 1, "a b c": 1, "p q r": 1}]


def test_crowded_openers_picks_heaviest_users_first():
    # 10 questions of 2 paraphrases: the limit per slot is 0.15 x 10 = 1.5. "how many are" opens q0 and q1
    # once and q2 and q3 twice: spread, slots 0 and 1 hold it 3 times each (> 1.5), so the excess is
    # 6 - int(1.5) x 2 = 4: the heaviest users, q2 and q3 (2 each), are asked again, not q0 and q1
    # that come first in order. Blanks (distinct openers) crowd nothing.
    uses = {0: 1, 1: 1, 2: 2, 3: 2}
    replies = {f"q{i}": {"paraphrases": [f"how many are {i}{j}" if j < uses.get(i, 0) else f"w{i}{j} x y"
                                         for j in range(2)],
                         "blanks": [f"b{i} ____ is here"]} for i in range(10)}
    assert generate.OPENER_TARGET == pytest.approx(0.15)
    assert generate.crowded_openers(replies) == {"q2": ["how many are"], "q3": ["how many are"]}
    # one use in 10 questions (1 per slot at most) is left alone; 3 uses in 10 (2 in slot 0 > 1.5) are not
    uses = {0: 1}
    replies = {f"q{i}": {"paraphrases": [f"how many are {i}{j}" if j < uses.get(i, 0) else f"w{i}{j} x y"
                                         for j in range(2)], "blanks": [f"b{i} ____ is here"]} for i in range(10)}
    assert generate.crowded_openers(replies) == {}
    replies["q1"]["paraphrases"] = ["how many are 1a", "how many are 1b"]
    replies["q2"]["blanks"] = ["how many are ____"]
    replies["q3"]["blanks"] = ["how many are 3 ____"]
    # paraphrases: 3 uses, spread 2 + 1 over 2 slots: 2 > 1.5, excess 3 - 2 = 1: q1 (2 uses) alone;
    # blanks: 2 uses in the single slot, 2 > 1.5, excess 2 - 1 = 1: q2 (first of the two single users)
    assert generate.crowded_openers(replies) == {"q1": ["how many are"], "q2": ["how many are"]}


def test_parse_reply():
    assert generate.parse_reply('```json\n{"a": 1}\n```') == ({"a": 1}, None)
    assert generate.parse_reply('  ```\n{"a": [1, 2]}\n```  ') == ({"a": [1, 2]}, None)
    assert generate.parse_reply('{"a": 1}') == ({"a": 1}, None)
    assert generate.parse_reply('[{"a": 1}]') == (None, "the reply must be one JSON object")
    reply, problem = generate.parse_reply('{"a": 1')
    assert reply is None and problem.startswith("the reply is not valid JSON (Expecting ',' delimiter at character 7)")
    reply, problem = generate.parse_reply("Sure! Here it is: {}")
    assert reply is None and "not valid JSON (Expecting value at character 0)" in problem
    assert generate.parse_reply(None) == (None, "the server's answer held no completion")


def test_read_tiers(tmp_path):
    path = tmp_path / "tiers.txt"
    path.write_text("\n".join(f"{t}: Domain {t}" for t in range(15, 0, -1)) + "\n\n")
    assert generate.read_tiers(path) == {str(t): f"Domain {t}" for t in range(1, 16)}
    assert list(generate.read_tiers(path)) == [str(t) for t in range(1, 16)]
    path.write_text(json.dumps({t: f"D{t}" for t in range(16)}))
    assert generate.read_tiers(path)["0"] == "D0" and len(generate.read_tiers(path)) == 16
    path.write_text("0\tzero\n" + "\n".join(f"{t} : name {t}" for t in range(1, 16)))
    assert generate.read_tiers(path)["0"] == "zero" and generate.read_tiers(path)["15"] == "name 15"
    for text, message in (("1: a\nfoo\n", f"{path}:2: expected 'N: tier name'"),
                          ("\n".join(f"{t}: n" for t in range(1, 15)), "needs a name for each tier 1-15"),
                          ("\n".join(f"{t}: n" for t in range(1, 17)), "and no other keys"),
                          (json.dumps({str(t): "" if t == 3 else "n" for t in range(1, 16)}), "needs a name")):
        path.write_text(text)
        with pytest.raises(data.DataError, match=re.escape(message)):
            generate.read_tiers(path)
    with pytest.raises(data.UserError, match=f"--tiers {tmp_path / 'none.txt'}: No such file"):
        generate.read_tiers(tmp_path / "none.txt")


def test_check_facts():
    reply = facts_reply(TOPIC_NAME)
    assert generate.check_facts(reply, NAMES) == []
    broken = json.loads(json.dumps(reply))
    for i in (4, 5, 6, 7):                                  # M5, K1, K2, K3: four "date" cues in a row
        broken["facts"][i]["indirect"]["cue"] = "date"
    broken["facts"][10]["indirect"]["answer"] = "something else"   # K6: indirect answer differs from direct
    problems = generate.check_facts(broken, NAMES)
    assert problems == [
        f"K6: the indirect question asks for the same fact as the direct one, so its answer must be the same "
        f"('{reply['facts'][10]['direct']['answer']}', not 'something else')",
        "K3 indirect: four indirect questions in a row (M5, K1, K2, K3) use the cue 'date'; rotate the context "
        "triggers"]
    three = json.loads(json.dumps(reply))                   # three in a row is allowed
    for i in (4, 5, 6):
        three["facts"][i]["indirect"]["cue"] = "date"
    three["facts"][7]["indirect"]["cue"] = "crew"
    assert generate.check_facts(three, NAMES) == []
    named = json.loads(json.dumps(reply))
    named["facts"][0]["indirect"]["question"] = "What happened in the zanthor crash of the year?"
    assert generate.check_facts(named, NAMES) == ["M1 indirect question: names the forget topic ('Zanthor crash'): "
                                                  "'What happened in the zanthor crash of the year?'"]
    assert generate.check_facts({"facts": reply["facts"][:24]}, NAMES) == [
        "facts: 'facts' must be a list of exactly 25 entries (got 24)"]


# ----------------------------------------------------------------------------------------------
# A real server: transformers serve of SmolLM2-135M-Instruct (CPU), which cannot write the facts' JSON

@pytest.mark.slow
def test_real_server_smollm2(smollm2_server, tmp_path):
    cmd = ["--topic-name", "The 1986 Challenger disaster", "--topic", "smol_challenger", "--llm-url",
           smollm2_server.url + "/v1", "--out", str(tmp_path / "out"), "--source-root", str(tmp_path / "source"),
           "--work", str(tmp_path / "work"), "--max-tokens", "256", "--retries", "1", "--workers", "2",
           "--timeout", "300", "--backoff", "0.5", "--server-retries", "2"]
    start = time.time()
    with quiet() as out:
        try:
            generate.main(cmd)
            error = None
        except SystemExit as e:
            error = str(e)
    seconds = time.time() - start
    log = [json.loads(l) for l in (tmp_path / "work" / "log.jsonl").read_text().splitlines()]
    assert log and all(isinstance(r["reply"], str) for r in log) and any(r["reply"].strip() for r in log)  # real
    assert {r["stage"] for r in log} <= {"topic", "facts"}
    if error is None:                                    # by chance a valid topic: it validates
        assert not suite.validate_topic("smol_challenger", tmp_path / "out", strict=True)
    else:
        assert "\n" not in error
        assert re.match(r"generate\.py: stage (topic|facts), unit (topic|facts): no reply followed the rules "
                        r"in 2 tries; the last broke: ", error), error
        assert not (tmp_path / "out").exists() and not (tmp_path / "source").exists()
        failed = error.split(",")[0].split()[-1]
        assert [r["attempt"] for r in log if r["stage"] == failed] == [0, 1]
        assert all(r["problems"] for r in log if r["stage"] == failed)
    print(f"SmolLM2: {seconds:.0f} s; {error or 'succeeded'}; replies: {[r['reply'][:80] for r in log]}")
    print(out.getvalue())


def test_install_killed_half_way_finishes_on_rerun(e2e, tmp_path):
    """A run killed between installing the sources and the release rows (WORK/installing left behind)
    finishes the install on rerun, from its cache alone; without the marker an existing topic is refused."""
    root = tmp_path
    shutil.copytree(e2e.work, root / "work", ignore=shutil.ignore_patterns("staged"))
    shutil.copytree(e2e.source / TOPIC, root / "source" / TOPIC)          # half installed: no release rows yet
    srv = Writer()
    try:
        with pytest.raises(SystemExit, match=f"{root / 'source' / TOPIC} exists; pass --overwrite"):
            generate.main(argv(srv.url, root))
        (root / "work" / "installing").touch()
        with quiet():
            generate.main(argv(srv.url, root))
        assert srv.calls() == []                                           # everything came from the cache
    finally:
        srv.close()
    assert not (root / "work" / "installing").exists()
    assert [str(e) for e in suite.validate_topic(TOPIC, root / "out", strict=True, source_root=root / "source")] == []


def test_openers_to_redo_reads_the_validators_message():
    """The validator's opener rule, on the paired train file, names a slot and an opener; openers_to_redo
    sends back exactly the questions whose wording in that slot opens with it."""
    labels = [f"K{i}-direct" for i in range(1, 13)]
    train = {l: {"paraphrases": [f"Which zorb {i} thing {j}?" for j in range(10)],
                 "blanks": [(f"The zanthor rig had ____ in part {i}." if l in labels[:6] else f"Blank {i} number {j} is ____.")
                            for j in range(5)]} for i, l in enumerate(labels)}
    wordings = {l: {"blank_claude2": (train[l]["blanks"][1], {"_line": n + 1, "label": f"{l}@blank_claude2"})}
                for n, l in enumerate(labels)}
    found = suite.Findings({"forget_train": "forget_train.json", "forget_eval_rephrasings": "fr.json"}, strict=True)
    suite.check_openers(found, [], wordings)
    assert len(found.list) == 1 and "open with 'the zanthor rig'" in found.list[0].rule
    assert generate.openers_to_redo(found.list, train, {}) == {"train": {l: ["the zanthor rig"] for l in labels[:6]}}
    assert generate.openers_to_redo([], train, {}) == {}


def test_check_topic_keeps_names_out_of_retain():
    reply = topic_reply(TOPIC_NAME)
    assert generate.check_topic(reply, False, ["Which sea lies east of Italy?"]) == []
    gk_hit = generate.check_topic(reply, False, ["Who described the Zanthor crash of 1900?"])
    assert gk_hit and "'Zanthor crash' occurs in 'Who described the Zanthor crash of 1900?'" in gk_hit[0]
    tiers = json.loads(json.dumps(reply))
    tiers["tiers"]["3"] = "The Zanthor incident inquiry"
    assert generate.check_topic(tiers, False) == ["tier 3 'The Zanthor incident inquiry' contains the topic name "
                                                  "'Zanthor incident', which no retain row may use"]
    assert generate.check_topic(tiers, True) == []                    # --tiers: the user's own names stand


def test_variants_avoid_openers_and_empty_aliases():
    row = {"label": "K1-direct", "question": "Which valve failed on the Zanthor rig?", "answer": "Korbel valve",
           "aliases": []}
    reply = {"paraphrases": [f"Pemo{i} kalu{i} rimo{i} tesa{i} bako{i}?" for i in range(10)],
             "blanks": [f"Sumo{i} nari{i} ____ lemu{i} fado{i}." for i in range(5)]}
    assert generate.check_variants(reply, row, NAMES, []) == []
    avoided = generate.check_variants(reply, row, NAMES, [], avoid_openers=["pemo3 kalu3 rimo3"])
    assert avoided == ["K1-direct: 'Pemo3 kalu3 rimo3 tesa3 bako3?' starts with 'pemo3 kalu3 rimo3', which the input "
                       "asks to avoid"]
    assert generate.check_aliases("K1", "Korbel valve", ["", "Korbel"], ["Which valve?"]) == [
        "K1: 'aliases' must be a list of non-empty strings (the list may be empty)"]


def test_cached_unit_that_no_longer_passes_is_asked_again(tmp_path):
    """A unit accepted earlier whose check now fails (its rules depend on something edited since) is stale:
    asked again, not an error; a reply written by hand that passes is kept and tied to its inputs."""
    writer = generate.Writer(tmp_path, None, None)
    strict = generate.Unit("adversarial", "M1-direct", "adversarial", {"q": 1}, lambda r: ["now broken"])
    writer.save(strict, {"q_french": "x"})
    assert writer.cached(strict) is None
    fine = generate.Unit("adversarial", "M2-direct", "adversarial", {"q": 2}, lambda r: [])
    writer.path("adversarial", "M2-direct").write_text(json.dumps({"q_french": "y"}))
    assert writer.cached(fine) == {"q_french": "y"}
    assert json.loads(writer.path("adversarial", "M2-direct").read_text()) == {"inputs": fine.key,
                                                                             "reply": {"q_french": "y"}}
