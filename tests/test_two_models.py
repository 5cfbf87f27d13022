"""Two swapped models in one process leave each other's numbers alone (issue 67, "Two models, tested").

A LoRA policy trained beside its frozen swapped reference (the reference's real logits read under ``no_grad`` every
step, before the policy's forward and again between its forward and backward, as a DPO or distillation loop does),
and two swapped models of different families trained in alternation: each model's losses and weights equal its own run
alone from the same seed and data, the reference's logits equal its logits alone and stock LitGPT's. Each model's run
state (``lit_liger.swap.state.state_of``: training tokens, CUDA-graph counters) counts that model's work only, and a
deep copy starts from a fresh state. The same on CUDA with ``LigerConfig(cuda_graphs=True)`` (``gpu``-marked).

CPU (tiny models: 2 layers, 64 wide, 160-224 tokens of vocabulary, 10-12 positions, 4 steps): the CPU tests run the
kernels' reference PyTorch math (``TRITON_INTERPRET=0``: what isolates two models is the integration, not the kernels'
arithmetic); the policy beside its reference runs once more with the Triton kernels in the interpreter (what conftest
sets without a GPU; one step, most of the file's time).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from helpers import TOL, rel_err
from litgpt import GPT
from litgpt.lora import GPT as LoRAGPT
from litgpt.lora import Config as LoRAConfig
from litgpt.lora import mark_only_lora_as_trainable
from test_adapter import _randomize, tiny_config

from lit_liger import LigerConfig, LigerLogits, apply_liger, chunked_cross_entropy

STEPS = 4
#: the models' (batch, length): different token counts per training forward, so that a counter adding up both
#: models' tokens cannot equal either model's own count
SHAPES = {"Llama-3.2-1B": (2, 12), "pythia-14m": (3, 10)}
#: pythia-14m (LayerNorm, GELU MLP, parallel residual, partial rotary) with its own vocabulary size
EXTRA = {"Llama-3.2-1B": {}, "pythia-14m": dict(padded_vocab_size=224, vocab_size=200)}
LORA = dict(lora_r=4, lora_alpha=8, lora_query=True, lora_value=True, lora_head=True, lora_dropout=0.1)
#: the dropout masks' seed, set once before each run's first step (a model that draws random numbers it should not
#: shifts the other's masks: its losses differ)
DROPOUT_SEED = 123


# ------------------------------------------------------------------------------------------------------ models, data
def _base(name: str, device: str) -> GPT:
    """A stock LitGPT GPT of the tiny ``name`` config with random weights (the same every call)."""
    cfg = tiny_config(name, **EXTRA[name])
    torch.manual_seed(0)
    gpt = GPT(cfg)
    _randomize(gpt)
    return gpt.to(device)


def _swapped(base: GPT, liger: LigerConfig) -> GPT:
    """A swapped copy of ``base``, fully trainable."""
    gpt = copy.deepcopy(base)
    apply_liger(gpt, liger)
    return gpt


def _policy(base: GPT, liger: LigerConfig, dropout: float = LORA["lora_dropout"]) -> LoRAGPT:
    """A swapped ``litgpt.lora.GPT`` on ``base``'s weights (LoRA on q, v and the head, non-zero B, ``dropout``); only
    the LoRA parameters train. The same every call."""
    lora = {**LORA, "lora_dropout": dropout}
    cfg = tiny_config(base.config.name, config_cls=LoRAConfig, **lora, **EXTRA[base.config.name])
    torch.manual_seed(1)
    policy = LoRAGPT(cfg)
    missing, unexpected = policy.load_state_dict(base.state_dict(), strict=False)  # (LitGPT maps the base's keys)
    assert not unexpected and missing and all("lora_" in k for k in missing)
    for n, p in policy.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)  # (LitGPT starts B at zero: the policy would equal its reference)
    mark_only_lora_as_trainable(policy)
    policy = policy.to(base.transformer.wte.weight.device)
    apply_liger(policy, liger)
    return policy


def _reference(base: GPT, liger: LigerConfig) -> GPT:
    """The policy's frozen reference as DPO keeps it: a swapped copy of ``base``, no parameter trained, eval mode."""
    ref = _swapped(base, liger)
    ref.requires_grad_(False)
    return ref.eval()


