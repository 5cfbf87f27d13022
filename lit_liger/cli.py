"""``lit-liger``: LitGPT's command line, with lit-liger's kernels on the training subcommands.

    lit-liger finetune_lora checkpoints/meta-llama/Llama-3.2-1B              # kernels on (default)
    lit-liger finetune_lora checkpoints/meta-llama/Llama-3.2-1B --liger false  # stock litgpt (A/B)
    lit-liger finetune_full ... --liger.rope false                            # one kernel off
    lit-liger pretrain --config configs/pretrain-tinyllama.yaml                # `liger:` in the YAML
    lit-liger download | chat | generate | merge_lora | ...                    # litgpt's, unchanged
    lit-liger demo | doctor | check                                            # lit-liger's own
    lit-liger litgpt_plugin install        # stock `litgpt finetune_lora ... --liger true` runs this command's path
    lit-liger bench kernels|step|finetune|... [options]                        # the benchmarks (--help)

How it plugs in. LitGPT's CLI is jsonargparse over a ``{subcommand: function}`` mapping
(``litgpt.__main__.PARSER_DATA``). lit-liger reuses that mapping as is, except that each training
``setup`` is replaced by :func:`with_liger` (``setup``): a function with the same signature plus
``liger: bool | LigerConfig``. ``--liger false`` calls litgpt's ``setup`` untouched. Otherwise the
wrapper runs it with four names of the script's module patched for the duration of the call:

* ``GPT`` -> a class whose call builds LitGPT's model and calls ``apply_liger`` on it: the model is
  swapped where the script builds it, inside ``fabric.init_module`` and before ``fabric.setup`` wraps it,
  for every strategy the scripts use (single device, FSDP, FSDP2).
* ``chunked_cross_entropy`` -> ``lit_liger.chunked_cross_entropy``: the fused loss for what the
  swapped model returns in training and validation; LitGPT's function for real logits (the generation
  example runs with a KV cache and gets real logits).
* ``validate`` (where the script has one) -> litgpt's ``validate`` with the swapped model's deferred logits
  (single process): validation computes the fused loss too and never holds the ``(B, T, V)`` logits.
* ``save_hyperparameters`` -> :func:`save_hyperparameters`: LitGPT re-parses ``sys.argv`` to write
  ``hyperparameters.yaml``; this version knows ``--liger`` and leaves it out of the file, so stock
  ``litgpt`` (``merge_lora``, ``--config``, resume) reads it. (Patched for ``--liger false`` too.)

Multi-device: Lightning's launcher re-executes ``sys.argv`` (``lit-liger ...`` or
``python -m lit_liger ...``) in every child process, so every rank parses ``--liger`` and patches its
own modules; nothing is rank-0 state except printing the swap report.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .config import LigerConfig

__all__ = ["LIGER_HELP", "TRAINING_COMMANDS", "bench", "main", "parser_data", "save_hyperparameters", "with_liger"]

from ._litgpt_boot import TRAINING_COMMANDS  # (litgpt's training subcommands: they gain ``--liger``)

#: The type of the ``liger`` parameter: ``--liger true|false`` or per kernel ``--liger.rope false``.
LigerArg = bool | LigerConfig

LIGER_HELP = (
    "lit-liger's Triton kernels. ``true`` (default) swaps in every kernel the model's config allows; "
    "``false`` runs stock litgpt. Per kernel, e.g. ``--liger.rope false``, or a ``liger:`` mapping in the "
    "``--config`` file. Switches (true|false): "
    + ", ".join(LigerConfig.switches())
    + "; flce_mode (fast|lean); compile_min_tokens (under torch.compile, smaller micro-batches run "
    "LitGPT's code for norms/attention/MLP; default automatic, 0 = never); seq_buckets (true: pad training "
    "lengths to a few buckets, on by default); packing (true: a micro-batch's samples end to end without their "
    "padding, attention inside each; off by default); cuda_graphs (capture each bucket's forward+backward as CUDA "
    "graphs; default automatic: on for LoRA, adapters and full fine-tuning; true|false); cuda_graphs_max_tokens (the "
    "most tokens per micro-batch captured; default automatic from a Block's size, longer steps are bound by the GPU); "
    "sdpa_backend (auto|flash|cudnn|efficient|math|torch: the causal layers' SDPA kernel; auto = flash on NVIDIA sm80+ "
    "for short uncaptured steps (no per-shape plans), PyTorch's choice for captured ones and sequences of 4,096 "
    "tokens or more); "
    "caller_thread_backward (true: autograd's backward runs on the training thread; off by default); "
    "activation_checkpointing (default automatic: planned per micro-batch from its tokens and the device's free "
    "memory (75%): every Block's activations kept where they fit, else the cheapest mix of Blocks recomputed in backward "
    "and Blocks whose MLP inputs are, else every Block recomputed with its input in pinned host memory; true: every "
    "Block recomputed; false: none); "
    "recompute_mlp (true: each Block's fc_1/fc_2 outputs recomputed in backward, less memory; off by default); "
    "data_parallel (auto|replicate|zero1|shard|litgpt: the plan on several devices; auto = a replica per device where "
    "the training state fits one, else a replica with the optimizer's state sharded (zero1) where that fits, else "
    "litgpt's strategy; shard = ZeRO-2 where litgpt uses FSDP1, not yet measured on GPUs); "
    "replicate_frozen_base (true: the same as data_parallel replicate; its earlier name); fp8 (off|tensorwise|rowwise|rowwise_with_gw_hp: the Block "
    "projections' GEMMs in float8 with torchao, pip install 'lit-liger[fp8]'; tensorwise runs on lit-liger's own "
    "casts, faster than bf16 without torch.compile too at large micro-batches, but slower (0.71-0.78x) at litgpt's "
    "recipe sizes of ~800 tokens, where it warns; the rowwise recipes are fast only under torch.compile, "
    "which litgpt's recipes do not use: here slower than bf16, and they say so; off by default); fp8_all_gather "
    "(with fp8 tensorwise under FSDP2: the weights all-gathered in float8; automatic by default: on across several "
    "hosts, off on one, where the bf16 all-gather measured faster; true|false). "
    "See ``lit_liger.LigerConfig``."
)

_DESCRIPTION = (
    "lit-liger: LitGPT's command line with Triton kernels for training. Every litgpt subcommand works "
    "unchanged; finetune*/pretrain gain --liger (true|false, or per kernel --liger.rope false). "
    "Extra: demo (offline A/B run), doctor (what runs natively here), check (parity on a model), "
    "bench (the benchmarks: `lit-liger bench --help` lists them), litgpt_plugin (install: stock `litgpt` takes "
    "--liger; remove: undoes it)."
)


# ----------------------------------------------------------------------------------------------
# The wrapper around a litgpt training `setup`
# ----------------------------------------------------------------------------------------------
@functools.cache
def with_liger(setup_fn: Callable) -> Callable:
    """``setup_fn`` with an extra ``liger`` parameter; calling it trains with lit-liger's kernels.

    The returned function has ``setup_fn``'s signature, annotations and docstring plus
    ``liger: bool | LigerConfig = True`` (keyword-only), so jsonargparse builds the same
    subcommand with one more option. Cached: one wrapper per litgpt function.
    """
    module = sys.modules[setup_fn.__module__]
    sig = inspect.signature(setup_fn, eval_str=True)
    if "liger" in sig.parameters:
        raise TypeError(f"{setup_fn.__module__}.{setup_fn.__name__} already has a `liger` parameter")

    def setup(*args: Any, liger: LigerArg = True, **kwargs: Any) -> Any:
        config = LigerConfig.from_value(liger)
        plan = _data_parallel_plan(module, sig, args, kwargs, config)
        with _patched(module, config, plan), config.backward_thread():
            return setup_fn(*args, **kwargs)

    functools.update_wrapper(setup, setup_fn)
    del setup.__wrapped__  # jsonargparse must read the signature below, not the original's
    liger_param = inspect.Parameter("liger", inspect.Parameter.KEYWORD_ONLY, default=True, annotation=LigerArg)
    setup.__signature__ = sig.replace(parameters=[*sig.parameters.values(), liger_param])
    setup.__annotations__ = {
        **{n: p.annotation for n, p in sig.parameters.items() if p.annotation is not inspect.Parameter.empty},
        "liger": LigerArg,
    }
    if sig.return_annotation is not inspect.Signature.empty:
        setup.__annotations__["return"] = sig.return_annotation
    setup.__doc__ = _doc_with_liger(setup_fn.__doc__)
    return setup


def _doc_with_liger(doc: str | None) -> str:
    """Append ``liger`` to the docstring's argument list (the last section of litgpt's setups)."""
    doc = inspect.cleandoc(doc or "")
    m = re.search(r"^(Arguments|Args|Parameters):\s*\n(\s+)\S", doc, flags=re.MULTILINE)
    indent = m.group(2) if m else "    "
    if not m:
        doc += "\n\nArguments:"
    return f"{doc}\n{indent}liger: {LIGER_HELP}\n"


class _RunState:
    """Per-call state shared by the patched names (one training run in this process)."""

    def __init__(self, config: LigerConfig) -> None:
        self.config = config
        self.reported = False  # print the swap report once (pretrain also builds a meta model to count FLOPs)


def _data_parallel_plan(module: Any, sig: inspect.Signature, args: tuple, kwargs: dict, config: LigerConfig) -> Any:
    """The data-parallel plan of this run (``lit_liger.parallel.dataparallel.choose``), or None: one device, ``--liger false``,
    or arguments that do not bind (litgpt's own call reports them)."""
    if not config.enabled:
        return None
    from .parallel import dataparallel

    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    setting = "replicate" if config.replicate_frozen_base else config.data_parallel
    chosen = dataparallel.choose(module, dict(bound.arguments), setting)
    if chosen is None:
        return None
    plan, devices = chosen
    _print_rank_zero(plan.line(module.__name__.removeprefix("litgpt.").replace(".", "_"), devices))
    return plan


@contextlib.contextmanager
def _patched(module: Any, config: LigerConfig, plan: Any = None) -> Iterator[None]:
    patches: dict[str, Any] = {"save_hyperparameters": save_hyperparameters}
    if config.enabled:
        from . import chunked_cross_entropy

        state = _RunState(config)
        _warn_if_reference_path()
        patches["GPT"] = _liger_gpt_class(module.GPT, state)
        patches["chunked_cross_entropy"] = chunked_cross_entropy
    missing = [name for name in patches if name not in vars(module)]
    if plan is not None and plan.name != "litgpt":
        from .parallel.dataparallel import STRATEGY_NAMES, strategy_factory

        name = STRATEGY_NAMES[module.__name__]
        patches[name] = strategy_factory(module.__name__, vars(module)[name], plan)
    if config.enabled and callable(vars(module).get("fit")):
        patches["fit"] = _fit_freezing_unoptimized(vars(module)["fit"], config)
    if config.enabled and config.defer_loss_sync and callable(vars(module).get("RunningMean")):
        from .runtime.lazylog import running_mean_factory

        patches["RunningMean"] = running_mean_factory(vars(module)["RunningMean"])
    if config.enabled and callable(vars(module).get("get_longest_seq_length")):
        from .runtime.lengths import longest_seq_length

        patches["get_longest_seq_length"] = longest_seq_length(vars(module)["get_longest_seq_length"])
    if config.enabled and callable(vars(module).get("validate")):
        patches["validate"] = _validate_with_fused_loss(vars(module)["validate"])
    if config.enabled and config.fused_optimizer and callable(vars(module).get("instantiate_torch_optimizer")):
        patches["instantiate_torch_optimizer"] = _fusing_optimizer(vars(module)["instantiate_torch_optimizer"])
    if missing:
        raise RuntimeError(
            f"lit-liger expected {missing} in {module.__name__} (litgpt {_litgpt_version()}); this litgpt "
            "version is not supported by `lit-liger` yet: use `--liger false` or the Python API (apply_liger)"
        )
    saved = {name: vars(module)[name] for name in patches}
    try:
        for name, value in patches.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _fusing_optimizer(make: Callable) -> Callable:
    """litgpt's ``instantiate_torch_optimizer``, its Adam / AdamW then switched to PyTorch's fused kernel
    (``LigerConfig.fused_optimizer``, :func:`lit_liger.runtime.optim.fuse_optimizer`; said on rank 0)."""
    from .runtime import optim

    @functools.wraps(make)
    def run(*args: Any, **kwargs: Any) -> Any:
        optimizer = make(*args, **kwargs)
        line = optim.fuse_and_report(optimizer, "--liger.fused_optimizer false")
        if line:
            _print_rank_zero(line)
        return optimizer

    return run


def freeze_unoptimized(model: torch.nn.Module, optimizer: Any) -> list[str]:
    """Freeze the parameters that require grad but belong to no param group of ``optimizer``; their names.

    litgpt's QLoRA (``finetune_lora --quantize bnb.*``) swaps ``transformer.wte`` for bitsandbytes'
    ``StableEmbedding`` *after* building the optimizer: its weight and LayerNorm require grad, so every step
    computes and accumulates their gradients (a ``(V, C)`` tensor), but nothing ever applies them. Frozen, they
    keep their values exactly as they did, no step computes their gradients, and the model counts as what it
    is, a frozen base with LoRA (``cuda_graphs`` automatic captures it). One process or lit-liger's replica plan
    only (a sharded optimizer holds other objects than the module's parameters)."""
    from ._dist import whole_model

    groups = getattr(optimizer, "param_groups", None)
    if not whole_model(_swapped_gpt(model)) or not groups:
        return []
    held = {id(p) for g in groups for p in g["params"]}
    if not held:
        return []
    frozen = []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in held:
            p.requires_grad_(False)
            frozen.append(name)
    return frozen


def release_replaced(model: torch.nn.Module, optimizer: Any) -> int:
    """Release the storage of the frozen parameters that ``optimizer`` holds but ``model`` no longer has; the bytes
    released.

    litgpt's QLoRA and adapter QLoRA build the optimizer on all of the model's parameters, then replace
    ``transformer.wte`` with bitsandbytes' ``StableEmbedding``: the embedding replaced stays alive until training ends,
    held by the optimizer's param group (and a local variable of litgpt's ``main``), one ``(V, C)`` tensor the run never
    reads again: 1.0 GiB for Llama-3.1-8B's vocabulary. Each such parameter (frozen, no gradient, its storage shared
    with none of the model's tensors) keeps its place in the param group with an empty tensor of its dtype and
    device: the optimizer skips it as it did (no gradient), and the memory is free. One process or lit-liger's
    replica plan only, as :func:`freeze_unoptimized`."""
    from ._dist import whole_model

    groups = getattr(optimizer, "param_groups", None)
    if not whole_model(_swapped_gpt(model)) or not groups:
        return 0
    mine = {id(p) for p in model.parameters()}
    used = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())
            if t.numel() and t.device.type != "meta"}
    released = 0
    for g in groups:
        for p in g["params"]:
            if (id(p) in mine or p.requires_grad or p.grad is not None or not p.numel() or p.device.type == "meta"
                    or p.untyped_storage().data_ptr() in used):
                continue
            released += p.untyped_storage().nbytes()
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    return released


