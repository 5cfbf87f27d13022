"""LigerCallback with the Lightning Trainer: models built in __init__ and in configure_model."""

import copy

import lightning as L
import pytest
import torch
from helpers import rel_err
from lightning.pytorch.loggers import CSVLogger
from litgpt import GPT
from litgpt.api import LLM
from test_adapter import _randomize, tiny_config

from lit_liger import LigerCallback, LigerConfig, LigerLogits
from lit_liger.swap.adapter import is_swapped
from lit_liger.swap import gpt as swap_gpt


def _data(vocab=150, n=8, T=12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, T), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=2)


class LLMModule(L.LightningModule):
    """LitGPT's recommended Trainer usage: `_, loss = self.llm(input_ids, target_ids)`."""

    def __init__(self, model: GPT):
        super().__init__()
        self.llm = LLM(model)
        self.losses = []

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        _, loss = self.llm(ids, ids)
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        (ids,) = batch
        logits = self.llm(ids)  # no grad: real logits
        assert isinstance(logits, torch.Tensor)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ConfigureModelModule(L.LightningModule):
    """The FSDP/DeepSpeed pattern: the GPT is built in configure_model (after Callback.setup)."""

    def __init__(self, cfg, state):
        super().__init__()
        self.cfg, self.state, self.model = cfg, state, None
        self.outputs = []

    def configure_model(self):
        if self.model is not None:
            return
        self.model = GPT(self.cfg)
        self.model.load_state_dict(self.state)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        out = self.model(ids)
        self.outputs.append(type(out))
        from lit_liger import chunked_cross_entropy

        return chunked_cross_entropy(out[..., :-1, :], ids[..., 1:])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, cb, steps=3, **kw):
    return L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, callbacks=[cb] if cb else [], logger=CSVLogger(tmp_path),
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, **kw,
    )


def _stock_and_ours(module_cls):
    """Two modules of ``module_cls`` around equal copies of one random-init tiny Llama: stock's and lit-liger's."""
    torch.manual_seed(0)
    base = GPT(tiny_config("Llama-3.2-1B"))
    _randomize(base)
    return module_cls(copy.deepcopy(base)), module_cls(copy.deepcopy(base))


def test_fit_with_llm_matches_stock(tmp_path):
    stock, ours = _stock_and_ours(LLMModule)
    _trainer(tmp_path / "a", None).fit(stock, _data())
    cb = LigerCallback()
    _trainer(tmp_path / "b", cb, limit_val_batches=1, val_check_interval=2).fit(ours, _data(), _data())
    assert cb.report is not None and is_swapped(ours.llm.model)
    assert len(ours.losses) == len(stock.losses) == 3
    for a, b in zip(ours.losses, stock.losses):
        assert rel_err(a, b) <= 1e-4
    # idempotent across stages: validate after fit swaps nothing twice
    n = len(cb.report.swapped)
    _trainer(tmp_path / "b", cb).validate(ours, _data())
    assert len(cb.report.swapped) == n
    # metrics reached the logger
    import csv
    import glob

    rows = [r for f in glob.glob(str(tmp_path / "b" / "**" / "metrics.csv"), recursive=True) for r in csv.DictReader(open(f))]
    assert any(r.get("liger/tokens_per_sec") for r in rows)


class AdamWModule(LLMModule):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("fused", [True, False])
def test_fit_switches_adamw_to_the_fused_kernel(tmp_path, monkeypatch, fused):
    """LigerConfig.fused_optimizer: the module's AdamW steps fused (CPU parameters let in here, as CUDA ones are); the
    losses are stock's."""
    from lit_liger.runtime import optim

    monkeypatch.setattr(optim, "DEVICES", ("cuda", "cpu"))
    stock, ours = _stock_and_ours(AdamWModule)
    _trainer(tmp_path / "a", None, steps=4).fit(stock, _data())
    _trainer(tmp_path / "b", LigerCallback(LigerConfig(fused_optimizer=fused), log_metrics=False), steps=4).fit(ours, _data())
    opt = ours.trainer.optimizers[0]
    assert opt.param_groups[0]["fused"] is (True if fused else None)
    assert stock.trainer.optimizers[0].param_groups[0]["fused"] is None
    assert len(ours.losses) == len(stock.losses) == 4
    assert rel_err(ours.losses[-1], ours.losses[0]) > 1e-3  # it trained
    for a, b in zip(ours.losses, stock.losses):
        assert rel_err(a, b) <= 1e-4


