"""What runs at the start of a ``litgpt`` process once ``lit-liger litgpt_plugin install`` has written its ``.pth`` file.

Python executes a site-packages ``.pth`` line that starts with ``import`` in every interpreter it starts. lit-liger's
line (:mod:`lit_liger.litgpt_plugin` writes it) only compares ``sys.argv[0]``'s file name with ``litgpt`` and, in a
``litgpt`` process, executes this file by its path. This file imports nothing heavy (not torch, not ``lit_liger``'s
package) and decides from the command line alone:

* a training subcommand (:data:`TRAINING_COMMANDS`) with ``--liger``, ``--liger.NAME`` / ``--liger=...`` or a ``liger:``
  mapping in a ``--config`` file: ``litgpt.__main__.main`` is replaced, when the console script imports it, by
  ``lit_liger.cli.main``: the ``lit-liger`` command's parser, output and exit codes for this one process;
* anything else (other subcommands, no ``--liger``, ``--help``): nothing is changed, the process is stock litgpt.

If ``lit_liger`` is no longer importable (uninstalled without ``lit-liger litgpt_plugin remove``), stock litgpt runs
and rejects ``--liger`` as it always did.
"""

from __future__ import annotations

import os
import sys

#: litgpt subcommands that build and train a model: they gain ``--liger`` (in ``litgpt`` and ``lit-liger``).
TRAINING_COMMANDS = (
    "finetune",
    "finetune_lora",
    "finetune_full",
    "finetune_adapter",
    "finetune_adapter_v2",
    "pretrain",
)


def _config_has_liger(path: str) -> bool:
    """Whether the YAML file at ``path`` has a top-level ``liger`` key (unreadable: no; litgpt reports it)."""
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except Exception:
        return False
    return isinstance(data, dict) and "liger" in data


def wants_liger(argv: list[str]) -> bool:
    """Whether the ``litgpt`` command line ``argv`` (``sys.argv``) asks for lit-liger: a training subcommand first,
    then ``--liger``, ``--liger.NAME``, ``--liger=VALUE`` or a ``--config`` file with a ``liger:`` mapping."""
    args = argv[1:]
    if not args or args[0] not in TRAINING_COMMANDS:
        return False
    rest = args[1:]
    for i, arg in enumerate(rest):
        if arg == "--liger" or arg.startswith(("--liger.", "--liger=")):
            return True
        if arg == "--config" and i + 1 < len(rest) and _config_has_liger(rest[i + 1]):
            return True
        if arg.startswith("--config=") and _config_has_liger(arg.partition("=")[2]):
            return True
    return False


def _liger_main() -> None:
    """``litgpt.__main__.main`` for a command line that asks for lit-liger."""
    from lit_liger.cli import main

    return main()


class _RouteLitgptMain:
    """A one-shot ``sys.meta_path`` finder: finds ``litgpt.__main__`` with the other finders and, once the module has
    run, points its ``main`` at :func:`_liger_main` (the console script then imports that name). Leaves
    ``sys.meta_path`` at the first lookup of that module."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "litgpt.__main__":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or importlib.util.find_spec("lit_liger") is None:
            return spec  # (lit-liger uninstalled: stock litgpt)
        run = spec.loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            run(module)
            module.main = _liger_main

        spec.loader.exec_module = exec_module
        return spec


def boot(argv: list[str] | None = None) -> bool:
    """Route this ``litgpt`` process through lit-liger if its command line asks for it; whether it does."""
    argv = sys.argv if argv is None else argv
    if not argv or os.path.basename(argv[0]).split(".")[0] != "litgpt":  # (the .pth line's test is looser)
        return False
    # (by name: a site directory reached twice, lib64 -> lib, executes this file twice, each time a new class)
    if not wants_liger(argv) or any(type(f).__name__ == "_RouteLitgptMain" for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _RouteLitgptMain())
    return True


if __name__ == "_lit_liger_litgpt_boot":  # executed by the .pth line (not on a plain import from lit_liger)
    boot()