def _fit_freezing_unoptimized(fit: Callable, config: LigerConfig | None = None) -> Callable:
    """litgpt's ``fit(fabric, model, optimizer, ...)``, after :func:`freeze_unoptimized` and :func:`release_replaced`
    (each said on rank 0); in one process with ``config.defer_loss_sync``, its log read one iteration late
    (:func:`_deferred_log`)."""

    @functools.wraps(fit)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = inspect.signature(fit).bind_partial(*args, **kwargs).arguments
        except TypeError:
            return fit(*args, **kwargs)  # not the signature we know: litgpt's own call, unchanged
        model, optimizer, fabric = bound.get("model"), bound.get("optimizer"), bound.get("fabric")
        state = bound.get("state")
        if model is None and isinstance(state, dict):  # (finetune_full's and pretrain's fit take them in `state`)
            model, optimizer = state.get("model"), state.get("optimizer")
        rank0 = getattr(fabric, "global_rank", 0) == 0
        if isinstance(model, torch.nn.Module) and optimizer is not None:
            frozen = freeze_unoptimized(model, optimizer)
            if frozen and rank0:
                print(f"lit-liger: {', '.join(frozen)} require grad but are in no optimizer param group (litgpt "
                      "swaps in bitsandbytes' StableEmbedding after building the optimizer): frozen, so their "
                      "gradients are no longer computed; nothing else changes (they never trained).", flush=True)
            released = release_replaced(model, optimizer)
            if released and rank0:
                print(f"lit-liger: {released / 2**30:.2f} GiB released: frozen parameters that the optimizer holds but "
                      "the model no longer has (the embedding litgpt's QLoRA replaced with StableEmbedding); they "
                      "never trained and nothing reads them.", flush=True)
        from ._dist import liger_replica, several_processes, whole_model
        from .runtime import hostgc
        from .runtime import loaders
        from .runtime import profiling
        from .runtime.graphs import capture_report
        from .swap.state import states_in

        gpt = _swapped_gpt(model) if isinstance(model, torch.nn.Module) else None
        states = list(states_in(model)) if isinstance(model, torch.nn.Module) else []

        def counts(kind: str) -> dict:  # (this run's model's counters, summed over its swapped GPTs)
            out: dict = {}
            for st in states:
                for k, v in getattr(st, kind).items():
                    out[k] = out.get(k, 0) + v
            return out

        restore, loader, balanced, packed = None, bound.get("train_dataloader"), None, False
        if isinstance(model, torch.nn.Module) and whole_model(gpt) and "train_dataloader" in bound:
            wrapped = _batches_off_the_host(model, bound["train_dataloader"], rank0)
            if wrapped is not None:
                bound["train_dataloader"], restore, packed = wrapped
                sig = inspect.signature(fit).bind_partial(**bound)
                args, kwargs = sig.args, sig.kwargs
        if config is not None and config.balance_ranks and loader is not None and liger_replica(gpt):
            balanced = _balance(fabric, loader, bound, packed, rank0)
            if balanced is not None and balanced[2] is not None:  # (the lengths the replicas are expected to meet)
                for st in states:
                    st.expected_lengths = balanced[2]
        defer = (_deferred_log(fabric, rank0, fit) if config is not None and config.defer_loss_sync
                 and whole_model(gpt) else contextlib.nullcontext())
        ahead = _state_ahead(fabric, optimizer) if isinstance(model, torch.nn.Module) and whole_model(gpt) else None
        if ahead is not None:  # (the first micro-batches' plans and graphs leave it free)
            for st in states:
                st.state_ahead.append(ahead)
        before, captured, t0 = counts("tokens"), counts("captures"), time.perf_counter()
        try:
            # (the loaders' workers stopped as fit returns: litgpt's fit leaves its frame in a reference cycle, whose
            # collection would cost each running worker 5 s; lit_liger.runtime.loaders)
            with defer, profiling.iterations(model, getattr(fabric, "global_rank", 0)), hostgc.quiet() as gcwatch, \
                    loaders.stop_workers(bound.get("train_dataloader"), bound.get("val_dataloader")), \
                    _peak_said(fit, gpt):
                out = fit(*args, **kwargs)
        finally:
            if ahead is not None:
                for st in states:
                    st.state_ahead.remove(ahead)
            if restore is not None:
                restore()
            if balanced is not None:
                for st in states:
                    st.expected_lengths = None
                loader._dataloader = balanced[1]
                line = balanced[0].report()
                if line and rank0:
                    print(line, flush=True)
            if isinstance(model, torch.nn.Module):
                from .runtime.graphs import release
                from .runtime.memplan import release_pinned

                for line in (release(model), release_pinned()):  # (before litgpt validates, saves, merges or generates)
                    if line and rank0:
                        print(line, flush=True)
        wall = time.perf_counter() - t0
        # (litgpt's counts are summed over the ranks, the model's are this rank's: under the replica plan they are
        # summed too; the graphs' line is rank 0's)
        anywhere = None  # (the longest full collection of any process, under the replica plan)
        if whole_model(gpt):
            now = counts("tokens")
            tokens = {k: now[k] - before.get(k, 0) for k in now}
            if several_processes() and fabric is not None:
                summed = fabric.all_reduce(torch.tensor(list(tokens.values()), dtype=torch.float64,
                                                        device=fabric.device), reduce_op="sum")
                tokens = dict(zip(tokens, (int(v) for v in summed.tolist())))
                anywhere = float(fabric.all_reduce(torch.tensor(max(gcwatch.pauses[2], default=0.0),
                                                                dtype=torch.float64, device=fabric.device),
                                                   reduce_op="max"))
            lines = (padding_report(out, tokens),
                     capture_report({k: v - captured.get(k, 0) for k, v in counts("captures").items()}, wall))
            for line in lines:
                if line and rank0:
                    print(line, flush=True)
        line = hostgc.report(gcwatch, anywhere)
        if line and rank0:
            print(line, flush=True)
        return out

    return run


