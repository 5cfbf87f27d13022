"""LitGPT's GPT swapped: in training its forward returns the fused loss's input (:class:`LigerLogits`), pads to
buckets, packs samples, runs its Blocks under the memory plan and, through ``ModelState.runtime``, as CUDA graphs;
the token embedding and ``litgpt.LLM``."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint, get_device_states, set_checkpoint_early_stop as \
    _checkpoint_early_stop, set_device_states

from .. import _dist
from .._dist import sharded_processes
from ..kernels import _grad_into
from ..kernels._launch import use_triton
from ..kernels.embedding import embedding
from ._common import _CHECKPOINTED, _frozen_linear, _keeping, _MLP_RECOMPUTED, _plain_linear, _scoped, _tiled
from . import attend as _attend
from .attention import _AttentionMixin
from .block import _BlockMixin
from .buckets import bucket_length, packed_bucket_length
from . import fp8 as _fp8
from .fp8 import _warn_fp8_eager, _warn_fp8_small
from .loss import chunked_cross_entropy, GatheredHead, head_lora_input, LigerLogits, lm_head_lora, lm_head_weight_bias
from .mlp import _GeGLUMixin, _SwiGLUMixin
from . import packing as _packing
from .quant import is_4bit, is_quantized
from .state import state_of, states_in
from . import tied as _tied


def _checkpointed_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        pack: _packing.Pack | None = None, tile: int = 0,
                        kept: _attend.KeptAttention | None = None) -> torch.Tensor:
    """The function that ``torch.utils.checkpoint`` runs (and reruns in backward) for one Block; ``tile``: its MLP
    over sequence tiles of that many tokens (``MemPlan.tile``; 0: whole); ``kept``: where its attention keeps its
    output for the rerun (``MemPlan.attn``; None: nowhere)."""
    with _scoped(block, _CHECKPOINTED), _tiled(block, tile), _keeping(block, kept):
        return block(x, cos, sin, pack, None, None)


def _offloaded_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     pack: _packing.Pack | None, tile: int, anchor: torch.Tensor | None,
                     kept: _attend.KeptAttention | None = None) -> torch.Tensor:
    """:func:`_checkpointed_block` under the reentrant checkpoint of an offloaded Block; ``anchor``: a 0-dim tensor
    with grad where ``x`` has none (unused: it makes the checkpoint's output need grad)."""
    return _checkpointed_block(block, x, cos, sin, pack, tile, kept=kept)


def _autocast_kwargs(device_type: str) -> dict:
    return {"enabled": torch.is_autocast_enabled(device_type), "dtype": torch.get_autocast_dtype(device_type),
            "cache_enabled": torch.is_autocast_cache_enabled()}


def _keep_rng(ctx, x: torch.Tensor) -> None:
    """What :func:`_rerun` restores: the random number generators' states and autocast at this forward."""
    ctx.device_type = x.device.type
    ctx.cpu_rng = torch.get_rng_state()
    ctx.devices, ctx.device_rng = get_device_states(x) if x.device.type != "cpu" else ([], [])
    ctx.autocast = {t: _autocast_kwargs(t) for t in {x.device.type, "cpu"}}


class _PairFirst(torch.autograd.Function):
    """The first Block of an offloaded pair (``MemPlan.pairs``): it keeps its input, which ``save_for_backward`` hands
    to the offload hooks (``ModelState.runtime.offloaded``: pinned host memory); its output, the second Block's input
    (:class:`_PairSecond`), is kept by neither. Its backward brings the input back and runs the first Block's forward
    and backward. ``anchor``: a 0-dim tensor with grad where ``x`` has none (so the backward runs); ``first``: the
    Block's call; ``link``: a list this node puts itself in, for the second's backward to read the input through.

    Two nodes, not one: one Function over both Blocks would be handed the gradient flowing into the pair and hold it
    until its whole backward returned, one ``(T, C)`` tensor through the first Block's backward beyond what an
    offloaded Block holds (measured on an H200 with that design: benchmarks/results/h200-2026-12-02e). Here autograd
    frees that gradient when the second's backward returns. As in a reentrant checkpoint, the Blocks' parameters get
    their gradients from the backward runs inside these; each rerun draws the random numbers (dropout) and runs the
    autocast of its forward."""

    @staticmethod
    def forward(ctx, x, anchor, first, link):
        ctx.first, ctx.x_grad = first, x.requires_grad
        _keep_rng(ctx, x)
        ctx.save_for_backward(x)
        link.append(ctx)
        return first(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mid):
        with _rerun(ctx):
            x = ctx.saved_tensors[0].detach().requires_grad_(ctx.x_grad)
            out = ctx.first(x)
            if out.requires_grad:
                torch.autograd.backward(out, grad_mid)
        return (x.grad if ctx.x_grad else None), None, None, None


class _PairSecond(torch.autograd.Function):
    """The second Block of an offloaded pair: keeps nothing. Its backward brings the first's input back (through the
    first's node, in ``link``), reruns the first Block without grad to make its own input (the input from the host
    dropped as soon as that is made), then runs its forward and backward: the GPU holds what one offloaded Block's
    backward holds, and the pair costs one more forward of its first Block and one more copy in."""

    @staticmethod
    def forward(ctx, mid, second, link):
        ctx.second, ctx.link = second, link
        _keep_rng(ctx, mid)
        return second(mid)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        first = ctx.link[0]
        with _rerun(first), torch.no_grad():
            mid = first.first(first.saved_tensors[0])
        with _rerun(ctx):
            mid.requires_grad_(True)
            out = ctx.second(mid)
            torch.autograd.backward(out, grad)
        return mid.grad, None, None


def _offloaded_pair(x, anchor, first, second):
    """``second(first(x))`` as an offloaded pair (:class:`_PairFirst`, :class:`_PairSecond`)."""
    link: list = []
    return _PairSecond.apply(_PairFirst.apply(x, anchor, first, link), second, link)


@contextlib.contextmanager
def _rerun(ctx) -> Iterator[None]:
    """Grad on, the random number generators where the forward of ``ctx`` found them (:func:`_keep_rng`; put back
    after), autocast as it was."""
    with torch.random.fork_rng(devices=ctx.devices, enabled=True, device_type=ctx.device_type
                               if ctx.device_type != "cpu" else "cuda"), contextlib.ExitStack() as stack:
        torch.set_rng_state(ctx.cpu_rng)
        if ctx.devices:
            set_device_states(ctx.devices, ctx.device_rng, device_type=ctx.device_type)
        stack.enter_context(torch.enable_grad())
        for device_type, kwargs in ctx.autocast.items():
            stack.enter_context(torch.amp.autocast(device_type, **kwargs))
        yield


class _EmbeddingMixin:
    """The token embedding: while ``torch.compile`` traces a training forward, the weight's gradient comes from
    one op (:func:`embedding`); inside a capture's ``grads_into`` it is added into ``.grad`` by that op; otherwise
    ``nn.Embedding``'s own forward (eager mode runs the same ATen kernels).

    While lit-liger's CUDA graphs capture a training step that trains the token embedding (full fine-tuning,
    pretraining), its backward adds the weight's gradient straight into ``.grad`` (``kernels.embedding``: each touched
    row summed in fp32 and added once) instead of a new ``(V, C)`` gradient that a second pass adds: about 2 GB less
    memory traffic per micro-batch at Llama-3.2-1B's vocabulary. Measured on 2 x H200 (Llama-3.2-1B full fine-tuning,
    litgpt's recipe, micro-batch 4, 240 timed iterations): the mean iteration 19.13 -> 18.58 ms on one GPU, 24.09 ->
    23.59 ms on two (``benchmarks/results/h200x2-2026-11-27g``)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        into = _grad_into.target_for(self.weight) is not None
        if torch.is_grad_enabled() and self.weight.requires_grad and (torch.compiler.is_compiling() or into):
            return embedding(self.weight, idx)
        return super().forward(idx)


#: tests set this to bucket CPU runs too (on a CPU there are no per-shape plans or graphs to save)
_BUCKETS_ON_CPU = False


def _buckets_here(idx: torch.Tensor) -> bool:
    """Pad to buckets on GPU tensors in eager mode (``torch.compile`` handles shapes its own way)."""
    return (idx.is_cuda or _BUCKETS_ON_CPU) and not torch.compiler.is_compiling()


#: tests set this to pack CPU batches too (reference attention per sample)
_PACK_ON_CPU = False


#: where no data loader laid a batch out on the host (``lit_liger.runtime.batches``: a training loop of the user's own, litgpt's
#: pretraining), packing reads the batch's lengths from the device, a host sync that empties the GPU's queue. While
#: every batch read so far filled its length (no padding: pretraining, where such a batch runs unpacked anyway), a model
#: reads them only at these batches of its run, then at every multiple of the last; the others run unpacked, unread.
#: Unpacked is always right (the padding computed, its targets ignored): a padded batch between two reads costs its
#: padding until the next read finds one, from which on every batch is read (and packed). Found by the single-GPU tests
#: (``test_gpu_training_step_has_no_host_sync``: a full batch's step read its lengths every time)
LENGTH_READS = (1, 4, 16, 64, 256)


def _reads_lengths_at(n: int) -> bool:
    """Whether a model whose batches have all filled their length reads the lengths of its ``n``-th (from 1)."""
    return n in LENGTH_READS or n % LENGTH_READS[-1] == 0


def _lengths_sync(idx: torch.Tensor) -> bool:
    """Reading ``idx``'s lengths is a host sync (a device tensor)."""
    return idx.device.type != "cpu"


@contextlib.contextmanager
def fused_loss_without_grad(model: nn.Module) -> Iterator[None]:
    """While active, the forward of a swapped GPT in ``model`` without grad (and without a KV cache) returns :class:`LigerLogits` as
    in training, for a caller whose loss is ``lit_liger.chunked_cross_entropy``: validation then computes the fused
    loss and never holds the ``(B, T, V)`` logits (litgpt's ``validate``: 525 MB in bf16 and again in fp32 at 4 x 512
    tokens of a 128k vocabulary, more than a LoRA training step keeps). The CLI turns it on around litgpt's
    ``validate``; anything else without grad (generation, a user's own evaluation) gets real logits."""
    states = list(states_in(model))
    before = [st.fused_loss_without_grad for st in states]
    for st in states:
        st.fused_loss_without_grad = True
    try:
        yield
    finally:
        for st, b in zip(states, before):
            st.fused_loss_without_grad = b


class _GPTMixin:
    """In training (grad enabled, no KV cache; also without grad inside :func:`fused_loss_without_grad`) return
    :class:`LigerLogits` instead of logits.

    With ``seq_buckets`` the token ids are right-padded to a bucket length first (the LigerLogits keeps
    the caller's rows as its window, the padded rows' targets are ignored); with ``cuda_graphs`` the
    body (:meth:`_liger_hidden`) runs as captured CUDA graphs where it can (``lit_liger.runtime.graphs``)."""

    def forward(self, idx, input_pos=None, input_pos_maxp1=None, lm_head_chunk_size=0):
        if getattr(self, "_liger_tied_weights", False) and not torch.compiler.is_compiling():
            _tied.share_if_tied(self)  # (LigerConfig.tied_weights: one copy of a frozen head equal to the embedding)
        grad = torch.is_grad_enabled()
        state = state_of(self)
        rt = state.runtime  # (lit_liger.runtime.attach: None where only swapped, eager kernels)
        if input_pos is not None and not grad and rt is not None:  # (generation's one-token steps: CUDA graphs)
            out = rt.decode_step(self, super().forward, idx, input_pos, input_pos_maxp1, lm_head_chunk_size)
            if out is not None:
                return out
        if input_pos is not None or not (grad or state.fused_loss_without_grad) or _zero3_returns_logits(self) \
                or _int8_head(self):
            return super().forward(idx, input_pos, input_pos_maxp1, lm_head_chunk_size)
        T = idx.size(1)
        if self.max_seq_length < T:
            raise ValueError(f"Cannot forward sequence of length {T}, max seq length is only {self.max_seq_length}.")
        counted = grad and not torch.compiler.is_compiling()
        if counted:
            state.tokens["collated"] += idx.numel()
            if getattr(self, "_liger_fp8_eager_warning", False):
                _warn_fp8_eager(self)
            if getattr(self, "_liger_fp8_small_warning", False) and idx.numel() < _fp8.FP8_SMALL_TOKENS:
                _warn_fp8_small(self, idx.numel())
        plan = self._liger_plan(idx) if grad else None
        if plan is None:
            out = self._liger_output(idx, counted)
        else:  # LigerConfig.packing: the samples end to end, no padding computed
            state.tokens["processed"] += plan.idx.numel()
            state.tokens["packed"] += idx.numel()
            x = self._liger_body(plan.idx, None, plan)  # (1, N, C)
            out = LigerLogits(
                x[0], self.lm_head, self.config.final_logit_softcapping, self.config.padded_vocab_size,
                self._liger_flce_mode, None, x.dtype, 0, None, max_chunk_bytes=self._liger_chunk_cap(x),
                rows=plan.rows, unpacked=functools.partial(self._liger_output, idx, False), left_out=plan.check,
                x_lora=head_lora_input(self.lm_head, x[0]), state=state,
            )
        return [out] if lm_head_chunk_size > 0 else out

    def _liger_plan(self, idx: torch.Tensor) -> _packing.Plan | None:
        """The packed form of this training batch (``LigerConfig.packing``), or None: packing off or not applicable
        here (see :func:`_packing_why`), or nothing to save (one row, no padding)."""
        if not getattr(self, "_liger_packing", False) or idx.dim() != 2 or torch.compiler.is_compiling():
            return None
        if getattr(self, "_liger_pack_why", None) is not None or sharded_processes(self):
            return None
        if idx.is_cuda:
            if not _packing_device_ok(self, idx.device, self.transformer.wte.weight.dtype):
                return None
        elif not _PACK_ON_CPU:
            return None
        bucketed = getattr(self, "_liger_seq_buckets", False)
        plan = _packing.ready_plan(idx, bucketed, self.cos.size(0))  # planned by the data loader (no host sync)
        if plan is None:
            if idx.size(0) < 2:
                return None  # (one row: nothing to pack)
            if not self.__dict__.get("_liger_padded_seen") and _lengths_sync(idx):
                n = self.__dict__["_liger_unread"] = self.__dict__.get("_liger_unread", 0) + 1
                if not _reads_lengths_at(n):
                    return None  # (every batch read so far filled its length: unpacked, see LENGTH_READS)
            tops = self.__dict__.get("_liger_packed_tops", ())  # (a ladder fitted to the data: runtime.batches)
            ladder = functools.partial(packed_bucket_length, tops=tops) if tops else packed_bucket_length
            plan = _packing.plan(idx, ladder if bucketed else None, self.cos.size(0))
        if plan is not None and plan.real < idx.numel():
            self.__dict__["_liger_padded_seen"] = True
        elif plan is not None and not self.__dict__.get("_liger_padded_seen"):
            # a batch without padding (packed with a bucket ladder: lit_liger.swap.packing) is packed only in a run whose batches have had padding
            # (instruction data: such a batch is rare there, and packed it needs no shape of its own); where every
            # batch so far filled its length (pretraining), it runs unpacked, one shape with cuDNN attention
            return None
        return plan

    def _liger_output(self, idx: torch.Tensor, counted: bool) -> LigerLogits:
        """The training output of the batch ``idx`` as LitGPT computes it (padded rows; right-padded further to a
        bucket with ``seq_buckets``)."""
        T = idx.size(1)
        if getattr(self, "_liger_seq_buckets", False) and _buckets_here(idx):
            T_pad = bucket_length(T, self.max_seq_length)
            if T_pad != T:
                idx = F.pad(idx, (0, T_pad - T), value=0)  # (B, T_pad): causal attention, the pad comes last
        if counted:
            state_of(self).tokens["processed"] += idx.numel()
        # Taken first so that, in backward, its copy's gradient reaches the sharded parameter after
        # every other node of the model (autograd runs the most recently created ready node first):
        # by then the strategy's pre-backward hook on `hidden` has fired (see LigerLogits).
        head = _sharded_head_snapshot(self, self.lm_head)
        x = self._liger_body(idx, head)  # (B, T_pad, C)
        return LigerLogits(
            x, self.lm_head, self.config.final_logit_softcapping, self.config.padded_vocab_size,
            self._liger_flce_mode, head, x.dtype, 0, T if x.shape[1] != T else None,
            max_chunk_bytes=self._liger_chunk_cap(x),
            x_lora=head_lora_input(self.lm_head, x),  # (B, T_pad, C): a LoRA head's dropout, drawn where stock does
            state=state_of(self),
        )

    def set_kv_cache(self, *args, **kwargs):
        if (rt := state_of(self).runtime) is not None:
            rt.decode_drop(self)  # (its graph was captured on the cache being replaced)
        return super().set_kv_cache(*args, **kwargs)

    def clear_kv_cache(self):
        if (rt := state_of(self).runtime) is not None:
            rt.decode_drop(self)
        return super().clear_kv_cache()

    def _liger_body(self, idx: torch.Tensor, head: GatheredHead | None,
                    plan: _packing.Plan | None = None) -> torch.Tensor:
        """:meth:`_liger_hidden`, through the captured CUDA graphs where they apply (``cuda_graphs``)."""
        x = runner = None
        if not torch.compiler.is_compiling():  # (Blocks recomputed, inputs offloaded): read by the graphs, the body
            self._liger_mem_now = _memory_plan_here(self, idx)
        graphs = getattr(self, "_liger_cuda_graphs", False)  # True, False or None (automatic)
        rt = state_of(self).runtime
        if graphs is not False and rt is not None and head is None and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # (under torch.compile: not traced at all; making the runner registers global module hooks, which a
            # traced graph must not do)
            runner = rt.runner(self)
            x = runner.hidden(idx, auto=graphs is None, plan=plan)  # None where capture does not apply
        if x is None:
            x = self._liger_hidden(idx, plan)
            if runner is not None:
                runner.note_hidden(x)  # (the first micro-batch runs uncaptured: graphs.EAGER_FIRST)
        return x

    def _liger_chunk_cap(self, x: torch.Tensor) -> int | None:
        # With activation checkpointing the step keeps little beside the Blocks' inputs: the loss's logits chunk
        # is capped at their size, or its buffer (a (rows, V) chunk, 125 MiB at 512 rows of a 128k vocabulary)
        # would be the step's peak (measured, H100, Llama-3.2-1B LoRA at 1 x 512: 125 of the step's 163 MiB).
        # Not under torch.compile (the sizes may be symbolic there): the kernel's default chunk.
        recomputed = getattr(self, "_liger_mem_now", (0, False, 0))[0]
        if recomputed and not torch.compiler.is_compiling():
            return recomputed * x.numel() * x.element_size()
        return None

    def _liger_hidden(self, idx: torch.Tensor, plan: _packing.Plan | None = None,
                      taps: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Token ids ``(B, T)`` -> final hidden states ``(B, T, C)`` (embedding, blocks, ``ln_f``). ``plan``: ``idx``
        is a packed sequence ``(1, N)`` (its positions and samples' boundaries). Where the model's ``ModelState.grads_ready``
        has callbacks, the input of each Block at ``_dist.segment_cuts`` goes into ``taps`` (the CUDA graphs' capture
        splits its backward there) or, without ``taps``, gets a gradient hook that runs the callbacks."""
        T = idx.size(1)
        pack = None
        if plan is not None:  # each token at its position inside its sample
            cos, sin = self.cos[plan.positions].unsqueeze(0), self.sin[plan.positions].unsqueeze(0)
            pack = plan.pack.for_one_forward()  # (what every layer derives from the boundaries, derived once)
        else:
            cos = self.cos[:T].unsqueeze(0)  # (1, T, rope_n_elem)
            sin = self.sin[:T].unsqueeze(0)
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.scale_embeddings:
            x = x * torch.tensor(self.config.n_embd**0.5, dtype=x.dtype)
        ri = self.config.rope_indices
        # LigerConfig.activation_checkpointing: the lowest `recompute` Blocks keep only their input (the lowest `host`
        # of them in pinned host memory, the others on the GPU) and rerun in backward, their MLP over sequence tiles of
        # `tile` tokens (0: whole); the `mlp` Blocks above them keep no MLP input (see _memory_plan_here,
        # lit_liger.runtime.memplan); the lowest `attn` of them keep their attention's output for the rerun (the lowest
        # `attn_host` in pinned host memory)
        recompute, _, mlp, host, tile, pairs, attn, attn_host = (
            _memory_plan_here(self, idx) if torch.compiler.is_compiling()
            else getattr(self, "_liger_mem_now", None) or _memory_plan_here(self, idx))
        cuts = {} if torch.compiler.is_compiling() else {
            b: j for j, b in enumerate(_dist.segment_cuts(self), 1)}
        blocks, host, second = self.transformer.h, min(host, recompute), False
        rt = state_of(self).runtime
        # (the recomputed Blocks above the lowest `attn` keep nothing; their reruns' backward runs over slices)
        kept = [_attend.KeptAttention(rt if i < attn_host else None, keep=i < attn)
                for i in range(min(recompute, len(blocks)))]
        kept += [None] * (len(blocks) - len(kept))
        for block_idx, block in enumerate(blocks):
            if second:  # (run with the Block below it, an offloaded pair)
                second = False
                continue
            if block_idx in cuts:
                if taps is not None:
                    taps[block_idx] = x
                elif x.requires_grad:  # (the Blocks from here up have their gradients when x has its own)
                    x.register_hook(functools.partial(_segment_ready, self, cuts[block_idx]))
            c, s = (cos[..., ri[block_idx]], sin[..., ri[block_idx]]) if ri is not None else (cos, sin)
            if block_idx < host:  # reentrant: the checkpoint saves its input, which the hooks move
                # a frozen embedding's output: the reentrant checkpoint needs one input with grad, or the Block's
                # trainable parameters get none; a 0-dim leaf serves (x made a leaf would be held, with its gradient,
                # by its AccumulateGrad node for as long as the graph lives: through the whole backward, and past it
                # where the loop keeps the loss: 2 (B, T, C) tensors, 4 GiB at 262k tokens of width 4096)
                anchor = x.new_zeros((), requires_grad=True) if not x.requires_grad else None
                # the lowest `pairs` pairs keep one input each (MemPlan.pairs): not across a segment cut
                second = block_idx + 1 < min(host, 2 * pairs) and block_idx % 2 == 0 and block_idx + 1 not in cuts
                with state_of(self).runtime.offloaded(self.config.n_embd):
                    if second:
                        c2, s2 = ((cos[..., ri[block_idx + 1]], sin[..., ri[block_idx + 1]]) if ri is not None
                                  else (cos, sin))
                        x = _offloaded_pair(
                            x, anchor, functools.partial(_checkpointed_block, block, cos=c, sin=s, pack=pack,
                                                         tile=tile, kept=kept[block_idx]),
                            functools.partial(_checkpointed_block, blocks[block_idx + 1], cos=c2, sin=s2, pack=pack,
                                              tile=tile, kept=kept[block_idx + 1]))
                    else:
                        x = _checkpoint(_offloaded_block, block, x, c, s, pack, tile, anchor, kept[block_idx],
                                        use_reentrant=True, preserve_rng_state=True)
            elif block_idx < recompute:  # only x is kept; the Block reruns in backward
                if torch.compiler.is_compiling():  # (a traced checkpointed region allows no Python side effect)
                    x = _checkpoint(block, x, c, s, pack, None, None, use_reentrant=False, preserve_rng_state=True)
                else:
                    # without early stop (which ends the recompute by raising from inside the last saving op, here
                    # glu_mlp's autograd Function: seen to turn into a SystemError under CUDA memory history); the
                    # recompute then also runs what follows that op in the Block, a residual add
                    with _checkpoint_early_stop(False):
                        x = _checkpoint(_checkpointed_block, block, x, c, s, pack, tile, kept[block_idx],
                                        use_reentrant=False, preserve_rng_state=True)
            elif block_idx < recompute + mlp:
                with _scoped(block, _MLP_RECOMPUTED):
                    x = block(x, c, s, pack, None, None)
            else:
                x = block(x, c, s, pack, None, None)
        return self.transformer.ln_f(x)  # (B, T, C)


def _segment_ready(gpt: nn.Module, segment: int, grad: torch.Tensor) -> None:
    """A gradient hook: the trainable parameters of ``segment`` have their gradients (``ModelState.grads_ready``)."""
    _dist.grads_ready(gpt, segment)


def _packing_device_ok(gpt: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every layer attends packed samples on this CUDA device and dtype: softcap layers through lit-liger's
    softcap kernel with sample starts, the others through flash attention over cumulative lengths."""
    flash = None
    for block in gpt.transformer.h:
        attn = block.attn
        if attn.config.attention_logit_softcapping is not None:
            if not attn._liger_packed_softcap_here(device, dtype):
                return False
        else:
            if flash is None:
                flash = _packing.flash_varlen_ok(device, dtype, gpt.config.head_size)
            if not flash:
                return False
    return True


def _packing_why(gpt: nn.Module) -> str | None:
    """Why this GPT's training batches cannot be packed (``LigerConfig.packing``), or None: every layer's attention
    must be lit-liger's and able to attend inside packed samples."""
    for i, block in enumerate(gpt.transformer.h):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, _AttentionMixin):
            return f"transformer.h.{i}.attn is LitGPT's own attention (rope switched off, or latent attention)"
        if (why := attn._liger_packable()) is not None:
            return f"transformer.h.{i}.attn: {why}"
    return None


#: :func:`_memory_plan_here` where nothing is planned: every Block keeps its activations
NO_PLAN = (0, False, 0, 0, 0, 0, 0, 0)


def _memory_plan_here(gpt: nn.Module, idx: torch.Tensor) -> tuple[int, bool, int, int, int, int, int, int]:
    """``(recompute, offload, mlp, host, tile, pairs, attn, attn_host)`` for this forward of ``idx``: the lowest
    ``recompute`` Blocks recomputed in backward, the lowest ``host`` of them keeping their input in pinned host memory
    (``offload``: any), the lowest ``2 * pairs`` of those in pairs that keep one input each (:func:`_offloaded_pair`),
    ``mlp`` Blocks above them whose MLP inputs are recomputed, the recomputed Blocks' MLP over sequence tiles of
    ``tile`` tokens (0: whole), the lowest ``attn`` recomputed Blocks keeping their attention's output for the rerun,
    the lowest ``attn_host`` of them in pinned host memory (``lit_liger.swap.attend.kept_sdpa``). ``activation_checkpointing`` ``True`` every Block, ``False`` none, ``None``
    (automatic) :func:`lit_liger.runtime.memplan.plan_for` from the micro-batch's tokens and the device's and the
    host's memory (a CUDA device, eager mode; the log says each plan that recomputes more than any before it; it
    raises ``memplan.MemoryPlanError`` where nothing fits)."""
    setting = getattr(gpt, "_liger_activation_checkpointing", False)
    if setting is False or not _checkpoint_blocks_here(gpt):
        return NO_PLAN
    n = gpt.config.n_layer
    if setting is True:
        return n, False, 0, 0, 0, 0, 0, 0
    if torch.compiler.is_compiling() or (idx.is_cuda and torch.cuda.is_current_stream_capturing()):
        return NO_PLAN
    elt = gpt.transformer.wte.weight.element_size() if gpt.transformer.wte.weight.is_floating_point() else 2
    # (host offload is a reentrant checkpoint, which DDP's reducer hooks do not take: not inside a DDP wrapper)
    rt = state_of(gpt).runtime
    if rt is None:  # (swapped without the runtime: no memory plan)
        return NO_PLAN
    # (tiles: every Block is lit-liger's, which runs its MLP over the tiles its checkpointed call is given)
    plan = rt.memory_plan(gpt, idx.numel(), idx.device, elt, _dist.whole_model(gpt),
                          lambda: _mlp_recomputable(gpt, idx),
                          lambda: all(isinstance(b, _BlockMixin) for b in gpt.transformer.h),
                          lambda: _attention_keepable(gpt))
    if plan is None:
        return NO_PLAN
    said = gpt.__dict__.setdefault("_liger_mem_said", [-1, 0, 0, 0, 0, 0])
    # the first plan said that recomputes: its measured peak said at the next planned forward (the next step's with
    # one micro-batch a step), once
    due = gpt.__dict__.get("_liger_peak_due")
    say_measured_peak(gpt)
    if (plan.recompute, plan.host, plan.pairs, plan.mlp, plan.tile, plan.attn) > tuple(said):
        said[:] = [plan.recompute, plan.host, plan.pairs, plan.mlp, plan.tile, plan.attn]
        if _dist.rank_zero():
            print(plan.line(idx.numel(), n), flush=True)
            if due is None and plan.room is not None and (plan.recompute or plan.mlp):
                # (a plan that trades compute for memory)
                gpt.__dict__["_liger_peak_due"] = (plan, idx.numel(), idx.device)
    return plan.recompute, plan.offload, plan.mlp, plan.host, plan.tile, plan.pairs, plan.attn, plan.attn_host


def _attention_keepable(gpt: nn.Module) -> bool:
    """Whether every Block's attention can keep its output for the Block's rerun (``MemPlan.attn``): lit-liger's, on
    plain causal SDPA (no softcap, no window, LitGPT's own ``scaled_dot_product_attention``: no adapter's prefix)."""
    for block in gpt.transformer.h:
        attn = getattr(block, "attn", None)
        if not isinstance(attn, _AttentionMixin) or attn._liger_attention_path() != "sdpa" \
                or attn._liger_packable() is not None:
            return False
    return True


def say_measured_peak(gpt: nn.Module) -> None:
    """Print the measured-peak line of the first plan that recomputes (``MemPlan.peak_line``) where it is still due:
    at the next planned forward, or, for a run that ends or generates before one (a single long step), where
    the ``lit-liger`` command's ``fit`` ends or calls litgpt's ``generate_example``. Once."""
    due = gpt.__dict__.get("_liger_peak_due")
    if due:
        gpt.__dict__["_liger_peak_due"] = False
        plan, tokens, device = due
        print(plan.peak_line(tokens, *_measured_peaks(device)), flush=True)


def _measured_peaks(device: torch.device) -> tuple[float, float | None]:
    """The GPU's highest allocation so far (bytes) and this process's peak resident host memory (None where the
    platform does not say it in KiB: Linux)."""
    peak = float(torch.cuda.max_memory_allocated(device))
    if not sys.platform.startswith("linux"):
        return peak, None
    import resource

    return peak, float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _mlp_recomputable(gpt: nn.Module, idx: torch.Tensor) -> bool:
    """Every Block's GLU MLP can leave its two ``(B, T, I)`` inputs to its backward (the memory plan's MLP level):
    frozen plain projections (``glu_mlp``: it keeps its ``(B, T, C)`` input) or trained ones that
    ``recompute_mlp`` fuses with ``norm_2``; the Triton path."""
    if not use_triton(idx) or torch.is_autocast_enabled(idx.device.type):
        return False
    for block in gpt.transformer.h:
        mlp = getattr(block, "mlp", None)
        if not isinstance(block, _BlockMixin) or not isinstance(mlp, (_SwiGLUMixin, _GeGLUMixin)):
            return False
        linears = (mlp.fc_1, mlp.fc_2, mlp.proj)
        if all(_frozen_linear(m) is not None for m in linears):
            continue  # (glu_mlp)
        if not (all(_plain_linear(m) for m in linears) and block._liger_fuse_norm_2(structure_only=True)
                and (mlp.fc_1.weight.requires_grad or mlp.fc_2.weight.requires_grad)):
            return False  # (LoRA or float8 Linears, or a trained proj beside frozen fc_1 / fc_2: kept as they are)
    return True


def _checkpoint_blocks_here(gpt: nn.Module) -> bool:
    """``LigerConfig.activation_checkpointing`` (on or automatic) applies to this forward: grad enabled, one process
    or a replica (a sharding strategy checkpoints its own wrapped Blocks: warned once where it was asked for)."""
    setting = getattr(gpt, "_liger_activation_checkpointing", False)
    if setting is False or not torch.is_grad_enabled():
        return False
    if sharded_processes(gpt) and setting is None:
        return False  # (automatic: the strategy's own plan, no word)
    if sharded_processes(gpt):
        # (no Python side effects in a trace)
        if not torch.compiler.is_compiling() and state_of(gpt).warn_once("activation_checkpointing sharded"):
            import warnings

            warnings.warn(
                "lit-liger: activation_checkpointing applies to single-process and DDP runs; under this sharding "
                "strategy it is off (use the strategy's own: litgpt's FSDP recipes checkpoint each Block through "
                "activation_checkpointing_policy).", stacklevel=3)
        return False
    return True


def _zero3_returns_logits(gpt: nn.Module) -> bool:
    """DeepSpeed ZeRO-3 partitions the lm_head weight. Inside a DeepSpeed engine's forward, reading a
    partitioned parameter outside its module gathers it and registers it with the module whose
    forward is running, which gathers it again for its backward: so when the loss is computed inside
    the engine's forward by a module *around* the GPT (Lightning's Trainer: ``training_step`` runs
    inside the engine's forward), the fused loss reads the weight at loss time and its gradient is
    accumulated while gathered. When the GPT itself is the engine's module (Fabric + DeepSpeed), the
    loss runs after the engine's forward, where the weight is a size-0 partition: the model then
    returns real logits (LitGPT's loss path, every other kernel on), with a warning once.
    """
    lm_head = gpt.lm_head
    weight = getattr(getattr(lm_head, "linear", lm_head), "weight", None)
    if weight is None or not hasattr(weight, "ds_id"):
        return False
    try:
        from deepspeed.runtime.zero.parameter_offload import FWD_MODULE_STACK
    except ImportError:  # a `ds_id` without deepspeed: treat the GPT as the top module
        FWD_MODULE_STACK = []
    # DeepSpeed pushes each module on this stack in its pre-forward hook, and an engine's own module
    # once more when the engine is built: below the GPT's own entry sits the module whose forward
    # called it, or the GPT again when it is the engine's module
    if len(FWD_MODULE_STACK) >= 2 and FWD_MODULE_STACK[-1] is gpt and FWD_MODULE_STACK[-2] is not gpt:
        return False  # an outer module's forward computes the loss: fused, weight read at loss time
    if state_of(gpt).warn_once("zero3 logits"):
        import warnings

        warnings.warn(
            "lit-liger: DeepSpeed ZeRO-3 with the GPT as the engine's module: the loss runs after the engine's "
            "forward, where the lm_head weight is partitioned, so the fused linear cross-entropy is off here (the "
            "model returns logits; all other kernels stay on). Compute the loss inside the engine's forward (a "
            "module around the GPT, as Lightning's Trainer does) to keep it.",
            stacklevel=3,
        )
    return True


def _int8_head(gpt: nn.Module) -> bool:
    """The lm_head is a bitsandbytes int8 layer (quantized after ``apply_liger`` ran): its own forward, real logits
    (see ``lit_liger.swap.loss._linear_weight``)."""
    w = getattr(getattr(gpt.lm_head, "linear", gpt.lm_head), "weight", None)
    return w is not None and is_quantized(w) and not is_4bit(w)


def _is_zero3(lm_head: nn.Module) -> bool:
    return hasattr(getattr(getattr(lm_head, "linear", lm_head), "weight", None), "ds_id")


def _sharded_head_snapshot(gpt: nn.Module, lm_head: nn.Module) -> GatheredHead | None:
    """Under a sharding strategy the lm_head weight is gathered only inside the model's forward
    (FSDP1 may reshard the root's flat parameter when forward returns; FSDP2 holds DTensors;
    ZeRO-3 is handled by :func:`_zero3_returns_logits`), but the loss runs after it. So in a multi-process run, take the
    gathered (V, H) weight (and bias) here, inside forward, as an autograd-connected copy: its
    gradient flows back to the real parameter through the copy, and the sharding strategy reduces it
    as usual. Costs one (V, H) copy per step; single-process runs read the parameter directly."""
    if not sharded_processes(gpt) or _is_zero3(lm_head):  # (one process, or a DDP replica: the parameter is whole)
        return None  # ZeRO-3: read at loss time, inside the engine's forward (see _zero3_returns_logits)
    weight, bias = lm_head_weight_bias(lm_head)  # DTensors gathered; sharded flat params raise here
    lora = lm_head_lora(lm_head)  # a LoRA head: (A (r, C), B (V, r), scaling), gathered the same way
    if lora is not None:
        lora = (lora[0].clone(), lora[1].clone(), lora[2])
    return GatheredHead(weight.clone(), bias.clone() if bias is not None else None, lora)


class _LLMMixin:
    """``litgpt.LLM``: ``logits, loss = llm(input_ids, target_ids)`` gets the fused loss."""

    def forward(self, input_ids, target_ids=None, loss_fn=None):
        logits = self.model(input_ids)
        if target_ids is None:
            return logits
        loss_fn = loss_fn if loss_fn is not None else chunked_cross_entropy
        return logits, loss_fn(logits[..., :-1, :], target_ids[..., 1:])
