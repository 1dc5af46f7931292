"""FSDP2 in depth: mixed precision, resharding and prefetching counted, meta-device initialisation,
gradient accumulation without communication, full and sharded state dicts, a DCP checkpoint that
another number of ranks loads, activation checkpointing, and ZeroRedundancyOptimizer.

Run from the notebooks/ folder (gloo on the CPU, nccl on GPUs):

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/fsdp2_in_depth.py \
--ckpt /tmp/fsdp2/ckpt --out /tmp/fsdp2
    python -m torch.distributed.run --standalone --nproc-per-node 3 scripts/fsdp2_in_depth.py --load /tmp/fsdp2/ckpt
    # --ckpt: the checkpoint's folder, which --load reads on another number of ranks; --out: each rank's JSON record
    # or, in a notebook: course_utils.launch.torchrun("scripts/fsdp2_in_depth.py", nproc=2, args=[...])

The model is four transformer blocks and a head (``course_utils.ch07_parallelism.Stack``), each block
one FSDP unit. Where a result must equal one process's, the model is float64 and every rank also
computes the unsplit model on the whole batch: the rank prints the largest difference. With
``--ckpt`` the run saves a DCP checkpoint of the trained model (and ``full.pt``, its full weights
from rank 0, to compare against); with ``--load`` a run on any number of ranks loads it into its own
sharding and compares.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from course_utils.ch07_parallelism import (
    Block,
    CollectiveCounter,
    Stack,
    bytes_written,
    max_diff,
    seeded,
    write_record,
)
from course_utils.dist import cleanup, rprint, setup
from course_utils.memory import count_saved_tensors

BLOCKS, DIM, HEADS, HIDDEN, OUT = 4, 64, 4, 256, 10
TOL64 = 1e-12


def make(dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> Stack:
    """The same four-block model on every rank (seed 0)."""
    return seeded(lambda: Stack(BLOCKS, DIM, HEADS, HIDDEN, OUT), 0, dtype).to(device)


def shard(model: Stack, mesh, **kw) -> Stack:
    """Each block one FSDP unit (all-gathered just before it runs), then the root (the head and what is
    left). `kw` goes to the blocks; the root keeps FSDP's default, which does not reshard it after
    forward (its parameters are needed again at once by backward). `mp_policy` goes to the root too."""
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **{k: v for k, v in kw.items() if k == "mp_policy"})
    return model


def data(rank: int, world: int, dev, dtype=torch.float64, batch: int = 8, seq: int = 8):
    """One global batch (the same on every rank, seed 1) and this rank's slice of it."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, DIM, generator=gen, dtype=dtype)
    y = torch.randn(batch, seq, OUT, generator=gen, dtype=dtype)
    x, y = x.to(dev), y.to(dev)
    return (x, y), (x.chunk(world)[rank], y.chunk(world)[rank])