@contextlib.contextmanager
def _peak_said(fit: Callable, gpt: Any) -> Iterator[None]:
    """During litgpt's ``fit``: the memory plan's measured-peak line (``swap.gpt.say_measured_peak``), where no planned
    forward followed the first plan's step, said before ``fit`` calls its module's ``generate_example`` (whose KV cache
    would count in the peak) or once ``fit`` returns: a run of one long step says its peak too."""
    if not isinstance(gpt, torch.nn.Module):
        yield
        return
    from .swap.gpt import say_measured_peak

    module = inspect.getmodule(fit)
    generate = getattr(module, "generate_example", None)
    if callable(generate):
        @functools.wraps(generate)
        def generate_example(*args: Any, **kwargs: Any) -> Any:
            say_measured_peak(gpt)
            return generate(*args, **kwargs)

        setattr(module, "generate_example", generate_example)
    try:
        yield
    finally:
        if callable(generate):
            setattr(module, "generate_example", generate)
    say_measured_peak(gpt)


@contextlib.contextmanager
def _deferred_log(fabric: Any, rank0: bool, fit: Callable | None = None) -> Iterator[None]:
    """During litgpt's ``fit``: ``fabric.print`` / ``fabric.log_dict`` through ``lit_liger.runtime.lazylog.DeferredLog``, which
    the recipe's ``RunningMean`` (``lazylog.RunningMeans`` while patched, the name ``fit`` reads in its module) feeds
    for this ``fit``: the loop's per-iteration loss, token counts and their log line read one iteration later, without
    a device sync (said in the log)."""
    from .runtime import lazylog

    if fabric is None or not callable(getattr(fabric, "print", None)) or not callable(getattr(fabric, "log_dict", None)):
        yield
        return
    log = lazylog.DeferredLog(fabric.print, fabric.log_dict)
    if rank0:
        print("lit-liger: litgpt's loop reads each logged loss and token count one iteration later (no device sync "
              "per iteration; the same values, each log line printed when the next iteration logs; iter_time is then "
              "the loop's period); --liger.defer_loss_sync false keeps litgpt's", flush=True)
    fabric.print, fabric.log_dict = log.print, log.log_dict  # (instance attributes over Fabric's methods)
    means = getattr(inspect.getmodule(fit), "RunningMean", None) if fit is not None else None
    held = means.deferring(log) if isinstance(means, lazylog.RunningMeans) else contextlib.nullcontext()
    held.__enter__()  # (the running means litgpt's fit makes feed this log)

    def restore() -> None:
        held.__exit__(None, None, None)
        fabric.__dict__.pop("print", None)
        fabric.__dict__.pop("log_dict", None)

    try:
        yield
    except BaseException:
        restore()
        with contextlib.suppress(Exception):  # (what is kept is printed if it can be; fit's own error goes on)
            log.close()
        raise
    restore()
    log.close()


