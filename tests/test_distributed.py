"""Two processes on CPU (gloo): a swapped model under FSDP1 and FSDP2 gives rank 0 the loss and the
gradients of a single-process stock LitGPT run (same batch on both ranks, so the averaged gradient is
the single-process one). Exercises the fused-loss seam under sharding: the lm_head weight is taken
gathered inside the forward and its gradient goes back through the sharding strategy."""

import faulthandler
import gc
import multiprocessing.queues
import os
import queue as queue_module
import signal
import socket
import sys
import tempfile
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lit_liger.swap import gpt as swap_gpt

HERE = os.path.dirname(__file__)


#: seconds a multi-process test may run before it fails naming the ranks still running and where they were
SPAWN_TIMEOUT_S = float(os.environ.get("LIT_LIGER_TEST_SPAWN_TIMEOUT", "600"))


def _traced(rank: int, fn, args: tuple, stack_dir: str) -> None:
    """A rank's body: ``fn(rank, *args)``, with SIGUSR1 set to write every thread's Python stack to its file."""
    stacks = open(os.path.join(stack_dir, f"rank{rank}.txt"), "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    fn(rank, *args)


def spawn_ranks(fn, args: tuple, nprocs: int = 2, timeout: float | None = None) -> None:
    """``mp.spawn(fn, args, nprocs)`` that cannot hang: past ``timeout`` seconds (``SPAWN_TIMEOUT_S``) each rank
    still running dumps its Python stacks, is killed, and the test fails with which rank stalled where (a stale
    DeepSpeed extension build lock once made ``join=True`` wait forever). A rank that raises fails the test
    with its traceback, as ``mp.spawn`` does."""
    timeout = SPAWN_TIMEOUT_S if timeout is None else timeout
    stack_dir = tempfile.mkdtemp(prefix="lit-liger-ranks-")
    context = mp.spawn(_traced, args=(fn, args, stack_dir), nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    # a rank's results on a multiprocessing queue (``args``) are read while the ranks run and put back at the end: a
    # rank exits only once its queue's feeder thread has written everything into the pipe (64 KiB on Linux), and with
    # the parent reading nothing until the join, rank 0 of test_fp8_fsdp hung there at exit (CI of 2026-12-02: its
    # feeder thread blocked in the pipe's write; the test passed alone)
    queues = [a for a in args if isinstance(a, multiprocessing.queues.Queue)]
    held: list = []

    def drain() -> None:
        for q in queues:
            while True:
                try:
                    held.append((q, q.get(timeout=0.05)))
                except queue_module.Empty:
                    break

    while not context.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
        drain()
        if time.monotonic() < deadline:
            continue
        stalled = [rank for rank, proc in enumerate(context.processes) if proc.is_alive()]
        for rank in stalled:
            os.kill(context.processes[rank].pid, signal.SIGUSR1)
        time.sleep(2.0)  # time to write the stacks
        where = []
        for rank in stalled:
            path = os.path.join(stack_dir, f"rank{rank}.txt")  # (none yet: the rank had not started its body)
            text = open(path).read().strip() if os.path.exists(path) else ""  # noqa: SIM115
            where.append(f"--- rank {rank}:\n{text or '(no stack written: still starting)'}")
        for proc in context.processes:
            if proc.is_alive():
                proc.kill()
        pytest.fail(f"rank(s) {stalled} of {nprocs} still running after {timeout:.0f} s; their Python stacks:\n"
                    + "\n".join(where), pytrace=False)
    drain()
    for q, item in held:  # (in the order the ranks sent them)
        q.put(item)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _finish(result, queue) -> None:
    """End a worker cleanly: the body ran in its own function, so the sharded model, its hooks and the
    gloo work objects that reference tensors are unreachable now; free them while the interpreter is
    fully alive (a gloo thread freeing a tensor during interpreter shutdown aborts the process with
    "terminate called without an active exception"), wait for the other rank, then tear down."""
    if result is not None:
        queue.put(result)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _worker(rank: int, world: int, mode: str, name: str, port: int, queue) -> None:
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, HERE)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _finish(_sharded_run(rank, mode, name), queue)


def _sharded_config(name: str):
    """The tiny config of ``name``: Llama's from test_adapter; gemma-2's from test_attention (softcap on every layer,
    a window of 5 on the local ones, shorter than the test's 8 tokens: lit-liger's Triton softcap attention on the
    global layer, LitGPT's math after lit-liger's RoPE on the windowed ones, on CPU)."""
    if name == "gemma-2-2b":
        from test_attention import window_config

        return window_config(name)
    from test_adapter import tiny_config

    return tiny_config(name)


def _sharded_run(rank: int, mode: str, name: str):
    from litgpt.model import Block
    from litgpt.utils import chunked_cross_entropy as litgpt_ce
    from test_adapter import _pair

    from lit_liger import LigerLogits, apply_liger, chunked_cross_entropy

    cfg = _sharded_config(name)
    ref, ours = _pair(cfg)
    import lit_liger.swap.attention as swap_attention

    kernel_calls = []  # lit-liger's Triton softcap attention, as the swapped (and sharded) layers call it
    real_kernel = swap_attention.softcap_attention
    swap_attention.softcap_attention = lambda *a: kernel_calls.append(a[0].shape) or real_kernel(*a)
    torch.manual_seed(5)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    y = torch.randint(0, cfg.vocab_size, (2, 8))
    y[0, :2] = -100
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    loss_ref.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    apply_liger(ours)
    if mode.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(ours, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True,
                     limit_all_gathers=True, device_id=torch.device("cpu"))
        if mode == "fsdp1_ckpt":  # what `litgpt finetune_full` sets up through Fabric's FSDPStrategy
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )

            apply_activation_checkpointing(
                model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: isinstance(m, Block)
            )
    else:
        from torch.distributed.fsdp import fully_shard

        for block in ours.transformer.h:
            fully_shard(block)
        fully_shard(ours)
        model = ours
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(x)
    # FSDP2 (torch >= 2.13) warns where a wrapped module returns a view: the final norm's output is none
    views = [str(w.message)[:120] for w in caught if "returned a view tensor" in str(w.message)]
    assert isinstance(out, LigerLogits) and out.head is not None  # gathered inside the forward
    loss = chunked_cross_entropy(out, y)
    loss.backward()
    errs = {}
    if mode.startswith("fsdp1"):
        with FSDP.summon_full_params(model, with_grads=True):
            for n, p in ours.named_parameters():
                n = n.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")
                errs[n] = ((p.grad - ref_grads[n]).norm() / ref_grads[n].norm()).item()
    else:
        for n, p in ours.named_parameters():
            g = p.grad.full_tensor()
            errs[n] = ((g - ref_grads[n]).norm() / ref_grads[n].norm()).item()
    # a checkpoint consolidated from the sharded swapped model loads into stock LitGPT unchanged
    if mode.startswith("fsdp1"):
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType

        cfg_sd = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)  # CPU run: nothing to offload
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg_sd):
            full = model.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    loads = None
    if rank == 0:
        from litgpt import GPT

        stock = GPT(cfg)
        stock.load_state_dict(full, strict=True)  # same keys: the swap and the wrappers left no trace
        loads = all(torch.equal(stock.state_dict()[k], v) for k, v in ref.state_dict().items())
    swap_attention.softcap_attention = real_kernel
    return (float(loss.detach()), float(loss_ref.detach()), errs, loads, len(kernel_calls), views) if rank == 0 \
        else None


