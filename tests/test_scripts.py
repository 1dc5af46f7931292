"""The distributed scripts at the edges of what they can do: they adapt, or refuse once and clearly."""

import json

import pytest

from course_utils import ROOT
from course_utils.launch import LaunchError, torchrun

SCRIPTS = ROOT / "notebooks" / "scripts"


@pytest.mark.slow
def test_big_batch_lesson_adapts_its_steps_or_refuses_when_the_data_runs_out(tmp_path):
    # 2 ranks x 100 = 200 images a step: the 1,438 training images hold 7 steps, not 8
    run = torchrun(SCRIPTS / "ddp_equals_big_batch.py", nproc=2, args=["--batch", "100", "--out", tmp_path],
                   timeout=240, backend="gloo", show=False)
    assert "give 7 steps, not --steps 8: running 7" in run.logs[0] and "note:" not in run.logs[1]
    assert "7 SGD steps" in run.logs[0] and ": False" not in run.logs[0]
    record = json.loads((tmp_path / "big_batch_rank0.json").read_text())
    assert record["diffs"]["ddp"] < 1e-12
    # 2 ranks x 800: not even 2 steps of distinct samples (as with 12 ranks x 16 before)
    with pytest.raises(LaunchError) as info:
        torchrun(SCRIPTS / "ddp_equals_big_batch.py", nproc=2, args=["--batch", "800"], timeout=240,
                 backend="gloo", show=False)
    said = [text.count("error: 2 ranks x batch 800 = 1600 samples per step") for text in info.value.logs]
    assert said == [1, 0] and info.value.exit_code == 2


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["warm", "torchrun"])
def test_train_refusing_a_changed_configuration_shows_why_every_time(tmp_path, engine):
    """Every rank stops with exit code 2 when rank 0 refuses a checkpoint; whichever exits first, the
    error names rank 0 and quotes its reason (it once named a silent rank 1 in half the runs)."""
    from course_utils.launch import LaunchError, torchrun

    common = ["--model", "mlp", "--no-progress", "--out-dir", tmp_path / "run"]
    # the checkpoint to refuse (made the same way by either engine)
    torchrun(SCRIPTS / "train.py", nproc=2, args=[*common, "--epochs", "1"], timeout=240, show=False, engine="warm")
    for run in range(5 if engine == "warm" else 2):
        with pytest.raises(LaunchError) as info:
            torchrun(SCRIPTS / "train.py", nproc=2, args=[*common, "--epochs", "2"], timeout=240, show=False,
                     engine=engine)
        assert info.value.rank == 0 and info.value.exit_code == 2, f"run {run}: {info.value}"
        assert "made with another configuration (epochs: 1 -> 2)" in str(info.value), f"run {run}: {info.value}"


@pytest.mark.parametrize(("script", "nproc", "args", "said"), [
    ("tensor_parallel.py", 3, [], "error: 4 heads and 8 tokens must split evenly over the ranks; use 1, 2 or 4 ranks."),
    ("pipeline_parallel.py", 2, ["--microbatches", "1", "--batch", "4"],
     "error: 1F1B needs at least as many micro-batches as stages: --microbatches 1 < 2."),
    ("pipeline_parallel.py", 3, [], "error: --blocks 4 cannot be cut into 3 equal stages: use a multiple of 3."),
    ("mesh_2d.py", 3, [], "error: the meshes are 2 x 2 on 4 ranks (1 x 2 on 2, 1 x 1 on 1); 3 ranks do not form one."),
    ("stragglers.py", 2, ["--slow-rank", "2"], "error: --slow-rank 2 is not a rank of this job (0 to 1)."),
])
def test_chapter_07_scripts_refuse_a_job_they_cannot_split_once_and_clearly(script, nproc, args, said,
                                                                            chapter_07_imports):
    with pytest.raises(LaunchError) as info:
        torchrun(SCRIPTS / script, nproc=nproc, args=args, timeout=240, backend="gloo", show=False)
    assert [text.count(said) for text in info.value.logs] == [1] + [0] * (nproc - 1)
    assert info.value.exit_code == 2
