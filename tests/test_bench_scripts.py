"""Smoke test of the bench scripts: each runs end to end in its tiny mode and its last printed line is its headline.

Not a timing test (figures on a shared CPU say nothing here): it checks that the scripts still run against the
current backend, app and API names, and that the headline carries finite numbers. Each script runs in-process with
its smallest settings; the ones that measure processes still start them (the CLI, the plain script, the app).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NUMBER = r"([-+]?\d+(?:\.\d+)?)"

CASES = {
    "overhead": (
        ["--steps", "2", "--repeats", "1", "--skip", "1", "--tokenizer", "tiny", "--layers", "2", "--hidden", "64",
         "--seq", "96", "--batch", "2", "--out", ""],
        rf"^overhead: whole-process wall ours/plain = {NUMBER}x .* in-loop tokens/s ours/plain = {NUMBER}x",
    ),
    "startup": (
        ["--rounds", "1", "--no-imports", "--out", ""],
        rf"^startup: first page ours {NUMBER}s vs hello-world Gradio {NUMBER}s = {NUMBER}x",
    ),
    "chat_stream": (
        ["--model", "tiny", "--max-new-tokens", "8", "--rounds", "1", "--threads", "0", "--out", ""],
        rf"^chat stream: ours {NUMBER} tok/s vs plain generate {NUMBER} tok/s = {NUMBER}x",
    ),
    "ui_latency": (
        ["--tokenizer", "tiny", "--layers", "2", "--hidden", "64", "--steps", "4", "--skip", "1", "--seq", "96",
         "--batch", "2", "--pairs", "1", "--idle-polls", "3", "--chat-tokens", "4", "--chat-every", "0.5",
         "--log-lengths", "50", "--out", ""],
        rf"^ui latency: /status p50 {NUMBER} ms, p95 {NUMBER} ms .* slowdown from polling {NUMBER}%",
    ),
    "gpu_throughput": (
        ["--tiny", "--methods", "qlora", "--sides", "ours,ours-no-liger,plain", "--steps", "3", "--out", ""],
        rf"^gpu throughput on cpu \(ours/plain\): qlora tok/s {NUMBER}x, peak memory {NUMBER}x \(Liger False\), "
        rf"Liger off {NUMBER}x / {NUMBER}x; last loss {NUMBER} vs {NUMBER} off",
    ),
    "packing": (
        ["--model", "tiny", "--steps", "2", "--repeats", "1", "--seq", "512", "--kernels", "--kernel-batches", "1",
         "--kernel-reps", "1", "--out", ""],
        rf"^packing on cpu: real tokens/s packed/plain = {NUMBER}x \(goal >= 1.5\), packed/padded = {NUMBER}x; "
        rf"padding share {NUMBER}%",
    ),
    "vlm_step_time": (
        ["--steps", "3", "--repeats", "1", "--skip", "1", "--out", ""],
        rf"^vlm step time ours/plain TRL: {NUMBER}x \(goal <= 1.05\) \[(?:meets|MISSES)\], rounds {NUMBER}-{NUMBER}x; "
        rf"by CPU time {NUMBER}x .* all steps' median ours {NUMBER} ms, plain {NUMBER} ms$",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_bench_script_prints_its_headline(name, capsys, tmp_path):
    import importlib

    argv, pattern = CASES[name]
    module = importlib.import_module(f"bench.{name}")
    headline = module.main(argv)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines, f"{name} printed nothing"
    assert lines[-1] == headline, f"{name}: the last printed line is not the headline: {lines[-1]!r}"
    match = re.search(pattern, headline)
    assert match, f"{name}: headline does not match {pattern!r}: {headline!r}"
    numbers = [float(g) for g in match.groups()]
    assert all(math.isfinite(x) for x in numbers), headline
    # Times, rates and ratios must be positive (only the ui_latency slowdown, its last number, may be negative).
    positives = numbers[:-1] if name == "ui_latency" else numbers
    assert all(x > 0 for x in positives), headline
