"""lit_liger.parallel.dataparallel: the plan chosen for ``lit-liger <recipe> --devices N`` from the recipe's arguments, and the
replica's gradient segments (CPU; the strategy itself on 2 processes: tests/test_distributed.py, test_cli.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_liger import _dist
from lit_liger.parallel import dataparallel as dp

GiB = 2**30


def _estimate(module_name: str, model: str, device_gib: float, mb: int = 4, seq: int = 512, **lora):
    import importlib

    module = importlib.import_module(module_name)
    cfg = module.Config.from_name(model, **lora)
    n, trained, head = dp._count(module, module.GPT, cfg)
    return dp.estimate(cfg, n, trained, 2, mb, seq, device_gib * GiB, head), n, trained


LORA = {"lora_r": 8, "lora_alpha": 16, "lora_query": True, "lora_value": True}


def test_estimate_counts_what_trains():
    """LoRA: a few million trained parameters, no optimizer state to speak of; full fine-tuning: every parameter
    trains, gradients and Adam's two moments in bf16; activations grow with the micro-batch's tokens."""
    est, n, trained = _estimate("litgpt.finetune.lora", "Llama-3.2-1B", 80, **LORA)
    assert 1.2e9 < n < 1.6e9 and 0 < trained < 5e6
    assert est.weights == 2 * n and est.grads == 2 * trained and est.optimizer == 4 * trained
    full, n_full, t_full = _estimate("litgpt.finetune.full", "Llama-3.2-1B", 80)
    assert t_full == n_full == n - trained and full.grads == full.weights and full.optimizer == 2 * full.weights
    longer, _, _ = _estimate("litgpt.finetune.full", "Llama-3.2-1B", 80, seq=1024)
    assert longer.activations > 1.5 * (full.activations - 128256 * 2048 * 4)  # (the lm_head buffer stays)


def test_a_lora_head_is_not_a_trained_head_weight():
    """``lora_head``: the (V, C) weight stays frozen (its LoRA update trains), so no (V, C) fp32 gradient is estimated;
    full fine-tuning trains the head's weight."""
    module = __import__("litgpt.finetune.lora", fromlist=["GPT"])
    cfg = module.Config.from_name("Llama-3.2-1B", **LORA, lora_head=True)
    assert dp._count(module, module.GPT, cfg)[2] is False
    full = __import__("litgpt.finetune.full", fromlist=["GPT"])
    assert dp._count(full, full.GPT, full.Config.from_name("Llama-3.2-1B"))[2] is True


@pytest.mark.parametrize(("module", "model", "lora", "device", "plan"), [
    ("litgpt.finetune.lora", "Llama-3.2-1B", True, 80, "replicate"),
    ("litgpt.finetune.full", "Llama-3.2-1B", False, 80, "replicate"),
    ("litgpt.finetune.lora", "Llama-3.1-8B", True, 80, "replicate"),
    ("litgpt.finetune.full", "Llama-3.1-8B", False, 80, "zero1"),  # (the replica fits with half of Adam's state)
    ("litgpt.finetune.full", "Llama-3.1-8B", False, 141, "replicate"),  # an H200 holds the whole state
    ("litgpt.finetune.full", "Llama-3.1-70B", False, 80, "litgpt"),
])
def test_decide(module, model, lora, device, plan):
    est, _, _ = _estimate(module, model, device, **(LORA if lora else {}))
    chosen = dp.decide(est, 2, can_shard=module.endswith("full"))
    assert chosen.name == plan, chosen
    if plan == "replicate":
        assert "fits one device" in chosen.why and est.replicated() <= dp.MEMORY_FRACTION * device * GiB
    elif plan == "zero1":
        assert est.replicated() > est.budget >= est.zero1(2) and "optimizer state sharded" in chosen.why
    else:
        assert "no lighter plan fits" in chosen.why


