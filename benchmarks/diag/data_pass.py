"""litgpt's pass over the data for its longest sample: litgpt's own (one process) against lit-liger's
(``lit_liger.runtime.lengths``: worker processes), on Alpaca-shaped JSON instruction data (the recipe benchmark's).

usage: python -m benchmarks diag data-pass [OUT.json]   (env: SAMPLES=4000,52000, WORKERS=0 (lit-liger's choice),
MAX_SEQ=512, TOK_DIR: a tokenizer directory, default one trained here like the recipe benchmark's)

CPU only: no GPU is used. Each size runs litgpt's ``get_longest_seq_length`` over ``ConcatDataset([train, val])`` as
its ``fit`` does, then lit-liger's, and checks that both give the same (longest, index) and the same lengths.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from litgpt import Tokenizer
from litgpt.data import JSON
from litgpt.finetune.lora import get_longest_seq_length
from torch.utils.data import ConcatDataset

from lit_liger.runtime import lengths
from lit_liger.demo import source_files, train_tokenizer

from ..recipe import make_alpaca_like


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    sizes = [int(s) for s in os.environ.get("SAMPLES", "4000,52000").split(",")]
    max_seq = int(os.environ.get("MAX_SEQ", "512"))
    work = Path(tempfile.mkdtemp(prefix="data-pass-"))
    tok_dir = Path(os.environ["TOK_DIR"]) if os.environ.get("TOK_DIR") else work / "tok"
    if not (tok_dir / "tokenizer.json").is_file():
        train_tokenizer(tok_dir, 8192, source_files()[:40])
    n_workers = int(os.environ.get("WORKERS", "0")) or lengths.workers()
    rows = []
    for n in sizes:
        path = work / f"alpaca-like-{n}.json"
        make_alpaca_like(path, tok_dir, n)
        data = JSON(json_path=path, val_split_fraction=0.05)
        data.connect(Tokenizer(tok_dir), batch_size=4, max_seq_length=max_seq)
        data.setup()
        ds = ConcatDataset([data.train_dataloader().dataset, data.val_dataloader().dataset])
        t0 = time.perf_counter()
        want = get_longest_seq_length(ds)
        serial = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = lengths.sample_lengths(ds, n_workers)
        parallel = time.perf_counter() - t0
        same = got is not None and (max(got), got.index(max(got))) == want
        row = {"samples": len(ds), "litgpt_s": round(serial, 3), "lit_liger_s": round(parallel, 3),
               "workers": n_workers, "speedup": round(serial / parallel, 2), "same_result": same,
               "litgpt_ms_per_sample": round(1e3 * serial / len(ds), 4)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"cpus": lengths.usable_cpus(),
              "max_seq_length": max_seq, "rows": rows}
    if out_path:
        out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
