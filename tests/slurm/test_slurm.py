"""The Slurm lane (``make test-slurm``): chapter 04's ``scripts/slurm_ddp.sbatch``, unmodified, on a
real Slurm cluster of two emulated nodes on this machine (``cluster.py``), with 2 CPUs and no GPU
per node. Only what the file's header documents adapts it to such nodes: ``NPROC_PER_NODE=2``,
``--gpus-per-node=0`` (the file asks for GPUs) and ``--cpus-per-task=2`` (the nodes' real CPUs), and
the script it runs (chapter 05's ``train.py``, stopped by SIGUSR1 and resumed). Skipped outside the
lane."""

import json
import os
import re

import pytest

from course_utils import ROOT
from course_utils.ch05_full_pipeline import read_metrics

from .cluster import FINISHED, cluster, missing_programs

pytestmark = pytest.mark.skipif(os.environ.get("COURSE_SLURM_LANE") != "1",
                                reason="the Slurm lane: make test-slurm")


def test_the_course_sbatch_file_trains_on_two_nodes():
    assert not missing_programs(), "install the lane's programs: apt-get install slurm-wlm munge"
    notebooks = ROOT / "notebooks"
    with cluster() as c:
        job = c.submit(["--gpus-per-node=0", "--cpus-per-task=2", "scripts/slurm_ddp.sbatch"], cwd=notebooks,
                       env={"NPROC_PER_NODE": "2"})
        info = c.wait(job, timeout=600)
        out = notebooks / f"ddp-digits-{job}.out"
        text = out.read_text(errors="replace") if out.exists() else "(no output file)"
        out.unlink(missing_ok=True)
        print(f"--- job {job}: {info.get('JobState')} {info.get('ExitCode')} on {info.get('NodeList')}\n{text}")
        assert info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", text[-4000:]
    same = re.findall(r"my weights are bit-identical to rank 0's: (\w+)", text)
    assert same == ["True"] * 4, text[-4000:]  # 2 nodes x 2 processes, every replica the same
    assert len(re.findall(r"test accuracy: my \d+ images [\d.]+%, all 359 images", text)) == 4


def test_the_sbatch_file_refuses_cpu_nodes_without_a_process_count():
    assert not missing_programs(), "install the lane's programs: apt-get install slurm-wlm munge"
    notebooks = ROOT / "notebooks"
    with cluster() as c:
        job = c.submit(["--gpus-per-node=0", "--cpus-per-task=2", "scripts/slurm_ddp.sbatch"], cwd=notebooks)
        info = c.wait(job, timeout=300)
        out = notebooks / f"ddp-digits-{job}.out"
        text = out.read_text(errors="replace") if out.exists() else "(no output file)"
        out.unlink(missing_ok=True)
    assert info.get("JobState") == "FAILED" and info.get("ExitCode") == "1:0", (info, text)
    assert "NPROC_PER_NODE is not set" in text


def _output(notebooks, job):
    out = notebooks / f"ddp-digits-{job}.out"
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    out.unlink(missing_ok=True)
    return text


def test_sigusr1_leaves_a_checkpoint_that_a_resubmitted_job_resumes(tmp_path):
    """The time-limit warning of the sbatch file (--signal=USR1@120), sent now with `scancel
    --signal=USR1`: torchrun passes it on (--signals-to-handle), every rank of both nodes stops after
    the same step, rank 0 saves last.pt, the batch script, not ended by torchrun's exit code 1, recognises
    the stop (where it would requeue the job, its requeue line uncommented), and the same sbatch
    command, submitted again, resumes from it and finishes. The checkpoint folder is shared by both
    nodes (one machine here)."""
    import time

    import torch

    assert not missing_programs(), "install the lane's programs: apt-get install slurm-wlm munge"
    notebooks, run = ROOT / "notebooks", tmp_path / "run"
    argv = ["--gpus-per-node=0", "--cpus-per-task=2", "scripts/slurm_ddp.sbatch", "scripts/train.py",
            "--model", "mlp", "--epochs", "8", "--no-progress", "--out-dir", str(run)]
    with cluster() as c:
        first = c.submit(argv, cwd=notebooks, env={"NPROC_PER_NODE": "2"})
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
            assert time.monotonic() < deadline and c.job(first).get("JobState") not in FINISHED, \
                _output(notebooks, first)[-4000:]
            time.sleep(0.2)
        sent = c.run(["scancel", "--signal=USR1", first])
        assert sent.returncode == 0, sent.stderr
        info = c.wait(first, timeout=300)
        text = _output(notebooks, first)
        print(f"--- job {first}, sent SIGUSR1: {info.get('JobState')} {info.get('ExitCode')}\n{text}")
        ckpt = torch.load(run / "last.pt", weights_only=True)
        assert "signal SIGUSR1: stopped after step" in text and not (run / "final.pt").exists(), text[-4000:]
        assert "stopped at the signal, last.pt saved: the same sbatch command resumes from it" in text, text[-4000:]
        assert len(ckpt["rng"]) == 4 and ckpt["epoch"] >= 1 and ckpt["epoch"] < 8, text[-4000:]
        done = (ckpt["epoch"], ckpt.get("step", 0))

        second = c.submit(argv, cwd=notebooks, env={"NPROC_PER_NODE": "2"})
        info = c.wait(second, timeout=600)
        text = _output(notebooks, second)
        print(f"--- job {second}, the same command again: {info.get('JobState')} {info.get('ExitCode')}\n{text}")
    assert info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", text[-4000:]
    resumed = f"resumed from last.pt: {done[0]} epoch(s)" + (f" and {done[1]} step(s) done" if done[1] else " done")
    assert resumed in text, text[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["test_total"] == 359 and summary["test_acc"] > 0.9
    assert [r["epoch"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 9))