class FreezeCountModule(LLMModule):
    def training_step(self, batch, batch_idx):
        import gc

        self.frozen = getattr(self, "frozen", []) + [gc.get_freeze_count()]
        gc.collect(0)  # (one collection in the loop at least, for the line)
        return super().training_step(batch, batch_idx)


def test_fit_freezes_the_objects_alive_for_the_training_loop(tmp_path, caplog):
    """``lit_liger.runtime.hostgc`` under the Trainer: the objects alive when training starts are frozen for the loop (a full
    collection skips them), unfrozen when it ends; one line says what the collections cost."""
    import gc
    import logging

    _, ours = _stock_and_ours(FreezeCountModule)
    cb = LigerCallback(log_metrics=False)
    with caplog.at_level(logging.INFO):
        _trainer(tmp_path, cb, steps=3).fit(ours, _data())
    assert len(ours.frozen) == 3 and all(n > 1000 for n in ours.frozen)
    assert gc.get_freeze_count() == 0 and cb._gc is None
    line = next(r.getMessage() for r in caplog.records if "garbage collector" in r.getMessage())
    assert "objects alive at the start frozen (gc.freeze)" in line and int(line.split("loop: ")[1].split(" ")[0]) >= 3


class StateAheadModule(LLMModule):
    def training_step(self, batch, batch_idx):
        from lit_liger.runtime import memplan

        self.ahead = getattr(self, "ahead", []) + [memplan.state_ahead(self.llm.model)]
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_fit_counts_the_optimizer_state_still_to_come(tmp_path):
    """Under the Trainer the optimizers' state that their first step makes is in the model's ``state_ahead``
    (``lit_liger.swap.state.ModelState``) for the loop (the first steps' memory plans and graphs leave it free): AdamW's
    two moments of every trained parameter before the first step, nothing after it, and nothing registered once
    fitting ends."""
    from lit_liger.swap.state import state_of

    _, ours = _stock_and_ours(StateAheadModule)
    cb = LigerCallback(log_metrics=False)
    _trainer(tmp_path, cb, steps=3).fit(ours, _data())
    trained = sum(p.numel() * p.element_size() for p in ours.parameters() if p.requires_grad)
    assert ours.ahead[0] == 2 * trained > 0 and ours.ahead[1:] == [0, 0]
    assert state_of(ours.llm.model).state_ahead == [] and cb._ahead == []


def test_fit_with_configure_model(tmp_path):
    cfg = tiny_config("Qwen3-0.6B")
    torch.manual_seed(0)
    base = GPT(cfg)
    _randomize(base)
    module = ConfigureModelModule(cfg, base.state_dict())
    cb = LigerCallback(log_metrics=False)
    _trainer(tmp_path, cb, steps=2).fit(module, _data())
    assert is_swapped(module.model)
    assert module.outputs and all(t is LigerLogits for t in module.outputs)


def test_callback_warns_on_cpu_without_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cfg = tiny_config("Llama-3.2-1B")
    module = LLMModule(GPT(cfg))
    with pytest.warns(UserWarning, match="reference PyTorch path"):
        _trainer(tmp_path, LigerCallback(log_metrics=False), steps=1).fit(module, _data())


def bf16_pair(cfg):
    """A randomized stock LitGPT GPT in bf16 and a swapped copy of it."""
    from lit_liger import apply_liger

    torch.manual_seed(0)
    stock = GPT(cfg)
    _randomize(stock)
    stock = stock.to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    apply_liger(ours)
    return stock, ours


