"""The Slurm lane (``make test-slurm``): chapter 04's ``scripts/slurm_ddp.sbatch``, unmodified, on a
real Slurm cluster of two emulated nodes on this machine (``cluster.py``), with 2 CPUs and no GPU
per node. Only what the file's header documents adapts it to such nodes: ``NPROC_PER_NODE=2``,
``--gpus-per-node=0`` (the file asks for GPUs) and ``--cpus-per-task=2`` (the nodes' real CPUs).
Skipped outside the lane."""

import os
import re

import pytest

from course_utils import ROOT

from .cluster import cluster, missing_programs

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
