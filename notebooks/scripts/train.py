"""Chapter 05: the source's ``main_worker`` skeleton (section 4.5) as a real training script.

Runs on the CPU (gloo) and on GPUs (nccl, one process per GPU) unchanged:

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/train.py --out-dir /tmp/run
    torchrun --nproc-per-node 8 scripts/train.py --bf16 --compile          # one 8-GPU machine
    python scripts/train.py --help                                          # every flag

Resumes from OUT_DIR/last.pt when it exists, so the same command continues an interrupted
run, and ``torchrun --max-restarts 1`` survives a rank that dies (try ``--crash-at-epoch 2``).
Rank 0 alone decides whether to resume; every rank then loads the checkpoint it names from OUT_DIR
itself (each onto its own device), and a rank that cannot (node-local disks: only rank 0 writes) gets it
from rank 0 over the network, so the replicas never disagree. Which node gets rank 0 is the c10d
rendezvous' choice (static: --node-rank 0), so keep OUT_DIR on a filesystem every node shares. A
damaged checkpoint or metrics file, one of another number of processes, a folder that another run is
using, or a full disk is refused with what to do (exit code 2, every rank stopping).

After each epoch rank 0 appends the epoch's row to metrics.jsonl, then writes last.pt: a crash at any
point leaves the metrics file with a row for every epoch of the checkpoint, and resuming drops any row
newer than it (a last line cut short by the crash too), so the epoch is run and written again. A fresh
start (``--no-resume``, or no last.pt) in a folder that holds an earlier run's files moves them,
untouched, to OUT_DIR/previous-N/.
With this PyTorch version, give the launcher ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` when it may
restart: otherwise a restarted attempt can read the previous attempt's keys (gloo's addresses; any
backend exchanges its connection details through this store) and fail to connect (PyTorch issue 135712):

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run --standalone \
        --nproc-per-node 2 --max-restarts 1 scripts/train.py --crash-at-epoch 2

SIGUSR1 asks for a checkpoint and a clean exit (exit code 0) at the next check, every
``--stop-check-every`` steps (and at the end of each epoch): a scheduler's warning before its time limit
(Slurm: ``sbatch --signal=USR1@120``, or ``scancel --signal=USR1 JOBID``). The ranks agree on it, so all
of them stop after the same step, and the same command resumes in the middle of that epoch, with the
weights an uninterrupted run would have (the batches done are skipped by index without loading them with
``--num-workers 0``; with workers they are loaded and dropped, so that each worker's random stream goes on
as in the uninterrupted run). DataLoader workers ignore SIGUSR1, which the scheduler sends them too. Under
torchrun, pass ``--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``: by default the launcher
dies of SIGUSR1; with it, it passes the signal on and waits ``--shutdown-timeout`` seconds (default 30)
before it kills the workers (chapter 04's ``slurm_ddp.sbatch`` does both). Try it in a terminal with
``--signal-at-step 30``, which makes rank CRASH_RANK send the signal to itself and its DataLoader workers.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.ch05_full_pipeline import (
    CheckpointError,
    NoisyImages,
    ResumableSampler,
    TrainConfig,
    atomic_save,
    evaluate,
    format_config,
    get_rng_state,
    hold_out_dir,
    ignore_stop_signal,
    load_checkpoint,
    load_splits,
    parse_config,
    read_metrics,
    set_aside,
    set_rng_state,
    stop_signal_blocked,
    sync_buffers,
)
from course_utils.device import seed_everything
from course_utils.dist import DistContext, cleanup, rprint, setup
from course_utils.models import MODELS

CRASH_EXIT_CODE = 13


def log(ctx: DistContext, *args: object) -> None:
    """Print on rank 0 only (the other ranks hold the same numbers after the all-reduces)."""
    if ctx.rank == 0:
        rprint(*args)


def write_atomically(path: Path, text: str) -> None:
    """A text file written beside its place, then renamed over it: never seen half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Refused(Exception):
    """The run cannot go on as asked; rank 0 has said why."""