def _batches(gpt: torch.nn.Module, device: str, seed: int, steps: int = STEPS) -> list[tuple[torch.Tensor, ...]]:
    """``steps`` random (tokens, targets) batches of ``gpt``'s shape (``SHAPES``) and vocabulary; no token is 0 (the
    collate's padding) and a few targets are ignored."""
    B, T = SHAPES[gpt.config.name]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randint(1, gpt.config.vocab_size, (B, T), generator=g)
        y = torch.randint(0, gpt.config.vocab_size, (B, T), generator=g)
        y[0, :2] = -100
        out.append((x.to(device), y.to(device)))
    return out


class _Run:
    """One model's training: AdamW on its trainable parameters, lit-liger's loss on the model's output."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.train()
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        self.losses: list[torch.Tensor] = []

    def step(self, x: torch.Tensor, y: torch.Tensor, between=None) -> None:
        """One optimizer step on ``(x, y)``; ``between()`` runs after the forward, before the loss and backward."""
        out = self.model(x)
        assert isinstance(out, LigerLogits)  # (the fused loss's seam: a swapped model in training)
        if between is not None:
            between()
        loss = chunked_cross_entropy(out, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.detach())


def _trained(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _assert_same(got, want, device: str) -> None:
    """Equal: bit for bit on CPU; on CUDA within a tight fp32 tolerance (the same kernels on the same inputs)."""
    tol = dict(rtol=0.0, atol=0.0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


def _real_logits(ref: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = ref(x)
    assert type(logits) is torch.Tensor and not logits.requires_grad  # real logits, not the fused loss's input
    assert logits.shape == (*x.shape, ref.config.padded_vocab_size)
    return logits


# ------------------------------------------------------------------------------------------------------------ flows
def _policy_beside_reference(device: str, liger: LigerConfig, steps: int = STEPS):
    """Item 1: the policy trained alone, then again beside its frozen reference (whose real logits each step reads
    before the policy's forward and between its forward and backward). Asserts the losses, the trained weights, the
    reference's logits (against its own alone and stock LitGPT's) and that the reference stayed frozen. Returns
    ``(policy, reference, policy_alone, reference_alone)``."""
    base = _base("Llama-3.2-1B", device)
    stock = copy.deepcopy(base).eval()  # untouched LitGPT: the reference's logits
    data = _batches(base, device, seed=7, steps=steps)

    alone = _Run(_policy(base, liger))
    start = _trained(alone.model)
    torch.manual_seed(DROPOUT_SEED)
    for x, y in data:
        alone.step(x, y)
    ref_alone = _reference(base, liger)
    logits_alone = [_real_logits(ref_alone, x) for x, _ in data]

    run, ref = _Run(_policy(base, liger)), _reference(base, liger)
    torch.manual_seed(DROPOUT_SEED)
    for i, (x, y) in enumerate(data):
        first = _real_logits(ref, x)  # (as DPO reads the reference's log-probs before the policy's forward)
        inside = []
        run.step(x, y, between=lambda: inside.append(_real_logits(ref, x)))
        for logits in (first, inside[0]):
            _assert_same(logits, logits_alone[i], device)
        with torch.no_grad():
            want = stock(x)
        assert rel_err(first, want) <= TOL[torch.float32], (i, rel_err(first, want))

    _assert_same(torch.stack(run.losses), torch.stack(alone.losses), device)
    got, want = _trained(run.model), _trained(alone.model)
    assert got.keys() == want.keys() and any("lm_head" in n for n in got) and all("lora_" in n for n in got)
    for n in got:
        _assert_same(got[n], want[n], device)
    assert any(not torch.equal(want[n], start[n]) for n in want)  # (the steps trained something)
    # the policy's LoRA update shows in its logits: a test comparing the two models' logits would notice a mix-up
    with torch.no_grad():
        assert rel_err(run.model(data[0][0]), logits_alone[0]) > 100 * TOL[torch.float32]
    # the reference stayed frozen: no gradients, its weights the base's
    base_params = dict(base.named_parameters())
    for n, p in ref.named_parameters():
        assert p.grad is None and not p.requires_grad, n
        assert torch.equal(p, base_params[n]), n
    return run.model, ref, alone.model, ref_alone


def _two_models_in_alternation(device: str, liger: LigerConfig, on_step=None):
    """Item 2: a tiny Llama and a tiny pythia (LayerNorm, GELU, parallel residual, partial rotary, another
    vocabulary), each fully trained alone, then both trained in alternation (A step, B step, ...); each one's losses
    and weights equal its run alone. ``on_step(trained, runs)`` is called after each step of the alternation.
    Returns ``(together, alone)``: the models by name."""
    names = ("Llama-3.2-1B", "pythia-14m")
    bases = {name: _base(name, device) for name in names}
    data = {name: _batches(bases[name], device, seed=11 + i) for i, name in enumerate(names)}

    alone = {}
    for name in names:
        alone[name] = _Run(_swapped(bases[name], liger))
        for x, y in data[name]:
            alone[name].step(x, y)

    runs = {name: _Run(_swapped(bases[name], liger)) for name in names}
    for i in range(STEPS):
        for name in names:
            runs[name].step(*data[name][i])
            if on_step is not None:
                on_step(name, runs)

    for name in names:
        _assert_same(torch.stack(runs[name].losses), torch.stack(alone[name].losses), device)
        got, want = _trained(runs[name].model), _trained(alone[name].model)
        assert got.keys() == want.keys() and len(got) == len(list(bases[name].parameters()))
        for n in got:
            _assert_same(got[n], want[n], device)
        assert all(torch.isfinite(t) for t in runs[name].losses)
    # (different models: a mix-up of their outputs or state would not go unnoticed)
    assert not torch.allclose(torch.stack(runs[names[0]].losses), torch.stack(runs[names[1]].losses))
    return {n: r.model for n, r in runs.items()}, {n: r.model for n, r in alone.items()}


def _captures(gpt: torch.nn.Module) -> dict:
    from lit_liger.swap.state import state_of

    return dict(state_of(gpt).captures)


def _tokens(gpt: torch.nn.Module) -> int:
    B, T = SHAPES[gpt.config.name]
    return B * T


# ----------------------------------------------------------------------------------------------- 1, 2: CPU
@pytest.fixture
def reference_math(monkeypatch):
    """CPU tensors take the kernels' reference PyTorch math (fast), not Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("kernels", ["reference_math", "interpreter"])
