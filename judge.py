"""LLM judge for forget, retain, gibberish and RGQ (paper, appendix "Judge" and "Judge Prompts"): the
client of any OpenAI-compatible server, its rubrics, parsing, cache and retries.

    judge = make_judge("http", url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3.5-35B-A3B")
    judge.verdicts("forget", [{"question": q, "ground_truth": gt, "answer": a}, ...])  # YES/NO/INVALID
    judge.compare([{"instruction": i, "response_a": x, "response_b": y}, ...])        # A/B/tie/INVALID

The paper judges with Qwen3.5-35B-A3B (no thinking) behind an OpenAI-compatible server (vLLM, SGLang;
`transformers serve` works for small models). The four system prompts, prompts/judge_forget.txt,
judge_retain.txt, judge_gibberish.txt and judge_rgq.txt, restate the paper's prompts in our own words,
keeping every rule, example and output format. make_judge("heuristic") gives the offline stand-in
(heuristic.py; its numbers are approximate), and `python report.py agree ROWS.jsonl` measures any judge
against the verdicts of a judged rows file. The compare() verdicts of both orders become RGQ in
utility.rgq (eq. 10).

Verdicts are cached on disk (SQLite), keyed by sha256(RUBRIC_VERSION, kind, judge model, messages), so
a rerun or a resumed run never asks the same question twice.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import requests

from heuristic import KINDS, HeuristicJudge

# Part of every cache key next to the messages. The messages carry the rubric and the user turn, so an
# edited prompt makes new keys by itself; bump this only when cached verdicts go stale while the
# messages stay the same: a change of how replies are parsed (parse_yes_no, parse_winner) or of what a
# request asks for besides the messages (temperature, the thinking switch).
RUBRIC_VERSION = "2026-11-26.1"
INVALID = "INVALID"
DEFAULT_CACHE = Path(os.environ.get("SUITE_CACHE", Path.home() / ".cache" / "suite-unlearning")) / "judge.sqlite"
PROMPTS = Path(__file__).resolve().parent / "prompts"

# ----------------------------------------------------------------------------------------------
# Rubrics (system prompts), one text file each, restated from the paper's appendix prompts

def load_rubric(kind, folder=PROMPTS):
    """The system prompt for `kind` (forget, retain, gibberish, rgq): folder/judge_<kind>.txt, without
    its surrounding whitespace. A missing or unreadable file is an error naming it."""
    path = Path(folder) / f"judge_{kind}.txt"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise OSError(f"judge rubric {path} cannot be read: {e.strerror or e}") from None


RUBRICS = {kind: load_rubric(kind) for kind in (*KINDS, "rgq")}


def user_message(kind, item):
    """The user turn for one item: Question / Ground Truth / Test Response, or the RGQ pair."""
    if kind == "rgq":
        return (f"[Question]\n{item['instruction']}\n\n[assistant_1]\n{item['response_a']}\n\n"
                f"[assistant_2]\n{item['response_b']}")
    if kind not in KINDS:
        raise ValueError(f"unknown judge kind {kind!r}")
    parts = [f"Question: {item['question']}"]
    if kind != "gibberish" or item.get("ground_truth") is not None:  # gibberish: GT is context only
        parts.append(f"Ground Truth: {item['ground_truth']}")
    parts.append(f"Test Response: {item['answer']}")
    return "\n".join(parts)


def messages(kind, item):
    return [{"role": "system", "content": RUBRICS[kind]}, {"role": "user", "content": user_message(kind, item)}]


# ----------------------------------------------------------------------------------------------
# Verdict parsing: strict. None means unparseable (the caller retries, then records INVALID).

_THINK = re.compile(r"<think>.*?</think>", re.S)


def parse_yes_no(text):
    """'YES'/'NO' from a reply whose first line is exactly that word, allowing case, spaces, markdown
    emphasis, quotes, final punctuation and a 'Verdict:'/'Answer:' prefix. Anything else -> None."""
    if text is None:
        return None
    text = _THINK.sub("", text).strip()
    if not text:
        return None
    line = text.splitlines()[0].strip().strip("*_`\"' ").rstrip(".!").strip("*_`\"' ")
    line = re.sub(r"^(verdict|answer|output|final answer)\s*:\s*", "", line, flags=re.I).strip("*_`\"' ")
    word = line.upper()
    return word if word in ("YES", "NO") else None


def parse_winner(text):
    """'A'/'B'/'tie' from the RGQ JSON's winner field (assistant_1 / assistant_2 / tie). None if absent."""
    if text is None:
        return None
    text = _THINK.sub("", text)
    start, end = text.find("{"), text.rfind("}")
    winner = None
    if start >= 0 and end > start:
        try:
            obj = json.loads(text[start:end + 1])
            winner = obj.get("winner") if isinstance(obj, dict) else None
        except json.JSONDecodeError:
            pass
    if winner is None:  # e.g. an unescaped quote inside "reason": read the winner field alone
        m = re.findall(r'"winner"\s*:\s*"([^"]*)"', text)
        winner = m[0] if len(m) == 1 else None
    if not isinstance(winner, str):
        return None
    w = winner.strip().lower()
    if w == "tie":
        return "tie"
    m = re.fullmatch(r"assistant[\s_-]*([12])", w)
    return {"1": "A", "2": "B"}[m.group(1)] if m else None


