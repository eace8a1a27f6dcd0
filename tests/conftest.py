"""Shared fixtures: a tiny random Llama-style model (built from a config, no download) with the
SmolLM2 tokenizer and chat template, and the small SUITE fixture in the official layout."""
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "fixtures" / "suite"


def pytest_addoption(parser):
    parser.addoption("--update-reference", action="store_true",
                     help="rewrite tests/fixtures/reference_loss_curve.json from a fresh run (after a deliberate "
                          "change of the training numerics) instead of comparing against it")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than about 20 s on a 2-core CPU (deselect with -m 'not slow')")
    # A fresh inductor cache per session: torch 2.13 loads CPU kernels cached under another instruction set
    # (e.g. compiled under ATEN_CPU_CAPABILITY=avx2, then run without it) and aborts the process; a
    # cold cache is also what a new machine has, so the suite's time is that machine's.
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        import tempfile
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = config._suite_inductor_cache = tempfile.mkdtemp(prefix="suite-inductor-")


def pytest_unconfigure(config):
    if getattr(config, "_suite_inductor_cache", None):
        shutil.rmtree(config._suite_inductor_cache, ignore_errors=True)


def free_port():
    """A local TCP port nothing listens on (for servers started by a test, and for "nothing there")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """A real HTTP server on a free local port, answering with `handler` (a BaseHTTPRequestHandler class)
    from a thread; `url` is its OpenAI-style base URL."""

    def __init__(self, handler):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def smollm2_path():
    from model import smollm2_folder
    return str(smollm2_folder())


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, smollm2_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture()
def fixture_root(tmp_path):
    """A writable copy of the fixture release."""
    dest = tmp_path / "suite"
    shutil.copytree(FIXTURE, dest)
    return dest


@pytest.fixture()
def two_topic_root(fixture_root):
    """The fixture with its topic copied under a second topic name (for sequential runs)."""
    shutil.copytree(fixture_root / "challenger_disaster", fixture_root / "salem_witch_trials")
    shutil.copy(fixture_root / "adversarial_questions" / "challenger_disaster_adv.json",
                fixture_root / "adversarial_questions" / "salem_witch_trials_adv.json")
    return fixture_root


# ----------------------------------------------------------------------------------------------
# A real server: transformers serve of SmolLM2-135M-Instruct on CPU (shared by test_judge and test_generate)

class Server:
    """`transformers serve FOLDER` on a local port, started and stopped (abruptly) by the tests."""

    def __init__(self, folder, port, log):
        from model import choose_precision
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        dtype = {"bf16": "bfloat16", "fp32": "float32"}[choose_precision("auto", "cpu")[0]]   # bf16 where native
        self.cmd = [exe, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                    "--dtype", dtype]
        self.url, self.log, self.proc = f"http://127.0.0.1:{port}", log, None

    def start(self, timeout=60):
        # One OpenMP thread: on a shared 2-core machine, two threads next to another busy process run
        # about 20x slower (each request waits for a thread that is not scheduled).
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        # its own process group, so that stop() ends the server and anything it started
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
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
        """SIGKILL to the server's whole process group (abrupt on purpose: requests in flight see a reset
        connection; a server busy on abandoned requests would otherwise slow every later test)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:                 # the group is gone already
            pass
        self.proc.wait()


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory):
    """`transformers serve` of the SmolLM2 folder on CPU, for the tests of real HTTP clients (judge, generate);
    skips cleanly where transformers[serving] or the model is missing."""
    exe = shutil.which("transformers") or Path(sys.executable).parent / "transformers"
    if not Path(exe).exists():
        pytest.skip("`transformers serve` is not installed (pip install 'transformers[serving]')")
    try:
        from model import smollm2_folder
        folder = smollm2_folder()
    except (ImportError, SystemExit, OSError) as e:
        pytest.skip(f"no SmolLM2 folder to serve: {e}")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    srv = Server(folder, free_port(), log)
    if not srv.start():
        srv.stop()
        pytest.skip(f"transformers serve did not start within 60 s: {log.read_text()[-500:]}")
    try:
        yield srv
    finally:
        srv.stop()