def test_policy_beside_frozen_reference_trains_as_alone(kernels, monkeypatch):
    """A LoRA policy (q, v, head) trained beside its frozen swapped reference whose real logits each step reads under
    ``no_grad`` (before the policy's forward and between its forward and backward): the policy's losses and LoRA
    weights are those of the policy trained alone (bit for bit), the reference's logits every step are its logits
    alone (bit for bit) and stock LitGPT's (fp32 tolerance), and the reference stays frozen. ``interpreter``: the
    Triton kernels themselves, in the interpreter (conftest's setting without a GPU), one step."""
    if kernels == "interpreter":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton's interpreter runs the CPU tests where there is no GPU (conftest)")
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    _policy_beside_reference("cpu", LigerConfig(), steps=STEPS if kernels == "reference_math" else 1)


def test_two_different_models_in_alternation_train_as_alone(reference_math):
    """A tiny Llama and a tiny pythia, both swapped and fully trained, one step each in turn: each model's losses and
    weights are those of its run alone (bit for bit)."""
    _two_models_in_alternation("cpu", LigerConfig())


# ------------------------------------------------------------------------------------ 3: run state per model (CPU)
def test_token_counters_count_each_models_own_training_forwards(reference_math):
    """``state_of(m).tokens`` of a policy, its frozen reference (read under ``no_grad`` every step) and a model of
    another family trained in alternation with the policy: after each step only the stepping model's counters moved,
    by exactly its micro-batch's tokens; the reference's stay at zero; at the end each model's ``collated`` is its own
    ``STEPS x B x T``, not the sum of the models'."""
    from lit_liger.swap.state import state_of

    liger = LigerConfig()
    base, other_base = _base("Llama-3.2-1B", "cpu"), _base("pythia-14m", "cpu")
    policy, ref, other = _Run(_policy(base, liger)), _reference(base, liger), _Run(_swapped(other_base, liger))
    models = {"policy": policy.model, "reference": ref, "other": other.model}
    assert len({id(state_of(m)) for m in models.values()}) == 3  # (three states, one per model)
    zero = {"collated": 0, "processed": 0, "packed": 0}
    assert all(state_of(m).tokens == zero for m in models.values())
    data, other_data = _batches(base, "cpu", seed=7), _batches(other_base, "cpu", seed=8)
    for i in range(STEPS):
        for name, run, (x, y) in (("policy", policy, data[i]), ("other", other, other_data[i])):
            before = {n: state_of(m).counters() for n, m in models.items()}
            run.step(x, y, between=lambda: _real_logits(ref, x) if name == "policy" else None)
            for n, m in models.items():
                now = state_of(m).counters()
                if n == name:
                    n_tok = _tokens(m)
                    # (CPU: no buckets, no packing: the step ran the tokens it was given)
                    assert now["tokens"] == {"collated": before[n]["tokens"]["collated"] + n_tok,
                                             "processed": before[n]["tokens"]["processed"] + n_tok, "packed": 0}, n
                else:
                    assert now == before[n], (name, n)  # (another model's step leaves these alone)
    assert state_of(policy.model).tokens == {"collated": STEPS * 24, "processed": STEPS * 24, "packed": 0}
    assert state_of(other.model).tokens == {"collated": STEPS * 30, "processed": STEPS * 30, "packed": 0}
    assert state_of(ref).tokens == zero  # (its forwards without grad are no training)
    for m in models.values():  # (CPU: no CUDA graphs, no generation graphs)
        assert all(v == 0 for v in state_of(m).captures.values()) and all(v == 0 for v in state_of(m).decode.values())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_deepcopy_gets_fresh_state_and_trains_like_the_original(device, monkeypatch):
    """A deep copy of a swapped LoRA model taken after two steps (its optimizer's state loaded into the copy's) starts
    with a fresh ``state_of`` (its own object, every counter at zero, no warnings, no graph runner, the same
    runtime), is still swapped, and trains the next two steps to the original's losses and weights (bit for bit on
    CPU); each counts its own tokens. CUDA: ``cuda_graphs=True`` and no dropout (the copy's first step warms its
    capture up, which draws dropout masks the original's replays do not); the copy captures its own graphs (one, two
    replays) while the original's counters go on from theirs (one capture, four replays)."""
    from lit_liger.swap.adapter import is_swapped
    from lit_liger.swap.state import state_of

    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # (the kernels' reference math, see reference_math)
    liger = LigerConfig(cuda_graphs=True) if device == "cuda" else LigerConfig()
    base = _base("Llama-3.2-1B", device)
    data = _batches(base, device, seed=5)
    orig = _Run(_policy(base, liger, dropout=LORA["lora_dropout"] if device == "cpu" else 0.0))
    torch.manual_seed(DROPOUT_SEED)
    for x, y in data[:2]:
        orig.step(x, y)
    assert state_of(orig.model).tokens["collated"] == 2 * _tokens(orig.model)
    if device == "cuda":
        assert _captures(orig.model)["captures"] == 1 and _captures(orig.model)["replays"] == 2

    dup = _Run(copy.deepcopy(orig.model))
    dup.opt.load_state_dict(copy.deepcopy(orig.opt.state_dict()))  # (load_state_dict keeps the tensors it is given)
    st = state_of(dup.model)
    assert st is not state_of(orig.model) and is_swapped(dup.model)
    assert st.tokens == {"collated": 0, "processed": 0, "packed": 0}
    assert all(v == 0 for c in st.counters().values() for v in c.values()) and not st.warned
    assert st.runner is None and st.runtime is not None and st.runtime is state_of(orig.model).runtime
    assert state_of(orig.model).tokens["collated"] == 2 * _tokens(orig.model)  # (the copy took nothing away)

    rng = torch.get_rng_state()
    for x, y in data[2:]:
        orig.step(x, y)
    torch.set_rng_state(rng)  # (the same dropout masks)
    for x, y in data[2:]:
        dup.step(x, y)
    _assert_same(torch.stack(dup.losses), torch.stack(orig.losses[2:]), device)
    got, want = _trained(dup.model), _trained(orig.model)
    assert got.keys() == want.keys() and got
    for n in got:
        _assert_same(got[n], want[n], device)
    assert state_of(orig.model).tokens["collated"] == 4 * _tokens(orig.model)
    assert state_of(dup.model).tokens["collated"] == 2 * _tokens(dup.model)
    if device == "cuda":
        assert state_of(dup.model).runner is not state_of(orig.model).runner
        c, c_dup = _captures(orig.model), _captures(dup.model)
        assert c["captures"] == 1 and c["replays"] == 4, c
        assert c_dup["captures"] == 1 and c_dup["replays"] == 2, c_dup