def test_decide_names_zero2_where_only_it_fits():
    """The 8B full fine-tune on 80 GB at 4 x 2048 tokens per micro-batch: no replica fits, ZeRO-2 with recomputed
    Blocks would (the estimate counts whole gradients while micro-batches accumulate: FSDP1 under no_backward_sync);
    ``auto`` keeps litgpt's strategy there and names ``--liger.data_parallel shard`` (not measured on GPUs at that
    size). With room for the activations, the replica with its optimizer state sharded comes first."""
    est, _, _ = _estimate("litgpt.finetune.full", "Llama-3.1-8B", 80, seq=2048)
    plan = dp.decide(est, 2, can_shard=True)
    assert plan.name == "litgpt" and "ZeRO-2 with recomputed Blocks would fit" in plan.why
    assert "--liger.data_parallel shard" in plan.why
    assert est.zero2(2, False) - est.zero2(2, False, accumulating=False) == pytest.approx(est.grads / 2)
    assert est.zero1(2) > est.budget
    # where the weights gathered beside their shard fit, the replica with its optimizer state sharded (zero1) fits too
    # (it holds the weights once): it comes first
    roomy = dp.Estimate(**{**vars(est), "device": (est.zero2(2, False) + 1) / dp.MEMORY_FRACTION})
    assert roomy.replicated() > roomy.budget and roomy.zero1(2) < roomy.zero2(2, False)
    assert dp.decide(roomy, 2, can_shard=True).name == "zero1"
    tight = dp.Estimate(**{**vars(est), "device": (est.zero2(2, True) + 1) / dp.MEMORY_FRACTION})
    assert dp.decide(tight, 2, can_shard=False).name == "litgpt"  # (LoRA's FSDP2 recipe: no ZeRO-2 plan here)


def test_optimizer_owners_balance_the_large_parameters():
    """zero1: each parameter of at least ``min_numel`` elements to one rank, largest first to the least-loaded; the
    small ones to nobody (every rank steps them); the same answer for the same parameters."""
    params = [torch.empty(n) for n in (1000, 10, 600, 500, 400, 64, 3)]
    owners = dp.optimizer_owners(params, 2, min_numel=64)
    assert [owners.get(id(p)) for p in params] == [0, None, 1, 1, 0, 1, None]
    load = [sum(p.numel() for p in params if owners.get(id(p)) == r) for r in range(2)]
    assert load == [1400, 1164]
    assert dp.optimizer_owners(params, 2, min_numel=64) == owners
    assert set(dp.optimizer_owners(params, 3, min_numel=1).values()) == {0, 1, 2}


def test_zero1_steps_in_chunks_of_about_equal_elements():
    """zero1's step runs in chunks (each chunk's broadcast beside the next chunk's step): the parameters in order, every
    one in exactly one chunk, cut at about equal elements."""
    params = [torch.empty(n) for n in (10,) * 8]
    assert [[p.numel() for p in c] for c in dp._chunks(params, 4)] == [[10, 10]] * 4
    mixed = [torch.empty(n) for n in (10, 10, 10, 10, 1, 100, 5)]
    chunks = dp._chunks(mixed, 4)
    assert [p for c in chunks for p in c] == mixed and len(chunks) <= 4
    assert dp._chunks(mixed, 1) == [mixed]