def _balance(fabric: Any, loader: Any, bound: dict, packed: bool, rank0: bool) -> tuple[Any, Any, Any] | None:
    """Under lit-liger's replica plan: Fabric's training ``loader`` draws every device's micro-batches and deals them
    by length (``lit_liger.parallel.balance``; said in the log), from litgpt's ``fit`` arguments ``bound`` (its ``train``
    arguments' gradient accumulation; a resumed run's loop reads the data from its start again, so the optimizer
    steps' rounds count from the first); ``packed``: the batches are laid out packed. As ``(the batch sampler, the
    DataLoader it replaced, the lengths each process is expected to meet or None)``; None where it does not apply
    (said why)."""
    from .parallel.balance import balanced_loader

    inner = getattr(loader, "_dataloader", None)
    train = bound.get("train")
    expected = None
    try:
        accumulation = train.gradient_accumulation_iters(bound.get("devices", fabric.world_size),
                                                         bound.get("num_nodes", 1))
    except Exception:  # (not litgpt's TrainArgs)
        out, why = None, "litgpt's fit names no gradient accumulation"
    else:
        out, why = balanced_loader(loader, fabric.global_rank, fabric.world_size, accumulation, packed)
        if out is not None and packed:
            expected = _expect_lengths(out, train, accumulation)
    if rank0:
        print("lit-liger: " + (f"{why}: the devices' micro-batches stay in litgpt's order" if out is None else
                               "each optimizer step's micro-batches are dealt to the devices by their estimated length "
                               "(every device draws every device's index lists; the same micro-batches per step, each "
                               "step's first ones as litgpt's order; --liger.balance_ranks false keeps litgpt's "
                               "order)"), flush=True)
    return None if out is None else (out, inner, expected)