# ------------------------------------------------------------------------------------- 4: CUDA, CUDA graphs on
@pytest.mark.gpu
def test_gpu_policy_beside_frozen_reference_with_graphs():
    """Item 1 on CUDA with ``cuda_graphs=True`` (the policy's first micro-batch captured: conftest turns
    ``graphs.EAGER_FIRST`` off): the same losses, weights and reference logits as alone. Each policy (beside the
    reference, and alone) counts its own capture (one shape: one) and replays (one per step) on its own state; the
    reference (frozen, read without grad) captures and replays nothing; the training tokens are each policy's own."""
    from lit_liger.swap.state import state_of

    policy, ref, policy_alone, ref_alone = _policy_beside_reference("cuda", LigerConfig(cuda_graphs=True))
    for m in (policy, policy_alone):
        c = _captures(m)
        assert c["captures"] == 1 and c["replays"] == STEPS, c
        assert state_of(m).tokens["collated"] == STEPS * _tokens(m)
    for m in (ref, ref_alone):
        c = _captures(m)
        assert c["captures"] == 0 and c["replays"] == 0, c
        assert state_of(m).tokens["collated"] == 0


@pytest.mark.gpu
def test_gpu_two_models_in_alternation_with_graphs():
    """Item 2 on CUDA with ``cuda_graphs=True``, both models fully trained and captured: each model's losses and
    weights equal its run alone; each step moves the stepping model's capture counters and tokens only (the other
    model's stay what they were); at the end each model counts one capture, ``STEPS`` replays and its own tokens."""
    from lit_liger.swap.state import state_of

    seen: dict[str, dict] = {}

    def on_step(name, runs):
        for n, run in runs.items():
            now = state_of(run.model).counters()
            if n != name and n in seen:
                assert now == seen[n], (name, n)  # (the other model's counters stayed what they were)
            seen[n] = now

    together, alone = _two_models_in_alternation("cuda", LigerConfig(cuda_graphs=True), on_step)
    for m in (*together.values(), *alone.values()):
        c = _captures(m)
        assert c["captures"] == 1 and c["replays"] == STEPS, (m.config.name, c)
        assert state_of(m).tokens["collated"] == STEPS * _tokens(m)
