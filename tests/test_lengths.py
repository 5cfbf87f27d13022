"""litgpt's pass over the data for its longest sample, read in worker processes (``lit_liger.runtime.lengths``): the same
lengths as litgpt's own pass, sample by sample, and litgpt's pass wherever the workers do not apply or fail."""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch
from torch.utils.data import ConcatDataset

from lit_liger import LigerConfig, cli

from lit_liger.runtime import lengths


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """litgpt's SFTDataset (training and validation sets, as litgpt's fit concatenates them) over JSON instruction
    samples of many lengths, with a BPE trained here, truncated at 400 tokens: several samples share the longest."""
    from litgpt import Tokenizer
    from litgpt.data import JSON

    from lit_liger.demo import source_files, train_tokenizer

    root = tmp_path_factory.mktemp("lengths")
    train_tokenizer(root / "tok", 512, source_files()[:20])
    g = torch.Generator().manual_seed(0)
    words = ["data", "value", "return", "list", "error", "model", "because", "x", "12"]
    rows = []
    for _ in range(300):
        k = int(torch.randint(1, 120, (1,), generator=g))
        text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (k,), generator=g))
        rows.append({"instruction": f"Say {k} words.", "input": "" if k % 3 else "some input", "output": text})
    (root / "data.json").write_text(json.dumps(rows))
    data = JSON(json_path=root / "data.json", val_split_fraction=0.1)
    data.connect(Tokenizer(root / "tok"), batch_size=2, max_seq_length=400)
    data.setup()
    return ConcatDataset([data.train_dataloader().dataset, data.val_dataloader().dataset])


def _litgpt_pass():
    return importlib.import_module("litgpt.finetune.lora").get_longest_seq_length


def test_workers_read_litgpt_lengths_sample_by_sample(sft, monkeypatch):
    monkeypatch.setattr(lengths, "PARALLEL_MIN", 16)
    want = [len(sft[i]["input_ids"]) for i in range(len(sft))]
    assert len(set(want)) > 20 and want.count(max(want)) > 1  # (many lengths; the longest more than once)
    for n_workers in (2, 3):
        assert lengths.sample_lengths(sft, n_workers) == want
    litgpt = _litgpt_pass()
    got = lengths.longest_seq_length(litgpt)(sft)
    assert got == litgpt(sft) == (max(want), want.index(max(want)))  # the first of the longest, as litgpt's


def test_small_data_or_one_worker_takes_litgpt_pass(sft, monkeypatch):
    calls = []

    def litgpt(data):
        calls.append(len(data))
        return _litgpt_pass()(data)

    assert lengths.PARALLEL_MIN > len(sft)
    assert lengths.sample_lengths(sft, 4) is None
    assert lengths.longest_seq_length(litgpt)(sft) == _litgpt_pass()(sft) and calls == [len(sft)]
    monkeypatch.setattr(lengths, "PARALLEL_MIN", 16)
    assert lengths.sample_lengths(sft, 1) is None
    monkeypatch.setattr(lengths, "workers", lambda: 1)
    calls.clear()
    assert lengths.longest_seq_length(litgpt)(sft) == _litgpt_pass()(sft) and calls == [len(sft)]
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])  # (macOS, Windows)
    assert lengths.sample_lengths(sft, 4) is None


class _FailsInWorkers(torch.utils.data.Dataset):
    """Samples that a worker process cannot read (the main process can)."""

    def __init__(self, n: int) -> None:
        self.parent, self.n = os.getpid(), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i >= self.n:
            raise IndexError(i)  # (litgpt's pass iterates the data set)
        if os.getpid() != self.parent:
            raise OSError("no such file in a worker")
        return {"input_ids": torch.zeros(i % 7 + 1)}


def test_failing_workers_warn_and_litgpt_pass_runs(monkeypatch):
    monkeypatch.setattr(lengths, "PARALLEL_MIN", 16)
    monkeypatch.setattr(lengths, "workers", lambda: 2)
    data = _FailsInWorkers(40)
    with pytest.raises(Exception, match="no such file"):
        lengths.sample_lengths(data, 2)
    with pytest.warns(UserWarning, match="failed .*no such file.*litgpt reads them in this process"):
        assert lengths.longest_seq_length(_litgpt_pass())(data) == (7, 6)


def test_workers_share_the_cpus_among_the_training_processes(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(40)), raising=False)
    monkeypatch.setattr(lengths, "MAX_WORKERS", 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert lengths.workers() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert lengths.workers() == 10
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert lengths.workers() == 1


@pytest.mark.parametrize("name", ["lora", "full", "adapter", "adapter_v2"])
def test_the_command_patches_litgpt_pass_and_puts_it_back(name):
    module = importlib.import_module(f"litgpt.finetune.{name}")
    original = module.get_longest_seq_length
    with cli._patched(module, LigerConfig()):
        assert module.get_longest_seq_length is not original
        assert module.get_longest_seq_length.__qualname__.startswith("longest_seq_length")
    assert module.get_longest_seq_length is original
    with cli._patched(module, LigerConfig.off()):
        assert module.get_longest_seq_length is original