def _state_ahead(fabric: Any, optimizer: Any) -> Any:
    """The optimizer state litgpt's ``fit`` will make at its first step, for the model's ``ModelState.state_ahead``
    (the caller removes it after ``fit``): the first micro-batches' memory plans and CUDA graphs leave it free.
    Under lit-liger's zero1, only this process's share. None without an optimizer."""
    from .runtime.memplan import optimizer_state_ahead

    inner = getattr(optimizer, "optimizer", optimizer)
    if inner is None or not hasattr(inner, "param_groups") or not hasattr(inner, "state"):
        return None
    owners = getattr(getattr(fabric, "strategy", None), "owners", None) or {}
    rank = getattr(fabric, "global_rank", 0)
    return optimizer_state_ahead(inner, (lambda p: owners.get(id(p), rank) == rank) if owners else None)


#: the most rounds of the data :func:`_expect_lengths` (and the Trainer's under DDP, ``LigerCallback``) reads (a longer
#: run's counts are scaled up); 0: none (the replicas pre-capture the whole ladder)
EXPECT_ROUNDS = 4096


def _expect_lengths(dealt: Any, train: Any, accumulation: int) -> dict | None:
    """``ModelState.expected_lengths`` for this run (``fit`` clears it): the packed lengths the dealt batch
    sampler's first pass is expected to give each process, scaled to the run's iterations per process (litgpt's
    ``train.max_steps`` times ``accumulation``, or its epochs)."""
    from .parallel.balance import expect_lengths

    per_epoch = len(dealt)
    runs = [per_epoch * getattr(train, "epochs", 0)] if getattr(train, "epochs", None) else []
    if getattr(train, "max_steps", None):
        runs.append(train.max_steps * accumulation)
    return expect_lengths(dealt, min(runs) if runs else per_epoch, EXPECT_ROUNDS)


