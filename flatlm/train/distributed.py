"""Data-parallel pre-training: ``train.world_size`` processes share every update.

Rank r of W takes rows r B/W .. (r+1) B/W - 1 of the very batch a one-process run draws at that
update (every rank draws and masks the whole batch, a pure function of (seed, i), and keeps its
slice; sam: that slice of each half). A rank's backward gives the gradient of the mean over its own
masked words; ``reduce_gradients`` all-reduces (gradient x local count, loss x local count, local
count) and divides by the global count, so that every rank applies the gradient of the mean over
the global batch's masked words: the one-process update, up to the order of float summation
(tests/train/test_distributed.py holds the parameters to 1e-6 of the one-process run's).

The calling process is rank 0: it alone holds the run directory's lock, writes checkpoints and
the train log, and runs ``on_checkpoint`` (so a Tune trial's reports and its MLflow tracker stay
in the trial's process). Ranks 1..W-1 are processes (spawned on CUDA; on the CPU forked from a
fork server that imported this module once) that run the same loop and write nothing. A
checkpoint stores every rank's RNG state and all ranks resume from the checkpoint rank 0 chose, so
a resumed run equals the uninterrupted one. Rank r draws dropout from its own stream
(``derive_seed(seed, "dropout", r)``): with dropout > 0 a W-rank run is another, equally valid,
draw than the one-process run; without dropout (noreg, sam) it is the same run.

Devices: gloo processes on the CPU; on CUDA rank r uses GPU ``index + r`` over NCCL. The gradient
is all-reduced after the backward of the whole batch (no overlap with it, unlike torch's DDP, which
this loop cannot use: it averages over ranks, not over masked words, and the MLM head is called
outside the model's ``forward``). adversarial is refused (its head is fitted on all of D1 at once).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flatlm.core.registry import load_plugins, loaded_plugins
from flatlm.core.seeds import derive_seed
from flatlm.models.presets import parse_model
from flatlm.sources import load
from flatlm.storage.dirlock import writer_lock
from flatlm.train.algorithms import StepContext, accumulate_mlm, sam_step
from flatlm.train.config import TrainConfig, resolve
from flatlm.train.data import BatchPipeline, MLMBatch, StepInputs, prefetch_depth
from flatlm.train.registry import (
    REGISTRY,
    Algorithm,
    RegistryView,
    algorithm_named,
    check_before_training,
    register_algorithm,
)
from flatlm.train.run import Run, TrainHooks, TrainResult, build_pipeline, start_checkpoint
from flatlm.train.state import capture_rng, find_checkpoints, load_state, restore_rng, set_aside

# A rank waits this long in a collective (a dead NCCL rank is noticed after it); while rank 0
# measures a checkpoint the others wait on the store instead, as long as rank 0 lives.
TIMEOUT = timedelta(minutes=30)
POLL = timedelta(seconds=0.2)
ABORT = "abort"  # the store key rank 0 sets when it fails
# How ranks 1.. start: on CUDA a fresh interpreter (nothing in it has touched CUDA); on the CPU
# forked from a clean process that has done the imports once (a second's start-up, not ten).
START_METHOD = {"cuda": "spawn", "cpu": "forkserver"}
BUCKET = 2**25  # gradient elements per all-reduce (128 MiB of float32)


def train_data_parallel(cfg: TrainConfig, source, model_cfg, out_dir, *, device="cpu",
                        on_checkpoint=None, progress=True, resume=False, corpus=None,
                        on_step=None, resume_before=None):
    """``flatlm.train.train`` over ``cfg.world_size`` processes, this one rank 0 (see the
    module docstring); same arguments, same result. Bad input raises before a process starts."""
    cfg = resolve(cfg)
    model_cfg = dataclasses.replace(parse_model(model_cfg), dropout=cfg.dropout)
    check_before_training(cfg, model_cfg)  # grow: every shape a growth of the one before it
    device = rank_device(torch.device(device), 0, cfg.world_size)  # checks the GPUs
    out_dir = Path(out_dir).absolute()
    start, unreadable = start_checkpoint(cfg, model_cfg, out_dir, resume, source, resume_before)
    pipeline = _sharded_pipeline(cfg, source, device, corpus, 0)  # checks train.data
    job = {"cfg": cfg, "source": source.spec, "model_cfg": model_cfg, "out_dir": out_dir,
           "device": str(device), "ckpt": start[0] if start else None, "corpus": corpus,
           "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "algorithm": algorithm_named(cfg.algorithm),  # one registered outside flatlm too
           "plugins": loaded_plugins()}  # a fresh rank registers what this process did
    try:
        with writer_lock(out_dir), _ranks(job, cfg.world_size, device):
            for bad, _ in unreadable:  # no rank reads them: each loads job["ckpt"]
                set_aside(bad)
            run = _train_rank(cfg, source, model_cfg, out_dir, device, start, pipeline,
                              TrainHooks(on_checkpoint, progress, on_step))  # rank 0
    finally:
        pipeline.close()
    return TrainResult(model=run.ctx.model, step=run.step, history=run.history,
                       checkpoints=find_checkpoints(out_dir))


def rank_device(device: torch.device, rank: int, world_size: int) -> torch.device:
    """Rank ``rank``'s device: the CPU, or GPU ``device.index + rank`` (which must exist)."""
    if device.type != "cuda":
        return device
    first, count = device.index or 0, torch.cuda.device_count()
    if first + world_size > count:
        raise ValueError(f"train.world_size={world_size}: one GPU per process from "
                         f"cuda:{first} needs {first + world_size} GPUs, this machine has {count} "
                         "(visible: CUDA_VISIBLE_DEVICES); lower train.world_size, or ask the "
                         "sweep for that many (--gpus-per-trial)")
    return torch.device("cuda", first + rank)