def test_step_chunks_follow_the_all_reduces_in_the_order_issued():
    """The replica's step chunks: the pending all-reduces in the order issued, cut at about equal elements, each chunk
    with the optimizer's parameters its work reduced; the parameters no work covers step in the first chunk, and work
    for a parameter the optimizer does not hold is still waited for in its run."""
    a, b, c, d, e, f = (torch.nn.Parameter(torch.empty(n)) for n in (40, 40, 40, 30, 10, 5))
    outside = torch.nn.Parameter(torch.empty(50))  # (reduced, but in no param group)
    pending = [("w-c", None, None, [c]), ("w-a", None, None, [a]), ("flat", None, None, [e, outside, d]),
               ("w-b", None, None, [b])]
    chunks = dp._step_chunks([a, b, c, d, e, f], pending, 4)
    assert [w[0] for ws, _ in chunks for w in ws] == ["w-c", "w-a", "flat", "w-b"]  # every work once, in order
    assert [[id(p) for p in ps] for _, ps in chunks] == [[id(f), id(c)], [id(a)], [id(e), id(d)], [id(b)]]
    together = dp._step_chunks([a, b, c, d, e, f], pending, 2)
    assert [[w[0] for w in ws] for ws, _ in together] == [["w-c", "w-a"], ["flat", "w-b"]]
    assert sorted(id(p) for _, ps in together for p in ps) == sorted(map(id, (a, b, c, d, e, f)))
    assert [[p.numel() for p in c] for _, c in dp._step_chunks([a, b], [], 2)] == [[40], [40]]


def _args(tmp_path: Path, **over) -> dict:
    from litgpt.args import TrainArgs

    args = {"checkpoint_dir": tmp_path, "devices": 2, "num_nodes": 1, "precision": "bf16-true",
            "train": TrainArgs(micro_batch_size=4, max_seq_length=512), "quantize": None}
    args.update(over)
    return args


def test_choose_from_recipe_arguments(tmp_path):
    """The plan from what ``lit-liger finetune_* --devices N`` binds: one device -> no plan; ``litgpt`` as asked; a
    quantized run keeps litgpt's (it stops there on several devices); a checkpoint that cannot be sized keeps
    litgpt's and says why; a real config is sized (its max_seq_length, or an assumed length, said)."""
    import yaml
    from litgpt import Config

    import litgpt.finetune.full as full
    import litgpt.finetune.lora as lora

    assert dp.choose(full, _args(tmp_path, devices=1), "auto") is None
    plan, n = dp.choose(full, _args(tmp_path), "litgpt")
    assert (plan.name, n) == ("litgpt", 2) and "as asked" in plan.why
    assert dp.choose(lora, _args(tmp_path, quantize="bnb.nf4"), "auto")[0].name == "litgpt"
    missing, _ = dp.choose(full, _args(tmp_path), "auto")
    assert missing.name == "litgpt" and "could not be sized" in missing.why
    from dataclasses import asdict

    (tmp_path / "model_config.yaml").write_text(yaml.safe_dump(asdict(Config.from_name("pythia-14m"))))
    plan, _ = dp.choose(full, _args(tmp_path), "auto")
    assert plan.name == "replicate" and "micro-batch 4 x 512 tokens" in plan.why
    from litgpt.args import TrainArgs

    plan, _ = dp.choose(lora, _args(tmp_path, train=TrainArgs(micro_batch_size=2), lora_r=4), "auto")
    assert plan.name == "replicate" and f"{dp.ASSUMED_SEQ} assumed" in plan.why
    plan, _ = dp.choose(lora, _args(tmp_path), "shard")
    assert plan.name == "litgpt" and "FSDP2" in plan.why
    plan, _ = dp.choose(full, _args(tmp_path), "shard")
    assert plan.name == "shard" and not plan.checkpoint
    plan, _ = dp.choose(full, _args(tmp_path), "zero1")
    assert plan.name == "zero1" and "as asked" in plan.why


def test_plan_line_names_the_way_back():
    for name in ("replicate", "zero1"):
        line = dp.Plan(name, "why").line("finetune_full", 2)
        assert line.startswith("lit-liger: data parallel on 2 devices, finetune_full: the whole model on every device")
        assert line.endswith("--liger.data_parallel litgpt keeps litgpt's")
    assert "optimizer's state sharded" in dp.Plan("zero1", "why").line("finetune_full", 2)


