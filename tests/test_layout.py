"""The package's layers (issue 67): imports flow one way, entry points -> parallel -> runtime -> swap -> base
(``config``, ``_dist``) and kernels; no module imports a layer above its own, lazily inside a function included."""

import ast
from pathlib import Path

import lit_liger

ROOT = Path(lit_liger.__file__).parent
KERNELS = Path(lit_liger.kernels.__file__).parent
#: lower number = lower layer; a module may import its own layer or any below it
LAYERS = {"kernels": 0, "config": 1, "_dist": 1, "swap": 2, "runtime": 3, "parallel": 4}
TOP = 5  # the entry points: apply, callback, cli, doctor, selfcheck, demo, litgpt_plugin, ...


def _layer(dotted: str) -> int:
    """The layer of the module ``lit_liger.<dotted>``."""
    head = dotted.split(".")[0]
    return LAYERS.get(head, TOP) if head else TOP


def _imports(path: Path, package: list[str]) -> list[tuple[str, int]]:
    """``(lit_liger.<module> imported, line)`` for every import of the package in ``path`` (``package``: the parts
    of its package under lit_liger), functions' lazy imports included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            names = [target + [a.name] for a in node.names] if not node.module else [target]
            out += [(".".join(t), node.lineno) for t in names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lit_liger"):
            out.append((node.module.removeprefix("lit_liger").lstrip("."), node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix("lit_liger").lstrip("."), node.lineno) for a in node.names
                    if a.name.startswith("lit_liger.")]
    return out


def test_imports_flow_down_the_layers():
    bad = []
    files = [(p, list(p.relative_to(ROOT).parent.parts)) for p in ROOT.rglob("*.py")]
    files += [(p, ["kernels"]) for p in KERNELS.glob("*.py")]
    assert len(files) > 40
    for path, package in files:
        own = _layer(".".join(package + [path.stem]) if package else path.stem)
        for target, line in _imports(path, package):
            if _layer(target) > own:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports lit_liger.{target}")
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_the_layer_check_sees_an_import_up(tmp_path):
    """The check above is not vacuous: a swap module importing the runtime, lazily inside a function, is found."""
    path = tmp_path / "probe.py"
    path.write_text("import torch\n\ndef f():\n    from ..runtime import graphs\n    from .state import state_of\n")
    found = _imports(path, ["swap"])
    assert found == [("runtime", 4), ("swap.state", 5)]
    assert _layer(found[0][0]) > _layer("swap.probe") >= _layer(found[1][0])