@pytest.mark.parametrize("mode, name", [("fsdp1", "Llama-3.2-1B"), ("fsdp1_ckpt", "Llama-3.2-1B"),
                                        ("fsdp2", "Llama-3.2-1B"), ("fsdp1_ckpt", "gemma-2-2b"),
                                        ("fsdp2", "gemma-2-2b")])
def test_sharded_fused_loss_matches_single_process(mode, name):
    """Sharded (FSDP1 with and without LitGPT's activation checkpointing, FSDP2) swapped models against stock LitGPT
    in one process: loss and every gradient; gemma-2 adds the softcap attention kernel and windowed layers."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_worker, (2, mode, name, _free_port(), queue))
    loss, loss_ref, errs, loads, kernel_calls, views = queue.get(timeout=60)
    assert not views, views
    assert loads  # consolidated weights == the (untrained) single-process model's, key for key
    assert abs(loss - loss_ref) / abs(loss_ref) <= 1e-5
    assert len(errs) == len(list(tiny_config_param_names(name)))
    # gemma-2's global layer (1 of 3) ran the Triton kernel: once per forward, twice where checkpointing recomputes
    assert kernel_calls == {"Llama-3.2-1B": 0, "gemma-2-2b": 2 if mode == "fsdp1_ckpt" else 1}[name]
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-4, (worst, errs[worst])
    assert errs["lm_head.weight"] <= 1e-4  # the fused loss's weight gradient reached the sharded parameter


def tiny_config_param_names(name: str = "Llama-3.2-1B"):
    sys.path.insert(0, HERE)
    from litgpt import GPT

    with torch.device("meta"):
        return [n for n, _ in GPT(_sharded_config(name)).named_parameters()]


def _deepspeed_worker(rank: int, world: int, port: int, stage: int, name: str, queue) -> None:
    """DeepSpeed ZeRO-``stage`` on CPU (gloo), 2 processes, the tiny ``name`` config (Llama; gemma-2 with its softcap
    attention kernel and windowed layers): stock LitGPT vs the swapped model, 4 optimizer
    steps, (a) loss computed inside the engine's forward by a module around the GPT (how Lightning's
    Trainer runs ``training_step``); (b) GPT as the engine's module, loss after its forward (Fabric +
    DeepSpeed). ZeRO-2: fused loss in both. ZeRO-3: fused in (a); in (b) the lm_head is a size-0
    partition at loss time, so real logits and LitGPT's loss. Same losses and lm_head gradients."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    faulthandler.enable()
    sys.path.insert(0, HERE)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    _finish(_deepspeed_run(rank, stage, name), queue)