def test_segments_follow_the_cuts():
    """With a callback registered on a GPT's state the Blocks split into _dist.SEGMENTS groups from the top; ln_f goes
    with the top group, the embedding with the lowest, the lm_head alone (reduced at the end); a tied lm_head (the
    embedding's Parameter) goes with the embedding, where its last gradient arrives. Another GPT without a callback
    stays one backward graph."""
    from litgpt import GPT, Config

    from lit_liger.swap.state import state_of

    def layers(n: int) -> SimpleNamespace:
        return SimpleNamespace(config=SimpleNamespace(n_layer=n))

    sixteen, two = layers(16), layers(2)
    assert _dist.segment_cuts(sixteen) == [] and _dist.segment_cuts(None) == []  # (no callback: one backward graph)
    for m in (sixteen, two):
        state_of(m).grads_ready.append(lambda gpt, seg: None)
    assert _dist.segment_cuts(sixteen) == [12, 8, 4] and _dist.segment_cuts(two) == [1]
    assert _dist.segment_cuts(layers(16)) == []  # (another model: its own callbacks, none)
    with torch.device("meta"):
        gpt = GPT(Config.from_name("pythia-14m", n_layer=6))  # (6 layers, 4 segments: cuts 4, 3, 1)
    state_of(gpt).grads_ready.append(lambda gpt, seg: None)
    assert _dist.segment_cuts(gpt) == [4, 3, 1]
    segments = dp.grad_segments(gpt)
    names = {id(p): n for n, p in gpt.named_parameters()}
    got = [{names[id(p)].split(".")[2] if names[id(p)].startswith("transformer.h.") else names[id(p)].split(".")[1]
            for p in seg} for seg in segments]
    assert got == [{"weight"}, {"4", "5", "ln_f"}, {"3"}, {"1", "2"}, {"0", "wte"}], got
    gpt.lm_head.weight = gpt.transformer.wte.weight  # tied
    segments = dp.grad_segments(gpt)
    assert not segments[0] and any(p is gpt.transformer.wte.weight for p in segments[-1])


def test_reduce_one_process_is_a_no_op(monkeypatch):
    """In a world of one nothing is reduced (and nothing is zeroed)."""
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    p = torch.nn.Parameter(torch.ones(3))
    assert dp.start_reduce([p]) == [] and p.grad is None
    assert dp.reduce_gradients([]) == 0


def test_strategy_names_are_litgpts():
    """The class names the plan replaces exist in this litgpt's recipes."""
    import importlib

    for module_name, class_name in dp.STRATEGY_NAMES.items():
        assert isinstance(getattr(importlib.import_module(module_name), class_name), type)


def test_replica_marks_only_the_models_it_sets_up():
    """``setup_module`` marks each swapped GPT inside the module it sets up as a replica (``ModelState.replica``) with
    the strategy's segment callback; a second swapped GPT in the process (a frozen reference) keeps its own state: no
    callback (its backward issues no collective), not a replica; ``teardown`` undoes the marks."""
    from lightning.fabric.accelerators import CPUAccelerator
    from lightning.fabric.plugins import Precision
    from lightning.fabric.plugins.environments import LightningEnvironment
    from litgpt import GPT, Config

    from lit_liger import apply_liger
    from lit_liger.swap.state import state_of

    config = Config.from_name("pythia-14m", n_layer=4)
    policy, reference = GPT(config), GPT(config)
    apply_liger(policy)
    apply_liger(reference)
    strategy = dp.replica_class()(accelerator=CPUAccelerator(), cluster_environment=LightningEnvironment(),
                                  precision=Precision())
    wrapper = torch.nn.ModuleDict({"model": policy, "head": torch.nn.Linear(2, 2)})  # (a GPT under a wrapper)
    assert strategy.setup_module(wrapper) is wrapper
    strategy.setup_module(wrapper)  # (twice: one callback)
    mine, other = state_of(policy), state_of(reference)
    assert mine.replica and mine.grads_ready == [strategy._ready] and _dist.whole_model(policy)
    assert not other.replica and other.grads_ready == [] and _dist.segment_cuts(reference) == []
    assert _dist.segment_cuts(policy) == [3, 2, 1]
    strategy.teardown()
    assert not mine.replica and mine.grads_ready == [] and _dist.segment_cuts(policy) == []


