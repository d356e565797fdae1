"""`python -m finetune export RUN_DIR --format merged|gguf|gguf-lora [--quant f16|q8_0] [--out PATH]`: a finished run
exported to run outside Python (finetune/publish/export.py); stages on stderr, the main file written on stdout."""

from __future__ import annotations

import argparse
from typing import Any

from finetune.cli.terminal import to_stderr
from finetune.publish.export import EXPORTS_FOLDER, export_run


def register(subparsers: Any) -> None:
    """Add `export`."""
    parser = subparsers.add_parser(
        "export",
        help="export a finished run as a merged model, a GGUF file with an Ollama Modelfile, or a LoRA GGUF",
        description=(
            "Export a finished run to run outside Python: --format merged writes a standalone Transformers model "
            "(adapter merged in); --format gguf writes one .gguf file (weights, tokenizer, chat template) for "
            "llama.cpp, Ollama and LM Studio, with an Ollama Modelfile beside it; --format gguf-lora writes the LoRA "
            "adapter alone as a llama.cpp LoRA GGUF (llama-cli -m BASE.gguf --lora FILE). Written under --out, or "
            f"under the run's {EXPORTS_FOLDER}/ folder."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory, or the name of a run under the runs root")
    parser.add_argument("--format", default="merged", metavar="FORMAT", help="merged (default), gguf or gguf-lora")
    parser.add_argument("--quant", metavar="QUANT", help="gguf / gguf-lora weight type: f16 (default) or q8_0")
    parser.add_argument(
        "--out",
        metavar="PATH",
        help=f"folder to create (default: RUN_DIR/{EXPORTS_FOLDER}/merged, gguf-QUANT or gguf-lora-QUANT)",
    )
    parser.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    """Handle `export`: print the main file written (the .gguf, or the merged model's folder)."""
    result = export_run(args.run_dir, args.format, quant=args.quant, out=args.out, progress=to_stderr)
    print(result.main)
    return 0