def test_fabric_bf16_true_output_cast_leaves_the_fused_loss_unchanged():
    """Fabric's ``bf16-true`` precision casts a module's floating outputs to float32 after forward
    (what every litgpt training script runs under). The deferred logits must survive it: same loss
    and gradients as calling the swapped model directly, and close to stock LitGPT's bf16 loss."""
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import apply_liger, chunked_cross_entropy

    cfg = tiny_config("Llama-3.2-1B")
    stock, ours = bf16_pair(cfg)
    direct = copy.deepcopy(ours)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    wrapped = fabric.setup_module(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    y = torch.randint(0, cfg.vocab_size, (2, 12))
    y[0, :3] = -100

    out = wrapped(x)
    # Fabric cast the output: its dtype says so, and the model's bf16 hidden states are kept rather than a float32
    # copy of them (which would live until the step ends)
    assert isinstance(out, LigerLogits) and out.dtype == torch.float32 and out.hidden.dtype == torch.bfloat16
    assert out.float() is out and out.bfloat16().dtype == torch.bfloat16
    with torch.no_grad():
        real, direct_real = out.real(), direct(x)  # (a no-grad call returns the real logits)
    # the logits of the model's own bf16 hidden states, cast as Fabric casts outputs
    assert real.dtype == torch.float32 and direct_real.dtype == torch.bfloat16
    assert torch.equal(real, direct_real.float())
    loss = chunked_cross_entropy(out[..., :-1, :], y[..., 1:])
    loss.backward()
    loss_direct = chunked_cross_entropy(direct(x)[..., :-1, :], y[..., 1:])
    loss_direct.backward()
    assert loss.dtype == torch.float32 and torch.equal(loss.detach(), loss_direct.detach())
    for (n, p), (_, q) in zip(ours.named_parameters(), direct.named_parameters()):
        assert p.grad.dtype == torch.bfloat16 and torch.equal(p.grad, q.grad), n
    loss_stock = litgpt_ce(stock(x)[..., :-1, :], y[..., 1:], chunk_size=0)
    assert rel_err(loss, loss_stock) < 1e-2  # bf16 model, fp32 loss math in both


class SFTModule(L.LightningModule):
    """A Trainer over litgpt's SFT collate (input_ids / labels / token_counts), litgpt's finetune loss."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model
        self.losses, self.token_counts = [], []

    def training_step(self, batch, batch_idx):
        from lit_liger import chunked_cross_entropy

        counts = batch["token_counts"]["raw_plus_prompt_template"]
        self.token_counts.append((counts.device.type, int(counts.sum())))
        out = self.model(batch["input_ids"], lm_head_chunk_size=128)
        out[-1] = out[-1][..., :-1, :]
        loss = chunked_cross_entropy(out, batch["labels"][..., 1:])
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _sft_loader(vocab=150, n=8):
    from litgpt.data.base import get_sft_collate_fn

    g = torch.Generator().manual_seed(0)
    samples = []
    for L_ in torch.randint(4, 12, (n,), generator=g).tolist():
        ids = torch.randint(1, vocab, (L_,), generator=g)
        labels = ids.clone()
        labels[: L_ // 3] = -100
        samples.append({"input_ids": ids, "labels": labels, "token_counts": {"raw": L_ - 2, "raw_plus_prompt_template": L_}})
    return torch.utils.data.DataLoader(samples, batch_size=2, collate_fn=get_sft_collate_fn())


def test_trainer_batches_packed_by_the_data_loader(tmp_path, monkeypatch):
    """With litgpt's SFT collate the callback has the data loader lay each batch out packed (``lit_liger.runtime.batches``):
    the forward plans nothing, the loss checks nothing on the device, the token counts reach ``training_step`` as
    host tensors with their values, the losses equal stock's, and litgpt's collate is back after ``fit``."""
    from lit_liger.swap import adapter as adapter_mod
    from lit_liger.swap import packing
    from lit_liger.swap.state import state_of

    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    stock, ours = _stock_and_ours(SFTModule)
    _trainer(tmp_path / "a", None).fit(stock, _sft_loader())
    planned, plan = [], packing.plan
    monkeypatch.setattr(packing, "plan", lambda *a, **k: planned.append(plan(*a, **k)) or planned[-1])
    loader = _sft_loader()
    collate = loader.collate_fn
    _trainer(tmp_path / "b", LigerCallback()).fit(ours, loader)
    assert len(ours.losses) == len(stock.losses) == 3
    for a, b in zip(ours.losses, stock.losses):
        assert rel_err(a, b) <= 1e-4
    assert all(p is None for p in planned)  # the forward planned nothing (a batch without padding: nothing to pack)
    checks = state_of(ours.model).loss_checks  # (the model's own, from 0 when the callback swapped it)
    assert checks["host"] == 3 - len(planned) >= 1
    assert checks["device"] == 0
    assert ours.token_counts == stock.token_counts and all(d == "cpu" for d, _ in ours.token_counts)
    assert loader.collate_fn is collate


def test_sigterm_check_of_several_processes_is_read_later(monkeypatch):
    """Lightning's loop in several processes broadcasts rank 0's SIGTERM flag before every batch and reads it with
    ``.item()``, a wait for the GPU per micro-batch; LigerCallback (defer_loss_sync) puts a check in its place that
    reads the broadcast of two batches before: a SIGTERM stops every rank two batches later, as Lightning stops it."""
    import os
    import socket
    import types

    import torch.distributed as dist
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lit_liger.callback import _LaggedSigtermCheck

    assert hasattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor")  # (what is replaced: Lightning >= 2.5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
    monkeypatch.setitem(os.environ, "MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        loop = type("Loop", (), {"_broadcast_sigterm_tensor": lambda self: None})()
        trainer = types.SimpleNamespace(fit_loop=types.SimpleNamespace(epoch_loop=loop), world_size=1,
                                        strategy=types.SimpleNamespace(root_device=torch.device("cpu")),
                                        received_sigterm=False)
        _LaggedSigtermCheck.install(trainer)
        assert "_broadcast_sigterm_tensor" not in loop.__dict__  # (one process: Lightning broadcasts nothing)
        trainer.world_size = 2
        _LaggedSigtermCheck.install(trainer)
        check = loop._broadcast_sigterm_tensor
        assert isinstance(check, _LaggedSigtermCheck)
        for _ in range(6):  # no SIGTERM: batches go on (past the ring's 4 slots)
            check()
        trainer.received_sigterm = True
        check()  # broadcast now, read two batches later
        check()
        with pytest.raises(SIGTERMException):
            check()
        _LaggedSigtermCheck.remove(trainer)
        assert "_broadcast_sigterm_tensor" not in loop.__dict__
    finally:
        dist.destroy_process_group()


def test_ddp_moves_the_batch_without_the_boxed_token_counts():
    """Under DDP the token counts stay boxed through its forward's move of the inputs (torch's ``_to_kwargs``, the
    function DDP calls: the box has no ``.to``, so no CPU tensor of it is copied, a copy that would wait for the GPU),
    and the LightningModule's forward pre-hook unboxes them in the moved copy the step receives and in the loop's own
    batch; the hook goes with ``remove``."""
    from torch.distributed.utils import _to_kwargs

    from lit_liger.runtime.batches import HostPrep
    from lit_liger.callback import _BoxedCounts

    seen = []

    class Step(L.LightningModule):
        def forward(self, batch):
            seen.append(batch["token_counts"])
            return batch.get("input_ids")

    batch = HostPrep(pack=False, bucketed=False)({"input_ids": torch.ones(2, 3, dtype=torch.long),
                                                  "token_counts": {"raw": torch.tensor([3, 2])}})
    boxed = batch["token_counts"]
    module = Step()
    hook = _BoxedCounts(module)
    hook.batch = batch
    inputs, _ = _to_kwargs((batch,), {}, torch.device("meta"), False)  # (a device the copy would go to)
    (moved,) = inputs[0]
    assert moved is not batch and moved["input_ids"].device.type == "meta" and moved["token_counts"] is boxed
    module(moved)
    assert seen[-1] is boxed.value and seen[-1]["raw"].device.type == "cpu" and batch["token_counts"] is boxed.value
    hook.remove()
    again = HostPrep(pack=False, bucketed=False)({"token_counts": {"raw": torch.tensor([1])}})
    module(again)
    assert seen[-1] is again["token_counts"] and not isinstance(seen[-1], dict)  # no hook any more


def test_host_side_batch_prep_under_ddp_but_not_deepspeed_or_fsdp():
    """The batches' host-side prep (packed layout, token counts on the host) runs where every process holds the whole
    model and runs its own batches: one process or Lightning's DDPStrategy (a user's subclass too), not DeepSpeed's
    subclass of it, not FSDP."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

    from lit_liger.callback import _replicates

    class MyDDP(DDPStrategy):
        pass

    assert _replicates(DDPStrategy()) and _replicates(MyDDP())
    assert not _replicates(FSDPStrategy())
    assert not _replicates(DeepSpeedStrategy.__new__(DeepSpeedStrategy))  # (no deepspeed package needed)