def _swapped_gpt(model: torch.nn.Module) -> torch.nn.Module | None:
    """The swapped GPT inside ``model`` (itself, or under a wrapper), or None."""
    return next((m for m in model.modules() if "_liger_state" in m.__dict__), None)


def _batches_off_the_host(model: torch.nn.Module, loader: Any, rank0: bool) -> tuple[Any, Callable, bool] | None:
    """The training data loader with ``lit_liger.runtime.batches.LigerCollate`` in its DataLoader and ``AfterMove`` around it,
    for a swapped model in one process (said in the log), what puts litgpt's collate back (after ``fit``) and whether
    the batches are laid out packed; None where it does not apply (see ``lit_liger.runtime.batches.install``)."""
    from .runtime.batches import AfterMove, install

    installed = install(model, loader)
    if installed is None:
        return None
    pack, restore = installed
    if rank0:
        print("lit-liger: the data loader's workers keep litgpt's token counts on the host (its two .item() calls per "
              "iteration no longer wait for the GPU; the numbers logged are the same)"
              + ("; and lay each batch out packed, so that the step reads nothing back from the GPU" if pack else ""),
              flush=True)
    return AfterMove(loader), restore, pack


def padding_report(token_counts: Any, tokens: dict[str, int]) -> str | None:
    """One line on the padding of a run: litgpt's ``fit`` returns its token counts (``raw_tokens_plus_prompt_template``:
    the real tokens; ``..._and_padding``: as collated), the swapped model counted what it collated and ran
    (its ``ModelState.tokens``, this process's share). None where either is missing."""
    if not isinstance(token_counts, dict) or not tokens.get("processed"):
        return None
    real = token_counts.get("raw_tokens_plus_prompt_template")
    if real is None:
        return None
    real = int(real.item() if hasattr(real, "item") else real)
    collated, processed = tokens["collated"], tokens["processed"]
    if processed <= 0 or real <= 0:
        return None
    packed = tokens.get("packed", 0)
    how = f"lit-liger's length buckets added {processed - collated:,}"
    if packed:  # (packed batches run fewer positions than collated; the rest, padded to buckets, more)
        how = (f"lit-liger packed the batches of {packed:,} of those positions, leaving padding out: "
               f"{processed - collated:+,} positions in all")
    return (f"lit-liger: the GPU ran {processed:,} token positions in training for {real:,} real tokens: "
            f"{1 - real / processed:.1%} padding (litgpt's collate padded to {collated:,}, "
            f"{1 - real / collated:.1%}; {how})")


