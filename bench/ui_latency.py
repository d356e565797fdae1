"""Responsiveness during training: the app's status refresh and chat latency, and what UI polling costs training.

Starts `app.py` (a fresh process, its own runs folder), then drives it only through its HTTP API: `/start` with the
run's settings, the page's own poll (`page_status`: the Train tab's gr.Timer tick, which reads the in-memory state and
redraws only on change; with `--poll-with client`, the documented `/status` through `gradio_client`) and `/chat`
(the streaming reply).

Runs, each a fresh training run of the same LoRA job (random Llama with the real tokenizer, 128-token rows):
  A  no UI traffic (the bench reads status.json from disk) - the baseline training speed
  B  one page polling /status once a second, as the Timer does (`--pollers` pages)
  C  polling plus a chat request every few seconds (base model, greedy, `--chat-tokens` tokens)
A and B alternate (`--pairs`); C runs once. Training speed is in-loop tokens/s from events.jsonl step timestamps.

    .venv/bin/python bench/ui_latency.py                     # about 5 minutes here
    .venv/bin/python bench/ui_latency.py --tokenizer tiny --hidden 64 --layers 2 --steps 6 --pairs 1 --out ''

The last line is the headline: status p95 (goal <= 150 ms) and the slowdown from polling (goal <= 3%).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    CpuSampler,
    Report,
    build_llama,
    child_env,
    load_tokenizer,
    loadavg,
    median,
    percentile,
    stop_process,
    table,
    wait_http,
    write_rows,
)
from finetune.engines.world import free_port  # noqa: E402


def form_values(args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    """The run's settings as the API takes them ({field: value}; the defaults fill in the rest)."""
    return dict(
        model=str(model), dataset=str(data), eval_split="", max_seq_length=args.seq,
        per_device_train_batch_size=args.batch, max_steps=args.steps, logging_steps=1,
        save_steps=args.steps + 1000, packing=False, method="lora",
    )  # fmt: skip


def newest_run(runs: Path, known: set[str]) -> Path:
    deadline = time.time() + 60
    while time.time() < deadline:
        fresh = [p for p in runs.iterdir() if p.is_dir() and p.name not in known] if runs.is_dir() else []
        if fresh:
            return max(fresh, key=lambda p: p.stat().st_mtime)
        time.sleep(0.1)
    raise TimeoutError("the started run's folder did not appear")