# ------------------------------------------------------------------------------ one rank's run


def _sharded_pipeline(cfg, source, device, corpus, rank: int) -> ShardedPipeline:
    return ShardedPipeline.of(build_pipeline(cfg, source, device, corpus)[0], rank, cfg.world_size)


QUIET = TrainHooks(progress=False)  # a rank that tells no one


def _train_rank(cfg, source, model_cfg, out_dir, device, start, pipeline,
                hooks: TrainHooks = QUIET):
    """This rank's run; only rank 0 tells ``hooks``."""
    rank = dist.get_rank()
    cuda = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        run = _RankRun.begin(cfg, source, model_cfg, out_dir, device, pipeline, 0, start)
        run.seed_dropout(rank, start)
        run.loop(hooks if rank == 0 else QUIET)
    return run


class ShardedPipeline(BatchPipeline):
    """Rank ``rank``'s slice of every update's inputs (``shard``), prepared as ``BatchPipeline``
    prepares the whole batch."""

    @classmethod
    def of(cls, whole: BatchPipeline, rank: int, world_size: int) -> ShardedPipeline:
        whole.close()
        pipeline = cls(whole.cfg, whole.sentences, whole.device,
                       prefetch=prefetch_depth(whole.cfg, whole.device), workers=whole.workers,
                       truth=whole.truth)  # every rank: the whole batch's truth, then its slice
        pipeline.rank, pipeline.world_size = rank, world_size
        return pipeline

    def host_inputs(self, i: int) -> StepInputs:
        mlm = shard(super().host_inputs(i).mlm, self.rank, self.world_size,
                    halves=algorithm_named(self.cfg.algorithm).halves_batch)
        return StepInputs(mlm)


