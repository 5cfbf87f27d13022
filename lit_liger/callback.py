"""``LigerCallback``: lit-liger for the Lightning Trainer.

Swaps after the model exists and before the strategy wraps it:

* a model built in ``LightningModule.__init__`` is swapped in ``setup``;
* a model built in ``configure_model`` (the FSDP / DeepSpeed pattern; Lightning calls that hook
  *after* ``Callback.setup``) is swapped right after it is built: ``setup`` wraps the module's
  ``configure_model`` so the swap runs at its end, still before the strategy wraps the model.

Idempotent across fit/validate/test/predict (``apply_liger`` restores, then re-applies). The
report is logged once, on rank zero. Under ``ModelParallelStrategy`` a model swapped before ``configure_model`` shards
gets FSDP2's float8 all-gather with ``LigerConfig(fp8="tensorwise")`` (``fp8_all_gather``), and the callback computes
the float8 weights' scales once after each optimizer step. In one process (or each of DDP's), with litgpt's SFT
collate in the training DataLoader, each batch is laid out packed and its token counts kept on the host in the module's
``on_before_batch_transfer`` (``lit_liger.runtime.batches``), so a packed step reads nothing back from the GPU; the module's own
hook runs first and is put back after fitting. At ``on_fit_start`` a plain Adam / AdamW is switched to PyTorch's fused
kernel (``LigerConfig.fused_optimizer``). In several processes Lightning's per-batch broadcast of the SIGTERM flag
is read two batches later (``LigerConfig.defer_loss_sync``), so no batch waits for the GPU. Optional metrics: tokens/s
and peak GPU memory through Lightning's ``Throughput`` utility, logged to the Trainer's logger every
``log_every_n_steps``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from .apply import apply_liger
from .swap.fp8 import precompute_fp8_scales, wrapping_strategy
from .swap.report import LigerReport
from .runtime.batches import HostPrep, after_move, prep_for
from .config import LigerConfig
from .kernels._launch import interpret_mode
from .runtime import hostgc
from .runtime import optim as _optim

__all__ = ["LigerCallback"]


class LigerCallback(Callback):
    def __init__(self, config: LigerConfig | dict | bool | None = None, log_metrics: bool = True) -> None:
        self.config = LigerConfig.from_value(config)
        self.log_metrics = log_metrics
        self.report: LigerReport | None = None
        self._reported = False
        self._warned_cpu = False
        self._throughput: Throughput | None = None
        self._t0 = 0.0
        self._tokens = 0
        self._samples = 0
        self._backward_thread: Any = None
        self._gc: Any = None  # (lit_liger.runtime.hostgc.quiet, entered for the training loop) and its watch
        self._gc_watch: Any = None
        self._restore_collate: Any = None  # puts litgpt's collate back (lit_liger.runtime.batches.install)
        self._ahead: list = []  # the optimizers' state still to come, in the models' ModelState.state_ahead for the loop
        self._expected = False  # the models' ModelState.expected_lengths set for the loop (DDP's replicas)
        self._states: list = []  # the ModelStates of the swapped GPTs in the loop's module (lit_liger.swap.state)
        self._boxed: _BoxedCounts | None = None  # under DDP: unboxes the token counts inside its forward
        self._fp8_step = -1  # the optimizer step whose float8 all-gather scales were last computed
        self._fp8_weights = 0  # how many weights they cover (none: not computed again until the next fit)

    # -- swapping ------------------------------------------------------------------------------------
    def _swap(self, trainer: Trainer, pl_module: LightningModule) -> bool:
        strategy = trainer.strategy
        try:  # (LigerConfig.fp8_all_gather's automatic choice: on where FSDP2 shards the model next)
            from lightning.pytorch.strategies import ModelParallelStrategy

            fsdp2 = isinstance(strategy, ModelParallelStrategy)
        except ImportError:
            fsdp2 = False
        try:
            with wrapping_strategy(fsdp2, type(strategy).__name__):
                self.report = apply_liger(pl_module, self.config)
        except TypeError:
            return False  # no GPT yet: it will come from configure_model
        if not self._reported:
            rank_zero_info(str(self.report))
            self._reported = True
        return True

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self._warned_cpu and trainer.strategy.root_device.type != "cuda" and not interpret_mode():
            rank_zero_warn(
                "lit-liger: no CUDA device, so the Triton kernels cannot run; the swapped model uses the "
                "reference PyTorch path (same results, no speed-up). Set TRITON_INTERPRET=1 to run the kernels "
                "on CPU for testing."
            )
            self._warned_cpu = True
        self._swap(trainer, pl_module)
        if not getattr(pl_module.configure_model, "_liger_wrapped", False):
            original = pl_module.configure_model

            @functools.wraps(original)
            def configure_model(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                if not self._swap(trainer, pl_module):
                    raise TypeError(
                        "LigerCallback: no litgpt GPT found in the LightningModule after configure_model; "
                        "build a litgpt.GPT or litgpt.LLM in __init__ or configure_model"
                    )
                return out

            configure_model._liger_wrapped = True
            pl_module.configure_model = configure_model

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The optimizers exist by now (before a checkpoint's state is loaded into them): a plain Adam / AdamW steps
        with PyTorch's fused kernel (``LigerConfig.fused_optimizer``)."""
        if self.report is None or not self.config.enabled or not self.config.fused_optimizer:
            return
        for optimizer in trainer.optimizers:
            line = _optim.fuse_and_report(optimizer, "LigerConfig(fused_optimizer=False)")
            if line:
                rank_zero_info(line)

    # -- metrics -------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fp8_scales(trainer, pl_module, force=True)  # (weights restored from a checkpoint by now)
        from .swap.state import states_in

        self._states = list(states_in(pl_module)) if isinstance(pl_module, torch.nn.Module) else []
        # one process or DDP's replicas, litgpt's SFT collate in the training DataLoader: each batch is laid out packed
        # and its token counts kept on the host in the module's on_before_batch_transfer (lit_liger.runtime.batches; the
        # loader's iterator, and with it its collate, exists by now); on_train_batch_start unboxes each batch on the
        # device
        loader = getattr(trainer, "train_dataloader", None)
        if self._restore_collate is None and isinstance(loader, torch.utils.data.DataLoader) and \
                (trainer.world_size == 1 or _replicates(trainer.strategy)):
            prep = prep_for(pl_module, loader)
            if prep is not None:
                self._restore_collate = _prepare_before_transfer(pl_module, prep)
                if trainer.world_size > 1:  # DDP: the token counts unboxed once its forward has moved the batch
                    self._boxed = _BoxedCounts(pl_module)
        # the Trainer calls backward from this thread: run it here (LigerConfig.caller_thread_backward), until
        # on_train_end puts the thread's setting back
        if self._backward_thread is None:
            self._backward_thread = self.config.backward_thread()
            self._backward_thread.__enter__()
        if self.report is not None and self.config.enabled and self.config.defer_loss_sync:
            _LaggedSigtermCheck.install(trainer)
        if not self._ahead and (getattr(trainer, "world_size", 1) == 1 or _replicates(trainer.strategy)):
            # the state the optimizers make at their first step, left free by the first steps' memory plans and CUDA
            # graphs (ModelState.state_ahead; sharded parameters are the strategy's to plan)
            from .runtime.memplan import optimizer_state_ahead

            for opt in getattr(trainer, "optimizers", None) or []:
                inner = getattr(opt, "optimizer", opt)
                if hasattr(inner, "param_groups") and hasattr(inner, "state"):
                    self._ahead.append(optimizer_state_ahead(inner))
            for st in self._states:
                st.state_ahead.extend(self._ahead)
        if self.report is not None and self.config.enabled and not self._expected:
            expected = _expect_lengths(trainer, loader)
            for st in self._states:
                st.expected_lengths = expected
            self._expected = expected is not None
        if self.report is not None and self.config.enabled and self._gc is None:
            # the objects alive now frozen for the loop (lit_liger.runtime.hostgc): a full collection would walk them all
            self._gc = hostgc.quiet()
            self._gc_watch = self._gc.__enter__()
        if not self.log_metrics:
            return
        self._throughput = Throughput(world_size=trainer.world_size, window_size=max(2, trainer.log_every_n_steps))
        self._t0, self._tokens, self._samples = time.perf_counter(), 0, 0
        if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._restore_collate is not None:
            # (the Trainer moved it to the device before this hook; under DDP its forward moves it again)
            after_move(batch, unbox_counts=self._boxed is None)
            if self._boxed is not None:
                self._boxed.batch = batch

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _LaggedSigtermCheck.remove(trainer)
        self._forget_state_ahead()
        self._end_gc(trainer)
        self._restore_backward_thread()
        self._clear_fp8_scales(pl_module)
        self._put_collate_back()
        self._release_graphs(trainer, pl_module)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        _LaggedSigtermCheck.remove(trainer)
        self._forget_state_ahead()
        self._end_gc(trainer)
        self._restore_backward_thread()  # fitting stopped by an exception skips on_train_end
        self._clear_fp8_scales(pl_module)
        self._put_collate_back()
        self._release_graphs(trainer, pl_module)

    @staticmethod
    def _release_graphs(trainer: Trainer, pl_module: LightningModule) -> None:
        """The CUDA graphs captured in training and their pool go when training ends (``lit_liger.runtime.graphs.release``),
        and the pinned host memory of offloaded activations (``memplan.release_pinned``): what follows
        (``trainer.test``, saving, generation) gets that memory. Before that, the memory plan's measured-peak line where
        no planned forward followed its first step (``swap.gpt.say_measured_peak``)."""
        from .runtime.graphs import release
        from .runtime.memplan import release_pinned
        from .swap.gpt import say_measured_peak

        if not isinstance(pl_module, torch.nn.Module):
            return
        for module in pl_module.modules():  # (a run of one planned step: its measured peak, where still due)
            say_measured_peak(module)
        for line in (release(pl_module), release_pinned()):  # (and the offloaded activations' pinned host memory)
            if line and getattr(trainer, "is_global_zero", True):
                print(line, flush=True)

    def _put_collate_back(self) -> None:
        if self._restore_collate is not None:
            self._restore_collate()
            self._restore_collate = None
        if self._boxed is not None:
            self._boxed.remove()
            self._boxed = None

    def _clear_fp8_scales(self, pl_module: LightningModule) -> None:
        """After fitting the weights may change without an optimizer step (``trainer.validate(ckpt_path=...)``): each
        all-gather computes its weight's scale again."""
        if self._fp8_weights:
            precompute_fp8_scales(pl_module, clear=True)
            self._fp8_weights, self._fp8_step = 0, -1

    def _forget_state_ahead(self) -> None:
        for st in self._states:
            st.state_ahead[:] = [f for f in st.state_ahead if f not in self._ahead]
            if self._expected:  # (and the replicas' expected lengths: this loop's only)
                st.expected_lengths = None
        self._ahead, self._expected = [], False

    def _end_gc(self, trainer: Trainer) -> None:
        """The collector as it was before the loop (``on_train_start``), and one line on its collections meanwhile."""
        if self._gc is None:
            return
        gc_context, watch, self._gc, self._gc_watch = self._gc, self._gc_watch, None, None
        gc_context.__exit__(None, None, None)
        line = hostgc.report(watch)
        if line and getattr(trainer, "is_global_zero", True):
            rank_zero_info(line)

    def _restore_backward_thread(self) -> None:
        if self._backward_thread is not None:
            self._backward_thread.__exit__(None, None, None)
            self._backward_thread = None

    def _fp8_scales(self, trainer: Trainer, pl_module: LightningModule, force: bool = False) -> None:
        """With FSDP2's float8 all-gather (``LigerConfig.fp8_all_gather``): the weights' float8 scales for the next
        all-gathers, once per optimizer step (torchao's ``precompute_float8_dynamic_scale_for_fsdp``, one all-reduce
        on every rank) instead of an all-reduce per weight in each all-gather. The same scales either way."""
        if self.config.fp8 != "tensorwise" or self.config.fp8_all_gather is False:
            return
        if force or (self._fp8_weights and trainer.global_step != self._fp8_step):
            self._fp8_step = trainer.global_step
            self._fp8_weights = precompute_fp8_scales(pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._fp8_scales(trainer, pl_module)  # (after the batch's optimizer step, if it had one)
        if self._throughput is None:
            return
        tokens, samples = _count(batch)
        self._tokens += tokens
        self._samples += samples
        step = trainer.global_step
        if step == 0 or step % max(1, trainer.log_every_n_steps) or trainer.logger is None:
            return
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # only on logging steps
        self._throughput.update(
            time=time.perf_counter() - self._t0, batches=step, samples=self._samples, lengths=self._tokens
        )
        computed = self._throughput.compute()
        metrics = {"liger/tokens_per_sec": computed[k] for k in ("device/items_per_sec", "items_per_sec") if k in computed}
        if device.type == "cuda":
            metrics["liger/peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        if metrics:
            trainer.logger.log_metrics(metrics, step=step)


def _prepare_before_transfer(pl_module: LightningModule, prep: HostPrep) -> Callable[[], None]:
    """``pl_module.on_before_batch_transfer`` (the module's own first) followed by ``prep`` on the host batch, until
    the returned function puts the module's hook back."""
    own = pl_module.on_before_batch_transfer

    def hook(batch: Any, dataloader_idx: int) -> Any:
        batch = own(batch, dataloader_idx)
        trainer = getattr(pl_module, "_trainer", None)
        return prep(batch) if trainer is None or trainer.training else batch  # (validation batches: the user's)

    pl_module.on_before_batch_transfer = hook  # (an instance attribute over the class's method)

    def restore() -> None:
        pl_module.__dict__.pop("on_before_batch_transfer", None)

    return restore


class _BoxedCounts:
    """Under ``DistributedDataParallel`` a training batch's token counts stay boxed (:class:`lit_liger.runtime.batches.HostPrep`)
    past its forward's move of the inputs (``_to_kwargs``: every CPU tensor copied to the device from pageable
    memory, which waits for the GPU's queued work, at every micro-batch); a forward pre-hook on the LightningModule,
    which runs inside DDP's forward after that move, unboxes them in the arguments the step receives and in the batch
    the loop holds (``batch``, which its later hooks see)."""

    def __init__(self, pl_module: LightningModule) -> None:
        self.batch: Any = None
        self.handle = pl_module.register_forward_pre_hook(self._unbox, with_kwargs=True)

    def _unbox(self, _module: Any, args: tuple, kwargs: dict) -> None:
        from .runtime.batches import unbox

        for value in (*args, *kwargs.values(), self.batch):
            unbox(value)
        self.batch = None

    def remove(self) -> None:
        self.handle.remove()
        self.batch = None


def _count(batch: Any) -> tuple[int, int]:
    """(tokens, samples) of a batch: the first integer tensor found (input ids)."""
    if isinstance(batch, torch.Tensor):
        if batch.dtype in (torch.int64, torch.int32):
            return batch.numel(), batch.shape[0] if batch.dim() else 1
        return 0, 0
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else []
    for item in items:
        t, s = _count(item)
        if t:
            return t, s
    return 0, 0


def _expect_lengths(trainer: Trainer, loader: Any) -> dict | None:
    """Under DDP (several replicas), the models' ``ModelState.expected_lengths`` for this fit from the training loader: every
    rank's micro-batches rebuilt from Lightning's ``DistributedSampler`` (``lit_liger.parallel.balance.ReplicaBatches``), counted
    per packed length over the loop's micro-batches per rank (``max_steps`` x ``accumulate_grad_batches``, or its
    epochs), so that the first step pre-captures only the lengths expected at least ``graphs.PRECAPTURE_MIN_COUNT``
    times, as the command's replicas do. None where not known (the caller clears it at the loop's end)."""
    from . import cli
    from .parallel.balance import ReplicaBatches, expect_lengths

    world = getattr(trainer, "world_size", 1)
    if world < 2 or not _replicates(trainer.strategy) or cli.EXPECT_ROUNDS <= 0:
        return None
    batches = ReplicaBatches.of(loader, world)
    if batches is None:
        return None
    per_epoch = len(batches)
    runs = []
    if (getattr(trainer, "max_steps", -1) or -1) > 0:
        runs.append(trainer.max_steps * max(1, getattr(trainer, "accumulate_grad_batches", 1)))
    if (getattr(trainer, "max_epochs", -1) or -1) > 0:
        runs.append(trainer.max_epochs * per_epoch)
    return expect_lengths(batches, min(runs) if runs else per_epoch, cli.EXPECT_ROUNDS)


def _replicates(strategy: Any) -> bool:
    """Lightning's ``DDPStrategy`` (or a subclass of the user's, not DeepSpeed's): every process holds the whole model
    and runs its own batches through it, so each batch's host-side prep is the one process's."""
    from lightning.pytorch.strategies import DDPStrategy

    return isinstance(strategy, DDPStrategy) and "DeepSpeed" not in type(strategy).__name__


class _LaggedSigtermCheck:
    """Lightning's training loop, in several processes, broadcasts rank 0's "SIGTERM received" flag before every batch
    and reads it with ``.item()`` (``_TrainingEpochLoop._broadcast_sigterm_tensor``, Lightning 2.6): the host waits
    for the GPU at every micro-batch, so it never prepares the next batch while the GPU runs this one. Measured under
    DDP (2 x H200, Llama-3.2-1B LoRA, micro-batch 4): 31.3 ms per micro-batch against 15.2 on one GPU; with a check
    read one batch later and the replicas' lengths captured together at the first step, 17.1 against 14.1
    (benchmarks/results/h200x2-2026-11-27c).

    This check broadcasts the same flag without the compute stream waiting for it: the broadcast's result is copied to
    pinned host memory on a side stream that waits for it, and the host reads the copy :data:`LAG` batches later (a ring
    of :data:`SLOTS` flags; a slot is reused only after its copy was read). Every rank reads the same value at the same
    batch, :data:`LAG` batches later than Lightning would, and then stops as Lightning does (barrier,
    ``SIGTERMException``). A broadcast the compute stream waited for would hold every rank's GPU to the slower rank's
    at every micro-batch, where the gradients' all-reduce does once per optimizer step (the measurement above waited
    so; reading two batches later without that wait is not measured yet). On CPU (gloo) the broadcast is synchronous
    and only the reading lags."""

    SLOTS = 4
    LAG = 2

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        device = trainer.strategy.root_device
        self.cuda = device.type == "cuda"
        self.flags = torch.zeros(self.SLOTS, dtype=torch.int32, device=device)
        self.host = torch.zeros(self.SLOTS, dtype=torch.int32, pin_memory=self.cuda)
        self.events = [torch.cuda.Event() for _ in range(self.SLOTS)] if self.cuda else []
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.n = 0

    def __call__(self) -> None:
        if self.n >= self.LAG:
            j = (self.n - self.LAG) % self.SLOTS
            if self.cuda:
                self.events[j].synchronize()  # (done unless this rank's GPU or the other's is LAG batches behind)
            if int(self.host[j]) == 1:
                from lightning.pytorch.utilities.exceptions import SIGTERMException

                with contextlib.suppress(Exception):
                    torch.distributed.barrier()  # (as Lightning: no rank left waiting in a collective)
                raise SIGTERMException()
        i = self.n % self.SLOTS
        flag = self.flags[i:i + 1]
        flag.fill_(1 if getattr(self.trainer, "received_sigterm", False) else 0)
        if self.cuda:
            work = torch.distributed.broadcast(flag, src=0, async_op=True)
            with torch.cuda.stream(self.stream):
                work.wait()  # (this side stream waits for the broadcast; the compute stream does not)
                self.host[i:i + 1].copy_(flag, non_blocking=True)
                self.events[i].record()
        else:
            torch.distributed.broadcast(flag, src=0)
            self.host[i:i + 1].copy_(flag)
        self.n += 1

    @staticmethod
    def install(trainer: Trainer) -> None:
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if loop is None or not hasattr(type(loop), "_broadcast_sigterm_tensor") or trainer.world_size < 2 \
                or isinstance(loop.__dict__.get("_broadcast_sigterm_tensor"), _LaggedSigtermCheck):
            return
        loop._broadcast_sigterm_tensor = _LaggedSigtermCheck(trainer)

    @staticmethod
    def remove(trainer: Trainer) -> None:
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if loop is not None and isinstance(loop.__dict__.get("_broadcast_sigterm_tensor"), _LaggedSigtermCheck):
            del loop._broadcast_sigterm_tensor

