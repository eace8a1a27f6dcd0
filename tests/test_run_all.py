"""run_all.sh: the dry run prints every block's commands (nothing runs).

    python -m pytest tests/test_run_all.py -q
"""
import os
import re
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


def test_small_lambda_part_sweeps_the_factors_its_learning_rate_run_lacks():
    """Part lambda: at each method's picked LR, every loss factor the paper swept except the ones the LR sweep's
    run already has (the Llama row's, or SMALL_LAMBDAS': JensUn++'s lambda_f 2, so its 0.33 is run); the line
    fails when any factor's run failed (a bare `wait` passed whatever failed), the pick made again in any case."""
    lines = [l for l in dry_run("small", SMALL_PARTS="lambda") if l.startswith("+ ") and "--method jensunpp" in l]
    assert len(lines) == 1
    factors = sorted({float(f) for f in re.findall(r"--method jensunpp --lr \S+ --lambda-f (\S+) ", lines[0])})
    assert factors == [0.2, 0.33, 0.5, 1.0, 4.0]
    assert lines[0].endswith("> /dev/null; exit $st") and "wait $p || st=1" in lines[0]
    npo = next(l for l in dry_run("small", SMALL_PARTS="lambda") if "--method npo" in l)
    assert sorted({float(f) for f in re.findall(r"--lambda-r (\S+) ", npo)}) == [0.5, 1.0, 5.0]   # its own 3 left out


def test_sweeps_block_trains_no_setting_twice():
    """Block sweeps (Llama): the lambda sweep runs at the Llama row's LR, whose run the LR sweep has made at the
    row's own loss factors: that factor is not trained again (10 of 76 runs were repeats)."""
    runs = [l for l in dry_run("sweeps") if "train.py" in l]
    settings = []
    for line in runs:
        m = line.split("--method ")[1].split()[0]
        h = losses.resolve_hparams(m, "llama")
        lr = float(re.search(r"--lr (\S+)", line).group(1)) if "--lr " in line else h["lr"]
        f = float(re.search(r"--lambda-f (\S+)", line).group(1)) if "--lambda-f " in line else h["lambda_f"]
        r = float(re.search(r"--lambda-r (\S+)", line).group(1)) if "--lambda-r " in line else h["lambda_r"]
        settings.append((m, lr, f, r))
    assert len(settings) == len(set(settings)) == 66


def test_dry_run_prints_every_block():
    lines = dry_run("all")
    for block in ("small", "small_ablations", "proximity", "lkf_small", "sweeps", "single", "sequential", "joint",
                  "relearn", "ablations", "lkf"):
        assert f"### block {block}" in lines
    commands = [l for l in lines if l.startswith("+ ")]
    # 5 methods x 3 models; the small block's 6 methods and its 4 ablations
    assert sum("--mode sequential" in c for c in commands) == 15 + 6 + 4
    assert all("--refusal paper" in c for c in commands if c.startswith("+ torchrun"))   # the paper's refusals
    assert not any("nvidia-cuda-mps-control" in c for c in commands)        # MPS is opt-in


def test_small_block_parts():
    """Block small (v3, the authors' semantics): the injection of all four topics beside the base model's
    evaluation, the injected model's evaluations beside the sweep; every method of the six at its three
    learning rates, a pool line each, at micro-batch 4 and deterministic, then report.py's pick per method;
    sequential, joint and relearning runs at the picks (relearning at the highest picked LR, the paper's rule,
    micro-batch 8); the other six methods once at their picks; every job skipped by its metrics alone."""
    commands = [l for l in dry_run("small") if l.startswith("+ ")]
    base = next(i for i, c in enumerate(commands) if "--out runs/small/eval_base" in c)
    assert commands[base].endswith("&") and "--relearn-set inject" in commands[base + 1]
    assert "--topics all --mode joint --lr 1e-4 --epochs 4 --global-batch 16 --batch-size 16 --deterministic" in commands[base + 1]
    assert commands[base + 2].endswith("&") and "evaluate.py runs/small/injected " in commands[base + 2]
    sweep = [c for c in commands if c.startswith("+ [ -f runs/small/sweep/")]
    assert len(sweep) == 6 * 3 and {c.split("--method ")[1].split()[0] for c in sweep} == {
        "graddiff", "jensun", "npo", "pdu", "jensunpp", "dpo"}
    for c in sweep:
        d = c.split("[ -f ")[1].split("/eval/final/metrics.json")[0]
        assert f"--batch-size 4 --deterministic --print-every 60 --out {d} " in c and f"python evaluate.py {d} " in c
        assert "--skip mmlu rep rgq" in c and ("--lambda-f 2" in c) == ("--method jensunpp" in c)
    picks = [c for c in commands if c.startswith("+ python report.py table runs/small/sweep/")]
    assert [c.split("sweep/")[1].split(".md")[0] for c in picks] == ["graddiff", "jensun", "npo", "pdu", "jensunpp", "dpo"]
    seq = [c for c in commands if "runs/small/seq/" in c and "train.py" in c]
    assert len(seq) == 12       # a dry run has no sweep picks: run D's (SMALL_PICKS) stand in
    assert all("--method jensunpp" not in c or "--lr 9e-05 --lambda-f 2 --lambda-r 1 --batch-size 4" in c for c in seq)
    for c in seq:           # relearning attacks the joint model (the paper's relearning block)
        assert ("--relearn-set retain_train" in c) == ("--mode joint" in c)
        assert "--batch-size 4 --deterministic --print-every 60 --out" in c
        if "--relearn-set retain_train" in c:
            assert "--lr HIGHEST_PICKED_LR --deterministic --print-every 60 --out" in c      # micro-batch 8, the default
            m = c.split("--method ")[1].split()[0]
            assert f"--model runs/small/seq/{m}-joint/final" in c and c.startswith(f"+ [ -f runs/small/seq/{m}-relearn/eval/")
    others = [c for c in commands if "runs/small/sweep/" in c and "report.py table runs/small/sweep/" in c and "train.py" in c]
    assert {c.split("--method ")[1].split()[0] for c in others} == {"rmu", "satimp", "simnpo", "undial", "wga", "ga"}
    assert any(c.startswith("+ python report.py stages runs/small/sequential.md") for c in commands)
    assert any(c.startswith("+ python report.py relearn runs/small/relearn.md") for c in commands)
    only = [l for l in dry_run("small", SMALL_PARTS="seq") if l.startswith("+ ")]
    assert not any("--relearn-set inject" in c or "report.py table runs/small/sweep/jensunpp.md" in c for c in only)
    assert any("runs/small/seq/" in c for c in only)