def mixed_precision(mesh, dev, r, n, gloo: bool) -> dict:
    """One forward and backward in float32, then with bfloat16 compute and float32 or bfloat16 reduction:
    the gradients' largest error relative to the float32 ones, the bytes this rank sent (gloo: Linux's
    count of bytes written), and the dtypes of the stored shard, the unsharded parameter and the gradient."""
    (_, _), (x, y) = data(r, n, dev, torch.float32)
    grads, seen, sent = {}, {}, {}
    policies = {"float32": None,
                "bf16 compute, fp32 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                  reduce_dtype=torch.float32),
                "bf16 compute, bf16 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                  reduce_dtype=torch.bfloat16)}
    for name, policy in policies.items():
        model = shard(make(torch.float32, dev), mesh, **({"mp_policy": policy} if policy else {}))
        dtypes: dict[str, str] = {}

        def peek(mod, inp, dtypes=dtypes):  # the parameter as the layer computes with it (returns None)
            dtypes.setdefault("unsharded", str(mod.weight.dtype).replace("torch.", ""))

        hook = model.blocks["0"].attn.q.register_forward_pre_hook(peek)
        F.mse_loss(model(x), y).backward()  # (the first step also sets FSDP up: measure the second)
        model.zero_grad()
        dist.barrier()
        before = bytes_written()
        F.mse_loss(model(x), y).backward()
        after = bytes_written()
        hook.remove()
        sent[name] = after - before if gloo and before is not None and after is not None else None
        p = model.blocks["0"].attn.q.weight
        dtypes |= {"stored": str(p.dtype).replace("torch.", ""), "grad": str(p.grad.dtype).replace("torch.", "")}
        grads[name] = [q.grad.full_tensor().double() for q in model.parameters()]
        seen[name] = dtypes
    ref = grads["float32"]
    scale = max(g.abs().max().item() for g in ref)
    errors = {name: max((a - b).abs().max().item() for a, b in zip(g, ref, strict=True)) / scale
              for name, g in grads.items()}
    for name, err in errors.items():
        kb = f"{sent[name] / 1024:,.0f} KiB" if sent[name] is not None else "not measured (nccl)"
        rprint(f"  {name:<26} stored {seen[name]['stored']}, computed in {seen[name]['unsharded']}, gradients "
               f"{seen[name]['grad']}; sent {kb}; max gradient error {err:.1e} of the largest gradient")
    return {"errors": errors, "dtypes": seen, "sent": sent}


def resharding(mesh, dev, r, n) -> dict:
    """All-gathers per training step with and without resharding after forward, and with forward
    prefetching; how many blocks hold their whole parameters at once (memory) in each case."""
    (_, _), (x, y) = data(r, n, dev)
    out = {}
    for name, raf, prefetch in (("reshard_after_forward=True", True, False),
                                ("reshard_after_forward=False", False, False),
                                ("True + forward prefetch", True, True)):
        model = shard(make(torch.float64, dev), mesh, reshard_after_forward=raf)
        blocks = list(model.blocks.values())
        if prefetch:
            for a, b in zip(blocks, blocks[1:], strict=False):
                a.set_modules_to_forward_prefetch([b])
        with CollectiveCounter() as mode:
            issued, whole = [], []

            def before(mod, inp, issued=issued, whole=whole, blocks=blocks, mode=mode):
                issued.append(mode.counts.get("all_gather", 0))  # (a DTensor parameter: still sharded)
                whole.append(sum(not hasattr(b.attn.q.weight, "to_local") for b in blocks))

            hooks = [b.register_forward_pre_hook(before) for b in blocks]
            loss = F.mse_loss(model(x), y)
            held_after_forward = sum(not hasattr(b.attn.q.weight, "to_local") for b in blocks)
            loss.backward()
        for h in hooks:
            h.remove()
        c = mode.counts
        out[name] = {"counts": c, "issued_before_block": issued, "whole_blocks": whole,
                     "held_after_forward": held_after_forward}
        rprint(f"  {name:<28} all-gathers {c.get('all_gather', 0)}, reduce-scatters {c.get('reduce_scatter', 0)}; "
               f"all-gathers issued when each block starts {issued}; blocks whole after forward {held_after_forward}")
    return out


def meta_init(mesh, dev, r, n) -> dict:
    """Build on the meta device (no memory), shard, ``to_empty`` (each rank allocates its shard only);
    then two ways to fill the weights: each module's ``reset_parameters`` on the shards, and the full
    weights of rank 0 broadcast into the shards."""
    with torch.device("meta"):
        model = Stack(BLOCKS, DIM, HEADS, HIDDEN, OUT).to(torch.float64)
    # A meta tensor has a shape and a dtype but no storage: there is nothing to measure, only to check.
    all_meta = all(p.is_meta for p in model.parameters())
    shard(model, mesh)
    model.to_empty(device=dev)
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    # On a CPU mesh DTensor has no random-number tracker, and says so in a warning: the lines below show
    # what that means for the numbers.
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DTensor random operators")
        torch.manual_seed(0)
        for module in model.modules():
            if hasattr(module, "reset_parameters") and module is not model:
                module.reset_parameters()
    w = model.head.weight.full_tensor()
    rows = w.shape[0] // n
    repeated = n > 1 and bool(torch.equal(w[:rows], w[rows:2 * rows]))
    reference = make(torch.float64, dev)
    after_reset = max(max_diff(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    full = reference.state_dict() if r == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    after_load = max(max_diff(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    rprint(f"  every parameter a meta tensor (shape, no storage): {all_meta}; after to_empty this rank holds "
           f"{local:,} of {total:,} values")
    rprint(f"  reset_parameters on the shards: max |diff| from one process's initialisation {after_reset:.2f}"
           f"{'; the head weight repeats itself every ' + str(rows) + ' rows' if repeated else ''}")
    rprint(f"  full weights broadcast from rank 0: max |diff| {after_load:.1e} (< {TOL64:.0e}: {after_load < TOL64})")
    return {"all_meta": all_meta, "local": local, "total": total, "after_reset": after_reset,
            "repeated_rows": repeated, "after_load": after_load}


def accumulation(mesh, dev, r, n, k: int = 4) -> dict:
    """k micro-batches per optimizer step: with ``set_requires_gradient_sync(False)`` on the first k-1 the
    gradients accumulate unreduced on each rank, and the last backward reduce-scatters their sum once.
    The price is memory: until then each rank keeps every unit's UNSHARDED gradient (whole tensors, not
    1/N of them), as FSDP2's ``accumulate_unsharded_grad_if_needed`` does.
    One SGD step, against one process on the whole batch."""
    (X, Y), (x, y) = data(r, n, dev, batch=8 * k)
    reference = make(torch.float64, dev)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    F.mse_loss(reference(X), Y).backward()
    ref_opt.step()
    out = {}
    for sync_each in (True, False):
        model = shard(make(torch.float64, dev), mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with CollectiveCounter() as mode:
            for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
                model.set_requires_gradient_sync(sync_each or i == k - 1)
                (F.mse_loss(model(xm), ym) / k).backward()
        opt.step()
        diff = max(max_diff(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))
        name = "sync every micro-batch" if sync_each else "set_requires_gradient_sync(False)"
        out[name] = {"counts": mode.counts, "diff": diff}
        rprint(f"  {name:<34} reduce-scatters {mode.counts.get('reduce_scatter', 0):>2} for {k} micro-batches; "
               f"max |diff| vs one process {diff:.1e} (< {TOL64:.0e}: {diff < TOL64})")
    return out


def train(model: Stack, dev, r, n, steps: int = 3) -> Stack:
    """A few AdamW steps on this rank's slice of the batch."""
    (_, _), (x, y) = data(r, n, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return model


def state_dicts(model: Stack, r) -> dict:
    """What each kind of state dict holds on this rank."""
    sharded = get_model_state_dict(model)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    key = "blocks.0.mlp.up.weight"
    held = {"sharded": list(sharded[key].to_local().shape), "sharded_type": type(sharded[key]).__name__,
            "full": list(full[key].shape) if key in full else None, "full_keys": len(full)}
    rprint(f"  sharded state dict: {key} is a {held['sharded_type']}, this rank holds {held['sharded']}; "
           f"full state dict (cpu_offload): {len(full)} tensors on this rank"
           f"{', ' + key + ' ' + str(held['full']) if held['full'] else ''}")
    return held


def save(model: Stack, folder: str, r) -> list[str]:
    """A DCP checkpoint (each rank writes its shards, rank 0 the .metadata) and rank 0's full weights."""
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=folder)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if r == 0:
        torch.save(full, Path(folder) / "full.pt")
    dist.barrier()
    return sorted(os.listdir(folder))


def load(folder: str, mesh, dev, r, n) -> dict:
    """The checkpoint loaded into this run's sharding (another number of ranks), compared with full.pt."""
    with torch.device("meta"):
        model = Stack(BLOCKS, DIM, HEADS, HIDDEN, OUT).to(torch.float64)
    shard(model, mesh)
    model.to_empty(device=dev)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state["model"])
    full = torch.load(Path(folder) / "full.pt", weights_only=True)
    diff = max(max_diff(p, full[name].to(dev)) for name, p in model.named_parameters())
    rows = list(model.blocks["0"].mlp.up.weight.to_local().shape)
    rprint(f"  loaded on {n} rank(s): this rank holds blocks.0.mlp.up.weight {rows}; max |diff| vs the saved "
           f"weights {diff:.1e} (exact: {diff == 0.0})")
    return {"diff": diff, "rows": rows}


def activation_checkpointing(dev) -> dict:
    """What one block keeps for backward, plainly and under ``torch.utils.checkpoint`` (recomputed in
    backward instead); the gradients agree."""
    block = seeded(lambda: Block(DIM, HEADS, HIDDEN), 0, torch.float64).to(dev)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 32, DIM, generator=gen, dtype=torch.float64).to(dev).requires_grad_(True)
    out = {}
    grads = {}
    for name in ("plain", "checkpoint"):
        block.zero_grad(set_to_none=True)
        x.grad = None
        with count_saved_tensors(held=[x, *block.parameters()]) as log:
            y = block(x) if name == "plain" else checkpoint(block, x, use_reentrant=False)
        y.pow(2).sum().backward()
        grads[name] = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
        out[name] = {"count": log.count, "extra_bytes": log.extra_bytes}
    diff = max(max_diff(a, b) for a, b in zip(grads["plain"], grads["checkpoint"], strict=True))
    out["grad_diff"] = diff
    rprint(f"  saved for backward: plain {out['plain']['count']} tensors, {out['plain']['extra_bytes']:,} bytes "
           f"beyond inputs and weights; checkpoint {out['checkpoint']['count']} tensors, "
           f"{out['checkpoint']['extra_bytes']:,} bytes; gradients max |diff| {diff:.1e}")
    return out


def zero(dev, r, n) -> dict:
    """DDP with ZeroRedundancyOptimizer (each rank keeps the AdamW state of its share of the parameters,
    steps them and broadcasts them) against DDP with a plain AdamW: the same weights."""
    (_, _), (x, y) = data(r, n, dev)
    out = {}
    weights = {}
    for name in ("AdamW", "ZeroRedundancyOptimizer(AdamW)"):
        model = DDP(make(torch.float64, dev))
        if name == "AdamW":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        else:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        inner = opt.optim if name != "AdamW" else opt
        state = sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
                    if torch.is_tensor(t) and t.dim() > 0)
        weights[name] = [p.detach().clone() for p in model.parameters()]
        out[name] = {"state_bytes": state}
    diff = max(max_diff(a, b) for a, b in zip(*weights.values(), strict=True))
    out["diff"] = diff
    rprint(f"  AdamW state on this rank: plain {out['AdamW']['state_bytes']:,} bytes, ZeRO "
           f"{out['ZeroRedundancyOptimizer(AdamW)']['state_bytes']:,} bytes; weights max |diff| {diff:.1e}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default=None, help="folder to save the DCP checkpoint to")
    parser.add_argument("--load", default=None, help="a checkpoint folder to load (on any number of ranks)")
    parser.add_argument("--out", default=None, help="folder for the per-rank JSON record")
    args = parser.parse_args()

    # FSDP2 warns that the model's output is a view (an in-place op on it would skip a hook); none here.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    ctx = setup()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    mesh = init_device_mesh(dev.type, (n,))
    if args.load:
        record = {"load": load(args.load, mesh, dev, r, n)}
        write_record(args.out, "fsdp2_load", r, {"rank": r, "world": n, **record})
        cleanup()
        return
    record = {}
    rprint("1. mixed precision")
    record["mixed_precision"] = mixed_precision(mesh, dev, r, n, ctx.backend == "gloo")
    rprint("2. resharding and prefetching")
    record["resharding"] = resharding(mesh, dev, r, n)
    rprint("3. meta-device initialisation")
    record["meta"] = meta_init(mesh, dev, r, n)
    rprint("4. gradient accumulation")
    record["accumulation"] = accumulation(mesh, dev, r, n)
    rprint("5. state dicts")
    model = train(shard(make(torch.float64, dev), mesh), dev, r, n)
    record["state_dicts"] = state_dicts(model, r)
    if args.ckpt:
        record["files"] = save(model, args.ckpt, r)
        rprint(f"  checkpoint files: {record['files']}")
    rprint("6. activation checkpointing")
    record["checkpointing"] = activation_checkpointing(dev)
    rprint("7. ZeroRedundancyOptimizer")
    record["zero"] = zero(dev, r, n)
    write_record(args.out, "fsdp2", r, {"rank": r, "world": n, **record})
    cleanup()


if __name__ == "__main__":
    main()