def parse(kind, text):
    return parse_winner(text) if kind == "rgq" else parse_yes_no(text)


# ----------------------------------------------------------------------------------------------
# HTTP judge: any OpenAI-compatible chat-completions server

class ServerUnavailable(RuntimeError):
    """A model server (the judge, or the writer of `generate.py`) cannot be reached or refuses our
    requests."""


class _Cache:
    """sha256 key -> verdict, in SQLite. One connection shared by the worker threads, under a lock."""

    def __init__(self, path):
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self.db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, kind TEXT, model TEXT, "
                        "verdict TEXT, raw TEXT, created REAL)")
        self.db.commit()

    def get_many(self, keys):
        out = {}
        with self.lock:
            for k in set(keys):
                row = self.db.execute("SELECT verdict FROM verdicts WHERE key = ?", (k,)).fetchone()
                if row:
                    out[k] = row[0]
        return out

    def put(self, key, kind, model, verdict, raw):
        with self.lock:  # committed at once: a killed run keeps everything judged so far
            self.db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
                            (key, kind, model, verdict, raw, time.time()))
            self.db.commit()


def cache_key(kind, model, msgs):
    blob = json.dumps([RUBRIC_VERSION, kind, model, msgs], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ChatClient:
    """Client for an OpenAI-compatible /chat/completions endpoint (vLLM, SGLang, transformers serve),
    shared by the judge and by `generate.py` (`role` names it in errors).

    Thinking is switched off with chat_template_kwargs={"enable_thinking": false} (vLLM, SGLang and
    transformers serve accept it; for a server that rejects unknown fields pass no_thinking=False).
    Transport failures (timeouts, refused or reset connections, HTTP 429/5xx) are retried with
    exponential backoff, max_retries times; then ServerUnavailable. The API key comes only from the
    environment variable named by api_key_env, never from the command line.
    """

    def __init__(self, url="http://127.0.0.1:8000/v1", model=None, api_key_env="JUDGE_API_KEY", timeout=60,
                 max_retries=6, backoff=1.0, no_thinking=True, check=True, role="judge"):
        self.url = url.rstrip("/")
        self.model, self.role, self.api_key_env = model, role, api_key_env
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.no_thinking = no_thinking
        self.requests = 0        # HTTP requests sent (tests and logs read these counters)
        self.transport_errors = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        if check:
            self.check()
        if self.model is None:
            raise ValueError(f"{type(self).__name__} needs model= (or check=True to take the one the server lists)")

    @property
    def label(self):
        return f"{str(self.model).rstrip('/').split('/')[-1]} @ {self.url}"

    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _session(self):
        if not hasattr(self._local, "session"):  # requests.Session is not thread-safe: one per thread
            self._local.session = requests.Session()
        return self._local.session

    def check(self):
        """Fail fast, in one line, when no server answers at self.url; pick the served model if unset."""
        hint = ("start one, e.g. `transformers serve <model folder> --port 8000` or "
                "`vllm serve Qwen/Qwen3.5-35B-A3B --port 8000`")
        hint += ", or use the heuristic judge" if self.role == "judge" else ""
        try:
            r = requests.get(f"{self.url}/models", headers=self._headers(), timeout=min(self.timeout, 10))
        except requests.RequestException as e:
            raise ServerUnavailable(f"no {self.role} server answers at {self.url} ({type(e).__name__}): {hint}") from None
        if r.status_code in (401, 403):
            raise ServerUnavailable(f"{self.role} server at {self.url} refused the API key (HTTP {r.status_code}): "
                                    f"set the environment variable that holds it ({self.api_key_env})")
        if r.status_code != 200:
            raise ServerUnavailable(f"{self.role} server at {self.url} answered HTTP {r.status_code} on /models: {hint}")
        if self.model is None:
            try:
                served = [m.get("id") for m in r.json().get("data", [])]
            except (ValueError, AttributeError, TypeError):
                served = []
            if not served:
                raise ServerUnavailable(f"{self.role} server at {self.url} lists no model on /models: pass the model name")
            self.model = served[0]

    def chat(self, messages, max_tokens, temperature=0.0):
        """One chat completion with transport retries; returns (text, finish_reason), (None, None) for a
        body that is not a completion."""
        body = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if self.no_thinking:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return self._post(body)

    def _post(self, body):
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            try:
                r = self._session().post(f"{self.url}/chat/completions", json=body, headers=self._headers(),
                                         timeout=self.timeout)
                if r.status_code == 429 or r.status_code >= 500:
                    raise requests.HTTPError(f"HTTP {r.status_code}")
            except requests.RequestException as e:
                with self._lock:
                    self.transport_errors += 1
                self._local.__dict__.pop("session", None)  # a dead server: drop its pooled connections
                if attempt == self.max_retries:
                    raise ServerUnavailable(f"{self.role} server at {self.url} failed {attempt + 1} times in a row "
                                            f"({e}); what is done so far is cached, rerun to resume") from None
                time.sleep(min(self.backoff * 2 ** attempt, 30.0))
                continue
            if r.status_code != 200:  # 4xx: our request is wrong (model name, fields); retrying won't help
                extra = " (if it rejects chat_template_kwargs, pass no_thinking=False)" if self.no_thinking else ""
                raise ServerUnavailable(f"{self.role} server at {self.url} answered HTTP {r.status_code}: "
                                        f"{' '.join(r.text[:300].split())}{extra}")
            try:
                choice = r.json()["choices"][0]
                return choice["message"].get("content") or "", choice.get("finish_reason")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                return None, None  # malformed body: counts as an unparseable reply


class HTTPJudge(ChatClient):
    """The judge over HTTP (ChatClient): temperature 0, thinking off; a reply that does not parse is
    asked again up to parse_retries times and then recorded as INVALID, which is not cached so that a
    later run asks again.
    """

    def __init__(self, url="http://127.0.0.1:8000/v1", model=None, api_key_env="JUDGE_API_KEY", concurrency=16,
                 timeout=60, max_tokens=16, rgq_max_tokens=200, parse_retries=2, max_retries=6, backoff=1.0,
                 cache_path=None, no_thinking=True, check=True):
        # check() runs before the cache file exists: a judge that is not there leaves nothing behind
        super().__init__(url, model, api_key_env, timeout, max_retries, backoff, no_thinking, check)
        self.concurrency = concurrency
        self.max_tokens, self.rgq_max_tokens = max_tokens, rgq_max_tokens
        self.parse_retries = parse_retries
        self.cache_hits = 0
        self.cache = _Cache(DEFAULT_CACHE if cache_path is None else cache_path)

    def _judge_one(self, kind, msgs):
        """Ask until the reply parses (1 + parse_retries tries). Returns (verdict or INVALID, raw text)."""
        max_tokens = self.rgq_max_tokens if kind == "rgq" else self.max_tokens
        text = None
        for _ in range(1 + self.parse_retries):
            text, finish = self.chat(msgs, max_tokens)
            verdict = parse(kind, text)
            if verdict is not None:
                return verdict, text
            if finish == "length":  # cut off (e.g. a long RGQ reason): give the next try more room
                max_tokens *= 2
        return INVALID, text

    def _run(self, kind, items, progress):
        msgs = [messages(kind, it) for it in items]
        keys = [cache_key(kind, self.model, m) for m in msgs]
        found = self.cache.get_many(keys)
        with self._lock:
            self.cache_hits += sum(k in found for k in keys)
        todo = {}  # key -> messages, each distinct question asked once
        for k, m in zip(keys, msgs):
            if k not in found:
                todo.setdefault(k, m)
        done = len(items) - sum(1 for k in keys if k not in found)
        if progress:
            progress(done)
        waiting = {}  # key -> number of items that share it
        for k in keys:
            if k not in found:
                waiting[k] = waiting.get(k, 0) + 1
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency)
        futures = {}
        try:
            futures = {pool.submit(self._judge_one, kind, m): k for k, m in todo.items()}
            for fut in concurrent.futures.as_completed(futures):
                k = futures[fut]
                verdict, raw = fut.result()  # ServerUnavailable propagates; finished verdicts are cached
                found[k] = verdict
                if verdict != INVALID:
                    self.cache.put(k, kind, self.model, verdict, raw)
                done += waiting[k]
                if progress:
                    progress(done)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for fut, k in futures.items():      # after a failure: the requests in flight then, cached as they finished
                if k not in found and fut.done() and not fut.cancelled() and fut.exception() is None:
                    verdict, raw = fut.result()
                    if verdict != INVALID:
                        self.cache.put(k, kind, self.model, verdict, raw)
        return [found[k] for k in keys]

    def verdicts(self, kind, items, progress=None):
        """kind in forget/retain/gibberish; items {question, ground_truth, answer} -> YES/NO/INVALID each."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self._run(kind, items, progress)

    def compare(self, items, progress=None):
        """RGQ pairs {instruction, response_a, response_b} -> A/B/tie/INVALID each (A = response_a)."""
        return self._run("rgq", items, progress)


# ----------------------------------------------------------------------------------------------
# The factory

def make_judge(spec, url=None, model=None, cache_path=None, **kw):
    """'heuristic' -> HeuristicJudge() (rules, and the embedded model's coherence score for long answers);
    'rules' -> the rules alone (no model loaded); 'http' -> HTTPJudge(url, model, cache_path=..., **kw)."""
    if spec in ("heuristic", "rules"):
        return HeuristicJudge(coherence=spec == "heuristic")
    if spec == "http":
        return HTTPJudge(url or "http://127.0.0.1:8000/v1", model, cache_path=cache_path, **kw)
    raise ValueError(f"judge spec must be 'heuristic', 'rules' or 'http', got {spec!r}")
