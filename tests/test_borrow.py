"""``lit_liger.graphs.BORROW_LONGER``: a packed length met too rarely for a capture to repay runs through a longer
captured length, its pad segment widened (``lit_liger.packing.widened``). CPU: the decision, the widened layout's
numbers, the choice of the graphs and what the report and the command say; GPU: a borrowed replay against the
uncaptured model."""

import copy
import types

import pytest
import torch
from helpers import rel_err
from test_adapter import tiny_config
from test_packing import LENGTHS, _batch, _lora_step_loss, pack_on_cpu  # noqa: F401 - (a fixture)

from lit_liger import LigerConfig, apply_liger, graphs, packing


@pytest.fixture
def run_length():
    """``graphs.set_run_length`` for the test; unset after it."""
    yield graphs.set_run_length
    graphs.set_run_length(None)


def test_borrow_pays_weighs_the_expected_padding_against_one_capture():
    # 2 ms of padding a micro-batch against a 70 ms capture: a length met once in 50, 150 micro-batches to go, is
    # expected 3 more times: (1 + 3) x 2 = 8 ms < 70, borrowed; met 20 times in 50 (60 more): 122 ms > 70, captured
    assert graphs.borrow_pays(0.002, 0.070, seen=1, met=50, remaining=150)
    assert not graphs.borrow_pays(0.002, 0.070, seen=20, met=50, remaining=150)
    # the same length over a run 100 times as long: captured
    assert not graphs.borrow_pays(0.002, 0.070, seen=1, met=50, remaining=15_000)
    # the run's last micro-batch: borrowed unless its own padding costs more than a capture
    assert graphs.borrow_pays(0.002, 0.070, seen=1, met=1, remaining=0)
    assert not graphs.borrow_pays(0.080, 0.070, seen=1, met=1, remaining=0)
    assert graphs.borrow_pays(0.002, 0.070, seen=1, met=0, remaining=-5)  # (counts out of step: no division by 0)


def test_set_run_length_takes_finite_positive_lengths_only(run_length):
    run = graphs.RUN["run"]
    run_length(200.0)
    assert graphs.RUN["micro_batches"] == 200 and graphs.RUN["run"] == run + 1
    for unknown in (None, float("inf"), 0, -3):
        run_length(unknown)
        assert graphs.RUN["micro_batches"] is None
    assert graphs.RUN["run"] == run + 5  # (each call a new loop: its counts start again)


def test_widened_plan_computes_the_same_real_rows(pack_on_cpu):
    """The widened layout (the pad segment longer, to a captured length) gives every real position the hidden states,
    the loss and the gradients of the plan's own length."""
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    torch.manual_seed(0)
    from litgpt import GPT

    model = GPT(cfg)
    apply_liger(model, LigerConfig(packing=True))
    x, y = _batch(cfg)
    plan = packing.plan(x, None, model.cos.size(0))
    n = plan.idx.shape[-1]
    assert n == sum(LENGTHS) == plan.real
    wide = packing.widened(plan, n + 19)
    assert wide.idx.shape == (1, n + 19) and torch.equal(wide.idx[:, :n], plan.idx) and not wide.idx[:, n:].any()
    assert torch.equal(wide.positions[:n], plan.positions) and wide.pack.max_len == n + 19
    assert wide.pack.cu_seqlens.tolist() == [*plan.pack.cu_seqlens.tolist()[:-1], n + 19]
    assert wide.pack.bounds == (*plan.pack.bounds[:-1], n + 19) and wide.rows is plan.rows
    assert plan.pack.cu_seqlens[-1] == n  # (the plan itself is left as it was)
    assert packing.widened(plan, n) is plan
    with pytest.raises(ValueError, match="cannot lay 44 packed positions out at 40"):
        packing.widened(plan, 40)
    grads = []
    for p in (plan, wide):
        model.zero_grad(set_to_none=True)
        h = model._liger_hidden(p.idx, p)[:, :n]
        h.float().square().mean().backward()
        grads.append((h.detach(), {k: v.grad.clone() for k, v in model.named_parameters() if v.grad is not None}))
    (h0, g0), (h1, g1) = grads
    assert rel_err(h1, h0) <= 1e-5 and g0.keys() == g1.keys() and g0
    for k in g0:
        assert rel_err(g1[k], g0[k]) <= 1e-4, k