def test_small_ablations_change_one_thing_each():
    """Block small_ablations: sequential JensUn++ at its pick, each line one change from block small's own
    sequential run: micro-batch 32, a third of the LR, the seen topics' retain sets, or the model injected with
    the training files only (made by its own part, with block small's injection recipe)."""
    lines = [l for l in dry_run("small", "small_ablations") if l.startswith("+ ")]
    baseline = next(c for c in lines if "runs/small/seq/jensunpp-sequential " in c and "train.py" in c)
    base_args = baseline.split("--mode sequential ")[1].split(" --out")[0]
    assert base_args == "--lr 9e-05 --lambda-f 2 --lambda-r 1 --batch-size 4 --deterministic --print-every 60"
    runs = {c.split("jensunpp-")[1].split("/eval")[0]: c for c in lines if "runs/small/ablation/jensunpp-" in c and "train.py" in c}
    assert set(runs) == {"batch32", "lr_third", "seen_retain", "inject_train"}
    flags = {a: c.split("--mode sequential ")[1].split(" --print-every")[0] for a, c in runs.items()}
    injected = "--model runs/small/injected/final --lr 9e-05 --lambda-f 2 --lambda-r 1 --batch-size 4 --deterministic"
    assert flags["batch32"] == injected + " --batch-size 32"
    assert flags["lr_third"] == injected.replace("9e-05", "LR_THIRD")
    assert flags["seen_retain"] == injected + " --retain-scope seen"
    assert flags["inject_train"] == injected.replace("runs/small/injected/", "runs/small/injected_train/")
    inject = next(c for c in lines if "--relearn-set inject_train" in c)
    assert inject.split("--mode joint ")[1] == baseline_inject(lines).split("--mode joint ")[1].replace("injected", "injected_train")
    assert lines[-1].startswith("+ python report.py stages runs/small/ablations.md base=runs/small/seq/jensunpp-sequential/eval")


def baseline_inject(lines):
    return next(c for c in lines if "--relearn-set inject " in c)


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
        assert c.split(" > ")[0].endswith("--topics challenger_disaster --lr 9e-05 --batch-size 4 --deterministic --print-every 60 --out "
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
    assert "--recipe lkf --lr 0.00015 --lambda-f 0.33 --lambda-r 1 --batch-size 4 --deterministic" in jensunpp    # 9e-5 x 5e-6 / 3e-6
    assert jensunpp.count("python evaluate.py") == 2 and "--protocol lkf" in jensunpp
    assert any("--method graddiff" in c and "--lr 1.5e-05 --lambda-f 1 --lambda-r 2 --batch-size 4 --deterministic" in c for c in small)
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


def test_a_run_trained_at_an_older_pick_is_set_aside(tmp_path):
    """Block small's part seq may start at run D's picks before the sweep has picked (a resumed lease): a run
    folder whose config.json records other settings than the pick is moved to FOLDER.stale, so that the
    block trains it again instead of skipping it by its metrics; a run at the pick stays."""
    script = (ROOT / "run_all.sh").read_text()
    start = script.index("set_aside_if_stale() {")
    function = script[start:script.index("\n}\n", start) + 3]
    run = tmp_path / "jensunpp-sequential"
    run.mkdir()
    (run / "config.json").write_text('{"hparams": {"lr": 9e-05, "lambda_f": 2, "lambda_r": 1}}')

    def set_aside(*flags):
        return subprocess.run(["bash", "-c", f"DRY=0\n{function}\nset_aside_if_stale {run} {' '.join(flags)}"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)

    same = set_aside("--lr", "9e-05", "--lambda-f", "2", "--lambda-r", "1")
    assert same.returncode == 1 and run.is_dir() and not (tmp_path / "jensunpp-sequential.stale").exists()
    other = set_aside("--lr", "3e-05", "--lambda-f", "2", "--lambda-r", "1")
    assert other.returncode == 0, other.stderr
    assert not run.exists() and (tmp_path / "jensunpp-sequential.stale" / "config.json").is_file()
    assert "set aside" in other.stdout
    assert set_aside("--lr", "9e-05").returncode == 1          # no folder (any more): nothing to do
