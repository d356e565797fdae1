"""The terminal side of the sub-commands: following a run (the progress bar, Ctrl-C as a clean stop, the closing
summary line), shared by `train` and `launch --follow`; the progress line of `eval`; stage messages on stderr."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any


def follow(manager: Any, show_bar: bool) -> Any:
    """Poll the run, draw a terminal progress bar, and turn Ctrl-C into a clean stop (checkpoint saved)."""
    from tqdm import tqdm

    stops = {"n": 0}

    def on_sigint(signum: int, frame: Any) -> None:
        stops["n"] += 1
        if stops["n"] > 1:
            raise KeyboardInterrupt
        print("\nstopping after this step (saving a checkpoint); Ctrl-C again to abort", file=sys.stderr)
        manager.stop()

    previous = signal.signal(signal.SIGINT, on_sigint)
    bar = None
    seen_messages: set[str] = set()
    try:
        while manager.is_active():
            state = manager.state()
            if state and state.message and state.message not in seen_messages and show_bar:
                seen_messages.add(state.message)
                (bar.write if bar else print)(f"[{state.status}] {state.message}")
            if show_bar and state and state.status == "running" and state.max_steps:
                if bar is None:
                    bar = tqdm(
                        total=state.max_steps,
                        initial=state.step,
                        unit="step",
                        dynamic_ncols=True,
                        mininterval=1,
                        disable=False,  # the CLI sets TQDM_DISABLE for the libraries' bars; this one is ours
                    )
                if bar.n != state.step:
                    bar.set_postfix_str(_postfix(state), refresh=False)
                    bar.update(state.step - bar.n)
            manager.wait(0.2)  # returns as soon as the run ends
        state = manager.state()
        if bar is not None and state:
            bar.set_postfix_str(_postfix(state), refresh=False)
            bar.update(state.step - bar.n)
            bar.close()
        return state
    finally:
        signal.signal(signal.SIGINT, previous)


def _postfix(state: Any) -> str:
    parts = []
    if state.loss is not None:
        parts.append(f"loss={state.loss:.3f}")
    if state.eval_loss is not None:
        parts.append(f"eval={state.eval_loss:.3f}")
    if state.tokens_per_second:
        parts.append(f"{state.tokens_per_second:.0f} tok/s")
    return " ".join(parts)


def summary_line(state: Any, manager: Any) -> str:
    """One closing line: status, steps, time, losses and where the result is."""
    if state is None:
        return "no run"
    if state.status == "failed":
        advice = f" — {state.advice}" if state.advice else ""
        return f"failed: {state.error}{advice}"
    took = (state.finished_at or time.time()) - (state.started_at or time.time())
    losses = f", loss {state.loss:.4f}" if state.loss is not None else ""
    evals = f", eval loss {state.eval_loss:.4f}" if state.eval_loss is not None else ""
    return f"{state.status}: step {state.step}/{state.max_steps} in {took:.0f}s{losses}{evals} → {state.run_dir}"


def to_stderr(message: str) -> None:
    """A stage message on stderr, at once (stdout keeps the command's result: a path, a URL)."""
    print(message, file=sys.stderr, flush=True)


class ProgressLine:
    """A plain progress line on stderr: rewritten in place on a terminal, one line per stage elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.shown = ""

    def __call__(self, fraction: float, text: str) -> None:
        line = f"[{fraction:4.0%}] {text}"
        if self.tty:
            sys.stderr.write("\r" + line.ljust(len(self.shown)))
            sys.stderr.flush()
        elif text.endswith(" 0/" + text.rsplit("/", 1)[-1]) or text == "done":
            print(line, file=sys.stderr, flush=True)
        self.shown = line

    def close(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