def _runner_with_graphs(monkeypatch, lengths, per_token=1e-6, capture_s=0.07):
    """A runner whose captured graphs (stand-ins) are packed lengths ``lengths`` of 3 samples, its captures'
    cost and replays' time per token as given; the replay returns zeros of the replayed length, recorded."""
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    from litgpt import GPT

    gpt = GPT(cfg)
    runner = graphs.GraphRunner(gpt)
    runner.keep = gpt  # (the runner holds its model weakly)
    for n in lengths:
        runner.graphs[((1, n), torch.int64, True, 5, (0, 0))] = types.SimpleNamespace(n=n, params=[])
    runner._capture_s, runner._timed = [capture_s], [per_token * 1e3 * 100, 100]
    replayed = []

    def replay(g, idx, plan, *params):
        replayed.append((g.n, tuple(idx.shape), plan.pack.cu_seqlens[-1].item()))
        return torch.zeros(1, g.n, 8)

    monkeypatch.setattr(graphs._Replay, "apply", replay)
    return runner, replayed


def _plan(n):
    bounds = (0, 10, 20, n - 3, n)
    return packing.Plan(torch.ones(1, n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                        packing.Pack(torch.tensor(bounds, dtype=torch.int32), n, bounds), torch.zeros(3, 4), n - 3)


def test_runner_borrows_the_shortest_longer_length_with_the_same_key(monkeypatch, run_length):
    runner, replayed = _runner_with_graphs(monkeypatch, [64, 96, 128])
    key = ((1, 80), torch.int64, True, 5, (0, 0))
    run_length(1000)
    before = dict(graphs.CAPTURE_STATS)
    for _ in range(40):  # (a length met 1 in 40, 960 to go: 24 more x 16 padded tokens x 1 us each: 0.4 ms < 70 ms)
        runner._meet(((1, 64), torch.int64, True, 5, (0, 0)))
    runner._meet(key)
    out = runner._borrow(key, torch.ones(1, 80, dtype=torch.long), _plan(80))
    assert out.shape == (1, 80, 8) and replayed == [(96, (1, 96), 96)]
    assert graphs.CAPTURE_STATS["borrowed"] - before["borrowed"] == 1
    assert graphs.CAPTURE_STATS["borrowed_lengths"] - before["borrowed_lengths"] == 1
    # another key field (an evaluation step, other sample counts, another memory plan): nothing to borrow
    for other in (((1, 80), torch.int64, False, 5, (0, 0)), ((1, 80), torch.int64, True, 4, (0, 0)),
                  ((1, 80), torch.int64, True, 5, (2, 0))):
        runner._meet(other)
        assert runner._borrow(other, torch.ones(1, 80, dtype=torch.long), _plan(80)) is None
    # longer than every captured length: captured
    long = ((1, 160), torch.int64, True, 5, (0, 0))
    runner._meet(long)
    assert runner._borrow(long, torch.ones(1, 160, dtype=torch.long), _plan(160)) is None
    assert len(replayed) == 1


def test_runner_captures_where_padding_would_cost_more_or_nothing_is_known(monkeypatch, run_length):
    runner, replayed = _runner_with_graphs(monkeypatch, [96], per_token=1e-4)
    key, idx = ((1, 80), torch.int64, True, 5, (0, 0)), torch.ones(1, 80, dtype=torch.long)
    runner._meet(key)
    assert runner._borrow(key, idx, _plan(80)) is None  # (no loop length: every length captured)
    run_length(1000)
    for _ in range(10):
        runner._meet(key)
    # 16 padded tokens x 100 us: 1.6 ms a micro-batch, the length met 10 in 10 (990 to go): captured
    assert runner._borrow(key, idx, _plan(80)) is None
    run_length(1000)
    runner._meet(((1, 96), torch.int64, True, 5, (0, 0)))
    runner._meet(key)  # (a new loop: met once in 2)
    runner._timed = [0.0, 0]  # nothing timed yet: captured
    assert runner._borrow(key, idx, _plan(80)) is None
    runner._timed = [1e-3 * 100, 100]  # (1 us per token)
    monkeypatch.setattr(graphs, "BORROW_LONGER", False)
    assert runner._borrow(key, idx, _plan(80)) is None
    monkeypatch.setattr(graphs, "BORROW_LONGER", True)
    monkeypatch.setattr(graphs, "_several_replicas", lambda: True)  # (replicas: their own pre-capture)
    assert runner._borrow(key, idx, _plan(80)) is None
    monkeypatch.setattr(graphs, "_several_replicas", lambda: False)
    assert runner._borrow(key, idx, _plan(80)) is not None and len(replayed) == 1


def test_capture_report_says_the_borrowed_micro_batches():
    from benchmarks.recipe import padding_from_log

    stats = {k: 0 for k in graphs.CAPTURE_STATS}
    stats.update(captures=6, replays=200, warmup=0.1, forward=0.2, backward=0.2, warmed=1, borrowed=23,
                 borrowed_lengths=4)
    line = graphs.capture_report(stats, 10.0)
    assert ("; 23 micro-batches of 4 lengths ran through a longer captured length, padded (met too rarely for a "
            "capture of their own to repay it in the rest of the run)") in line
    parsed = padding_from_log(line)
    assert parsed["graph_borrowed"] == 23 and parsed["graph_borrowed_lengths"] == 4 and parsed["graph_captures"] == 6


def test_the_command_tells_the_graphs_its_loop_length():
    """``lit-liger``'s ``fit`` wrapper: litgpt's ``max_steps`` x accumulation or its epochs, whichever ends first."""
    from litgpt.args import TrainArgs

    from lit_liger.cli import _run_length

    train = TrainArgs(global_batch_size=16, micro_batch_size=4, max_steps=50, epochs=3, lr_warmup_steps=10)
    bound = {"train": train, "train_dataloader": list(range(100)), "devices": 1}
    assert _run_length(None, bound) == 200  # 50 steps x 4 micro-batches, before 3 epochs of 100
    assert _run_length(None, {**bound, "devices": 2}) == 100  # (2 devices: 2 micro-batches a step each)
    train.max_steps = None
    assert _run_length(None, bound) == 300
    assert _run_length(None, {"train": object(), "train_dataloader": []}) is None


# ------------------------------------------------------------------------------------------------
# GPU: a borrowed replay against the uncaptured model
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_borrowed_length_equals_uncaptured(run_length):
    """A run's last micro-batch of a new, shorter packed length runs through the captured longer length (its own
    capture could not repay): its loss and the accumulated gradients equal the uncaptured model's; nothing new is
    captured."""
    from litgpt import GPT

    cfg = tiny_config("Llama-3.2-1B").__class__.from_name("Llama-3.2-1B", n_layer=2, block_size=512)
    torch.manual_seed(0)
    with torch.device("cuda"):
        a = GPT(cfg).to(torch.bfloat16)
    a.apply(a._init_weights)
    b = copy.deepcopy(a)
    apply_liger(a, LigerConfig(packing=True, cuda_graphs=True))
    apply_liger(b, LigerConfig(packing=True, cuda_graphs=False))
    runner = graphs.runner_for(a)
    batches = [(100, 300, 90, 310), (100, 300, 90, 310), (40, 60, 30, 50)]
    run_length(len(batches))
    before = dict(graphs.CAPTURE_STATS)
    for lengths in batches:
        x, y = _batch(cfg, lengths)
        x, y = x.cuda(), y.cuda()
        losses = []
        for m in (a, b):
            loss = _lora_step_loss(m, x, y)
            loss.backward()
            losses.append(loss.detach().float())
        assert rel_err(losses[0], losses[1]) <= 5e-3, (lengths, losses)
    assert runner.captures == 1 and graphs.CAPTURE_STATS["borrowed"] - before["borrowed"] == 1
    assert runner._timed[1] > 0  # (the replays' time per token was read back)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert rel_err(p.grad, q.grad) <= 3e-2, n