# ----------------------------------------------------------------------------------------------
# lit_liger.parallel.balance: the devices' micro-batches dealt by length (the CLI on 2 processes: test_cli.py)
# ----------------------------------------------------------------------------------------------
def test_deal_keeps_litgpts_order_first_then_longest_to_the_least_loaded():
    from lit_liger.parallel.balance import deal

    assert deal([30.0, 10.0], [0.0, 0.0], first=True) == [0, 1]
    assert deal([10.0, 30.0], [100.0, 50.0], first=True) == [0, 1]  # (a step's first round: litgpt's own)
    assert deal([30.0, 10.0], [100.0, 50.0], first=False) == [1, 0]  # the long one to the device behind
    assert deal([10.0, 30.0], [100.0, 50.0], first=False) == [0, 1]  # (litgpt's order is already that)
    assert deal([30.0, 10.0], [70.0, 70.0], first=False) == [0, 1]  # equal loads: each keeps its own
    assert deal([20.0, 20.0], [90.0, 10.0], first=False) == [0, 1]  # equal costs: each keeps its own
    # four devices: longest first to the least loaded
    assert deal([5.0, 40.0, 10.0, 20.0], [30.0, 0.0, 10.0, 20.0], first=False) == [0, 1, 3, 2]
    assert deal([40.0, 5.0, 20.0, 10.0], [30.0, 0.0, 10.0, 20.0], first=False) == [1, 0, 2, 3]