def agree(ctx: DistContext, problem: str | None) -> None:
    """Every rank learns whether rank 0 could do its part (None: it could; else why not, which rank 0
    prints once); all stop together (Refused) rather than wait for a rank that gave up."""
    said = [problem]
    dist.broadcast_object_list(said, src=0, device=ctx.device if ctx.backend == "nccl" else None)
    if said[0] is not None:
        if ctx.rank == 0:
            sys.stderr.write(f"error: {said[0]}\n")
        raise Refused(said[0])


def prepare_out_dir(cfg: TrainConfig, ctx: DistContext, out: Path) -> dict | None:
    """On rank 0: take OUT_DIR for this run, load last.pt when resuming, keep the metrics rows of the
    epochs it holds (a last line cut short by a crash is dropped), or, starting afresh, move an earlier
    run's files aside. Returns the checkpoint (None: a fresh run)."""
    global _held
    _held = hold_out_dir(out)  # released when this process ends
    metrics = out / "metrics.jsonl"
    path = out / "last.pt"
    ckpt = load_checkpoint(path, map_location="cpu", config=cfg) if cfg.resume else None
    saved_world = len(ckpt["rng"]) if ckpt is not None else ctx.world_size
    if saved_world != ctx.world_size:
        raise CheckpointError(
            f"the checkpoint {path.name} in {path.parent} was written by a run of {saved_world} "
            f"processes, and this run has {ctx.world_size}. Its learning-rate schedule counts the "
            "optimizer steps of an epoch split over the old number of processes (the schedule would "
            "end too early or too late), and its random streams are one per old process, so it "
            f"cannot be continued. Resume with {saved_world} processes (for an elastic job: "
            "--nnodes N:N, a fixed number of nodes), or start a fresh run with --no-resume (the earlier "
            "run's files are kept in previous-N/) or another --out-dir."
        )
    if ckpt is None:
        kept = set_aside(out)
        if kept is not None:
            rprint(f"note: {out.name}/ held an earlier run's files; they are kept in {out.name}/{kept.name}/ "
                   "(this run starts afresh)")
        return None
    torn: list[str] = []
    rows = [row for row in read_metrics(metrics, torn) if row.get("epoch", 0) <= ckpt["epoch"]]
    if torn:
        rprint("note: the last line of metrics.jsonl was cut short (a crash while writing it): dropped")
    write_atomically(metrics, "".join(json.dumps(row) + "\n" for row in rows))  # a re-run epoch: one row
    return ckpt


_held = None  # rank 0's hold on OUT_DIR (see hold_out_dir)


