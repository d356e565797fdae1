"""Print the configuration reference (one row per TrainConfig field) as Markdown, for docs/configure.md.

Run: python scripts/config_reference.py   (tests/test_readme.py checks that docs/configure.md holds exactly this table)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from finetune.config import EMBEDDED_MODEL, FIELDS, field_groups  # noqa: E402


def default_text(name: str) -> str:
    f = FIELDS[name]
    value = EMBEDDED_MODEL if name == "model" else f.default
    if value in ("", None):
        return "*(empty)*"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def allowed_text(name: str) -> str:
    meta = FIELDS[name].metadata
    if meta.get("choices"):
        return " \\| ".join(choice or "*(empty)*" for choice in meta["choices"])
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and hi is not None:
        return f"{lo} – {hi}"
    if lo is not None:
        return f"≥ {lo}"
    return ""


def table() -> str:
    lines = ["| key | default | allowed | what it does |", "|---|---|---|---|"]
    for group, names in field_groups().items():
        lines.append(f"| **{group}** | | | |")
        for name in names:
            help_text = FIELDS[name].metadata["help"].replace("|", "\\|")
            lines.append(f"| `{name}` | {default_text(name)} | {allowed_text(name)} | {help_text} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
