"""What every sub-command that takes a run configuration shares: `--config`, `--set`, `-v`, and turning them into a
`TrainConfig`. Below the CLI and its sub-command modules, so none of them imports another to get it."""

from __future__ import annotations

import argparse

from finetune.config import TrainConfig, parse_set_option


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
