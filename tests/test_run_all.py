"""run_all.sh: the dry run prints every block's commands (nothing runs).

    python -m pytest tests/test_run_all.py -q
"""
import os
import subprocess
import sys
from pathlib import Path

import losses
from conftest import ROOT


def dry_run(*blocks, **env):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}
    out = subprocess.run(["bash", str(ROOT / "run_all.sh"), "--dry-run", *blocks], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_dry_run_prints_every_block():
    lines = dry_run("all")
    for block in ("small", "proximity", "lkf_small", "sweeps", "single", "sequential", "joint", "relearn", "ablations", "lkf"):
        assert f"### block {block}" in lines
    commands = [l for l in lines if l.startswith("+ ")]
    assert sum("--mode sequential" in c for c in commands) == 15 + 3        # 5 methods x 3 models; the small block's 3
    assert all("--refusal paper" in c for c in commands if c.startswith("+ torchrun"))   # the paper's refusals
    assert not any("nvidia-cuda-mps-control" in c for c in commands)        # MPS is opt-in


def test_small_block_parts():
    """Block small: the injection of all four topics beside the base model's evaluation; per method one
    pool job with its three learning rates side by side and report.py's pick; then, at the picked LR,
    the loss factors the paper swept (JensUn++: lambda_f up to 4), the final pick and its Rep; one
    results table; sequential, joint and relearning runs of three methods with their picked settings."""
    commands = [l for l in dry_run("small") if l.startswith("+ ")]
    base = next(i for i, c in enumerate(commands) if "--out runs/small/eval_base" in c)
    assert commands[base].endswith("&") and "--relearn-set inject" in commands[base + 1]
    assert "--topics all --mode joint" in commands[base + 1]
    lr_jobs = [c for c in commands if c.endswith("-lr.md runs/small/sweep/" + c.split("report.py table runs/small/sweep/")[-1].split("-lr.md")[0] + "-lr*/eval/final > /dev/null")]
    assert len(lr_jobs) == 12 and sum(c.count("python train.py --model") for c in lr_jobs) == 12 * 3
    assert {c.split("--method ")[1].split()[0] for c in lr_jobs} == set(losses.METHODS) - {"nll"}
    assert all(c.count("--skip rep rgq") == 3 and c.count("--batch-size 8") == 3 for c in lr_jobs)
    lambda_jobs = [c for c in commands if "--lambda-" in c and "report.py table" in c]
    jensunpp = next(c for c in lambda_jobs if "--method jensunpp" in c)
    assert [f"--lambda-f {v}" in jensunpp for v in ("0.2", "0.33", "0.5", "1", "2", "4")] == [True, False] + [True] * 4
    npo = next(c for c in lambda_jobs if "--method npo" in c)    # lambda_r 3 is NPO's own: the LR sweep ran it
    assert [f"--lambda-r {v} " in npo for v in ("0.5", "1", "3", "5")] == [True, True, False, True]
    assert len(lambda_jobs) == 10                                           # not GA, not DPO (not swept by the paper)
    assert all(c.endswith("--topics challenger_disaster --skip rgq >> runs/small/sweep/" + c.split("sweep/")[-1])
               for c in lambda_jobs)
    assert sum("report.py table runs/small/results.md" in c for c in commands) == 1
    seq = [c for c in commands if "runs/small/seq/" in c and "train.py" in c]
    assert len(seq) == 6 and all("--lr LR_OF_runs/small/sweep/" in c for c in seq)
    assert sum("--relearn-set retain_train" in c for c in seq) == 3
    for c in seq:           # relearning attacks the joint model (the paper's relearning block); one micro-batch of 32
        assert ("--relearn-set retain_train" in c) == ("--mode joint" in c)
        assert c.split(" > ")[0].endswith("--batch-size 32 --print-every 60 --out " + c.split("--out ")[1].split()[0])
    assert all("--model runs/small/seq/" + m + "-joint/final" in " ".join(seq) for m in ("jensunpp", "dpo", "npo"))
    assert all("--lr HIGHEST_PICKED_LR --batch-size 32 --out" in c for c in seq if "--relearn-set retain_train" in c)   # the paper's rule
    assert any(c.startswith("+ python report.py stages runs/small/sequential.md") for c in commands)
    assert any(c.startswith("+ python report.py relearn runs/small/relearn.md") for c in commands)
    only = [l for l in dry_run("small", SMALL_PARTS="seq") if l.startswith("+ ")]
    assert not any("--relearn-set inject" in c or "-lr.md" in c for c in only) and any("runs/small/seq/" in c for c in only)


def test_proximity_block_arms_start_from_one_checkpoint_at_equal_settings():
    """Block proximity: each method unlearns Challenger at its pick; every arm relearns from that
    checkpoint alone (never from another arm) at the same flags but its --relearn-set, at the highest
    picked LR (the paper's rule), and is read out on the forget set against the unlearned model."""
    commands = [l for l in dry_run("proximity") if l.startswith("+ ")]
    unlearn = [c for c in commands if "--method nll" not in c and "train.py" in c]
    assert [c.split("--method ")[1].split()[0] for c in unlearn] == ["jensunpp", "dpo", "npo"]
    arms = [c for c in commands if "--method nll" in c]
    assert len(arms) == 3 * 14
    for c in arms:
        m = c.split("--model runs/proximity/")[1].split("/final")[0]
        assert m in ("jensunpp", "dpo", "npo") and f"--base runs/proximity/{m}/final" in c
        assert c.split(" > ")[0].endswith("--topics challenger_disaster --lr 9e-05 --batch-size 8 --print-every 60 --out "
                                          + c.split("--out ")[1].split()[0])
        assert "--sets forget --skip mmlu rep rgq" in c
    specs = [c.split("--relearn-set ")[1].split()[0] for c in arms]
    assert {"tiers:0", "tiers:13-14", "forget:K1-K5", "forget_train", "gk", "lexical", "retain_train"} <= set(specs)
    assert commands[-1].startswith("+ python report.py proximity runs/proximity/proximity.md jensunpp=")
    assert commands[-1].count("/eval/final") == 3 * 15


def test_lkf_blocks_train_each_method_on_both_datasets():
    """Blocks lkf (Llama) and lkf_small (the injected SmolLM2): every method trained on LKF* with the recipe
    (lkf_small: the LKF* table's loss factors, its LR times the pick's factor) and on SUITE; LKF*-trained
    models evaluated under both protocols; one report over all of them."""
    big = [l for l in dry_run("lkf") if l.startswith("+ ")]
    for m in ("graddiff", "jensun", "npo", "pdu", "rmu", "jensunpp"):
        assert sum(f"--method {m} " in c and "--recipe lkf --out runs/lkf/" in c for c in big) == 1
        assert any(c.startswith(f"+ python evaluate.py runs/lkf/{m}-lkf --protocol lkf") for c in big)
        assert any(c.startswith(f"+ python evaluate.py runs/lkf/{m}-suite --topics challenger_disaster") for c in big)
    assert big[-1].startswith("+ python report.py lkf runs/lkf/tables.md base=")
    small = [l for l in dry_run("lkf_small") if l.startswith("+ ")]
    jensunpp = next(c for c in small if "--method jensunpp" in c and "--recipe lkf" in c)
    assert "--recipe lkf --lr 0.00015 --lambda-f 0.33 --lambda-r 1 --batch-size 8" in jensunpp    # 9e-5 x 5e-6 / 3e-6
    assert jensunpp.count("python evaluate.py") == 2 and "--protocol lkf" in jensunpp
    assert any("--method graddiff" in c and "--lr 1.5e-05 --lambda-f 1 --lambda-r 2 --batch-size 8" in c for c in small)
    assert small[-1].count("/eval_lkf/final,") == 7


def test_small_block_starts_mps_only_when_asked_and_none_runs(tmp_path):
    lines = dry_run("small", MPS="1", CUDA_MPS_PIPE_DIRECTORY=str(tmp_path))
    start, stop = lines.index("+ nvidia-cuda-mps-control -d"), lines.index("+ bash -c echo quit | nvidia-cuda-mps-control")
    assert start < next(i for i, l in enumerate(lines) if "--relearn-set inject" in l) < stop
    (tmp_path / "control").touch()                       # a daemon's pipe: leave that daemon alone
    lines = dry_run("small", MPS="1", CUDA_MPS_PIPE_DIRECTORY=str(tmp_path))
    assert "MPS: a daemon is running already" in lines and not any("mps-control" in l for l in lines)


def test_pool_runs_every_line_once_and_spreads_them_over_gpus(tmp_path):
    """The block's real pool function (not a dry run): with GPUS, line i runs on the i-th GPU in turn, at
    most $JOBS at a time; without GPUS, no line is given a device; a failed line makes the pool fail."""
    script = (ROOT / "run_all.sh").read_text()
    pool = script[script.index("pool() {"):script.index("\n}\n", script.index("pool() {")) + 3]
    lines = "".join(f"echo $CUDA_VISIBLE_DEVICES > {tmp_path}/{i}\n" for i in range(5))

    def run(gpus, extra=""):
        for f in tmp_path.iterdir():
            f.unlink()
        return subprocess.run(["bash", "-c", f"set -euo pipefail; DRY=0 JOBS=2 GPUS='{gpus}'\n{pool}\npool"],
                              input=lines + extra, capture_output=True, text=True, timeout=60)

    out = run("0 1 3")
    assert out.returncode == 0, out.stderr
    assert [(tmp_path / str(i)).read_text().strip() for i in range(5)] == ["0", "1", "3", "0", "1"]
    assert out.stdout.splitlines()[0] == f"+ CUDA_VISIBLE_DEVICES=0 echo $CUDA_VISIBLE_DEVICES > {tmp_path}/0"
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; unset CUDA_VISIBLE_DEVICES; DRY=0 JOBS=2 GPUS=''\n{pool}\npool"],
                         input=lines, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [(tmp_path / str(i)).read_text().strip() for i in range(5)] == [""] * 5
    out = run("0", "false\n")
    assert out.returncode != 0 and "pool: 1 command(s) failed" in out.stdout