def _deepspeed_run(rank: int, stage: int, name: str):
    import warnings

    import deepspeed
    from deepspeed.utils import safe_get_full_grad, safe_get_local_grad
    from litgpt import GPT

    from lit_liger import apply_liger, chunked_cross_entropy

    import lit_liger.swap.attention as swap_attention

    cfg = _sharded_config(name)  # gemma-2: softcap attention kernel, windowed layers, final softcap
    kernel_calls = [0]  # lit-liger's Triton softcap attention, as the swapped layers call it
    real_kernel = swap_attention.softcap_attention

    def counted(*a):
        kernel_calls[0] += 1
        return real_kernel(*a)

    swap_attention.softcap_attention = counted
    # overlap_comm (ZeRO-3's default) and parameter prefetch off. Once, in CI, the stock-vs-stock lm_head gradients
    # came out 19% apart at step 3, the first step that prefetches from the recorded trace (not reproduced in 26
    # reruns, 20 of them with the CPU loaded); their asynchronous scheduling is our guess at the cause. This test
    # is about the loss path, not DeepSpeed's overlap.
    ds_cfg = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "overlap_comm": False, "stage3_prefetch_bucket_size": 0}}

    class Around(torch.nn.Module):
        def __init__(self, gpt):
            super().__init__()
            self.gpt = gpt
            self.outputs = []

        def forward(self, x, y):
            out = self.gpt(x)
            self.outputs.append(type(out).__name__)
            return chunked_cross_entropy(out, y)

    results = {}
    for variant in ("stock-around", "liger-around", "stock-top", "liger-top"):
        with deepspeed.zero.Init(config_dict_or_path=ds_cfg, enabled=stage == 3):
            torch.manual_seed(0)
            gpt = GPT(cfg)
        if variant.startswith("liger"):
            apply_liger(gpt)
        module = Around(gpt) if variant.endswith("around") else gpt
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
        engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=ds_cfg)
        g = torch.Generator().manual_seed(rank)
        losses, head_grads, kinds = [], [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4):
                x = torch.randint(0, cfg.vocab_size, (2, 8), generator=g)
                y = torch.randint(0, cfg.vocab_size, (2, 8), generator=g)
                if variant.endswith("around"):
                    loss = engine(x, y)
                else:
                    out = engine(x)
                    kinds.append(type(out).__name__)
                    loss = chunked_cross_entropy(out, y)
                engine.backward(loss)
                # ZeRO-3: this rank's partition, read without DeepSpeed's in-place all-gather (the full read once
                # gave a step-3 gradient 100% off for stock alone while every loss matched); compared across ranks
                # below with a plain all_reduce.
                read = safe_get_local_grad if stage == 3 else safe_get_full_grad
                head_grads.append(read(gpt.lm_head.weight).clone())
                engine.step()
                losses.append(float(loss.detach()))
        kinds = module.outputs if variant.endswith("around") else kinds
        results[variant] = (losses, head_grads, kinds, [str(w.message) for w in caught if "ZeRO-3" in str(w.message)],
                            kernel_calls[0])
        kernel_calls[0] = 0
    ref = results["stock-around"][1]
    summed = {}
    for k, v in results.items():  # per step: |g|^2, |g - g_stock|^2, |g_stock|^2, summed over the ranks' partitions
        sq = torch.tensor([[a.double().square().sum(), (a.double() - b.double()).square().sum(),
                            b.double().square().sum()] for a, b in zip(v[1], ref)])
        if stage == 3:
            dist.all_reduce(sq)
        summed[k] = sq
    if rank != 0:
        return None
    return {k: (v[0], summed[k][:, 0].sqrt().tolist(), v[2], v[3], (summed[k][:, 1] / summed[k][:, 2]).sqrt().tolist(),
                v[4]) for k, v in results.items()}


@pytest.mark.parametrize("stage, name", [(2, "Llama-3.2-1B"), (3, "Llama-3.2-1B"), (2, "gemma-2-2b"),
                                         (3, "gemma-2-2b")])
def test_deepspeed_fused_loss_matches_stock(stage, name):
    pytest.importorskip("deepspeed")
    if not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ctx = mp.get_context("spawn")
    # Stock against stock first: the two ways of calling stock LitGPT must agree, or the run measured DeepSpeed, not
    # the loss path. Under ZeRO-3 on CPU they did not, three times in CI (an lm_head gradient 10-100% off at one
    # step, every loss equal; see _deepspeed_run), and once more (2026-11-26, CI of 0f0036c: the 4th step's loss of
    # stock called directly 2e-4 off stock called inside a module, earlier steps equal), never in reruns. Such a run
    # is repeated (up to twice); lit-liger's variants are held to the unchanged bounds below on a run where stock
    # agrees with itself.
    def stock_agrees(r: dict) -> bool:
        losses, ref = r["stock-top"][0], r["stock-around"][0]
        return max(r["stock-top"][4]) <= 1e-4 and all(abs(a - b) / abs(b) <= 1e-5 for a, b in zip(losses, ref))

    for attempt in range(3):
        queue = ctx.Queue()
        spawn_ranks(_deepspeed_worker, (2, _free_port(), stage, name, queue))
        r = queue.get(timeout=60)
        if stock_agrees(r):
            break
    stock_losses = r["stock-around"][0]
    for variant in ("liger-around", "liger-top", "stock-top"):
        losses, _, _, _, grad_errs, _ = r[variant]
        assert all(abs(a - b) / abs(b) <= 1e-5 for a, b in zip(losses, stock_losses)), (variant, losses, stock_losses)
        assert max(grad_errs) <= 1e-4, (variant, grad_errs, r)  # the lm_head gradient, gathered in full
    assert r["liger-around"][2] == ["LigerLogits"] * 4 and not r["liger-around"][3]  # fused, no warning
    # gemma-2's global layer (1 of its 3) ran the Triton kernel in each of the 4 forwards; stock never calls it
    want = 4 if name == "gemma-2-2b" else 0
    assert [r[v][5] for v in ("stock-around", "liger-around", "stock-top", "liger-top")] == [0, want, 0, want], r
    if stage == 2:
        assert r["liger-top"][2] == ["LigerLogits"] * 4 and not r["liger-top"][3]
    else:
        assert r["liger-top"][2] == ["Tensor"] * 4 and r["liger-top"][3]  # logits, and it said why