def _validate_with_fused_loss(validate: Callable) -> Callable:
    """litgpt's ``validate`` (model forward, then ``chunked_cross_entropy``, under ``no_grad``) with the swapped
    model's deferred logits, so its loss is the fused one and the ``(B, T, V)`` logits are never held
    (:func:`lit_liger.swap.gpt.fused_loss_without_grad`). One process or lit-liger's replica plan: in a sharded run,
    validation keeps LitGPT's path."""

    @functools.wraps(validate)
    def run(*args: Any, **kwargs: Any) -> Any:
        from ._dist import whole_model
        from .swap.gpt import fused_loss_without_grad

        model = kwargs.get("model", args[1] if len(args) > 1 else None)  # (litgpt: validate(fabric, model, ...))
        if not isinstance(model, torch.nn.Module) or not whole_model(_swapped_gpt(model)):
            return validate(*args, **kwargs)
        with fused_loss_without_grad(model):
            return validate(*args, **kwargs)

    return run


def _liger_gpt_class(base: type, state: _RunState) -> type:
    """What the script's ``GPT`` name points to during the run: builds LitGPT's model, then swaps it.

    Calling it (``GPT(config)``, or ``GPT.from_name(...)``) returns an instance of LitGPT's own class,
    swapped by ``apply_liger`` exactly as a user's ``apply_liger(GPT(config))`` would be (so the model's
    class, report and pickling are the adapter's). ``isinstance(x, GPT)`` keeps meaning "is a LitGPT
    GPT". Swapping changes module classes only, so it works on the meta device (FSDP's
    ``empty_init``) and before ``fabric.setup`` wraps the model.
    """

    class _Meta(type(base)):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, base)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        from . import apply_liger

        model = base(*args, **kwargs)  # not an instance of cls: Python does not call __init__ again
        report = apply_liger(model, state.config)
        if not state.reported:
            state.reported = True
            _print_rank_zero(str(report))
        from .swap.state import states_in

        for st in states_in(model):  # "lm_head.weight equals ...: one copy kept" when it happens
            st.on_share.append(_print_rank_zero)
        return model

    return _Meta(
        base.__name__, (base,), {"__new__": __new__, "__module__": base.__module__, "__qualname__": base.__qualname__}
    )


def _print_rank_zero(text: str) -> None:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:
        print(text, flush=True)


def _warn_if_reference_path() -> None:
    from .kernels._launch import interpret_mode

    if not torch.cuda.is_available() and not interpret_mode():
        _print_rank_zero(
            "lit-liger: no CUDA/ROCm GPU here, the kernels run their PyTorch reference path (correct, not "
            "faster). `lit-liger doctor` says more; TRITON_INTERPRET=1 runs the Triton code on CPU (slow, tests)."
        )


def _litgpt_version() -> str:
    try:
        from importlib.metadata import version

        return version("litgpt")
    except Exception:  # pragma: no cover
        return "?"


# ----------------------------------------------------------------------------------------------
# hyperparameters.yaml
# ----------------------------------------------------------------------------------------------
def save_hyperparameters(function: Callable, checkpoint_dir: Path, known_commands: list[str] | None = None) -> None:
    """LitGPT's ``save_hyperparameters``, for a command line that may carry ``--liger``.

    LitGPT re-parses ``sys.argv`` against the training ``setup`` to write
    ``checkpoint_dir/hyperparameters.yaml``. Here it parses against ``with_liger(setup)`` (so
    ``--liger`` and a ``liger:`` key in ``--config`` are known), then removes the ``liger`` entry:
    the file is what stock litgpt would have written for the same run, and stock litgpt loads it.
    The kernel settings are kept as a comment on the first line.
    """
    from litgpt.parser_config import save_hyperparameters as litgpt_save_hyperparameters

    litgpt_save_hyperparameters(with_liger(function), checkpoint_dir, known_commands)
    _drop_liger_key(Path(checkpoint_dir) / "hyperparameters.yaml")


