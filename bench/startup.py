"""Start-up time: process start to the first page served, ours (`app.py`) against a hello-world Gradio app.

Each round starts both (alternating which goes first) as fresh processes with the same environment, polls
`GET /` every 20 ms until it answers 200 with the page, then `GET /config` (the page needs it to draw), and stops
the server. Then one more start of ours under `python -X importtime` lists what the app imports before serving:
torch, transformers, peft and datasets should not be among them (they load on first use).

    .venv/bin/python bench/startup.py                 # 5 rounds, about a minute
    .venv/bin/python bench/startup.py --rounds 1 --no-imports --out ''

The last line is the headline: median of the per-round ratios ours / hello (goal <= 1.5x).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    Report,
    child_env,
    loadavg,
    median,
    stop_process,
    table,
    wait_http,
)
from finetune.engines.world import free_port  # noqa: E402

PY = sys.executable
HEAVY = ("torch", "transformers", "peft", "datasets", "accelerate", "deepspeed", "bitsandbytes", "pandas", "gradio")


def command(which: str, port: int, runs_root: Path, importtime: bool = False) -> list[str]:
    pre = [PY, "-X", "importtime"] if importtime else [PY]
    if which == "ours":
        return [*pre, str(ROOT / "app.py"), "--port", str(port), "--runs-root", str(runs_root)]
    return [*pre, str(ROOT / "bench" / "hello_gradio.py"), "--port", str(port)]


def start_once(which: str, work: Path, timeout: float) -> dict[str, float]:
    port = free_port()
    log = open(work / f"{which}-{port}.log", "w", encoding="utf-8")
    t0 = time.time()
    proc = subprocess.Popen(
        command(which, port, work / "runs"), cwd=ROOT, env=child_env(FINETUNE_STUDIO_HOME=str(work / "home")),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        page = wait_http(f"http://127.0.0.1:{port}/", timeout, proc) - t0
        c0 = time.time()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=30) as response:
            size = len(response.read())
        config = time.time() - t0
        return {"page": page, "config": config, "config_fetch": time.time() - c0, "config_kb": size / 1024}
    except Exception:
        log.flush()
        print((work / f"{which}-{port}.log").read_text(encoding="utf-8")[-3000:], file=sys.stderr)
        raise
    finally:
        stop_process(proc)
        log.close()


def imports_of_ours(work: Path, timeout: float) -> tuple[list[list[object]], list[str]]:
    """Top-level imports of the app process before it serves, by cumulative time (from -X importtime)."""
    port = free_port()
    err = open(work / "importtime.log", "w", encoding="utf-8")
    proc = subprocess.Popen(
        command("ours", port, work / "runs", importtime=True), cwd=ROOT,
        env=child_env(FINETUNE_STUDIO_HOME=str(work / "home")), stdout=subprocess.DEVNULL, stderr=err,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout, proc)
    finally:
        stop_process(proc)
        err.close()
    cumulative: dict[str, int] = {}
    for line in (work / "importtime.log").read_text(encoding="utf-8").splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not cum.isdigit():
            continue
        top = name.split(".")[0]
        depth = len(name) - len(name.lstrip())
        if depth <= 2 or top in HEAVY:  # top-level imports, plus the first import of each heavy package
            cumulative.setdefault(top, 0)
            cumulative[top] = max(cumulative[top], int(cum))
    rows = sorted(cumulative.items(), key=lambda kv: -kv[1])
    listed = [[name, us / 1e6, "yes" if name in HEAVY else ""] for name, us in rows[:12]]
    absent = [name for name in HEAVY if name not in cumulative]
    return listed, absent


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for a page")
    parser.add_argument("--no-imports", action="store_true", help="skip the -X importtime listing")
    parser.add_argument("--out", default=str(RESULTS), help="results folder or .md file; '' = do not save")
    args = parser.parse_args(argv)

    report = Report("startup")
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        report.print(f"load average before: {loadavg()}")
        ours, hello = [], []
        for i in range(args.rounds):
            order = ("ours", "hello") if i % 2 == 0 else ("hello", "ours")
            for which in order:
                r = start_once(which, work, args.timeout)
                (ours if which == "ours" else hello).append(r)
                print(f"  round {i + 1} {which:5s}: page {r['page']:.2f}s, config {r['config']:.2f}s", flush=True)
        rows = [
            [i + 1, o["page"], h["page"], o["page"] / h["page"], o["config"], h["config"], o["config"] / h["config"]]
            for i, (o, h) in enumerate(zip(ours, hello, strict=False))
        ]
        report.print()
        report.print(
            table(
                [
                    "round",
                    "ours page s",
                    "hello page s",
                    "page ratio",
                    "ours +config s",
                    "hello +config s",
                    "config ratio",
                ],
                rows,
            )  # fmt: skip
        )
        report.print(
            f"/config size: ours {median([o['config_kb'] for o in ours]):.0f} KB, "
            f"hello {median([h['config_kb'] for h in hello]):.0f} KB; fetch ours "
            f"{median([o['config_fetch'] for o in ours]) * 1000:.0f} ms, hello "
            f"{median([h['config_fetch'] for h in hello]) * 1000:.0f} ms"
        )
        if not args.no_imports:
            report.print()
            report.print("what ours imports before serving (cumulative seconds under -X importtime, inflated):")
            listed, absent = imports_of_ours(work, args.timeout)
            report.print(table(["top-level module", "seconds", "heavy"], listed))
            report.print(f"not imported before serving: {', '.join(absent) or 'none'}")
        report.print(f"load average after: {loadavg()}")
        ratio = median([r[3] for r in rows])
        ok = "meets" if ratio <= 1.5 else "MISSES"
        headline = (
            f"startup: first page ours {median([o['page'] for o in ours]):.2f}s vs hello-world Gradio "
            f"{median([h['page'] for h in hello]):.2f}s = {ratio:.2f}x (goal <= 1.5) [{ok}; median of "
            f"{args.rounds} rounds]"
        )
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