def _stall(rank: int, stall_rank: int) -> None:
    if rank == stall_rank:
        time.sleep(60)  # a rank that never arrives (as one waiting on a lock would)


def test_a_stalled_rank_fails_with_where_it_was():
    """The multi-process tests cannot hang: a rank past the timeout fails the test, naming the rank and its stack."""
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as info:  # (20 s: a spawned rank's imports took 9 s on a busy 2-core CI)
        spawn_ranks(_stall, (1,), timeout=20.0)
    message = str(info.value)
    assert "rank(s) [1] of 2 still running after 20 s" in message
    assert "--- rank 1:" in message and "in _stall" in message  # faulthandler's frame line of the stalled call
    assert "--- rank 0:" not in message  # the rank that finished is not blamed
    assert time.monotonic() - t0 < 55  # (the stalled rank sleeps 60 s: killed, not waited for)


def _ddp_worker(rank: int, world: int, port: int, queue) -> None:
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, HERE)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _finish(_ddp_run(rank), queue)


def _ddp_run(rank: int):
    """A swapped model replicated by DDP, packing and activation checkpointing on (what ``replicate_frozen_base``
    gives each device): inside DDP's forward the batch is packed and the Blocks recomputed, as in one process; the
    loss and the all-reduced gradients equal stock LitGPT's single-process ones (same batch on both ranks)."""
    from litgpt.utils import chunked_cross_entropy as litgpt_ce
    from test_adapter import _pair
    from test_packing import _batch

    import lit_liger.swap.adapter as adapter
    from lit_liger import LigerConfig, apply_liger
    from lit_liger._dist import replicated, sharded_processes

    swap_gpt._PACK_ON_CPU = True
    swap_gpt._BUCKETS_ON_CPU = True
    cfg = _sharded_config("Llama-3.2-1B")
    cfg.block_size = 64
    ref, ours = _pair(cfg)
    x, y = _batch(cfg, lengths=(21, 9, 14))
    loss_ref = litgpt_ce(ref(x)[..., :-1, :], y[..., 1:], chunk_size=0)
    loss_ref.backward()
    apply_liger(ours, LigerConfig(packing=True, activation_checkpointing=True))
    model = torch.nn.parallel.DistributedDataParallel(ours)
    seen = []
    real_plan = type(ours)._liger_plan

    def plan(self, idx):
        seen.append((replicated(self), sharded_processes(self), swap_gpt._checkpoint_blocks_here(self)))
        return real_plan(self, idx)

    type(ours)._liger_plan = plan
    try:
        out = model(x)
    finally:
        type(ours)._liger_plan = real_plan
    packed = out.rows is not None
    loss = litgpt_ce(out[..., :-1, :], y[..., 1:], chunk_size=0)
    loss.backward()
    errs = {n: ((p.grad - q.grad).norm() / q.grad.norm()).item()
            for (n, p), q in zip(ours.named_parameters(), ref.parameters())}
    outside = (replicated(ours), sharded_processes(ours))
    return (float(loss), float(loss_ref), errs, seen, packed, outside) if rank == 0 else None


def test_ddp_replica_packs_and_matches_single_process():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_ddp_worker, (2, _free_port(), queue))
    loss, loss_ref, errs, seen, packed, outside = queue.get(timeout=60)
    assert seen == [(True, False, True)] and packed  # inside DDP's forward: a replica, checkpointed and packed
    assert outside == (False, True)  # outside it, the same process counts as a multi-process (sharded) run
    assert abs(loss - loss_ref) / abs(loss_ref) <= 1e-5
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-4, (worst, errs[worst])


def _ddp_gpu_worker(rank: int, world: int, port: int, queue) -> None:
    _join(rank, world, port, gpu=True)
    _finish(_ddp_gpu_run(rank), queue)


