"""What a DataLoader iterator with running workers costs when Python's garbage collector frees it (a reference cycle
holds it), with and without ``lit_liger.runtime.loaders.stop_workers``; and whether litgpt's ``save_hyperparameters`` leaves
its caller's frame (litgpt's ``fit``) alive past its return, in such a cycle.

usage: python -m benchmarks diag loader-cycle [OUT.json]   (env: WORKERS=1,2,4)

CPU only. Each row: an iterator that has given one batch, put in a cycle and dropped, then ``gc.collect()`` timed;
where ``stop_workers`` ended first, the time it took; how many workers PyTorch terminated (still alive after its 5 s
join timeout) rather than saw exit on its signal.
"""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from lit_liger.runtime import loaders


class _Range(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> int:
        return i


TERMINATED: list[int] = []


def _recording_terminate() -> None:
    import multiprocessing.process

    terminate = multiprocessing.process.BaseProcess.terminate

    def recording(self) -> None:
        if self.is_alive():
            TERMINATED.append(self.pid)
        terminate(self)

    multiprocessing.process.BaseProcess.terminate = recording


def _row(workers: int, stop: bool) -> dict:
    TERMINATED.clear()
    dl = DataLoader(_Range(), batch_size=4, num_workers=workers, multiprocessing_context=multiprocessing.get_context("fork"))
    with loaders.stop_workers(dl if stop else None):
        it = iter(dl)
        next(it)
        time.sleep(0.5)  # (the workers have prefetched and wait for indices)
        box = {"it": it}
        box["self"] = box
        t0 = time.perf_counter()
    t_stop = time.perf_counter() - t0
    del it, box
    t0 = time.perf_counter()
    gc.collect()
    t_gc = time.perf_counter() - t0
    return {"workers": workers, "stop_workers": stop, "stop_s": round(t_stop, 3) if stop else None,
            "gc_collect_s": round(t_gc, 3), "terminated": len(TERMINATED)}


def _save_hyperparameters_keeps_the_caller() -> dict:
    """litgpt's save_hyperparameters called from a function (as litgpt's fit calls it at each save): is a local of
    that function alive after it returns, and after a collection?"""
    import litgpt.finetune.lora as lora
    from litgpt.parser_config import save_hyperparameters

    class Marker:
        pass

    out_dir = Path(tempfile.mkdtemp(prefix="loader-cycle-"))

    def fit() -> weakref.ref:
        local = Marker()
        argv, sys.argv = sys.argv, ["litgpt", "finetune_lora", str(out_dir / "checkpoint"), "--out_dir", str(out_dir)]
        try:
            save_hyperparameters(lora.setup, out_dir)
        finally:
            sys.argv = argv
        return weakref.ref(local)

    enabled = gc.isenabled()
    gc.disable()
    try:
        ref = fit()
        after_return = ref() is not None
        gc.collect()
        return {"fit_local_alive_after_return": after_return, "after_gc_collect": ref() is not None}
    finally:
        if enabled:
            gc.enable()


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    _recording_terminate()
    rows = []
    for n in (int(w) for w in os.environ.get("WORKERS", "1,2,4").split(",")):
        for stop in (False, True):
            row = _row(n, stop)
            print(json.dumps(row), flush=True)
            rows.append(row)
    litgpt = _save_hyperparameters_keeps_the_caller()
    print(json.dumps({"litgpt_save_hyperparameters": litgpt}), flush=True)
    result = {"torch": torch.__version__, "python": sys.version.split()[0], "rows": rows,
              "litgpt_save_hyperparameters": litgpt}
    if out_path:
        out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