class _DDPSFTModule(SFTModule):
    """SFTModule that logs, from inside each training step, what rank 0's launcher hands back to the test process
    (``callback_metrics``): whether Lightning's per-batch SIGTERM check is LigerCallback's, and whether the batches
    are prepared on the host (``lit_liger.runtime.batches``)."""

    def training_step(self, batch, batch_idx):
        from lit_liger.callback import _LaggedSigtermCheck

        loss = super().training_step(batch, batch_idx)
        loop = self.trainer.fit_loop.epoch_loop
        self.log("lagged_sigterm_check", float(isinstance(loop.__dict__.get("_broadcast_sigterm_tensor"),
                                                          _LaggedSigtermCheck)), reduce_fx="min")
        self.log("host_prep", float(any(getattr(cb, "_restore_collate", None) is not None
                                        for cb in self.trainer.callbacks)), reduce_fx="min")
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        counts = batch["token_counts"]  # (the loop's own batch, as callbacks see it: unboxed too)
        self.log("counts_on_host", float(isinstance(counts, dict) and counts["raw"].device.type == "cpu"),
                 reduce_fx="min")


def test_trainer_under_ddp_matches_stock_ddp(tmp_path, monkeypatch):
    """Two processes (Lightning's ``ddp_fork`` on CPU, gloo), litgpt's SFT collate: with LigerCallback the batches are
    packed on the host and Lightning's SIGTERM check is read two batches later; rank 0's weights after 3 steps equal
    stock's under the same strategy."""
    from lit_liger.swap import adapter as adapter_mod

    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    stock, ours = _stock_and_ours(_DDPSFTModule)

    def fit(module, cb, root):
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=3, callbacks=[cb] if cb else [],
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=root)
        trainer.fit(module, _sft_loader(n=12))
        return trainer

    a = fit(stock, None, tmp_path / "a")
    b = fit(ours, LigerCallback(log_metrics=False), tmp_path / "b")
    assert float(a.callback_metrics["lagged_sigterm_check"]) == 0.0
    assert float(b.callback_metrics["lagged_sigterm_check"]) == 1.0
    assert float(a.callback_metrics["host_prep"]) == 0.0 and float(b.callback_metrics["host_prep"]) == 1.0
    assert float(a.callback_metrics["counts_on_host"]) == float(b.callback_metrics["counts_on_host"]) == 1.0
    moved = 0
    for (name, p), q, r in zip(ours.model.named_parameters(), stock.model.parameters(), _stock_and_ours(SFTModule)[0]
                               .model.parameters()):
        assert rel_err(p, q) <= 1e-4, name
        moved += bool((q - r).abs().max() > 1e-6)
    assert moved > 0  # (rank 0's trained weights came back to this process)