def _ddp_gpu_run(rank: int):
    """Each rank: a bf16 LoRA model replicated by DDP with CUDA graphs and packing, three accumulated micro-batches
    of different lengths (rank-dependent data); rank 0 also runs the same model in one process on both ranks' data
    (uncaptured, unpacked): the DDP run's all-reduced gradients equal the mean of the two."""
    from litgpt.utils import chunked_cross_entropy as litgpt_ce
    from test_buckets import _gpu_models
    from test_packing import _batch

    from lit_liger import LigerConfig, apply_liger
    from lit_liger.runtime.graphs import runner_for

    cfg, graphed, plain = _gpu_models(lora=True)
    apply_liger(graphed, LigerConfig(cuda_graphs=True, packing=True))
    # (on a side stream, as PyTorch's notes on CUDA graphs ask and Lightning's DDPStrategy does: constructed on the
    # default stream, its gradient accumulators make the captured backward fail, h200x2-2026-11-27c/f2-ddp-capture.log)
    with torch.cuda.stream(torch.cuda.Stream()):
        model = torch.nn.parallel.DistributedDataParallel(graphed, device_ids=[rank])
    batches = {r: [_batch(cfg, lengths, seed=10 * r + i) for i, lengths in enumerate([(100, 300, 90), (50, 120),
                                                                                       (100, 300, 90)])]
               for r in range(2)}
    for x, y in batches[rank]:  # (each backward all-reduces: the accumulated gradient is the mean over the ranks)
        loss = litgpt_ce(model(x.cuda())[..., :-1, :], y.cuda()[..., 1:], chunk_size=0)
        (loss / 3).backward()
    runner = runner_for(graphed)
    result = None
    if rank == 0:
        for r in range(2):
            for x, y in batches[r]:
                loss = litgpt_ce(plain(x.cuda())[..., :-1, :], y.cuda()[..., 1:], chunk_size=0)
                (loss / 6).backward()
        errs = {n: ((p.grad.float() - q.grad.float()).norm() / q.grad.float().norm()).item()
                for (n, p), q in zip(graphed.named_parameters(), plain.parameters()) if p.grad is not None}
        result = (errs, runner.captures, runner.precaptured_n, runner.replays,
                  (runner.disabled, (runner.error or "")[-3000:]))
    return result


@pytest.mark.gpu
def test_gpu_ddp_replica_graphs_and_packing_reduce_gradients():
    """Two GPUs (NCCL): CUDA graphs replay inside the forward of torch's DDP (constructed on a side stream) and DDP
    all-reduces the gradients the replayed backward hands to autograd; with packing on, the gradients are one
    process's over both ranks' batches."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_ddp_gpu_worker, (2, _free_port(), queue))
    errs, captures, precaptured, replays, (disabled, error) = queue.get(timeout=60)
    # (DDP's replicas capture the packed lengths of the first step's 3 samples at that step, every process at once: 15
    # on 2 x H200; the 2-sample micro-batch is outside that ladder and is captured at its own step:
    # benchmarks/results/h200x2-2026-11-27d/g2-pytest.log. All three micro-batches replay. With graphs.CAPTURE_AFTER 4
    # it ran uncaptured, its gradients added to the replayed ones': passed, h200x2-2026-11-27h/s1-pytest.log)
    assert not disabled and precaptured >= 2 and captures == precaptured + 1 and replays == 3, (
        captures, precaptured, replays, disabled, error)
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 3e-2, (worst, errs[worst])


# ----------------------------------------------------------------------------------------------
# lit-liger's replica plan (lit_liger.parallel.dataparallel.ReplicaStrategy)
# ----------------------------------------------------------------------------------------------
def _join(rank: int, world: int, port: int, gpu: bool) -> None:
    """A spawned rank's set-up: stacks on a fatal signal, the rendezvous, this test folder importable, its GPU
    (``gpu``: NCCL, else gloo) and the process group."""
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, HERE)
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)


def _replica_worker(rank: int, world: int, port: int, queue, gpu: bool, graphs: bool = True) -> None:
    _join(rank, world, port, gpu)
    _finish(_replica_run(rank, gpu, graphs), queue)


def _replica_run(rank: int, gpu: bool, graphs: bool = True):
    """Each rank: a swapped model trained in full (every parameter; on GPUs bf16 with CUDA graphs, packing and
    gradients added straight into ``.grad``) under ReplicaStrategy: ``setup_module`` (rank 1 starts from other
    weights: the broadcast makes them rank 0's), three micro-batches of rank-dependent data, the first two inside
    ``no_backward_sync``, through the strategy's ``backward``. Rank 0 also runs one process's model on both ranks'
    data: the replicas' gradients are the mean of the two, and only the last backward reduced."""
    import copy

    from litgpt.utils import chunked_cross_entropy as litgpt_ce
    from lightning.fabric.plugins import Precision
    from test_adapter import _pair
    from test_packing import _batch

    import lit_liger.swap.adapter as adapter
    from lit_liger import LigerConfig, _dist, apply_liger
    from lit_liger.parallel.dataparallel import replica_class
    from lit_liger.runtime.graphs import runner_for

    device = "cuda" if gpu else "cpu"
    if gpu:
        from test_buckets import _gpu_models

        cfg, ours, _ = _gpu_models(lora=False)
        ref = copy.deepcopy(ours)
        apply_liger(ref, LigerConfig(cuda_graphs=False, packing=False))
        apply_liger(ours, LigerConfig(cuda_graphs=graphs, packing=True))
        lengths = [(100, 300, 90), (50, 120), (100, 300, 90)]
    else:
        swap_gpt._PACK_ON_CPU = True
        swap_gpt._BUCKETS_ON_CPU = True
        cfg = _sharded_config("Llama-3.2-1B")
        cfg.block_size = 64
        ref, ours = _pair(cfg)
        apply_liger(ours, LigerConfig(packing=True))
        lengths = [(21, 9, 14), (30, 5), (21, 9, 14)]
    if rank == 1:  # (other weights: setup_module broadcasts rank 0's)
        with torch.no_grad():
            for p in ours.parameters():
                p.add_(1.0)
    strategy = replica_class()()
    strategy.precision = Precision()
    model = strategy.setup_module(ours)
    flags = (_dist.whole_model(ours), _dist.liger_replica(ours), _dist.replicated(ours), _dist.sharded_processes(ours))
    batches = {r: [_batch(cfg, ls, seed=10 * r + i) for i, ls in enumerate(lengths)] for r in range(2)}
    for i, (x, y) in enumerate(batches[rank]):
        with strategy._backward_sync_control.no_backward_sync(model, i < 2):
            loss = litgpt_ce(model(x.to(device))[..., :-1, :], y.to(device)[..., 1:], chunk_size=0)
            strategy.backward(loss / 3, None)
    assert strategy._unfinished  # (the last all-reduces are left to the optimizer step: read the sums after them)
    strategy.finish_gradients()
    result = None
    captures = (runner_for(ours).captures, runner_for(ours).precaptured_n) if gpu else (0, 0)
    from lit_liger.parallel.dataparallel import grad_segments

    segments = grad_segments(ours)
    early = (strategy.early, sum(1 for seg in segments[1:-1] if seg), len(segments))
    if rank == 0:
        for r in range(2):
            for x, y in batches[r]:
                loss = litgpt_ce(ref(x.to(device))[..., :-1, :], y.to(device)[..., 1:], chunk_size=0)
                (loss / 6).backward()
        errs = {n: ((p.grad.float() - q.grad.float()).norm() / q.grad.float().norm()).item()
                for (n, p), q in zip(ours.named_parameters(), ref.parameters())}
        result = (errs, strategy.reductions, flags, captures, early)
    return result


def _replica_result(gpu: bool, graphs: bool = True):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_replica_worker, (2, _free_port(), queue, gpu, graphs))
    return queue.get(timeout=60)