class _Texts(torch.utils.data.Dataset):
    """litgpt's SFTDataset, with a tokenizer of one token per 2 characters (the ratio SampleCost must find)."""

    def __init__(self, n: int = 64, cap: int = 80) -> None:
        from litgpt.prompts import Default

        g = torch.Generator().manual_seed(0)
        self.data = [{"instruction": "x" * 4, "output": "y" * int(k)} for k in torch.randint(2, 120, (n,), generator=g)]
        self.prompt_style, self.max_seq_length, self.transform = Default(), cap, None

    def __len__(self) -> int:
        return len(self.data)

    def length(self, i: int) -> int:
        e = self.data[i]
        chars = len(self.prompt_style.apply(prompt=e["instruction"], **e)) + len(e["output"])
        return min(self.max_seq_length, chars // 2)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.zeros(self.length(i), dtype=torch.long), "i": i}


def _collate(samples: list[dict]) -> dict:  # padded to the longest, as litgpt's SFT collate
    return {"input_ids": torch.zeros(len(samples), max(len(s["input_ids"]) for s in samples), dtype=torch.long),
            "ids": [s["i"] for s in samples]}


def test_sample_cost_estimates_positions_from_the_text():
    from lit_liger.parallel.balance import SampleCost

    data = _Texts()
    packed, padded = SampleCost(data, packed=True), SampleCost(data, packed=False)
    for i in range(len(data)):
        assert abs(packed.tokens(i) - data.length(i)) <= 1.0, i  # (the ratio measured: 2 characters a token)
    assert packed([0, 1, 2]) == pytest.approx(sum(packed.tokens(i) for i in (0, 1, 2)))
    assert padded([0, 1, 2]) == pytest.approx(3 * max(packed.tokens(i) for i in (0, 1, 2)))
    short = _Texts(cap=20)
    capped = SampleCost(short, packed=True)
    assert max(capped.tokens(i) for i in range(len(short))) == 20  # (capped at max_seq_length)
    assert SampleCost.usable(data) and not SampleCost.usable(list(range(3)))


def _fabric_loader(data, rank: int, world: int, batch_size: int = 2, workers: int = 0):
    from lightning.fabric.wrappers import _FabricDataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    return _FabricDataLoader(torch.utils.data.DataLoader(data, batch_size=batch_size, sampler=sampler,
                                                         collate_fn=_collate, num_workers=workers))


@pytest.mark.parametrize("world,accumulate,workers", [(2, 2, 0), (2, 4, 0), (3, 3, 0), (2, 2, 2)])
def test_balanced_loader_deals_each_round_of_the_same_micro_batches(world, accumulate, workers):
    """Each device's dealt loader (Fabric's wrapper, as litgpt's loop iterates it, two passes over the data; with
    worker processes too): round ``k`` hands out exactly the micro-batches that litgpt's loaders give at
    iteration ``k``, one to each device; each step's first round as litgpt's; every device computes the same deal; the
    busiest device's positions per step come out below litgpt's order, by the true lengths too; the second pass follows
    the samplers' next epoch (Fabric's ``set_epoch``) and goes on with the steps' count (a step may straddle it)."""
    from lit_liger.parallel.balance import balanced_loader

    data = _Texts()
    natural, dealt, reports = [], [], []
    for rank in range(world):
        ref = _fabric_loader(data, rank, world)
        natural.append([b["ids"] for _ in range(2) for b in ref])  # (Fabric sets epoch 0, then 1)
        loader = _fabric_loader(data, rank, world, workers=workers)  # (workers: the deal stays in this process)
        sampler, why = balanced_loader(loader, rank, world, accumulate, packed=False)  # (padded batches)
        assert sampler is not None and why == "" and len(loader) == len(ref)
        dealt.append([b["ids"] for _ in range(2) for b in loader])
        reports.append(sampler.report())
    rounds = len(natural[0])
    assert rounds == 2 * -(-(-(-len(data) // world)) // 2) and all(len(d) == rounds for d in dealt)
    assert natural[0][:rounds // 2] != natural[0][rounds // 2:]  # (the second epoch is shuffled anew)
    changed = 0
    for k in range(rounds):
        ours, theirs = sorted(d[k] for d in dealt), sorted(n[k] for n in natural)
        assert ours == theirs, k
        if k % accumulate == 0:
            assert [d[k] for d in dealt] == [n[k] for n in natural], k
        changed += [d[k] for d in dealt] != [n[k] for n in natural]
    assert changed > 0
    line = reports[0]
    assert line is not None and f"({changed:,} of {rounds:,} rounds changed)" in line
    ran = float(line.split("busiest device ran ")[1].split("%")[0])
    litgpt = float(line.split("against ")[1].split("%")[0])
    assert ran < litgpt, line
    shares = [float(r.split("this device: ")[1].split("%")[0]) for r in reports]
    assert abs(sum(shares) - 100) < 0.2, shares

    def busiest(order: list) -> float:  # the true positions (padded), summed over steps of the busiest device's
        out = 0.0
        for k0 in range(0, rounds - accumulate + 1, accumulate):
            out += max(sum(2 * max(data.length(i) for i in order[r][k]) for k in range(k0, k0 + accumulate))
                       for r in range(world))
        return out

    assert busiest(dealt) < busiest(natural)


def test_expected_lengths_of_the_dealt_rounds():
    """The lengths a replica run is expected to feed each process (``ModelState.expected_lengths``, from which its first
    step pre-captures): every process's micro-batches of the pass, by their samples' estimated tokens, each counted
    once per process count at its packed bucket (and its neighbour where the estimate's margin crosses into it); the
    counts come out near the true lengths' buckets."""
    from lit_liger.parallel.balance import balanced_loader
    from lit_liger.swap.buckets import packed_bucket_length
    from lit_liger.runtime.graphs import expected_lengths

    data, world = _Texts(n=200), 2
    sampler, _ = balanced_loader(_fabric_loader(data, 0, world, batch_size=4), 0, world, 2, packed=True)
    rounds = list(sampler.estimated_sizes(10**6))
    assert len(rounds) == len(sampler) and all(len(r) == world and len(b) == 4 for r in rounds[:-1] for b in r)
    assert rounds == list(sampler.estimated_sizes(10**6))  # (reading the pass changes nothing)
    assert list(sampler.estimated_sizes(3)) == rounds[:3]
    ids = [b for row in zip(*[_fabric_loader(data, r, world, batch_size=4) for r in range(world)]) for b in row]
    true = {}
    for b in ids:
        if len(b["ids"]) > 1:
            L = packed_bucket_length(sum(data.length(i) for i in b["ids"]))
            true[L] = true.get(L, 0) + 1 / world
    exact = expected_lengths(rounds, data.max_seq_length, margin=0.0)
    assert sum(exact.values()) == pytest.approx(sum(true.values()))  # (every packed micro-batch, once)
    # (the text's estimate is within a token of each sample's length: the exact buckets differ by at most a few
    # micro-batches near the edges, and the margin's counts take in the true ones)
    assert sum(abs(exact.get(L, 0) - n) for L, n in true.items()) <= 0.25 * sum(true.values())
    wide = expected_lengths(rounds, data.max_seq_length)
    assert all(wide.get(L, 0) >= n for L, n in true.items())
    doubled = expected_lengths(rounds, data.max_seq_length, scale=2.0)
    assert all(doubled[L] == pytest.approx(2 * wide[L]) for L in wide)


def test_the_command_expects_the_runs_lengths_over_its_iterations(monkeypatch):
    """``lit_liger.cli._expect_lengths``: the dealt pass's lengths, scaled to the run's iterations per process (litgpt's
    ``max_steps`` x accumulation, or its epochs; a pass read once at most ``EXPECT_ROUNDS`` rounds)."""
    from types import SimpleNamespace

    from lit_liger import cli

    from lit_liger.runtime import graphs
    from lit_liger.parallel.balance import balanced_loader

    data, world = _Texts(n=200), 2
    sampler, _ = balanced_loader(_fabric_loader(data, 1, world, batch_size=4), 1, world, 2, packed=True)
    per_epoch = len(sampler)
    total = sum(len(b) > 1 for r in sampler.estimated_sizes(per_epoch) for b in r) / world
    three = cli._expect_lengths(sampler, SimpleNamespace(epochs=3, max_steps=None), 2)
    assert sum(three.values()) >= 3 * total - 1e-9
    got = cli._expect_lengths(sampler, SimpleNamespace(epochs=5, max_steps=4), 2)  # (8 rounds of the pass)
    eight = graphs.expected_lengths(sampler.estimated_sizes(8), data.max_seq_length)
    assert got == eight
    monkeypatch.setattr(cli, "EXPECT_ROUNDS", 5)
    got = cli._expect_lengths(sampler, SimpleNamespace(epochs=1, max_steps=None), 2)
    five = graphs.expected_lengths(sampler.estimated_sizes(5), data.max_seq_length, scale=per_epoch / 5)
    assert got == pytest.approx(five)
    monkeypatch.setattr(cli, "EXPECT_ROUNDS", 0)
    assert cli._expect_lengths(sampler, SimpleNamespace(epochs=1, max_steps=None), 2) is None  # (nothing read)


def test_expected_lengths_counts_full_batches_packed_and_skips_single_samples():
    from lit_liger.runtime.graphs import expected_lengths

    full = [[100.0, 100.0, 100.0], [40.0, 30.0, 20.0]]  # (a full batch of max_seq_length 100, and a short one)
    counts = expected_lengths([full, [[97.0, 100.0, 99.0], [50.0]]], cap=100, margin=0.05)
    # (both full-looking batches, each counted 1/2 per process, at their packed length only: a batch without padding
    # runs packed too)
    assert None not in counts
    assert counts[128] == pytest.approx(0.5)  # (90 tokens: 85.5 .. 94.5 within the margin, one bucket)
    assert counts[320] == pytest.approx(1.0)  # (300 and 296 tokens; capped at 3 x 100)
    assert sum(counts.values()) == pytest.approx(1.5)  # (one sample: never packed)
    assert expected_lengths([[[300.0, 300.0]]], cap=-1, margin=0.0) == {640: 1.0}  # (no cap: never unpacked)
    straddle = expected_lengths([[[300.0, 340.0]]], cap=-1, margin=0.05)  # (608 .. 672: two buckets)
    assert straddle == {640: 1.0, 768: 1.0}


def test_balanced_loader_says_why_not():
    from lit_liger.parallel.balance import balanced_loader
    from lightning.fabric.wrappers import _FabricDataLoader

    data = _Texts()
    plain = _FabricDataLoader(torch.utils.data.DataLoader(data, batch_size=2, collate_fn=_collate))
    out, why = balanced_loader(plain, 0, 2, 2)
    assert out is None and "DistributedSampler" in why and isinstance(plain._dataloader, torch.utils.data.DataLoader)
    out, why = balanced_loader(_fabric_loader(data, 1, 2), 0, 2, 2)  # (another rank's sampler)
    assert out is None and "DistributedSampler" in why
    out, why = balanced_loader(_fabric_loader(list(range(8)), 0, 2), 0, 2, 2)
    assert out is None and "SFTDataset" in why
    out, why = balanced_loader(object(), 0, 2, 2)
    assert out is None and "Fabric" in why


def test_the_trainer_replicas_expect_their_lengths_from_lightnings_sampler(monkeypatch):
    """``LigerCallback`` under DDP (``callback._expect_lengths``): every rank's micro-batches rebuilt from the loader's
    ``DistributedSampler`` (its seed and epoch; not dealt) are each rank's own loader's; the expected lengths count them
    over the loop's micro-batches per rank (``max_steps`` x accumulation, or its epochs); nothing where the sampler is
    a wrapper of the user's, one process, or ``EXPECT_ROUNDS`` 0 (the callback keeps them on the models' states for
    the loop)."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from lit_liger import cli

    from lit_liger.runtime import graphs
    from lit_liger import callback as callback_mod
    from lit_liger.parallel.balance import ReplicaBatches, SampleCost

    data, world = _Texts(n=200), 2

    def loader(rank, epoch=1):
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(epoch)
        return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=_collate)

    batches = ReplicaBatches.of(loader(1), world)
    per_rank = [[b["ids"] for b in loader(r)] for r in range(world)]
    cost = SampleCost(data, packed=True)
    rounds = list(batches.estimated_sizes(10**6))
    assert len(rounds) == len(batches) == len(per_rank[0])
    assert rounds == [[[cost.tokens(i) for i in b] for b in row] for row in zip(*per_rank)]
    wrapped = loader(0)
    wrapped.sampler.__class__ = type("Wrapper", (DistributedSampler,), {})  # (Lightning's wrapper of a user's sampler)
    assert ReplicaBatches.of(wrapped, world) is None and ReplicaBatches.of(loader(0), 3) is None

    strategy = DDPStrategy.__new__(DDPStrategy)
    trainer = SimpleNamespace(world_size=world, strategy=strategy, max_steps=3, accumulate_grad_batches=4, max_epochs=-1)
    got = callback_mod._expect_lengths(trainer, loader(0))
    assert got == graphs.expected_lengths(rounds[:12], data.max_seq_length)
    trainer.max_steps, trainer.max_epochs = -1, 2  # (two passes: the first read, counted twice)
    got = callback_mod._expect_lengths(trainer, loader(0))
    assert got == pytest.approx(graphs.expected_lengths(rounds, data.max_seq_length, scale=2.0))
    monkeypatch.setattr(cli, "EXPECT_ROUNDS", 0)
    assert callback_mod._expect_lengths(trainer, loader(0)) is None
    monkeypatch.setattr(cli, "EXPECT_ROUNDS", 4096)
    assert callback_mod._expect_lengths(SimpleNamespace(**{**vars(trainer), "world_size": 1}), loader(0)) is None