def shard(batch: MLMBatch, rank: int, world_size: int, *, halves: bool = False) -> MLMBatch:
    """Rows ``rank`` B/W .. (rank+1) B/W - 1 of ``batch``; ``halves``: that slice of each half,
    concatenated (so that sam's split in two halves gives the ranks' slices of the halves)."""
    if not halves:
        return batch.split(len(batch) // world_size)[rank]
    first, second = (h.split(len(h) // world_size)[rank] for h in batch.split(len(batch) // 2))
    tensors = {f.name: torch.cat([getattr(first, f.name), getattr(second, f.name)])
               for f in dataclasses.fields(MLMBatch)
               if isinstance(getattr(first, f.name), torch.Tensor)}  # soft_targets may be None
    lengths = None if first.lengths is None else first.lengths + second.lengths  # host tuples
    return dataclasses.replace(first, **tensors, lengths=lengths)


# ------------------------------------------------------------------------------ the updates


def reduce_gradients(model: torch.nn.Module, loss: torch.Tensor, n_local) -> torch.Tensor:
    """Turns every rank's ``.grad`` (of its mean loss over its ``n_local`` masked words) into the
    gradient of the mean over all ranks' masked words; returns that mean ``loss``.

    Parameters without a gradient keep none (the same on every rank: one model, one code path).
    """
    n_local = torch.as_tensor(n_local, dtype=torch.float32, device=loss.device).reshape(1)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    n_total = torch.cat([loss.detach().float().reshape(1) * n_local, n_local])
    dist.all_reduce(n_total)  # (sum of the losses, masked words)
    n = n_total[1].clamp(min=1)
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket]).mul_(n_local)
        dist.all_reduce(flat)
        flat.div_(n)
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
            g.copy_(part.view_as(g))
    return n_total[0] / n


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    out, size = [[]], 0
    for g in grads:
        if out[-1] and size + g.numel() > BUCKET:
            out.append([])
            size = 0
        out[-1].append(g)
        size += g.numel()
    return out if out[0] else []


def data_parallel_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    """``standard_step`` on a rank's slice, with the gradient reduced over the ranks."""
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    loss = reduce_gradients(ctx.model, loss, inputs.mlm.n_targets())
    ctx.optimizer.step()
    return {"train/loss": loss}


def data_parallel_sam_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    """``sam_step`` on a rank's slices of the two halves: the perturbation from the first half's
    gradient reduced over the ranks (its norm is the global one), the update from the second's."""
    return sam_step(ctx, inputs, gradient=_reduced_gradient)


def _reduced_gradient(ctx: StepContext, batch: MLMBatch) -> torch.Tensor:
    return reduce_gradients(ctx.model, accumulate_mlm(ctx, batch), batch.n_targets())


# algorithm -> its data-parallel update, for those that have one: a view of the registry
# (flatlm.train.registry). grow: every rank grows alike (its new parameters' seed is the run's);
# label_noise: the targets are noised on the whole batch before it is sliced. Both update as
# adamw / sgd do.
DATA_PARALLEL_STEPS = RegistryView(Algorithm.data_parallel_update,
                                   has=lambda a: a.data_parallel_step is not None)


class _RankRun(Run):
    """A rank's run: its own update (``Algorithm.data_parallel_step``), every rank's RNG state
    in a checkpoint, and only rank 0 writing it."""

    def update_function(self):
        return algorithm_named(self.cfg.algorithm).data_parallel_update()

    def seed_dropout(self, rank: int, start) -> None:
        if start is None:
            torch.manual_seed(derive_seed(self.cfg.seed, "dropout", rank))
        else:
            restore_rng(start[1].rng["ranks"][rank], self.device)

    def checkpoint(self, on_checkpoint) -> None:
        self.ranks_rng = [None] * dist.get_world_size()
        dist.all_gather_object(self.ranks_rng, capture_rng(self.device))
        done = f"checkpoint-{self.step}"
        if dist.get_rank() == 0:
            super().checkpoint(on_checkpoint)
            _STORE[0].set(done, "1")
        else:  # measuring may outlast a collective's timeout
            _wait_for(done)

    def capture_rng(self) -> dict:
        return {**super().capture_rng(), "ranks": self.ranks_rng}


# ------------------------------------------------------------------------------ the processes


@contextmanager
def _ranks(job: dict, world_size: int, device: torch.device):
    """Starts ranks 1..W-1 (processes running ``job``) and joins the process group as
    rank 0; on exit leaves it and waits for them. A rank's error is raised here."""
    if dist.is_initialized():
        raise ValueError("train.world_size > 1 inside a process that already belongs to a "
                         "torch.distributed group; train with train.world_size=1 there")
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=TIMEOUT,
                          wait_for_workers=False)
    ctx = mp.get_context(START_METHOD[device.type])
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([__name__])
    errors = ctx.SimpleQueue()
    helpers = [ctx.Process(target=_helper, args=(rank, world_size, store.port, job, errors,
                                                 os.getpid()), name=f"flatlm-rank-{rank}")
               for rank in range(1, world_size)]
    threads = torch.get_num_threads()
    for p in helpers:
        p.start()
    try:
        _await_ranks(store, helpers, errors)
        _join_group(0, world_size, store, device)
        yield
    except BaseException as e:
        store.set(ABORT, "1")  # the ranks waiting on the store stop now, those in a collective
        if dist.is_initialized():  # once it is gone
            dist.destroy_process_group()
        _stop(helpers)
        helper_error = _first_error(errors)
        lost_peer = isinstance(e, dist.DistError) or type(e) is RuntimeError  # gloo's error
        if lost_peer and helper_error is not None \
                and not isinstance(helper_error, dist.DistError):
            raise helper_error from e  # rank 0 failed because that rank had
        raise
    else:
        _stop(helpers, wait_s=60.0)
        failed = [p for p in helpers if p.exitcode != 0]
        if failed:
            error = _first_error(errors)
            raise error or RuntimeError(f"data-parallel {failed[0].name} exited with "
                                        f"{failed[0].exitcode}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        errors.close()


def _helper(rank, world_size, port, job, errors, parent_pid) -> None:
    """Rank ``rank`` (a started process): trains ``job`` without writing; its error goes to
    ``errors``; it ends when its parent does."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    _see_gpus(job.get("gpus"))
    try:
        load_plugins(job["plugins"])  # before the source spec names a plug-in's kind
        _register_if_missing(job.get("algorithm"))
        device = rank_device(torch.device(job["device"]), rank, world_size)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=TIMEOUT)
        store.set(f"started-{rank}", "1")
        _join_group(rank, world_size, store, device)
        start = (job["ckpt"], load_state(job["ckpt"])) if job["ckpt"] else None
        cfg, source = job["cfg"], load(job["source"])
        pipeline = _sharded_pipeline(cfg, source, device, job["corpus"], rank)
        try:
            _train_rank(cfg, source, job["model_cfg"], job["out_dir"], device, start, pipeline)
        finally:
            pipeline.close()
    except BaseException as e:  # noqa: BLE001 - handed to rank 0, which raises it
        if _STORE[0] is not None and _STORE[0].check([ABORT]):
            sys.exit(1)  # rank 0 stopped first and raises its own error
        errors.put(_picklable(e))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _register_if_missing(algorithm: Algorithm | None) -> None:
    """Registers rank 0's algorithm here if this process lacks it (one registered outside flatlm,
    by a module that this rank, started afresh, has not imported)."""
    if algorithm is not None and algorithm.name not in REGISTRY:
        register_algorithm(algorithm)


# This process's store (one run at a time: a process belongs to one group).
_STORE: list = [None]


def _see_gpus(visible: str | None) -> None:
    """The GPUs rank 0 sees (Ray sets them per trial; the fork server kept those it started
    with), set before this process touches CUDA."""
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible


def _join_group(rank: int, world_size: int, store, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    _STORE[0] = store
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                            world_size=world_size, timeout=TIMEOUT)


def _wait_for(key: str) -> None:
    """Waits until rank 0 sets ``key`` in the store; raises if rank 0 stopped instead."""
    while not _STORE[0].check([key]):
        if _STORE[0].check([ABORT]):
            raise RuntimeError("rank 0 stopped (its error is raised there)")
        time.sleep(POLL.total_seconds())


def _await_ranks(store, helpers, errors) -> None:
    """Waits until every other rank has started (imports done, store reached); a rank that
    dies first is an error, not a wait for the timeout."""
    keys = [f"started-{rank}" for rank in range(1, len(helpers) + 1)]
    while not store.check(keys):
        dead = [p for p in helpers if not p.is_alive()]
        if dead:
            raise _first_error(errors) or RuntimeError(
                f"data-parallel {dead[0].name} exited with {dead[0].exitcode} before training")
        time.sleep(0.05)


def _watch_parent(parent_pid: int) -> None:
    """Ends this rank once rank 0's process is gone (NCCL would wait for its timeout)."""
    while True:
        try:
            os.kill(parent_pid, 0)  # no signal: only whether it exists
        except ProcessLookupError:
            os._exit(1)
        time.sleep(2.0)


def _stop(helpers, wait_s: float = 10.0) -> None:
    deadline = time.monotonic() + wait_s
    for p in helpers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in helpers:
        if p.is_alive():
            p.terminate()
            p.join()


def _first_error(errors) -> BaseException | None:
    return None if errors.empty() else errors.get()


def _picklable(e: BaseException) -> BaseException:

    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - an exception that does not cross processes: its text
        return RuntimeError(f"{type(e).__name__}: {e}")