def test_replica_strategy_reduces_once_per_step():
    """CPU (gloo), fp32: the replicas' accumulated, all-reduced gradients equal one process's over both ranks' data;
    one reduction for three micro-batches, the upper Blocks' started during the backward (a hook at each segment's
    lowest input); inside the plan each process counts as holding the whole model."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    errs, reductions, flags, _, (early, expected, n_segments) = _replica_result(gpu=False)
    assert reductions == 1
    assert n_segments >= 3 and early == expected >= 1, (early, expected, n_segments)
    assert flags == (True, True, True, False)
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-4, (worst, errs[worst])


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_gpu_replica_strategy_graphs_direct_grads(graphs):
    """Two GPUs (NCCL), bf16 full training: the replica captures its steps (full training, gradients straight into
    ``.grad``, which a DDP replica cannot; every packed length of the first micro-batch's sample count at its step,
    synthetic inputs, then replayed on real ones), packs, replays its backward as one graph per segment with the upper
    segments' all-reduce started between them, and its reduced gradients are one process's over both ranks' data."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    errs, reductions, flags, captures, (early, expected, _) = _replica_result(gpu=True, graphs=graphs)
    assert reductions == 1 and flags == (True, True, True, False)
    assert early == expected >= 1, (early, expected)  # (between the backward graphs of the segments)
    if graphs:  # (the packed lengths of the first micro-batch's sample count, pre-captured at its step)
        assert captures[1] >= 4 and captures[0] >= captures[1], captures
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 3e-2, (worst, errs[worst])


# ----------------------------------------------------------------------------------------------
# zero1: the replica with the optimizer's state sharded (ReplicaStrategy(shard_optimizer=True))
# ----------------------------------------------------------------------------------------------
def _zero1_worker(rank: int, world: int, port: int, queue, fused: bool, shard: bool = True, gpu: bool = False) -> None:
    _join(rank, world, port, gpu)
    _finish(_zero1_run(rank, world, fused, shard, "cuda" if gpu else "cpu"), queue)


def _zero1_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 32),
                               torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))