class StopSignal:
    """SIGUSR1 received: stop at the next check, after a checkpoint. The handler only
    takes note (a signal can arrive in the middle of anything); :meth:`agreed` is asked by every rank
    after the same steps (every ``--stop-check-every`` steps and at the end of each epoch), and
    all-reduces the note, so that all ranks stop after the same step even when the signal reaches them
    at different moments, or only one of them. Each check costs one all-reduce of one number, and on a
    GPU the host waits for the step's kernels to finish (``.item()``): hence not every step. A context
    manager: the previous handler is back afterwards."""

    def __init__(self, signum: int = signal.SIGUSR1) -> None:
        self.signum, self.noted = signum, False

    def __enter__(self) -> StopSignal:
        self.previous = signal.signal(self.signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(self.signum, self.previous)

    def _note(self, signum: int, frame: object) -> None:
        self.noted = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank has received the signal (a collective: every rank calls it)."""
        flag = torch.tensor([1.0 if self.noted else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0


def agree_on_checkpoint(cfg: TrainConfig, ctx: DistContext, out: Path) -> dict | None:
    """Rank 0 alone decides whether to resume (and prepares OUT_DIR); every rank then loads the checkpoint
    itself, onto its own device, and checks that it is the one rank 0 read (its ``id``).

    Only rank 0 writes checkpoints, so on node-local disks the other nodes have no ``last.pt`` (or an
    old one): ranks deciding alone could diverge. When any rank cannot load rank 0's checkpoint, rank 0
    sends it to every rank (pickled, through the process group: slow for a big model, and under nccl
    staged in GPU memory). A run that cannot go on (a checkpoint it cannot continue, a damaged metrics
    file, a folder in use) is refused once, by rank 0, and every rank stops.
    """
    found: list = [None]
    ckpt = None
    if ctx.rank == 0:
        path = out / "last.pt"
        try:
            ckpt = prepare_out_dir(cfg, ctx, out)
            found[0] = ("ok", None if ckpt is None else ckpt.get("id", ""))  # "": no id (an older file)
        except Exception as exc:  # refused once, never a rank left waiting: a bad file, a flaky filesystem
            why = f"{path} could not be read ({type(exc).__name__}: {exc}): move it away or pass --no-resume"
            if isinstance(exc, OSError):  # the folder itself: not there, not writable, full
                why = f"{out} cannot be used for this run ({exc}): check it, or give another --out-dir"
            found[0] = ("refused", str(exc) if isinstance(exc, CheckpointError) else why)
    on = ctx.device if ctx.backend == "nccl" else None
    dist.broadcast_object_list(found, src=0, device=on)  # a verdict and an id: a few bytes
    verdict, payload = found[0]
    if verdict == "refused":
        if ctx.rank == 0:
            sys.stderr.write(f"error: {payload}\n")
        raise Refused(payload)
    if payload is None:
        return None  # a fresh run on every rank
    if ctx.rank != 0:
        try:
            ckpt = load_checkpoint(out / "last.pt", map_location=ctx.device)
        except Exception:  # damaged or half-copied here: rank 0 sends its own
            ckpt = None
        if ckpt is None or not payload or ckpt.get("id") != payload:
            ckpt = None
    missing = torch.tensor([0.0 if ckpt is not None else 1.0], device=ctx.device)
    dist.all_reduce(missing, op=dist.ReduceOp.SUM)
    if missing.item() > 0:
        log(ctx, f"note: {int(missing.item())} rank(s) could not read this last.pt (node-local disks?): rank 0 "
                 "sends it to them through the process group")
        sent = [ckpt if ctx.rank == 0 else None]
        dist.broadcast_object_list(sent, src=0, device=on)
        if ckpt is None:
            ckpt = sent[0]
    return ckpt


def train(cfg: TrainConfig, ctx: DistContext, stop: StopSignal | None = None) -> dict:
    """The whole pipeline on this rank; returns the run's summary (the same on every rank), or where
    it stopped when `stop` received its signal."""
    out = Path(cfg.out_dir)
    device = ctx.device
    rank0 = ctx.rank == 0
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's, on this node
    log(ctx, "config:\n" + format_config(cfg, world_size=ctx.world_size,
                                         global_batch=cfg.batch_size * ctx.world_size, backend=ctx.backend))

    # 1. Data: in-memory tensors, a held-out validation split, a DistributedSampler for training.
    splits = load_splits(cfg.val_fraction, cfg.seed)
    train_sampler = DistributedSampler(splits.train, num_replicas=ctx.world_size, rank=ctx.rank,
                                       shuffle=True, seed=cfg.seed)
    # DataLoader seeds each worker (torch, random, NumPy) from a base seed drawn from loader_gen, which
    # is reseeded every epoch: a resumed run's workers get the same seeds as the uninterrupted run's.
    loader_gen = torch.Generator()
    workers = cfg.num_workers
    train_set = NoisyImages(splits.train, cfg.augment) if cfg.augment else splits.train
    sampler = ResumableSampler(train_sampler)  # a resumed epoch: from its first batch not done
    train_loader = DataLoader(
        train_set, batch_size=cfg.batch_size, sampler=sampler, num_workers=workers,
        pin_memory=device.type == "cuda", generator=loader_gen, timeout=60 if workers else 0,
        worker_init_fn=ignore_stop_signal if workers else None,  # a scheduler signals the workers too
        multiprocessing_context=None if cfg.worker_start == "default" or not workers else cfg.worker_start,
    )
    steps_per_epoch = len(train_loader)

    # 2. Model: the same initial weights on every rank (DDP would broadcast rank 0's anyway).
    seed_everything(cfg.seed)
    model = MODELS[cfg.model]().to(device)
    ckpt = agree_on_checkpoint(cfg, ctx, out)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    net = torch.compile(ddp_model) if cfg.compile else ddp_model

    # 3. Optimiser, schedule, loss.
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr,
                                                    total_steps=cfg.epochs * steps_per_epoch)
    criterion = nn.CrossEntropyLoss()

    start_epoch, elapsed, train_s, train_cpu_s = 0, 0.0, 0.0, 0.0
    done_steps, partial = 0, None  # a checkpoint of a stop in the middle of an epoch: its steps done
    seed_everything(cfg.seed + 1 + ctx.rank)  # dropout masks differ between ranks
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        start_epoch = ckpt["epoch"]
        extra = ckpt["extra"]
        elapsed, train_s, train_cpu_s = extra["elapsed_s"], extra["train_s"], extra["train_cpu_s"]
        set_rng_state(ckpt["rng"][ctx.rank])  # agree_on_checkpoint made sure there is one per rank
        done_steps = ckpt.get("step", 0)
        if done_steps:
            partial = ckpt["partial"][ctx.rank]  # this rank's sums and clock for the epoch so far
            log(ctx, f"resumed from last.pt: {start_epoch} epoch(s) and {done_steps} step(s) done "
                     f"(restart {restarts})")
        else:
            log(ctx, f"resumed from last.pt: {start_epoch} epoch(s) done (restart {restarts})")
    metrics = out / "metrics.jsonl"  # (rank 0 kept the rows of the epochs done: prepare_out_dir)

    def save_checkpoint(epochs_done: int, steps_done: int = 0, mine: dict | None = None) -> None:
        """last.pt at a signal, written by rank 0 with every rank's random state and every rank's sums so
        far in the epoch; a collective: every rank calls it (the end of an epoch saves in step 6)."""
        rng_states: list | None = [None] * ctx.world_size if rank0 else None
        dist.gather_object({"rng": get_rng_state(), "partial": mine}, rng_states, dst=0)  # to rank 0 only
        problem = None
        if rank0:  # epoch: the number of completed epochs, where the resumed loop starts
            state = {"id": os.urandom(8).hex(), "epoch": epochs_done, "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "rng": [r["rng"] for r in rng_states], "config": dataclasses.asdict(cfg),
                     "extra": {"elapsed_s": elapsed, "train_s": train_s, "train_cpu_s": train_cpu_s}}
            if steps_done:
                state.update(step=steps_done, partial=[r["partial"] for r in rng_states])
            try:
                atomic_save(state, out / "last.pt")
            except OSError as exc:  # the old last.pt is kept; every rank stops (agree)
                problem = (f"could not save the checkpoint ({exc}). Free some space (or fix the folder), then "
                           "run the same command again: it resumes from the last checkpoint")
        agree(ctx, problem)  # no rank leaves before last.pt is whole

    show_bar = cfg.progress and rank0 and sys.stderr.isatty()
    if show_bar:
        from tqdm.auto import tqdm
    n_train = len(splits.train)

    # 4. Training loop.
    for epoch in range(start_epoch, cfg.epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        loader_gen.manual_seed(cfg.seed * 1_000_003 + epoch * 1009 + ctx.rank)  # this epoch's workers
        model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of loss x n, n]
        skip = done_steps if epoch == start_epoch else 0
        # The steps done before a stop: without workers, skipped by index (never loaded: loading would
        # also draw the random augmentation of the skipped images from this process's random stream,
        # restored from the checkpoint). With workers, loaded and dropped: each worker's random stream
        # then goes on as in the uninterrupted run (the main process's is not drawn from).
        sampler.start = (skip if workers == 0 else 0) * cfg.batch_size
        if skip:  # the epoch was stopped after `skip` steps: its sums and clock go on from there
            sums += torch.tensor(partial["sums"], dtype=torch.float64, device=device)
            t0, c0 = t0 - partial["train_s"], c0 - partial["train_cpu_s"]
            last_batch_loss = partial["last_batch_loss"]
        bar = tqdm(total=steps_per_epoch, initial=skip, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False) if show_bar else None  # noqa: E501 (kept on one line: chapter 05 shows the numbers of the lines below)
        with stop_signal_blocked():  # the workers start here, with SIGUSR1 held back until they ignore it
            batches = iter(train_loader)
        for step, (images, labels) in enumerate(batches, start=sampler.start // cfg.batch_size):
            if step < skip:
                continue  # done before the stop: the same batches come back, in the same order
            if (epoch + 1 == cfg.crash_at_epoch and ctx.rank == cfg.crash_rank and restarts == 0
                    and step == steps_per_epoch // 2):
                rprint(f"rank {ctx.rank}: dying on purpose in epoch {epoch + 1}, step {step} (fault drill)")
                os._exit(CRASH_EXIT_CODE)
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                outputs = net(images)
                loss = criterion(outputs.float(), labels)
            loss.backward()
            if cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
            optimizer.step()
            scheduler.step()
            sums += torch.stack([loss.detach().double() * len(labels),
                                 torch.tensor(float(len(labels)), dtype=torch.float64, device=device)])
            last_batch_loss = loss.detach()  # what the skeleton printed: one batch of one rank (.item() below)
            if bar is not None:
                bar.update()
            global_step = epoch * steps_per_epoch + step + 1
            if global_step == cfg.signal_at_step and ctx.rank == cfg.crash_rank and stop is not None:
                # drill: the scheduler's warning, to this rank only, and (as torchrun's killpg and Slurm do)
                # to its DataLoader workers
                for worker in multiprocessing.active_children():
                    os.kill(worker.pid, stop.signum)
                os.kill(os.getpid(), stop.signum)
            check = (step + 1) % cfg.stop_check_every == 0 or step + 1 == steps_per_epoch  # the same on every rank
            if stop is not None and check and stop.agreed(device):
                if bar is not None:
                    bar.close()
                mine = {"sums": sums.tolist(), "train_s": time.perf_counter() - t0,
                        "train_cpu_s": time.process_time() - c0, "last_batch_loss": float(last_batch_loss)}
                save_checkpoint(epoch, step + 1, mine)
                log(ctx, f"signal {signal.Signals(stop.signum).name}: stopped after step {step + 1} of epoch "
                         f"{epoch + 1}; last.pt saved: the same command resumes from there")
                return {"stopped_at": (epoch, step + 1)}
        if bar is not None:
            bar.close()
        last_batch_loss = float(last_batch_loss)
        t_train, c_train = time.perf_counter() - t0, time.process_time() - c0

        # 5. Evaluation on every rank's shard, counts all-reduced (each sample counted once).
        dist.all_reduce(sums)
        train_loss = (sums[0] / sums[1]).item()
        sync_buffers(model)  # every rank evaluates, and saves, rank 0's BatchNorm statistics
        val = evaluate(model, splits.val, ctx.rank, ctx.world_size, device, cfg.eval_batch_size, cfg.bf16)
        test = (evaluate(model, splits.test, ctx.rank, ctx.world_size, device, cfg.eval_batch_size, cfg.bf16)
                if cfg.test_every_epoch else None)

        # 6. The epoch's metrics row, then the checkpoint: rank 0 writes, with every rank's random state;
        # the others wait for it to say it could (a full disk stops every rank, with the old last.pt kept).
        rng_states: list | None = [None] * ctx.world_size if rank0 else None
        dist.gather_object(get_rng_state(), rng_states, dst=0)  # to rank 0 only
        elapsed += time.perf_counter() - t0
        train_s += t_train
        train_cpu_s += c_train
        problem = None
        if rank0:  # epoch: the number of completed epochs, where the resumed loop starts
            row = {"epoch": epoch + 1, "train_loss": train_loss, "last_batch_loss": last_batch_loss,
                   "val_loss": val.loss, "val_acc": val.accuracy, "val_correct": val.correct, "val_total": val.total,
                   "lr": scheduler.get_last_lr()[0], "train_s": train_s, "train_cpu_s": train_cpu_s,
                   "elapsed_s": elapsed, "samples_per_s": sums[1].item() / t_train, "restart": restarts}
            if test is not None:
                row.update(test_acc=test.accuracy, test_loss=test.loss)
            state = {"id": os.urandom(8).hex(), "epoch": epoch + 1, "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_states,
                     "config": dataclasses.asdict(cfg),
                     "extra": {"elapsed_s": elapsed, "train_s": train_s, "train_cpu_s": train_cpu_s}}
            try:  # the row first: a crash between the two leaves a row that resuming drops, never a gap
                with open(metrics, "a") as f:
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                atomic_save(state, out / "last.pt")  # the epoch's checkpoint, after its row
            except OSError as exc:
                problem = (f"could not save epoch {epoch + 1} ({exc}). Free some space (or fix the folder), then run "
                           "the same command again: it resumes from the last checkpoint")
            else:
                rprint(f"epoch {epoch + 1}/{cfg.epochs}  train_loss {train_loss:.3f}  val_loss {val.loss:.3f}  "
                       f"val_acc {100 * val.accuracy:.2f}% ({val.correct}/{val.total})  ({t_train:.2f} s)")
        agree(ctx, problem)
        if epoch + 1 == cfg.stop_after_epoch:
            log(ctx, f"stopping after epoch {epoch + 1} (--stop-after-epoch): resume with the same command")
            return {"stopped_at": epoch + 1}

    # 7. Final test accuracy, the same way.
    sync_buffers(model)
    test = evaluate(model, splits.test, ctx.rank, ctx.world_size, device, cfg.eval_batch_size, cfg.bf16)
    summary = {"epochs": cfg.epochs, "test_acc": test.accuracy, "test_correct": test.correct, "test_total": test.total,
               "test_loss": test.loss, "train_s": train_s, "elapsed_s": elapsed, "world_size": ctx.world_size,
               "train_samples": n_train, "samples_per_s": cfg.epochs * n_train / max(train_s, 1e-9)}
    problem = None
    if rank0:
        try:
            atomic_save(model.state_dict(), out / "final.pt")
            write_atomically(out / "summary.json", json.dumps(summary, indent=1) + "\n")
        except OSError as exc:
            problem = (f"could not save the final weights ({exc}). Free some space (or fix the folder), then run "
                       "the same command again: it resumes from the last checkpoint and only tests again")
    agree(ctx, problem)
    log(ctx, f"test accuracy {100 * test.accuracy:.2f}% ({test.correct}/{test.total}), "
             f"test loss {test.loss:.3f}")
    log(ctx, f"training time {train_s:.1f} s over {cfg.epochs} epochs ({summary['samples_per_s']:.0f} samples per s)")
    return summary


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    with StopSignal(signal.SIGUSR1) as stop:  # before anything else: the signal may come at any time
        ctx = setup()
        try:
            train(cfg, ctx, stop)
        except Refused:
            return 2  # rank 0 has printed why; every rank stops
        finally:
            cleanup()
            if _held is not None:  # (a process ending lets go of OUT_DIR anyway)
                _held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
