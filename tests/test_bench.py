"""bench.py's side-by-side part on a tiny model (the GPU parts need a GPU and are run by hand)."""
import json

import pytest

import bench


def test_parallel_trainings_report_aggregate_steps_per_second(tiny_model_path, tmp_path):
    result = bench.bench_parallel(tiny_model_path, 2, 3, 1, tmp_path, [])
    assert result["procs"] == 2 and list(result["s_per_step"]) == ["00_ga", "01_graddiff"]
    assert result["steps_per_s"] == pytest.approx(sum(1 / t for t in result["s_per_step"].values()), abs=0.06)
    for i in range(2):                                   # every process ran its steps, and none saved a model
        assert len((tmp_path / f"parallel_{i:02d}" / "log.jsonl").read_text().splitlines()) == 3
        assert not (tmp_path / f"parallel_{i:02d}" / "final").exists()
    assert json.dumps(result)


def test_parallel_failure_names_the_log(tiny_model_path, tmp_path):
    with pytest.raises(SystemExit, match="ga failed, see .*parallel_00/train.log"):
        bench.bench_parallel(tiny_model_path, 1, 2, 1, tmp_path, ["--lr", "not-a-number"])
