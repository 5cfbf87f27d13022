"""Stock ``litgpt`` takes ``--liger`` (``lit-liger litgpt_plugin install``), and is stock without it.

tests/conftest.py writes this checkout's plugin into the environment for the session. The console-script tests run
the real ``litgpt`` script next to ``python -c`` running litgpt's own ``main`` (a process the plugin's line leaves alone:
its ``sys.argv[0]`` is ``-c``), so "stock" is litgpt's own output and exit code, read in the same environment. The
real training runs through ``litgpt ... --liger true`` are tests/test_config_hub.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from lit_liger import litgpt_plugin
from lit_liger._litgpt_boot import TRAINING_COMMANDS, wants_liger

LITGPT = Path(sys.executable).parent / "litgpt"
LIT_LIGER = Path(sys.executable).parent / "lit-liger"


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=300, **kw)


def _stock(args: list[str]) -> subprocess.CompletedProcess:
    """litgpt's own ``main`` with ``sys.argv = ["litgpt", *args]``, in a process the plugin does not route."""
    code = f"import sys; sys.argv = ['{LITGPT}', *{args!r}]; from litgpt.__main__ import main; sys.exit(main())"
    return _run([sys.executable, "-c", code])


@pytest.mark.parametrize("argv, expected", [
    (["litgpt", "finetune_lora", "ckpt", "--liger", "true"], True),
    (["litgpt", "finetune_lora", "ckpt", "--liger=false"], True),
    (["litgpt", "pretrain", "--liger.rope", "false"], True),
    (["litgpt", "finetune", "ckpt"], False),
    (["litgpt", "generate", "ckpt", "--liger", "true"], False),  # not a training subcommand: litgpt's own error
    (["litgpt", "finetune_lora", "ckpt", "--data.liger", "x"], False),
    (["litgpt", "finetune_lora", "ckpt", "--ligerx", "true"], False),
    (["litgpt"], False),
    (["litgpt", "--help"], False),
])
def test_wants_liger_reads_the_command_line(argv, expected):
    assert wants_liger(argv) is expected


def test_wants_liger_reads_a_liger_mapping_in_the_config(tmp_path):
    with_liger, without = tmp_path / "a.yaml", tmp_path / "b.yaml"
    with_liger.write_text(yaml.safe_dump({"lora_r": 4, "liger": {"rope": False}}))
    without.write_text(yaml.safe_dump({"lora_r": 4}))
    assert wants_liger(["litgpt", "finetune_lora", "ckpt", "--config", str(with_liger)])
    assert wants_liger(["litgpt", "finetune_lora", "ckpt", f"--config={with_liger}"])
    assert not wants_liger(["litgpt", "finetune_lora", "ckpt", "--config", str(without)])
    assert not wants_liger(["litgpt", "finetune_lora", "ckpt", "--config", str(tmp_path / "missing.yaml")])


def test_training_commands_are_litgpt_subcommands():
    from litgpt.__main__ import PARSER_DATA

    assert set(TRAINING_COMMANDS) <= set(PARSER_DATA)


def test_install_status_remove_in_a_site_folder(tmp_path):
    assert litgpt_plugin.status(tmp_path) == "absent"
    path = litgpt_plugin.install(tmp_path)
    assert path == tmp_path / litgpt_plugin.PTH_NAME and litgpt_plugin.status(tmp_path) == "installed"
    assert litgpt_plugin.install(tmp_path) == path  # idempotent
    assert [p.name for p in tmp_path.iterdir()] == [litgpt_plugin.PTH_NAME]  # one file, nothing else
    path.write_text(litgpt_plugin.pth_line(tmp_path / "elsewhere.py"))
    assert litgpt_plugin.status(tmp_path) == "stale"
    assert litgpt_plugin.remove(tmp_path) and litgpt_plugin.status(tmp_path) == "absent"
    assert not litgpt_plugin.remove(tmp_path)


