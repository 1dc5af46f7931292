"""Tensor parallelism: one transformer block split across the ranks with ``DeviceMesh`` and
``parallelize_module``, proven equal to the unsplit block, its shards shown, its collectives counted.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/tensor_parallel.py --out /tmp/tp
    # --out: a folder for each rank's JSON record (optional)
    # or, in a notebook: course_utils.launch.torchrun("scripts/tensor_parallel.py", nproc=2)

Every rank builds the same block from the same seed, keeps one copy whole (the reference, run on
every rank alike) and splits the other: the MLP column-wise then row-wise (Megatron-LM's split),
the attention by heads (q, k, v column-wise, o row-wise), then the same with ``SequenceParallel``
for the layer norms. Each split runs the same input forward and backward; the rank prints the
largest difference of the output, the input's gradient and every weight's gradient from the
reference, and the collectives that forward and backward issued (``CommDebugMode``).
float64 throughout, so that an agreement to 1e-15 is the proof and not a tolerance.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from course_utils.ch07_parallelism import (
    Block,
    max_diff,
    plan_from_spec,
    seeded,
    tp_plan,
    write_record,
)
from course_utils.dist import cleanup, rprint, setup

DIM, HEADS, HIDDEN, BATCH, SEQ = 64, 4, 256, 2, 8
TOL = 1e-12  # float64: the split adds the same numbers in another order, nothing more

PLANS = {
    # Megatron-LM's MLP: the first matrix split by output columns, the second by input rows; between
    # them each rank holds its own slice of the hidden units, and one all-reduce sums the partial outputs.
    "mlp": lambda: {"up": ColwiseParallel(), "down": RowwiseParallel()},
    # attention split by heads: each rank computes its heads' q, k, v, attends, and projects with
    # its rows of o; one all-reduce in forward, as for the MLP.
    "attention": lambda: {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                          "o": RowwiseParallel()},
}


def counts(mode: CommDebugMode) -> dict[str, int]:
    """{collective name: how many} that CommDebugMode saw, e.g. {"all_reduce": 1}."""
    return {str(op).split(".")[-1].rstrip("_"): n for op, n in sorted(mode.get_comm_counts().items(), key=str)}


def compare(name: str, ref: nn.Module, tp: nn.Module, x: torch.Tensor, mesh, shard_seq: bool) -> dict:
    """Forward and backward of `x` through the reference and the split module: the largest
    differences and the collectives of each pass."""
    r, n = mesh.get_rank(), mesh.size()
    ref.zero_grad(set_to_none=True)
    x_ref = x.clone().requires_grad_(True)
    out_ref = ref(x_ref)
    out_ref.pow(2).sum().backward()  # any scalar loss will do; this one makes every output count

    # With sequence parallelism the block's input and output are this rank's slice of the tokens.
    x_tp = (x.chunk(n, dim=1)[r] if shard_seq else x).clone().requires_grad_(True)
    with CommDebugMode() as fwd:
        out = tp(x_tp)
    loss = out.pow(2).sum()
    with CommDebugMode() as bwd:
        loss.backward()
    want_out = out_ref.chunk(n, dim=1)[r] if shard_seq else out_ref
    want_gx = x_ref.grad.chunk(n, dim=1)[r] if shard_seq else x_ref.grad
    grads = {p_name: max_diff(p.grad, dict(ref.named_parameters())[p_name].grad)
             for p_name, p in tp.named_parameters()}
    return {
        "name": name,
        "output": max_diff(out, want_out),
        "input_grad": max_diff(x_tp.grad, want_gx),
        "weight_grads": max(grads.values()),
        "forward": counts(fwd),
        "backward": counts(bwd),
        "shards": {p_name: [list(p.shape), list(p.to_local().shape) if hasattr(p, "to_local") else list(p.shape)]
                   for p_name, p in tp.named_parameters()},
        "activation": list(out.shape),
        "grad_placements": {p_name: [str(pl) for pl in p.grad.placements] for p_name, p in tp.named_parameters()
                            if hasattr(p.grad, "placements")},
    }


def run_plans(path: str, mesh, x: torch.Tensor) -> list[dict]:
    """(The chapter's exercise.) Each plan for the attention in the JSON file at `path` (a list of
    ``{layer: [style, {option: value}]}``), applied and compared. An error (a shape that does not fit) is
    reported, not raised: every rank meets the same one at the same point, so none waits for another."""
    attn = seeded(lambda: Block(DIM, HEADS, HIDDEN), 0).attn.to(x.device)
    results = []
    for spec in json.loads(Path(path).read_text()):
        try:
            tp = parallelize_module(copy.deepcopy(attn), mesh, plan_from_spec(spec))
            res = compare("plan", attn, tp, x, mesh, shard_seq=False)
        except Exception as exc:  # noqa: BLE001 - a learner's plan may fail in many ways: report it
            res = {"name": "plan", "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
        results.append(res)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    parser.add_argument("--plans", default=None, help="(the exercise) a JSON file of plans for the attention")
    args = parser.parse_args()

    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    if HEADS % n or SEQ % n:
        if r == 0:
            rprint(f"error: {HEADS} heads and {SEQ} tokens must split evenly over the ranks; use 1, 2 or 4 ranks.")
        cleanup()
        raise SystemExit(2)
    mesh = init_device_mesh(dev.type, (n,), mesh_dim_names=("tp",))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, generator=gen, dtype=torch.float64).to(dev)

    if args.plans is not None:
        results = run_plans(args.plans, mesh, x)
        write_record(args.out, "tp_plans", r, {"rank": r, "results": results})
        rprint(f"{len(results)} plan(s) tried: " + ", ".join("error" if "error" in res else "ran" for res in results))
        cleanup()
        return

    t0 = time.perf_counter()
    block = seeded(lambda: Block(DIM, HEADS, HIDDEN), 0).to(dev)
    results = []
    for name, make in PLANS.items():
        ref = getattr(block, "mlp" if name == "mlp" else "attn")
        tp = parallelize_module(copy.deepcopy(ref), mesh, make())
        results.append(compare(name, ref, tp, x, mesh, shard_seq=False))
    for sp in (False, True):
        tp = parallelize_module(copy.deepcopy(block), mesh, tp_plan(sp))
        results.append(compare("block + sequence parallel" if sp else "block", block, tp, x, mesh, shard_seq=sp))
    # One SGD step on the last split (sequence parallel): the norms' Partial gradients get summed now.
    torch.optim.SGD(block.parameters(), lr=0.1).step()
    with CommDebugMode() as step_mode:
        torch.optim.SGD(tp.parameters(), lr=0.1).step()
    ref_params = dict(block.named_parameters())
    step = {"collectives": counts(step_mode),
            "diff": max(max_diff(p, ref_params[name]) for name, p in tp.named_parameters())}
    seconds = time.perf_counter() - t0

    for res in results:
        ok = max(res["output"], res["input_grad"], res["weight_grads"]) < TOL
        rprint(f"{res['name']:<26} max |diff| vs unsplit: output {res['output']:.1e}, input grad "
               f"{res['input_grad']:.1e}, weight grads {res['weight_grads']:.1e}  (< {TOL:.0e}: {ok})")
        rprint(f"{'':<26} collectives: forward {res['forward']}, backward {res['backward']}")
        assert ok, f"{res['name']}: the split block differs from the unsplit one"
    rprint(f"one SGD step of the sequence-parallel block: collectives {step['collectives']}; max |diff| of the "
           f"weights vs the unsplit block's step {step['diff']:.1e} (< {TOL:.0e}: {step['diff'] < TOL})")
    assert step["diff"] < TOL, "the split block's SGD step differs from the unsplit one's"
    for p_name in ("attn.q.weight", "attn.o.weight", "mlp.up.weight", "mlp.down.weight", "norm1.weight"):
        full, local = results[3]["shards"][p_name]
        rprint(f"{p_name:<16} full {str(full):<10} -> this rank holds {local}")
    write_record(args.out, "tp", r, {"rank": r, "world": n, "results": results, "sgd_step": step,
                                     "seconds": seconds})
    cleanup()


if __name__ == "__main__":
    main()