def _drop_liger_key(path: Path) -> None:
    import yaml

    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or "liger" not in data:
        return
    liger = data.pop("liger")
    # jsonargparse writes one top-level key per unindented line: drop `liger:` and its indented block
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if skipping and (line[:1] in (" ", "\t") or not line.strip()):
            continue
        skipping = bool(re.match(r"liger\s*:", line))
        if not skipping:
            out.append(line)
    new_text = "".join(out)
    if yaml.safe_load(new_text) != data:  # an unexpected layout: fall back to a plain dump
        new_text = yaml.safe_dump(data, sort_keys=False)
    header = (
        f"# lit-liger: trained with liger={json.dumps(liger)} (left out below so that stock litgpt reads this file)\n"
    )
    path.write_text(header + new_text, encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------
def parser_data() -> dict[str, Callable]:
    """litgpt's ``{subcommand: function}`` mapping, training setups wrapped, plus lit-liger's commands."""
    from litgpt.__main__ import PARSER_DATA, _check_commands

    from .demo import demo
    from .doctor import check, doctor
    from .litgpt_plugin import litgpt_plugin

    _check_commands()
    missing = [c for c in TRAINING_COMMANDS if c not in PARSER_DATA]
    if missing:  # pragma: no cover - a litgpt that renamed its subcommands
        raise RuntimeError(f"litgpt {_litgpt_version()} has no subcommand(s) {missing}")
    data = {name: (with_liger(fn) if name in TRAINING_COMMANDS else fn) for name, fn in PARSER_DATA.items()}
    data.update(demo=demo, doctor=doctor, check=check, litgpt_plugin=litgpt_plugin)
    return data


def _urls_supported() -> bool:
    """Whether ``--config https://...`` can work here: jsonargparse reads URLs with ``requests``."""
    try:
        import requests  # noqa: F401
    except ImportError:
        return False
    return True


def _set_litgpt_parsing_options() -> None:
    """What ``litgpt.__main__.main`` sets before parsing (attribute docstrings, URLs in --config).

    URL config reading is turned on only where ``requests`` can be imported: jsonargparse imports it
    the moment the mode is set, and an offline training run must not fail for a package that only
    ``--config https://...`` uses (``requests`` is a dependency of lit-liger, for stock ``litgpt``'s
    sake, but a broken or trimmed environment should still train).
    """
    import jsonargparse

    urls = _urls_supported()
    if hasattr(jsonargparse, "set_parsing_settings"):
        jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True, config_read_mode_urls_enabled=urls)
    else:  # pragma: no cover - jsonargparse < 4.39
        jsonargparse.set_docstring_parse_options(attribute_docstrings=True)
        jsonargparse.set_config_read_mode(urls_enabled=urls)


def bench(args: list[str]) -> int:
    """``lit-liger bench NAME [options]``: the benchmarks (``lit_liger.benchmarks``, the checkout's ``benchmarks/``).

    They run in a fresh interpreter: without a GPU the benchmarks run the Triton kernels through the
    interpreter, and ``triton.jit`` reads ``TRITON_INTERPRET`` when a kernel module is imported, which
    in this process (``lit_liger`` imports the kernels) has already happened. Returns the exit status.
    """
    import os
    import subprocess

    if not args or args[0] in ("-h", "--help"):  # the list of benchmarks: no need for a second interpreter
        from .benchmarks.__main__ import main as bench_main

        bench_main(args)
        return 0
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    return subprocess.run([sys.executable, "-m", "lit_liger.benchmarks", *args], env=env, check=False).returncode


def _liger_boolean_values() -> dict[str, tuple[str, ...]]:
    """The LigerConfig fields that take true/false (and null: automatic, where the field allows None)."""
    import typing

    out = {}
    for name, tp in typing.get_type_hints(LigerConfig).items():
        if tp is bool:
            out[name] = ("true", "false")
        elif set(typing.get_args(tp)) == {bool, type(None)}:
            out[name] = ("true", "false", "null")
    return out


def _liger_choice_errors(argv: list[str]) -> list[str]:
    """Messages for ``--liger.NAME VALUE`` (or ``--liger.NAME=VALUE``) where NAME is a LigerConfig setting with a
    fixed set of values (``sdpa_backend``, ``flce_mode``; the true/false switches) and VALUE is not one of them.
    jsonargparse rejects those too, but through ``bool | LigerConfig``'s union its message names neither the allowed
    values nor the field ("Cannot take a Union of no types", or a dump of its internal types)."""
    choices = {**_liger_boolean_values(), **LigerConfig.choices()}
    errors = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--liger."):
            continue
        name, eq, value = arg[len("--liger."):].partition("=")
        if name not in choices:
            continue
        if not eq:
            if i + 1 >= len(argv):
                continue  # jsonargparse says a value is missing
            value = argv[i + 1]
        if value not in choices[name] and not (isinstance(choices[name][0], str) and choices[name][0] == "true"
                                               and value.lower() in choices[name]):
            allowed = ", ".join(choices[name])
            errors.append(f"--liger.{name} must be one of {allowed}; got {value!r}")
    return errors


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lit-liger`` and ``python -m lit_liger`` (``args`` defaults to ``sys.argv[1:]``)."""
    from jsonargparse import CLI

    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["bench"]:  # argparse-based, its own options: not a jsonargparse subcommand
        raise SystemExit(bench(argv[1:]))
    if argv[:1] and argv[0] in TRAINING_COMMANDS:
        errors = _liger_choice_errors(argv[1:])
        if errors:
            prog = Path(sys.argv[0]).name.split(".")[0] if args is None and sys.argv else "lit-liger"
            for message in errors:
                print(f"{prog} {argv[0]}: error: {message}", file=sys.stderr)
            raise SystemExit(2)  # what jsonargparse exits with on a bad argument
    _set_litgpt_parsing_options()
    # as litgpt's main: a PyTorch false-positive warning (litgpt issue 1561) and TF32 matmuls
    warnings.filterwarnings(
        action="ignore",
        message=r"The epoch parameter in `scheduler.step\(\)` was not necessary and is being deprecated.*",
        category=UserWarning,
        module=r".*torch\.optim\.lr_scheduler.*",
    )
    torch.set_float32_matmul_precision("high")
    CLI(parser_data(), args=args, description=_DESCRIPTION)


if __name__ == "__main__":
    main()