def _exec_pth_line(line: str, argv0: str, args: list[str]) -> str:
    """Execute a ``.pth`` line as ``site`` does, in a fresh interpreter whose ``sys.argv`` is set first; what the
    interpreter then has in ``sys.meta_path`` (the router's class name or nothing)."""
    code = textwrap.dedent(f"""
        import sys
        sys.argv = [{argv0!r}, *{args!r}]
        exec({line!r})
        print(",".join(type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_RouteLitgptMain"))
    """)
    return _run([sys.executable, "-c", code]).stdout.strip()


def test_the_pth_line_routes_litgpt_processes_only(tmp_path):
    line = litgpt_plugin.pth_line()
    assert line.startswith("import ") and line.count("\n") == 1  # what `site` executes: one line, starting "import "
    train = ["finetune_lora", "ckpt", "--liger", "true"]
    assert _exec_pth_line(line, "/venv/bin/litgpt", train) == "_RouteLitgptMain"
    assert _exec_pth_line(line, "litgpt.exe", train) == "_RouteLitgptMain"
    assert _exec_pth_line(line, "/venv/bin/litgpt", ["finetune_lora", "ckpt"]) == ""  # no --liger: stock
    assert _exec_pth_line(line, "/venv/bin/python", train) == ""  # another program
    assert _exec_pth_line(line, "-c", train) == ""
    # lit-liger uninstalled without `remove`: the line points at a missing file and does nothing
    assert _exec_pth_line(litgpt_plugin.pth_line(tmp_path / "gone.py"), "/venv/bin/litgpt", train) == ""


def test_the_cli_installs_and_removes(tmp_path):
    out = _run([LIT_LIGER, "litgpt_plugin", "install", "--site_packages", tmp_path])
    assert out.returncode == 0 and "litgpt_plugin remove" in out.stdout
    assert litgpt_plugin.status(tmp_path) == "installed"
    assert "installed" in _run([LIT_LIGER, "litgpt_plugin", "status", "--site_packages", tmp_path]).stdout
    out = _run([LIT_LIGER, "litgpt_plugin", "remove", "--site_packages", tmp_path])
    assert out.returncode == 0 and litgpt_plugin.status(tmp_path) == "absent"


# ------------------------------------------------------------------------------------------------
# the real console script (the plugin written into this environment by tests/conftest.py)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["--help"],
    ["finetune_lora", "--help"],
    ["pretrain", "--help"],
    ["finetune_lora", "checkpoints/none"],  # litgpt's own error (no checkpoint), its own exit code
    ["generate", "--help"],
    ["finetune_lora", "checkpoints/none", "--bogus", "1"],
])
def test_litgpt_without_liger_is_stock(args):
    assert litgpt_plugin.status() == "installed"
    ours, stock = _run([LITGPT, *args]), _stock(args)
    assert (ours.returncode, ours.stdout) == (stock.returncode, stock.stdout)
    assert ours.stderr.splitlines()[-1:] == stock.stderr.splitlines()[-1:]
    if args[-1] == "--help":
        assert "--liger" not in ours.stdout


def test_litgpt_with_liger_takes_it():
    ours = _run([LITGPT, "finetune_lora", "--liger", "true", "--help"])
    assert ours.returncode == 0, ours.stderr
    assert "--liger LIGER" in ours.stdout and ours.stdout.startswith("usage: litgpt ")
    stock = _stock(["finetune_lora", "checkpoints/none", "--liger", "true"])
    assert stock.returncode == 2 and "--liger" in stock.stderr  # what litgpt said before: unrecognized


def test_bad_liger_value_same_clear_error_through_litgpt_and_lit_liger():
    args = ["finetune_lora", "checkpoints/none", "--liger.rope", "maybe"]
    ours, theirs = _run([LITGPT, *args]), _run([LIT_LIGER, *args])
    assert ours.returncode == theirs.returncode == 2
    message = "finetune_lora: error: --liger.rope must be one of true, false; got 'maybe'"
    assert ours.stderr.strip() == f"litgpt {message}"
    assert theirs.stderr.strip() == f"lit-liger {message}"
