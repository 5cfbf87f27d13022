"""What ``apply_liger`` swapped and what it left alone (and why): :class:`LigerReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass
class LigerReport:
    swapped: list[tuple[str, str, str]] = field(default_factory=list)  # (path, original class, kernel)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (path, class, reason)

    def add(self, path: str, module: nn.Module, what: str) -> None:
        cls = getattr(module, "_liger_orig_class", None) or type(module)  # the LitGPT class it was
        self.swapped.append((path or "<root>", cls.__name__, what))

    def skip(self, path: str, module: nn.Module | None, why: str) -> None:
        cls = (getattr(module, "_liger_orig_class", None) or type(module)) if module is not None else None
        self.skipped.append((path or "<root>", cls.__name__ if cls is not None else "-", why))

    def count(self, kernel: str) -> int:
        return sum(1 for _, _, k in self.swapped if k == kernel)

    def paths(self, kernel: str) -> list[str]:
        return [p for p, _, k in self.swapped if k == kernel]

    def __str__(self) -> str:
        groups: dict[tuple[str, str], list[str]] = {}
        for path, cls, what in self.swapped:
            groups.setdefault(("swapped", f"{cls} -> {what}"), []).append(path)
        for path, cls, why in self.skipped:
            groups.setdefault(("left alone", f"{cls}: {why}"), []).append(path)
        rows = [(a, b, str(len(p)), _abbrev(p)) for (a, b), p in groups.items()]
        head = ("action", "module -> kernel / reason", "n", "where")
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
        lines = [f"lit-liger: {len(self.swapped)} modules swapped, {len(self.skipped)} left alone"]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip())
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths + [0])).rstrip())
        return "\n".join(lines)

    __repr__ = __str__


def _abbrev(paths: list[str]) -> str:
    if len(paths) <= 2:
        return ", ".join(paths)
    import re

    pattern = {re.sub(r"\.\d+(?=\.|$)", ".*", p) for p in paths}
    return ", ".join(sorted(pattern)) if len(pattern) <= 2 else f"{paths[0]}, ... ({len(paths)})"
