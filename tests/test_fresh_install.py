"""The installed package as a user gets it: console scripts run as separate processes.

Everything here goes through the scripts that ``pip install`` put next to ``sys.executable`` (the
virtual environment's ``bin/``), in child processes that import only what the environment really
has, never through this test process's imports. CI (``.ci/run``) runs the suite in a virtual
environment it creates from scratch on every run, so a package that the code imports but that no
declared dependency installs (``requests``, issue 14) fails here:

* ``lit-liger finetune_lora`` and ``finetune_full``, ``--liger true`` and ``false``, on a tiny checkpoint
  made here, then stock ``litgpt generate`` on what the ``--liger true`` run saved;
* ``lit-liger`` parses and trains where ``requests`` cannot be imported (URL configs are optional);
* ``pip check`` is clean and lit-liger's declared dependencies cover what its modules import;
* ``lit-liger bench --help`` from the installed script, and from a built (non-editable) wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from test_cli import assert_first_losses_match, finetune_args, losses, tiny_llama

from lit_liger.demo import make_instruction_dataset

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BENCHMARKS = ("kernels", "step", "finetune", "convergence", "strategies", "scaling", "all", "plot")


def script(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"no console script {name!r} next to {sys.executable}: is the package installed here?"
    return str(path)


def run(args: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A child process with this environment's variables minus PYTHONPATH (imports come from the install)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")  # the kernels in the interpreter, as in the other CPU tests
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh_install")
    ckpt, files, _ = tiny_llama(root)
    data = root / "data.json"
    make_instruction_dataset(data, files, n=40, max_chars=1500)
    return {"root": root, "ckpt": ckpt, "data": data}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["finetune_lora", "finetune_full"])
def test_installed_cli_trains_both_ways_and_stock_litgpt_generates(assets, tmp_path, command):
    for liger in ("true", "false"):
        out = tmp_path / liger
        proc = run([script("lit-liger"), *finetune_args(assets, command, out, liger)], cwd=tmp_path)
        assert (out / "final" / "lit_model.pth").is_file()
        assert ("fused linear cross-entropy" in proc.stdout) == (liger == "true")  # the swap report
    assert_first_losses_match(losses(tmp_path / "true"), losses(tmp_path / "false"))
    final = tmp_path / "true" / "final"
    gen = run(
        [script("litgpt"), "generate", final, "--prompt", "def", "--max_new_tokens", 4, "--precision", "32-true"],
        cwd=tmp_path,
    )
    assert gen.stdout.strip()


def test_cli_runs_where_requests_cannot_be_imported(tmp_path):
    """URL config reading is the only user of ``requests``: without it the CLI still parses and runs."""
    code = (  # the path finder stops seeing requests: find_spec gives None and `import requests` fails
        "import sys\n"
        "from importlib.machinery import PathFinder\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        return None if name.split('.')[0] == 'requests' else PathFinder.find_spec(name, path, target)\n"
        "    def invalidate_caches(self):\n"
        "        PathFinder.invalidate_caches()\n"
        "    def find_distributions(self, *args, **kwargs):\n"
        "        return PathFinder.find_distributions(*args, **kwargs)\n"
        "sys.meta_path[:] = [Hide() if f is PathFinder else f for f in sys.meta_path]\n"
        "try:\n"
        "    import requests\n"
        "    sys.exit('requests is still importable')\n"
        "except ImportError:\n"
        "    pass\n"
        "from lit_liger.cli import main\n"
        "try:\n"
        "    main(['finetune_lora', '--help'])\n"
        "except SystemExit as e:\n"
        "    sys.exit(e.code)\n"
    )
    proc = run([sys.executable, "-c", code], cwd=tmp_path)
    assert "--liger" in proc.stdout


def test_dependencies_are_declared_and_consistent(tmp_path):
    import importlib.metadata as md

    run([sys.executable, "-m", "pip", "check"], cwd=tmp_path)
    required = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for r in md.requires("lit-liger") or [] if "extra ==" not in r}
    # imported by lit_liger itself (or, for requests, by stock litgpt's CLI, which the README uses on our checkpoints)
    for dist in ("torch", "lightning", "litgpt", "jsonargparse", "torchmetrics", "pyyaml", "tokenizers", "requests"):
        assert dist in required, f"{dist} is not a declared dependency of lit-liger"
        md.version(dist)  # installed


def test_bench_help_from_the_installed_script(tmp_path):
    proc = run([script("lit-liger"), "bench", "--help"], cwd=tmp_path)
    for name in BENCHMARKS:
        assert f"\n    {name} " in proc.stdout, name
    assert "lit-liger bench NAME -h" in proc.stdout
    proc = run([script("lit-liger"), "bench", "kernels", "--help"], cwd=tmp_path)
    assert proc.stdout.startswith("usage: lit-liger bench kernels") and "--smoke" in proc.stdout


@pytest.mark.slow
def test_wheel_ships_the_benchmarks(tmp_path):
    """A non-editable install: build the wheel from a copy of the sources, run ``bench --help`` from it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.egg-info")
    for name in ("lit_liger", "kernels", "benchmarks"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", src], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("lit_liger-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    for module in ("__main__", "_common", "kernels", "step", "finetune", "convergence", "strategies", "scaling"):
        assert f"lit_liger/benchmarks/{module}.py" in names, module
    assert "lit_liger/kernels/rms_norm.py" in names
    assert not any("results/" in n for n in names)  # the committed results stay in the repository

    work = tmp_path / "work"
    work.mkdir()
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r})\n"
        "import lit_liger, lit_liger.benchmarks._common as C\n"
        f"assert lit_liger.__file__.startswith({str(tmp_path / 'site')!r}), lit_liger.__file__\n"
        "print('RESULTS', C.RESULTS_DIR, C.PROG)\n"
        "from lit_liger.cli import main\n"
        "main(['bench', '--help'])\n"
    )
    proc = run([sys.executable, "-c", code], cwd=work)
    assert f"RESULTS {work / 'lit-liger-bench-results'} lit-liger bench" in proc.stdout
    assert "\n    kernels " in proc.stdout
