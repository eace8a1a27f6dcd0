"""bench.py's side-by-side part on a tiny model (the GPU parts need a GPU and are run by hand)."""
import json

import pytest

import bench


def test_parallel_trainings_report_aggregate_steps_per_second(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # one thread a child: two runs on a 2-core machine do not contend
    steps = 30                      # fp32 steps of 8 pairs: a few seconds, so that both runs overlap after start-up
    result = bench.bench_parallel(tiny_model_path, 2, steps, 1, tmp_path, ["--global-batch", "8", "--precision", "fp32"])
    assert result["procs"] == 2 and list(result["s_per_step"]) == ["00_ga", "01_graddiff"]
    logs = [[json.loads(l) for l in (tmp_path / f"parallel_{i:02d}" / "log.jsonl").read_text().splitlines()][1:]
            for i in range(2)]
    start = max(log[0]["time"] - log[0]["step_time"] for log in logs)
    end = min(log[-1]["time"] for log in logs)
    inside = sum(start <= r["time"] <= end for log in logs for r in log)
    assert result["window_s"] == pytest.approx(end - start, abs=0.06) and inside >= 2
    assert result["steps_per_s"] == pytest.approx(inside / (end - start), rel=0.05)
    for i in range(2):                                   # every process ran its steps, and none saved a model
        assert len(logs[i]) == steps - 1
        assert not (tmp_path / f"parallel_{i:02d}" / "final").exists()


def test_parallel_failure_names_the_log(tiny_model_path, tmp_path):
    """Both children fail; the first to fail stops the other, so which one is named depends on timing."""
    with pytest.raises(SystemExit, match=r"failed: (ga \(.*parallel_00|graddiff \(.*parallel_01)/train.log\)"):
        bench.bench_parallel(tiny_model_path, 2, 2, 1, tmp_path, ["--lr", "not-a-number"])
