"""``LigerConfig``: one switch per kernel, all on by default."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from jsonargparse.typing import NonNegativeInt  # an int >= 0 that the command line's parser checks

# LigerConfig fields that are settings, not on/off switches
_SETTINGS = ("flce_mode", "compile_min_tokens", "seq_buckets", "packing", "data_parallel", "balance_ranks",
             "replicate_frozen_base", "fp8", "fp8_all_gather", "cuda_graphs", "cuda_graphs_max_tokens", "sdpa_backend",
             "caller_thread_backward", "activation_checkpointing", "recompute_mlp", "fused_optimizer",
             "defer_loss_sync")


@dataclass
class LigerConfig:
    """Which kernels lit-liger swaps into a LitGPT model.

    Args:
        rms_norm: RMSNorm (with or without Gemma's unit offset) -> Triton RMSNorm.
        layer_norm: LayerNorm (with or without affine parameters) -> Triton LayerNorm.
        rope: q/k rotary embedding in one launch (partial rotary, GQA, interleaved layout).
        flex_attention: layers with attention logit softcapping (Gemma-2) or a sliding window (Gemma-2/3,
            Mistral-7B-v0.1, Phi-3 ...) attend through PyTorch's FlexAttention on CUDA tensors: softcap and
            LitGPT's causal / window mask fused into one kernel (no ``(B, nh, T, T)`` scores, no per-step
            ``(T, T)`` mask), GQA without kv copies; under ``torch.compile`` too, also for micro-batches
            below ``compile_min_tokens``. Off, or on CPU tensors: LitGPT's own attention math (after
            lit-liger's RoPE). Needs ``rope`` (the swapped attention module).
        softcap_attention: of those layers, the ones with a softcap (Gemma-2) whose sequence fits inside their
            window (or that have none) run lit-liger's own Triton kernel (``kernels/attention.py``: causal +
            softcap, forward and backward) instead of FlexAttention; measured faster on an H100 at gemma-2's
            shape. Off: FlexAttention there too. Needs ``flex_attention``.
        lora: LitGPT's LoRA layers (``LoRALinear``, ``LoRAQKVLinear`` with r > 0): the frozen projection and the
            LoRA update in one autograd function of GEMMs (``lit_liger.swap.lora``) instead of LitGPT's dropout ->
            A -> grouped conv1d -> zero pad -> scale -> add chain (host-bound at fine-tuning sizes).
        swiglu: ``LLaMAMLP`` (and each ``LLaMAMoE`` expert) -> ``silu(fc_1) * fc_2`` kernel.
        geglu: ``GemmaMLP`` -> ``gelu(fc_1) * fc_2`` kernel (tanh or exact GELU per config).
        gelu: ``GptNeoxMLP`` (Pythia, Falcon, phi, StableLM-alpha, ...) -> GELU kernel; with a plain ``proj``
            Linear, GELU + ``proj`` keep only ``fc``'s output for backward (one ``(B, T, I)`` tensor per layer less).
        fused_residual: residual add + norm_2 fused in the Block where the structure allows.
        recompute_norm: in those Blocks, the RMSNorm outputs read by plain Linears (``attn.qkv``;
            ``mlp.fc_1``/``fc_2``) are recomputed in backward instead of kept for their weight
            gradients (two ``(B, T, C)`` activations per layer less; one extra norm pass each); read by LoRA
            layers with a frozen base (LoRA, QLoRA), the same for the LoRA update's ``lora_A`` gradient.
        fused_linear_cross_entropy: in training, lm_head + cross-entropy without the N x V logits.
        embedding: the token embedding (``transformer.wte``, a plain ``nn.Embedding``): under ``torch.compile``, its
            weight gradient from one op running ATen's CUDA kernel (``kernels/embedding.py``) where inductor would
            build a zero-filled fp32 ``(V, C)`` buffer, atomic adds and a cast (measured on an H100, gemma-2-2b's
            256k vocabulary: 1.96 ms per step against 0.68). Eager mode runs ``nn.Embedding`` as before.
        quantized_linear: bitsandbytes 4-bit Linears (QLoRA, ``--quantize bnb.nf4|nf4-dq|fp4|fp4-dq``): forward
            and backward as one autograd function whose frozen weight is decoded straight into the compute dtype
            (``lit_liger.swap.quant``), one kernel where bitsandbytes decodes to float16 and casts. The LoRA function
            and the fused loss read quantized weights the same way whatever this says.
        flce_mode: ``"fast"`` (3 GEMMs, fp32 weight-gradient buffer) or ``"lean"`` (least memory).
        compile_min_tokens: under ``torch.compile``, a micro-batch of fewer tokens (B x T) than this
            runs LitGPT's own norm, attention and MLP code, which inductor fuses and launches with
            less host work than lit-liger's kernels cost as opaque custom ops; the fused loss stays, and
            so do the softcap / sliding-window layers' RoPE + FlexAttention (LitGPT's math there
            builds (T, T) scores and, for a window, a mask row by row).
            Such small steps are bound by the host, not the GPU (docs/performance.md, "Small micro-batches").
            ``None`` (default): ``2**34 // n_embd**2`` tokens (4096 at n_embd 2048, 1024 at 4096);
            ``0``: lit-liger's kernels at every size. Eager mode is not affected.
        seq_buckets: in training (fused loss on, eager mode), pad each micro-batch's sequence length up to
            a bucket (multiples of 64 up to 512 tokens, then 8 buckets per doubling, never past the model's
            ``max_seq_length``), the padded targets ignored: the loss and every gradient are the unpadded
            batch's (attention is causal, padding is on the right), and a run on variable-length data sees
            a handful of shapes instead of a new one per step (no per-length attention plan, CUDA graphs
            reusable). On GPU tensors in eager mode (not under ``torch.compile``; a CPU has nothing to gain).
        packing: in training (fused loss on, eager mode, one process or a DDP replica), run a micro-batch of several samples as one
            sequence: each row without its right padding (its trailing token id 0, litgpt's collate pad), the rows
            end to end, attention inside each sample, RoPE positions restarting at each; the packed length is
            padded to a bucket with ``seq_buckets`` (with one process, a ladder fitted to the training set's lengths:
            ``lit_liger.swap.buckets.fit_packed_tops``, said in the log). The same computation as the padded batch for every real
            position, without the padding (a third of litgpt's LoRA recipe's positions on instruction data); the
            loss reads each target at its packed row (a left-out position whose target is not ignored, a sample
            that really ends in token 0: that loss comes from an unpadded forward, with a warning). On CUDA through
            flash attention over cumulative lengths (16-bit, head size <= 256), captured by ``cuda_graphs`` per
            packed length; CPU tensors only in the tests. Not for models with attention logit softcapping (Gemma-2)
            or adapter attention: they run padded (the report says why). With litgpt's SFT collate (the ``lit-liger``
            command line: in the data loader's workers; ``LigerCallback``: in ``on_before_batch_transfer``) each batch
            is laid out on the host (``lit_liger.runtime.batches``), so a packed step reads nothing back from the GPU; elsewhere
            the forward reads the rows' lengths (one host sync) and the loss checks the left-out targets (another);
            while every batch read has filled its length (pretraining), only the 1st, 4th, 16th, ... batch's lengths are
            read and the others run unpacked (``lit_liger.swap.gpt.LENGTH_READS``). On by default: measured on an H200
            (Llama-3.2-1B, litgpt's LoRA recipe, micro-batch 4, 39% of the positions padding, 9% packed), 300
            iterations: 1.16x the padded run's tokens/s; 100 iterations: 0.91x, because packed lengths spread wider and
            their captures (~0.13 s each) land later in a run; it reserves 0.8 GB more there
            (``benchmarks/results/h200-2026-11-26``). ``False``: padded batches.
        data_parallel: the ``lit-liger`` command line with ``--devices`` > 1 (``lit_liger.parallel.dataparallel``):
            ``"auto"`` (default) estimates, from the recipe's model, trainable parameters, precision, micro-batch
            and ``--train.max_seq_length``, whether one device holds the whole training state with margin (80% of
            its memory); if so every device runs a replica (``"replicate"``: no wrapper, lit-liger's single-device
            machinery on each, the gradients all-reduced once per optimizer step, the upper Blocks' under the backward
            of the lower ones, the optimizer stepping in chunks as the last all-reduces finish); where only Adam's
            state does not fit, the same replica with that state split between the devices (``"zero1"``: each
            gradient sent to the device that steps it, each stepped parameter sent back; checkpoints hold the whole
            state); else litgpt's own strategy (``"litgpt"``, which keeps it always). ``"shard"`` runs the recipes
            that litgpt shards with FSDP1 (full fine-tuning, adapters, pretraining) with ZeRO-2 (FSDP
            ``SHARD_GRAD_OP``, Blocks recomputed only if the estimate needs it); CPU-tested and run on GPUs only at
            1B (it trains, 0.29x the replica's speed), so ``"auto"`` does not name it yet. The plan and why are
            printed. Measured on 2 x H200 (Llama-3.2-1B, litgpt's recipes, micro-batch 4): LoRA 1.90x one GPU's
            tokens/s, full fine-tuning 1.59x, where litgpt's sharding ran 0.054x and 0.32x; Llama-3.1-8B full
            fine-tuning with ``"zero1"`` 3.45x stock litgpt's 2-GPU run. The Trainer keeps the user's strategy.
        balance_ranks: under ``data_parallel`` ``"replicate"`` / ``"zero1"``: each device's sampler draws every
            device's index lists (litgpt's ``DistributedSampler`` per rank), estimates each micro-batch's positions
            from its samples' text (litgpt's ``SFTDataset``; other data keeps litgpt's order, said in the log) and
            deals each optimizer step's rounds so that its positions spread evenly over the devices
            (``lit_liger.parallel.balance``): the first micro-batch of each step on each device is litgpt's, each later one
            goes, longest first, to the device with the fewest positions in the step so far. Each step trains on the
            micro-batches litgpt's order gives it (the same gradient, summed in another order); what a device logs is
            the loss of the micro-batches it ran. The log says how much the busiest device ran over the mean, dealt
            and in litgpt's order. Measured on 2 x H200 (Llama-3.2-1B, Alpaca-shaped lengths): the busiest device's
            excess 10.4% -> 5.6% of the positions per step, iterations 1.7% (full) and 1.9-2.9% (LoRA) shorter.
            ``False``: litgpt's order.
        replicate_frozen_base: the earlier name of ``data_parallel="replicate"`` (true forces it; false leaves
            ``data_parallel`` to decide).
        fp8: float8 GEMMs for the Block projections (attention ``qkv``/``proj``, MLP ``fc_1``/``fc_2``/``proj``;
            a LoRA layer's frozen base, its adapters staying in 16 bits) with torchao's float8 training recipe of
            that name (``pip install 'lit-liger[fp8]'``); the embedding, norms, lm_head and fused loss stay as
            they are. ``"off"`` (default). Where a GPU has no float8 tensor cores (below sm_89) or torchao is
            missing, the report says why and the model stays in 16 bits. The converted projections are torchao's
            ``Float8Linear`` modules: lit-liger's norm, RoPE, GLU and loss kernels run around them, and its fused
            norm->Linear and GLU-product recompute call their float8 GEMMs (``lit_liger.swap.fp8``: the normalized tensors
            and GLU products not kept for backward); ``apply_liger(model, False)`` puts the original Linears back.
            ``"tensorwise"`` runs on lit-liger's own casts (``lit_liger.kernels.float8``: the norm and GLU kernels
            write the float8 tensors, bit for bit torchao's numbers, and ``torch._scaled_mm`` is called as torchao
            calls it; a LoRA layer's frozen base inside lit-liger's LoRA function), fast with or without
            ``torch.compile`` at large micro-batches: on an H100, Llama-3.2-1B (B4 x T2048) runs 1.16x lit-liger +
            compile in bf16 with compile and 1.15x without; Llama-3.1-8B's widths (8 layers, B2 x T4096) 1.26x stock
            bf16 compile in lit-liger bf16's memory. At litgpt's recipe sizes (~800 tokens per micro-batch) it is
            slower than bf16 (0.71-0.78x: every weight cast at every step) and a micro-batch below 4,096 tokens
            warns once (``benchmarks/results/h100-2026-11-26d``). The rowwise recipes run on
            torchao's casts: use them with ``torch.compile`` (torchao's casts eagerly made tensorwise 0.4-0.55x bf16
            compile before lit-liger had its own; the model warns once when it trains eagerly on them).
            300-step loss within 1.1% (tensorwise) / 0.83% (rowwise) of bf16.
        fp8_all_gather: with ``fp8="tensorwise"``, give the float8 projections' weights torchao's FSDP2 float8
            all-gather (``Float8LinearConfig(enable_fsdp_float8_all_gather=True)``: each weight a
            ``WeightWithDynamicFloat8CastTensor``, so ``fully_shard`` gathers it in float8, half the bytes of bf16, and
            the GEMMs take it as gathered: the same float8 numbers as casting after a bf16 all-gather; bit for bit on
            2 CPU processes). torchao has it for FSDP2 and tensorwise scaling only: FSDP1 (``FSDPStrategy``),
            DeepSpeed, DDP and the rowwise recipes gather 16-bit weights and cast after, as before. It must be in
            place before ``fully_shard`` (projections converted after it gather in 16 bits; the report says so).
            ``None`` (default, automatic): on in a multi-process run that FSDP2 shards next across several hosts:
            ``LigerCallback`` under the Trainer's ``ModelParallelStrategy`` (a model that exists before
            ``configure_model`` shards it), and a model built on the meta device outside FSDP1's wrapping context
            (Fabric's ``ModelParallelStrategy``: ``lit-liger finetune_lora --devices N``); off on one host
            (``_dist.one_host``), where the 16-bit all-gather measured faster (2 x H200, 8B widths: 1.22x stock
            against 1.11x; LoRA at 1B widths: 0.93x of it), and off elsewhere. ``True``: on wherever the weights are not
            sharded yet (your own ``fully_shard`` loop); ``False``: off. The report says which and why.
            ``LigerCallback`` computes the weights' scales after each optimizer step with one all-reduce
            (``lit_liger.swap.fp8.precompute_fp8_scales``, torchao's ``precompute_float8_dynamic_scale_for_fsdp``); elsewhere each
            all-gather computes its weight's scale with an all-reduce of its own (the same numbers, more collectives).
            In eager mode the gathered float8 weights go into lit-liger's tensorwise GEMMs as they are. On 2 x H200:
            bit-equal to the bf16 all-gather, and slower on that one host (``benchmarks/results/h200x2-2026-11-26b``).
        cuda_graphs: capture the swapped model's training forward and backward once per (batch, bucket)
            shape on a single CUDA device in eager mode and replay them, so that a small step costs its GPU
            time rather than the host's launch time (the loss and the optimizer step run as before; LoRA
            dropout is captured, a replay draws fresh masks). ``None`` (default, "auto"): on for LoRA, adapters,
            full fine-tuning and pretraining alike; the replayed backward adds the gradients straight into the
            parameters' ``.grad`` (one copy of each, the uncaptured run's memory), except
            where a parameter has a tensor hook or several processes train (autograd accumulates there; in a DDP
            replica auto therefore captures LoRA-style runs only). ``True``: on whenever it can apply;
            ``False``: off. Inside a DDP forward the graphs replay and DDP reduces the gradients. Falls
            back to uncaptured steps (with one warning) where capture cannot apply: a sharding multi-process
            strategy (FSDP/DeepSpeed), autocast (use a ``*-true`` precision),
            module hooks, ``torch.compile``, a capture error. FlexAttention layers (softcap / sliding window) are
            captured too (``graphs.CAPTURE_FLEX``: what was measured, and the switch to turn that off).
            Graphs are governed by what they buy and what they hold: a micro-batch of more tokens than
            ``cuda_graphs_max_tokens`` runs uncaptured (the step is bound by the GPU there); the graphs' memory pool
            is bounded (``graphs.POOL_FRACTION`` of the device, and the room the memory plan leaves, the optimizer
            state still to come counted: past either, the graphs are released and longer shapes stay uncaptured);
            an out-of-memory error in a warm-up or capture releases them and runs the step
            uncaptured, with one warning; training's end releases them all (before litgpt validates, saves or merges).
            Not ``False`` also replays generation's one-token KV-cache steps (litgpt's ``generate``, no grad, eval
            mode) from CUDA graphs, one per key length of each KV cache (``lit_liger.runtime.decode``).
        cuda_graphs_max_tokens: the most tokens (B x T) of a micro-batch that ``cuda_graphs`` captures. ``None``
            (default): ``graphs.CAPTURE_MAX_WORK`` divided by the parameters of one transformer Block (a step's GPU
            time grows with tokens x parameters, its host time does not), measured on an H100 where capture stops
            paying (``graphs.auto_max_tokens``).
        sdpa_backend: the SDPA kernel of the plain causal attention layers, on CUDA tensors in eager mode (CUDA
            graphs included; under ``torch.compile`` inductor chooses). ``"auto"`` (default), chosen by measurement on an
            H100 (``attention.sdpa_backend_for``): for uncaptured steps flash attention on NVIDIA sm80+ (PyTorch
            2.11 picks cuDNN attention there, which builds a plan per new (batch, length) shape, 110-220 ms of
            host time each; flash needs none: 1.05x cuDNN's tokens/s on litgpt's LoRA recipe without graphs);
            for steps captured as CUDA graphs PyTorch's choice (cuDNN on an H100: its plans are built once per
            bucket, and its replays were 1.07x flash's tokens/s); PyTorch's choice on other devices. ``"flash"``, ``"cudnn"``, ``"efficient"``, ``"math"``: that backend
            first (cuDNN left off except for ``"cudnn"``; a call the kernel cannot take falls back to the next);
            ``"torch"``: PyTorch's flags untouched.
        caller_thread_backward: ``True``: the training thread runs autograd's backward itself
            (``torch.autograd.set_multithreading_enabled(False)``, a per-thread setting) instead of handing it to
            PyTorch's CUDA device thread, for a ``lit-liger`` training command's run and, with ``LigerCallback``,
            from the start of fitting to its end. Same results: only the thread that runs the backward changes.
            Off by default, by measurement on an H100 (Llama-3.2-1B, ``benchmarks/results/h100-2026-11-24b/``):
            in one process at a fixed 4 x 512 LoRA step it cut the host time per uncaptured step from 59.6 to
            46.4 ms (stock litgpt's from 75.8 to 66.1; lit-liger's backward steps are Python autograd functions,
            and on the device thread each takes the GIL from the waiting training thread), but in litgpt's own
            scripts on Alpaca-shaped data it was slower: LoRA without graphs 12,400 vs 15,543 tokens/s, full
            fine-tuning 13,822 vs 14,691, LoRA with graphs 46,529 vs 44,197 (the cause in litgpt's loop is not
            understood). With ``apply_liger`` alone, ``torch.autograd.set_multithreading_enabled(False)`` in the
            training thread does the same.
        activation_checkpointing: ``None`` (default, automatic): planned per training micro-batch from its token count,
            the model's widths and the device's memory at that moment (``lit_liger.runtime.memplan``): every Block's
            activations kept where they fit (within ``memplan.MEMORY_FRACTION``, 75%, of the device); else the mix
            that fits with the fewest added FLOPs of Blocks recomputed as below and Blocks whose GLU MLP keeps
            neither ``(B, T, I)`` input (recomputed in backward: ``glu_mlp`` for a frozen MLP, ``recompute_mlp``'s
            function for a trained one); else every Block recomputed and their inputs kept in pinned host memory
            (copied on a side stream). The log says each plan that recomputes more than any before it. One CUDA
            process, a lit-liger replica or DDP (no offload there); off under sharding strategies.
            ``True``: in training (fused loss on), keep only each transformer Block's input for the
            backward and recompute the Block's forward there (``torch.utils.checkpoint``, non-reentrant, with the
            RNG state restored so that LoRA dropout draws the same masks). Saved activations drop from all of every
            Block's to one ``(B, T, C)`` tensor per Block plus one Block's at a time, for one more forward of the
            Blocks (about a third more compute when every weight trains, about half more with frozen ones as in
            LoRA, whose backward has no weight-gradient GEMMs). In such a Block a frozen MLP (LoRA on attention only) runs
            over chunks of rows and recomputes ``fc_1``/``fc_2`` per chunk in its own backward (``glu_mlp``), so that
            no ``(B, T, I)`` tensor outlives one chunk. ``False``: never. One process or a lit-liger replica: a
            sharding run (FSDP/DeepSpeed) warns once where it is ``True`` and leaves it to the strategy (litgpt's FSDP recipes
            already checkpoint each Block through ``activation_checkpointing_policy``). CUDA graphs capture such steps
            on torch >= 2.10 (which can rewind the CUDA generator inside a capture); on older torch they run
            uncaptured, with one warning. The fused loss's logits chunk is capped at the size of the Blocks' kept
            inputs, so that it does not set the step's peak. Measured on an H100 in docs/performance.md.
        recompute_mlp: in the Blocks of ``recompute_norm`` whose GLU MLP reads ``norm_2`` through plain Linears
            (``fc_1``, ``fc_2``, ``proj``; trainable or not), keep neither ``fc_1``'s nor ``fc_2``'s ``(B, T, I)``
            output for the backward: it recomputes them from the kept residual sum, over 4 chunks of rows (two more
            GEMMs per layer, about a sixth more compute for a Llama-shaped layer whose weights all train; the weight
            gradients sum the chunks in the weights' dtype, one rounding per chunk). With the Triton kernels, in
            eager mode and under ``torch.compile`` (an opaque custom op there, so the compiler keeps neither output
            either; micro-batches below ``compile_min_tokens`` run LitGPT's MLP there), outside
            ``activation_checkpointing``'s Blocks (which recompute everything). Off by default. Measured on an H100
            (B4 T2048, docs/performance.md): 11-12% more step time for 21-25% less peak memory (Llama-3.2-1B, gemma-2-2b);
            at Mistral-7B's shape with 2 layers, peak 0.742x stock torch.compile's at 1.037-1.039x its speed (two
            runs), against 0.84x and 1.19x with the default; under compile 0.759x.
        tied_weights: where the output head's weight and the token embedding are both frozen (LoRA, adapters) and
            equal bit for bit, keep one copy (``lm_head.weight`` shares ``transformer.wte.weight``'s storage; the
            same parameters, values and ``state_dict`` keys). LitGPT's conversion of a Hugging Face checkpoint with
            tied embeddings (Llama-3.2-1B/3B, Qwen2.5 up to 3B, Gemma ...) writes the embedding into the head as
            well, so such a run held two equal ``(V, C)`` matrices: 501 MiB of Llama-3.2-1B's 2,928 MiB of bf16
            weights. Checked at the swapped model's forward (eager mode; the comparison runs once per state of the
            two weights), undone when either starts to train and before a ``load_state_dict``
            (``lit_liger.swap.tied``); a LoRA head's frozen base shares too (its ``merge`` gives it its own copy first:
            1,125 MiB of gemma-2-2b's recipe with ``lora_head: true``). One process (or lit-liger's replica plan),
            unsharded weights, a plain (not quantized) base Linear.
        fused_optimizer: the ``lit-liger`` command and ``LigerCallback`` switch a ``torch.optim.Adam`` / ``AdamW``
            built with ``fused`` and ``foreach`` unset (litgpt's recipes build theirs so) to PyTorch's fused kernel
            (``lit_liger.runtime.optim.fuse_optimizer``): the same algorithm, class, hyperparameters and ``state_dict`` keys, in one
            pass over each parameter, its gradient and moments per step, computed in fp32, instead of the ``foreach``
            default's dozen passes, each rounded to the parameters' dtype. CUDA parameters, plain or DTensor
            (FSDP2: each rank steps its shards); an optimizer the user configured (``fused``/``foreach`` set,
            ``differentiable``, FSDP1's flat parameters) is left as it is, and the log says why. The step count then
            lives on the device (PyTorch's fused optimizers keep it there; a checkpoint's CPU count is moved), and
            ``state_dict()`` hands it out on the host, as the default implementation keeps it, so checkpoints are
            stock's. ``apply_liger`` alone does not touch optimizers.
        defer_loss_sync: the ``lit-liger`` command, one process: litgpt's loop reads the loss and token counts it logs
            one iteration later (``lit_liger.runtime.lazylog``), so that no iteration waits for the GPU (at
            ``--train.log_interval 1`` litgpt's loop waited three times per iteration: its running loss's NaN check,
            ``.item()``, and the CSV logger's reading of the token counts) and the host prepares the next iteration
            while the GPU runs this one. The values printed and logged are the same; each line appears when the next
            iteration logs, and ``iter_time`` is then the loop's period, not one iteration's latency. Under the
            Trainer in several processes (``LigerCallback``): Lightning's per-batch broadcast of rank 0's "SIGTERM
            received" flag, which it reads with ``.item()``, is read two batches later, and no GPU waits for it (a
            SIGTERM stops every rank two batches later, as Lightning stops it).
    """

    rms_norm: bool = True
    layer_norm: bool = True
    rope: bool = True
    flex_attention: bool = True
    softcap_attention: bool = True
    lora: bool = True
    swiglu: bool = True
    geglu: bool = True
    gelu: bool = True
    fused_residual: bool = True
    recompute_norm: bool = True
    fused_linear_cross_entropy: bool = True
    embedding: bool = True
    quantized_linear: bool = True
    flce_mode: Literal["fast", "lean"] = "fast"
    compile_min_tokens: NonNegativeInt | None = None
    seq_buckets: bool = True
    packing: bool = True
    data_parallel: Literal["auto", "replicate", "zero1", "shard", "litgpt"] = "auto"
    balance_ranks: bool = True
    replicate_frozen_base: bool = False
    fp8: Literal["off", "tensorwise", "rowwise", "rowwise_with_gw_hp"] = "off"
    fp8_all_gather: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graphs_max_tokens: NonNegativeInt | None = None
    sdpa_backend: Literal["auto", "flash", "cudnn", "efficient", "math", "torch"] = "auto"
    caller_thread_backward: bool = False
    activation_checkpointing: bool | None = None
    recompute_mlp: bool = False
    tied_weights: bool = True
    fused_optimizer: bool = True
    defer_loss_sync: bool = True

    @classmethod
    def choices(cls) -> dict[str, tuple]:
        """The settings with a fixed set of values (their ``Literal`` types): name -> allowed values."""
        hints = typing.get_type_hints(cls)
        return {name: typing.get_args(tp) for name, tp in hints.items() if typing.get_origin(tp) is typing.Literal}

    def __post_init__(self) -> None:
        choices = self.choices()
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in choices:
                if v not in choices[f.name]:
                    allowed = ", ".join(map(repr, choices[f.name]))
                    raise ValueError(f"LigerConfig.{f.name} must be one of {allowed}, got {v!r}")
            elif f.name in ("compile_min_tokens", "cuda_graphs_max_tokens"):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise ValueError(
                        f"LigerConfig.{f.name} must be an integer >= 0 or None (automatic), got {v!r}")
                if v is not None:
                    setattr(self, f.name, int(v))  # a plain int (the parser passes its NonNegativeInt)
            elif f.name in ("cuda_graphs", "fp8_all_gather", "activation_checkpointing") and v is None:
                continue  # automatic
            elif not isinstance(v, bool):  # the switches and the boolean settings
                raise TypeError(f"LigerConfig.{f.name} must be true or false, got {v!r} ({type(v).__name__})")

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """The on/off fields (one per kernel or fusion); the others are settings."""
        return tuple(f.name for f in fields(cls) if f.name not in _SETTINGS)

    @classmethod
    def off(cls) -> "LigerConfig":
        return cls(**{name: False for name in cls.switches()})

    @classmethod
    def from_value(cls, value: Any) -> "LigerConfig":
        """Accepts a LigerConfig, None (defaults), a bool (all on/off) or a mapping of switches."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            return cls() if value else cls.off()
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown lit-liger switch(es) {sorted(unknown)}; known: {sorted(known)}")
            return cls(**value)
        raise TypeError(f"cannot make a LigerConfig from {value!r}")

    @property
    def enabled(self) -> bool:
        return any(getattr(self, name) for name in self.switches())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def backward_thread(self) -> Any:
        """A context manager for the training thread: with lit-liger on and ``caller_thread_backward`` set,
        autograd's backward runs on this thread (``torch.autograd.set_multithreading_enabled(False)``, restored
        on exit); else a no-op."""
        import contextlib

        import torch

        if self.enabled and self.caller_thread_backward:
            return torch.autograd.set_multithreading_enabled(False)
        return contextlib.nullcontext()
