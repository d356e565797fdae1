"""What every sub-command that takes a run configuration shares: `--config`, `--set`, `-v`, and turning them into a
`TrainConfig`. Below the CLI and its sub-command modules, so none of them imports another to get it."""

from __future__ import annotations

import argparse
import math
from typing import Any

from finetune.config import TrainConfig, parse_set_option
from finetune.errors import UserError


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """--config, --set and -v."""
    parser.add_argument("--config", help="YAML run configuration (flat, one key per field); default: built-in defaults")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config field (repeatable)")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' own warnings and progress bars"
    )


def load_config(path: str | None, sets: list[str] | None) -> TrainConfig:
    """The config from a YAML file (or the defaults) with `--set key=value` overrides applied."""
    base = TrainConfig.load(path).to_dict() if path else TrainConfig().to_dict()
    for item in sets or []:
        key, value = parse_set_option(item)
        base[key] = value
    return TrainConfig.from_dict(base)


def parse_count(value: Any, flag: str) -> int:
    """A whole number >= 1 from the command line (--gpus)."""
    try:
        n = int(str(value))
    except ValueError:
        raise UserError(f"{flag}: {value!r} is not a whole number") from None
    if n < 1:
        raise UserError(f"{flag}: must be 1 or more")
    return n


def parse_gib(value: Any, flag: str = "--gpu-gib") -> float | None:
    """GPU memory: a positive number of GiB, or the name of a common card (case and spaces ignored); None if empty."""
    from finetune.model.catalogue import GPU_CARDS

    if value in (None, ""):
        return None
    text = str(value).strip()
    try:
        gib = float(text)
    except ValueError:
        wanted = text.lower().replace(" ", "")
        for name, size in GPU_CARDS.items():
            if name.lower().replace(" ", "").startswith(wanted):
                return size
        raise UserError(f"{flag}: {text!r} is not a number of GiB or a known card ({', '.join(GPU_CARDS)})") from None
    if not math.isfinite(gib) or gib <= 0:
        raise UserError(f"{flag}: {text!r} must be a positive number of GiB")
    return gib
