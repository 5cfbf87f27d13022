"""``lit-liger litgpt_plugin install|remove|status``: stock ``litgpt`` takes ``--liger``.

``install`` writes one file, ``lit_liger_litgpt.pth``, into the site-packages of the Python that runs it (the one
litgpt is installed in). Python reads every ``.pth`` file there at start-up; lit-liger's holds one line that compares
``sys.argv[0]``'s file name with ``litgpt`` and, only in a ``litgpt`` process, executes
``lit_liger/_litgpt_boot.py`` by its path. That file routes a training subcommand with ``--liger`` (or a ``liger:``
mapping in its ``--config``) to ``lit_liger.cli.main``; any other ``litgpt`` command line runs stock litgpt,
untouched. ``remove`` deletes the file; so does deleting it by hand. Uninstalling lit-liger first leaves the line
pointing at a missing file, which it checks: stock litgpt runs (``remove`` then tidies up).

The trade-offs, and the start-up cost measured for every other Python process, are in docs/design.md
("``litgpt`` takes lit-liger").
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Literal

__all__ = ["PTH_NAME", "install", "litgpt_plugin", "pth_line", "remove", "site_file", "status"]

#: the file ``install`` writes into site-packages
PTH_NAME = "lit_liger_litgpt.pth"

_BOOT = Path(__file__).resolve().with_name("_litgpt_boot.py")


def pth_line(boot: Path = _BOOT) -> str:
    """The ``.pth`` line. Every Python process compiles it at start-up (that, not running it, is its cost), so the
    work is in a string constant compiled only in a process whose ``sys.argv[0]`` ends like ``litgpt``: it executes
    the boot file (which checks the name exactly) if that file still exists."""
    inner = (f"import os; p = {str(boot)!r}; os.path.exists(p) and exec(compile(open(p, encoding='utf-8').read(), p, "
             "'exec'), {'__name__': '_lit_liger_litgpt_boot', '__file__': p})")
    return f"import sys; 'litgpt' in (getattr(sys, 'argv', None) or [''])[0][-10:] and exec({inner!r})\n"


def _site_packages(site_packages: Path | None) -> Path:
    return Path(site_packages) if site_packages is not None else Path(sysconfig.get_paths()["purelib"])


def site_file(site_packages: Path | None = None) -> Path:
    """Where ``install`` writes the ``.pth`` file."""
    return _site_packages(site_packages) / PTH_NAME


def status(site_packages: Path | None = None) -> str:
    """``installed`` (this lit-liger's line), ``stale`` (a line pointing elsewhere) or ``absent``."""
    path = _site_packages(site_packages) / PTH_NAME
    if not path.is_file():
        return "absent"
    return "installed" if path.read_text(encoding="utf-8") == pth_line() else "stale"


def install(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` file (idempotent: rewritten in place, atomically); its path."""
    site = _site_packages(site_packages)
    path = site / PTH_NAME
    tmp = site / f".{PTH_NAME}.tmp"
    tmp.write_text(pth_line(), encoding="utf-8")
    tmp.replace(path)
    return path


def remove(site_packages: Path | None = None) -> bool:
    """Delete the ``.pth`` file; whether there was one."""
    path = _site_packages(site_packages) / PTH_NAME
    if not path.exists():
        return False
    path.unlink()
    return True


def litgpt_plugin(action: Literal["install", "remove", "status"], site_packages: Path | None = None) -> None:
    """Make stock ``litgpt`` accept ``--liger`` on its training subcommands (``install``), undo it (``remove``), or say
    which is in effect (``status``).

    After ``install``, ``litgpt finetune_lora ... --liger true`` (or a ``liger:`` mapping in ``--config``) runs
    through lit-liger exactly as ``lit-liger finetune_lora ...`` does; every other ``litgpt`` command line is stock
    litgpt: same parser, help, output and exit codes. It writes one file, ``lit_liger_litgpt.pth``, into this
    Python's site-packages; ``remove`` deletes it.

    Arguments:
        action: install, remove or status.
        site_packages: the site-packages folder (default: this Python's, where litgpt is installed).
    """
    site = _site_packages(site_packages)
    if action == "install":
        try:
            import importlib.util

            found = importlib.util.find_spec("litgpt") is not None
        except Exception:  # pragma: no cover
            found = False
        path = install(site)
        print(f"lit-liger: wrote {path}: `litgpt finetune* | pretrain ... --liger true` now runs through lit-liger; "
              "without --liger (or a `liger:` mapping in --config) litgpt is stock. Undo: "
              "`lit-liger litgpt_plugin remove`.")
        if not found:
            print("lit-liger: note: litgpt is not importable from this Python; the plugin acts in the Python "
                  "environment it was written into.")
    elif action == "remove":
        gone = remove(site)
        print(f"lit-liger: {'removed' if gone else 'no'} {site / PTH_NAME}" + ("; litgpt is stock." if gone else
                                                                             " (litgpt was already stock)."))
    else:
        state = status(site)
        print({"installed": f"lit-liger: installed ({site / PTH_NAME}): litgpt's training subcommands take --liger",
               "stale": f"lit-liger: {site / PTH_NAME} points at another lit-liger; `lit-liger litgpt_plugin "
                        "install` rewrites it for this one",
               "absent": "lit-liger: not installed: litgpt is stock (`lit-liger litgpt_plugin install` adds "
                         "--liger to it)"}[state])