def status_of(run: Path) -> dict[str, Any]:
    """The run's status.json; a run that fails before its first step has its folder removed: that reads 'failed'."""
    if not run.is_dir():
        return {"status": "failed", "error": "the run failed before its first step (its folder was removed)"}
    try:
        return json.loads((run / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def wait_status(run: Path, wanted: tuple[str, ...], timeout: float) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = status_of(run)
        if status.get("status") in wanted or status.get("status") == "failed":
            return status
        time.sleep(0.2)
    raise TimeoutError(f"run {run.name} did not reach {'/'.join(wanted)} within {timeout:.0f}s")


def loop_window(run: Path, skip: int) -> tuple[int, float, float]:
    """(steps, start, end): the timed part of the loop, from the end of step `skip` to the end of the last step."""
    events = [json.loads(line) for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    steps = [(e["step"], e["time"]) for e in events if e["type"] == "log"]
    first = next(s for s in steps if s[0] >= max(1, skip))
    last = steps[-1]
    return last[0] - first[0], first[1], last[1]


class App:
    """The app process and one API client per simulated page."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from gradio_client import Client

        self.port = free_port()
        self.runs = work / "runs"
        threads = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)} if args.threads else {}
        self.log = open(work / "app.log", "w", encoding="utf-8")
        app_args = ["--port", str(self.port), "--runs-root", str(self.runs)]
        if args.switch_interval:
            # Evaluating a fix: a shorter GIL switch interval for the app process (not what app.py does today).
            code = (
                f"import runpy, sys; sys.setswitchinterval({args.switch_interval}); "
                f"sys.argv = ['app.py', *{app_args!r}]; runpy.run_path('app.py', run_name='__main__')"
            )
            cmd = [sys.executable, "-c", code]
        else:
            cmd = [sys.executable, str(ROOT / "app.py"), *app_args]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env(FINETUNE_STUDIO_HOME=str(work / "home"), **threads),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.cpu = CpuSampler(self.proc.pid, 0.05)
        self.url = f"http://127.0.0.1:{self.port}/"
        wait_http(self.url, 180, self.proc)
        self.client_cls = Client
        self.poll_with = args.poll_with
        self.main = self.client()

    def client(self) -> Any:
        return self.client_cls(self.url, verbose=False)

    def page(self) -> Any:
        """A polling page: the browser protocol (default) or a gradio_client session (--poll-with client)."""
        return RawPage(self.url, "page_status") if self.poll_with == "raw" else self.client()

    def close(self) -> None:
        self.cpu.stop()
        stop_process(self.proc)
        self.log.close()


def timed_status(client: Any) -> float:
    t = time.perf_counter()
    client.predict(api_name="/status")
    return (time.perf_counter() - t) * 1000


class RawPage:
    """Calls an endpoint the way the page's JavaScript does: POST queue/join, then read the SSE stream to the end.

    gradio_client adds about 60 ms of its own per call (its job thread and polling); a browser does not, so the
    status latency a user sees is measured with this. One instance = one browser tab (one session).
    """

    def __init__(self, url: str, api_name: str) -> None:
        import uuid

        import httpx

        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=60)
        config = self.http.get("/config").json()
        self.prefix = (config.get("api_prefix") or "/gradio_api").rstrip("/")
        dep = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
        self.fn_index, self.n_inputs = dep["id"], len(dep["inputs"])
        self.session = uuid.uuid4().hex[:11]

    def call(self, data: list[Any] | None = None) -> float:
        """One request; returns its latency in ms."""
        payload = {
            "data": data if data is not None else [None] * self.n_inputs,
            "fn_index": self.fn_index,
            "session_hash": self.session,
            "event_data": None,
            "trigger_id": None,
        }
        t = time.perf_counter()
        self.http.post(f"{self.prefix}/queue/join", json=payload).raise_for_status()
        with self.http.stream("GET", f"{self.prefix}/queue/data", params={"session_hash": self.session}) as stream:
            for line in stream.iter_lines():
                if "process_completed" in line:
                    if '"success":false' in line.replace(" ", ""):
                        raise RuntimeError(f"request failed: {line[:300]}")
                    break
        return (time.perf_counter() - t) * 1000


def timed_chat(client: Any, args: argparse.Namespace, values: dict[str, Any], message: str) -> dict[str, float]:
    """One chat request; time to the first streamed update that holds reply text, and to the end (ms)."""
    t0 = time.perf_counter()
    job = client.submit(message, "base", None, values, args.chat_tokens, api_name="/chat")
    first = None
    for update in job:
        if first is None and isinstance(update, str) and update:
            first = time.perf_counter() - t0
    job.result()  # a refusal raises here, in one line
    total = time.perf_counter() - t0
    return {"first": (first or total) * 1000, "total": total * 1000}


def train_once(
    app: App, args: argparse.Namespace, values: dict[str, Any], mode: str, tokens_per_step: int
) -> dict[str, Any]:
    """Start a run through /start and follow it to the end; `mode` A (quiet), B (polling) or C (polling + chat)."""
    # Pages open before the run starts (client set-up is not measured); each is one session, as a browser tab.
    poll_clients = [app.page() for _ in range(args.pollers)] if mode in ("B", "C") else []
    chat_client = app.client() if mode == "C" else None
    known = {p.name for p in app.runs.iterdir()} if app.runs.is_dir() else set()
    result = app.main.predict(values, api_name="/start")  # a refusal raises, in one line
    if not result.get("run"):
        raise RuntimeError(f"/start did not start a run: {result}")
    run = newest_run(app.runs, known)
    status_ms: list[float] = []
    poll_times: list[float] = []
    chats: list[dict[str, float]] = []
    done = threading.Event()

    def poller(client: Any) -> None:
        tick = time.perf_counter()
        while not done.is_set():
            poll_times.append(time.time())
            status_ms.append(client.call() if isinstance(client, RawPage) else timed_status(client))
            tick += args.interval
            time.sleep(max(0.0, tick - time.perf_counter()))

    def chatter() -> None:
        n = 0
        while True:  # at least one request, then one every chat_every seconds until training ends
            chats.append(timed_chat(chat_client, args, values, f"Tell me a short sea story number {n}."))
            n += 1
            if done.wait(args.chat_every):
                return

    workers = [threading.Thread(target=poller, args=(c,), daemon=True) for c in poll_clients]
    if mode == "C":
        # Chat once training is under way, so every reply is generated while steps run.
        wait_status(run, ("running", "completed"), args.timeout)
        workers.append(threading.Thread(target=chatter, daemon=True))
    for w in workers:
        w.start()
    try:
        wait_status(run, ("completed", "stopped"), args.timeout)
    finally:
        done.set()
    for w in workers:
        w.join(timeout=120)
    status = status_of(run)
    if status.get("status") != "completed":
        raise RuntimeError(f"run {run.name} ended {status.get('status')}: {status.get('error')}")
    n, start, end = loop_window(run, args.skip)
    cpu = app.cpu.cpu_at(end) - app.cpu.cpu_at(start)
    return {
        "tps": n * tokens_per_step / (end - start),
        "cpu_per_step": cpu / n,
        "loop_polls": sum(1 for t in poll_times if start <= t <= end),
        "loop_steps": n,
        "status_ms": status_ms,
        "chats": chats,
    }


def hello_floor(work: Path, n: int) -> dict[str, list[float]]:
    """Latency of a trivial endpoint of a hello-world Gradio app through the same client: the floor."""
    from gradio_client import Client

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "hello_gradio.py"), "--port", str(port)],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, 180, proc)
        client = Client(url, verbose=False)
        page = RawPage(url, "greet")
        out: dict[str, list[float]] = {"raw": [], "client": []}
        for _ in range(n):
            out["raw"].append(page.call(["you"]))
            t = time.perf_counter()
            client.predict("you", api_name="/greet")
            out["client"].append((time.perf_counter() - t) * 1000)
        return out
    finally:
        stop_process(proc)


def handler_cost(lengths: list[int], work: Path, reps: int = 5) -> list[list[Any]]:
    """In-process cost of the Train tab's redraw (`TrainTab.render`) against the length of the run's event log: it
    re-reads and re-parses all of events.jsonl on every redraw (once per new step while a page is open)."""
    from finetune.config import TrainConfig
    from finetune.runs.rundir import RunDir
    from finetune.studio import Studio
    from ui.train_tab import TrainTab

    rows = []
    for n in lengths:
        root = work / f"handler-{n}"
        run = RunDir(root / "run-1")
        run.path.mkdir(parents=True)
        run.write_config(TrainConfig())
        run.write_status({"run_id": "run-1", "status": "completed", "step": n, "max_steps": n, "pid": 0})
        now = time.time()
        with open(run.events_path, "w", encoding="utf-8") as fh:
            for step in range(1, n + 1):
                fh.write(
                    json.dumps(
                        {
                            "time": now,
                            "type": "log",
                            "step": step,
                            "loss": 2.0 - step / (n + 1),
                            "learning_rate": 5e-4,
                            "grad_norm": 0.5,
                            "epoch": step / n,
                        }
                    )
                    + "\n"
                )
                if step % 100 == 0 or step == 1:
                    answers = [{"prompt": f"prompt {k}", "answer": "arr " * 30} for k in range(3)]
                    fh.write(json.dumps({"time": now, "type": "samples", "step": step, "samples": answers}) + "\n")
        tab = TrainTab(Studio(runs_root=root))
        tab.render("run-1")
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            tab.render("run-1")
            times.append((time.perf_counter() - t) * 1000)
        rows.append([n, run.events_path.stat().st_size / 1024, median(times)])
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--skip", type=int, default=2, help="steps left out of in-loop tokens/s")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokenizer", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument("--pairs", type=int, default=2, help="alternating quiet / polling run pairs")
    parser.add_argument("--pollers", type=int, default=1, help="pages polling /status at once")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls (the gr.Timer: 1 s)")
    parser.add_argument("--idle-polls", type=int, default=20, help="/status calls before any training (the floor)")
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--chat-every", type=float, default=2.0, help="seconds between chat requests in run C")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads of the app (0 = torch's default)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one training run may take")
    parser.add_argument(
        "--poll-with",
        choices=("raw", "client"),
        default="raw",
        help="how pages poll /status: raw = the browser's protocol (queue/join + SSE), client = gradio_client",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="start the app with sys.setswitchinterval(S) (a candidate fix for GIL waits; 0 = Python's default 5 ms)",
    )
    parser.add_argument(
        "--log-lengths", default="100,1000,10000",
        help="event-log lengths (steps) for the in-process redraw cost table; '' to skip",
    )  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS), help="results folder or .md file; '' = do not save")
    args = parser.parse_args(argv)

    report = Report("ui_latency")
    work = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    app = None
    try:
        tokenizer = load_tokenizer(args.tokenizer, work)
        model = build_llama(work / "model", tokenizer, layers=args.layers, hidden=args.hidden)
        data = write_rows(work / "rows.jsonl", args.steps * args.batch, words=max(40, args.seq * 2))
        values = form_values(args, model, data)
        tokens_per_step = args.batch * args.seq
        report.print(
            f"job: LoRA on a random {args.layers}-layer hidden-{args.hidden} Llama ({args.tokenizer} tokenizer), "
            f"batch {args.batch} x {args.seq} tokens, {args.steps} steps per run; {args.pollers} page(s) polling "
            f"/status every {args.interval:g}s; chat {args.chat_tokens} tokens greedy every {args.chat_every:g}s "
            f"in run C; app threads {args.threads or 'torch default'}; GIL switch interval "
            f"{args.switch_interval or 0.005:g}s"
        )
        report.print(f"load average before: {loadavg()}")
        t = time.time()
        app = App(args, work)
        report.print(f"app up in {time.time() - t:.1f}s")
        idle_page = RawPage(app.url, "page_status")
        idle = [idle_page.call() for _ in range(args.idle_polls)]
        idle_client = [timed_status(app.main) for _ in range(args.idle_polls)]
        floor = hello_floor(work, args.idle_polls) if args.idle_polls else {"raw": [], "client": []}
        warm = timed_chat(app.client(), args, values, "Hello!")  # the first chat loads the model
        report.print(f"first chat (loads the model): {warm['total']:.0f} ms")

        quiet, polled = [], []
        for i in range(args.pairs):
            for mode in ("A", "B") if i % 2 == 0 else ("B", "A"):
                r = train_once(app, args, values, mode, tokens_per_step)
                (quiet if mode == "A" else polled).append(r)
                print(f"  pair {i + 1} run {mode}: {r['tps']:.0f} tok/s, {len(r['status_ms'])} polls, "
                      f"load {loadavg()[0]}", flush=True)  # fmt: skip
        c = train_once(app, args, values, "C", tokens_per_step)
        print(f"  run C: {c['tps']:.0f} tok/s, {len(c['chats'])} chats, load {loadavg()[0]}", flush=True)

        status_b = [ms for r in polled for ms in r["status_ms"]]
        status_c = c["status_ms"]
        chat_first = [x["first"] for x in c["chats"]]
        chat_total = [x["total"] for x in c["chats"]]
        how = "browser protocol" if args.poll_with == "raw" else "gradio_client"
        rows = [
            ["hello-world /greet, idle, browser protocol", len(floor["raw"]), median(floor["raw"]),
             percentile(floor["raw"], 95), max(floor["raw"], default=float("nan"))],
            ["hello-world /greet, idle, gradio_client", len(floor["client"]), median(floor["client"]),
             percentile(floor["client"], 95), max(floor["client"], default=float("nan"))],
            ["/status, idle, browser protocol", len(idle), median(idle), percentile(idle, 95), max(idle, default=0)],
            ["/status, idle, gradio_client", len(idle_client), median(idle_client), percentile(idle_client, 95),
             max(idle_client, default=0)],
            [f"/status during training (B), {how}", len(status_b), median(status_b), percentile(status_b, 95),
             max(status_b, default=float("nan"))],
            [f"/status during training + chat (C), {how}", len(status_c), median(status_c), percentile(status_c, 95),
             max(status_c, default=float("nan"))],
            ["/chat first text during training (C), gradio_client", len(chat_first), median(chat_first),
             percentile(chat_first, 95), max(chat_first, default=float("nan"))],
            ["/chat whole reply during training (C), gradio_client", len(chat_total), median(chat_total),
             percentile(chat_total, 95), max(chat_total, default=float("nan"))],
        ]  # fmt: skip
        report.print()
        report.print(table(["request", "n", "p50 ms", "p95 ms", "max ms"], rows))
        slowdowns = [q["tps"] / p["tps"] - 1 for q, p in zip(quiet, polled, strict=False)]
        report.print()
        report.print(
            table(
                ["pair", "quiet tok/s (A)", "polled tok/s (B)", "slowdown"],
                [
                    [i + 1, q["tps"], p["tps"], f"{s:+.1%}"]
                    for i, (q, p, s) in enumerate(zip(quiet, polled, slowdowns, strict=False))
                ],
            )
        )
        cpu_a = median([q["cpu_per_step"] for q in quiet])
        cpu_b = median([p["cpu_per_step"] for p in polled])
        polls = sum(p["loop_polls"] for p in polled) / max(1, sum(p["loop_steps"] for p in polled))
        report.print(
            f"app CPU per training step: quiet {cpu_a:.3f}s, polled {cpu_b:.3f}s; {polls:.2f} polls per step -> "
            f"about {(cpu_b - cpu_a) / polls * 1000 if polls else float('nan'):.0f} ms of app CPU per /status poll"
        )
        chat_slow = 1 - c["tps"] / median([q["tps"] for q in quiet])
        report.print(f"training while chatting (C): {c['tps']:.0f} tok/s, {chat_slow:.0%} slower than quiet "
                     "(expected: generation and training share the CPU)")  # fmt: skip
        lengths = [int(x) for x in args.log_lengths.split(",") if x.strip()]
        if lengths:
            report.print()
            report.print("Train tab redraw (TrainTab.render, in-process, no HTTP) against the run's length:")
            report.print(table(["logged steps", "events.jsonl KB", "render ms (median)"], handler_cost(lengths, work)))
        report.print(f"load average after: {loadavg()}")
        p95 = percentile(status_b, 95)
        slowdown = median(slowdowns)
        ok = "meets" if p95 <= 150 and slowdown <= 0.03 else "MISSES"
        headline = (
            f"ui latency: /status p50 {median(status_b):.0f} ms, p95 {p95:.0f} ms during training "
            f"({how}; goal <= 150); slowdown from polling {slowdown:+.1%} (goal <= 3%); chat first text p50 "
            f"{median(chat_first):.0f} ms during training [{ok}]"
        )
        saved = report.save(args.out, headline)
        if saved:
            print(f"saved {saved}")
        print(headline, flush=True)
        return headline
    except Exception:
        if (work / "app.log").is_file():
            print((work / "app.log").read_text(encoding="utf-8")[-4000:], file=sys.stderr)
        raise
    finally:
        if app is not None:
            app.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