def _zero1_run(rank: int, world: int, fused: bool, shard: bool = True, device: str = "cpu"):
    """Each rank: a replica (rank 1 starts from other weights) under ``ReplicaStrategy(shard_optimizer=shard)`` with
    (zero1) every parameter of >= 30 elements given to one rank (the last bias, 8, stays everyone's), AdamW (``fused``
    or PyTorch's default), four optimizer steps of two accumulated micro-batches of rank-dependent data, the third
    clipped by ``clip_gradients_norm``. Every gradient of >= 30 elements is all-reduced on its own, so the step runs
    in several chunks, each after its own all-reduces. Rank 0 also trains one process's model on both ranks' data.
    Then the optimizer state is gathered (every rank; rank 0 gets it whole), loaded back into every rank (zero1: each
    keeps its share), and one more step runs."""
    import copy

    from lightning.fabric.plugins import Precision

    from lit_liger.parallel import dataparallel
    from lit_liger.parallel.dataparallel import replica_class

    dataparallel.SMALL = 30  # (one all-reduce per weight: the step's chunks wait for different work)
    ours = _zero1_model(0 if rank == 0 else 7).to(device)
    ref = copy.deepcopy(_zero1_model(0)).to(device)
    strategy = replica_class()(shard_optimizer=shard)
    strategy.precision = Precision()
    strategy.own_min = 30
    model = strategy.setup_module(ours)
    kw = {"lr": 0.05, "weight_decay": 0.1, **({"fused": True} if fused else {})}
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), **kw))
    ref_opt = torch.optim.AdamW(ref.parameters(), **kw)

    def data(step: int, r: int, micro: int):
        g = torch.Generator().manual_seed(1000 * step + 10 * r + micro)
        return torch.randn(6, 24, generator=g).to(device), torch.randn(6, 8, generator=g).to(device)

    def train(steps) -> None:
        for step in steps:
            for micro in range(2):
                x, y = data(step, rank, micro)
                with strategy._backward_sync_control.no_backward_sync(model, micro == 0):
                    strategy.backward(torch.nn.functional.mse_loss(model(x), y) / 2, model)
            unfinished.append(len(strategy._unfinished))
            if step == 2:
                strategy.clip_gradients_norm(model, optimizer, max_norm=0.05)
                unfinished.append(len(strategy._unfinished))
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
            if rank == 0:
                for r in range(world):
                    for micro in range(2):
                        x, y = data(step, r, micro)
                        (torch.nn.functional.mse_loss(ref(x), y) / (2 * world)).backward()
                if step == 2:
                    torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.05)
                ref_opt.step()
                ref_opt.zero_grad()

    unfinished: list[int] = []
    train(range(4))
    ref_sd = copy.deepcopy(ref_opt.state_dict()) if rank == 0 else None
    n_params = len(list(model.parameters()))
    held = len(optimizer.state)
    owned = sum(1 for o in strategy.owners.values() if o == rank)
    full = strategy.get_optimizer_state(optimizer)
    gathered = len(full.get("state", {}))
    full_list = [full]
    dist.broadcast_object_list(full_list, src=0)
    optimizer.load_state_dict(copy.deepcopy(full_list[0]))
    after_load = len(optimizer.state)
    train(range(4, 5))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flats = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(flats, flat)
    # an optimizer not known to update each parameter from its own gradient: its state stays whole (said on rank 0)
    class Custom(torch.optim.SGD):
        pass

    other = replica_class()(shard_optimizer=True)
    other.precision = Precision()
    other.setup_optimizer(Custom(model.parameters(), lr=0.1))
    kept_whole = not other.owners
    result = None
    if rank == 0:
        ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        state_err = 0.0
        for i, entry in full["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                a, b = entry[key].float().cpu(), ref_sd["state"][i][key].float().cpu()
                state_err = max(state_err, ((a - b).norm() / b.norm().clamp_min(1e-12)).item())
        result = {"ranks_same": max((f - flats[0]).abs().max().item() for f in flats),
                  "vs_ref": ((flats[0] - ref_flat).norm() / ref_flat.norm()).item(),
                  "held": held, "owned": owned, "n_params": n_params, "gathered": gathered,
                  "after_load": after_load, "state_err": state_err, "broadcasts": strategy.broadcasts,
                  "n_owned": len(strategy.owners), "kept_whole": kept_whole, "unfinished": unfinished,
                  "split_steps": strategy.split_steps,
                  "steps": sorted({float(e["step"]) for e in full["state"].values()})}
    return result


@pytest.mark.parametrize(("fused", "world"), [(False, 2), (True, 2), (True, 3)])
def test_zero1_replica_steps_its_share_and_checkpoints_whole_state(fused, world):
    """CPU (gloo), fp32, 2 and 3 processes: the replicas with the optimizer's state sharded (``zero1``) end with the
    same weights on every rank, equal to one process's AdamW over all ranks' data (four steps, then a fifth after the
    state was gathered and loaded back); each rank holds the state of its share of the owned parameters plus the
    small ones every rank steps; the gathered state (rank 0) has every parameter's moments, equal to one process's,
    and loading it back keeps each rank's share only."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_zero1_worker, (world, _free_port(), queue, fused), nprocs=world)
    r = queue.get(timeout=60)
    # (3 ranks: the gradients are scaled by 1/3, which fp32 rounds, and Adam's normalization amplifies it; the
    # replica's plain all-reduce lands at the same 2.5e-5 from one process's run)
    tol = 1e-5 if world == 2 else 1e-4
    assert r["ranks_same"] == 0.0, r
    assert r["vs_ref"] <= tol, r
    assert r["n_owned"] == 7 and r["n_params"] == 8, r
    assert r["held"] == r["owned"] + (r["n_params"] - r["n_owned"]) and 0 < r["owned"] < r["n_owned"], r
    assert r["after_load"] == r["held"], r
    assert r["gathered"] == r["n_params"] and r["state_err"] <= tol, r
    assert r["steps"] == [4.0], r
    assert r["broadcasts"] == 5 and r["split_steps"] == 5, r
    assert r["kept_whole"], r
    # the last backward's reductions are left to the step (one batch of sends and receives for the 7 owned
    # gradients, one flat all-reduce for the last bias); a clip waits for them first, and takes the norm across the
    # ranks (each has its owned gradients averaged, the others' stale)
    assert r["unfinished"] == [2, 2, 2, 0, 2, 2], r


@pytest.mark.parametrize("fused", [False, True])
def test_replica_steps_in_chunks_as_its_all_reduces_finish(fused):
    """CPU (gloo), fp32, 2 processes, the replica (no sharding): the optimizer steps in chunks, each once the
    all-reduces of its gradients are done, and the weights equal one process's AdamW over both
    ranks' data, a clipped step included (the clip waits for every all-reduce); the checkpointed state is whole."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_zero1_worker, (2, _free_port(), queue, fused, False))
    r = queue.get(timeout=60)
    assert r["ranks_same"] == 0.0, r
    assert r["vs_ref"] <= 1e-5, r
    # (the clipped step waited for every all-reduce: it steps at once)
    assert r["n_owned"] == 0 and r["broadcasts"] == 0 and r["split_steps"] == 4, r
    assert r["held"] == r["n_params"] == r["after_load"] == r["gathered"] == 8 and r["state_err"] <= 1e-5, r
    assert r["steps"] == [4.0], r
    assert r["unfinished"] == [8, 8, 8, 0, 8, 8], r


@pytest.mark.gpu
@pytest.mark.parametrize("shard", [True, False])
def test_gpu_zero1_and_replica_step_over_nccl(shard):
    """Two GPUs (NCCL), fp32: zero1's point-to-point gradients and parameters (``batch_isend_irecv``), its clip, and
    the replica's step in chunks after their all-reduces give one process's AdamW weights and state, as on gloo."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    spawn_ranks(_zero1_worker, (2, _free_port(), queue, True, shard, True))
    r = queue.get(timeout=60)
    assert r["ranks_same"] == 0.0 and r["vs_ref"] <= 1e-5 and r["state_err"] <= 1e-5, r
    assert r["steps"] == [4.0] and r["gathered"] == r["n_params"], r
    assert r["unfinished"] == ([2, 2, 2, 0, 2, 2] if shard else [8, 8, 8, 0, 8, 8]), r


# ----------------------------------------------------------------------------------------------
# lit_liger.runtime.optim.fuse_optimizer on FSDP2's DTensor parameters
# ----------------------------------------------------------------------------------------------
def _fused_dtensor_worker(rank: int, world: int, port: int, queue) -> None:
    _join(rank, world, port, gpu=False)
    _finish(_fused_dtensor_run(rank, world), queue)


def _fused_dtensor_run(rank: int, world: int):
    import copy

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from lit_liger.runtime.optim import fuse_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))
    ref = copy.deepcopy(model)
    start = [p.detach().clone() for p in ref.parameters()]
    fully_shard(model[0])
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    why = fuse_optimizer(opt, devices=("cpu", "cuda"))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    for i in range(3):
        torch.manual_seed(10 + i)
        x = torch.randn(6, 8)  # (the same batch on every rank: the averaged gradient is one process's)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x.to(next(m.parameters()).device)).square().mean().backward()
            o.step()
    # each rank's shards against the same rows of one process's weights (FSDP2 shards dim 0 as torch.chunk does; no
    # gather: DTensor's full_tensor over gloo crashed on the GPU image's torch 2.11)
    errs, local = [], []
    for p, r in zip(model.parameters(), ref.parameters()):
        mine = p.to_local().detach().cpu()
        rows = torch.chunk(r.detach(), world, dim=0)[rank]
        local.append(tuple(mine.shape))
        errs.append(float((mine[: rows.shape[0]] - rows).abs().max()) if rows.numel() else 0.0)
    moved = [float((r.detach() - r0).abs().max()) for r, r0 in zip(ref.parameters(), start)]
    return dict(rank=rank, why=why, fused=opt.param_groups[0]["fused"], errs=errs, moved=moved, local=local,
                dtensor=all(isinstance(p, DTensor) for p in model.parameters()),
                step=opt.state_dict()["state"][0]["step"].device.type)


def test_fused_optimizer_steps_fsdp2_dtensor_shards():
    """FSDP2 (``fully_shard``) parameters are DTensors: ``fuse_optimizer`` switches their AdamW to PyTorch's fused
    kernel, which steps each rank's shard (uneven: 5 rows over 2 ranks); the weights equal one process's stock
    AdamW, and a checkpoint's step count is on the host."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    spawn_ranks(_fused_dtensor_worker, (2, _free_port(), queue))
    outs = sorted((queue.get(), queue.get()), key=lambda o: o["rank"])
    for out in outs:
        assert out["why"] is None and out["fused"] is True and out["dtensor"]
        assert max(out["errs"]) < 1e-5, out["errs"]
        assert min(out["moved"]) > 1e-3  # (every weight stepped)
        assert out["step"] == "cpu"
    assert [o["local"][2] for o in outs] == [(3, 16), (2, 16)]  # (the (5, 16) weight sharded unevenly)
