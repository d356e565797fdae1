"""The documented API: one named endpoint per thing a person does, with stable parameter names, plain JSON answers and
one-line refusals (an API client gets `AppError: <the line>`; an MCP client the same text as the tool's error).

    from gradio_client import Client, handle_file
    app = Client(url, auth=("alice", "pw1"))                      # Space: Client(url, oauth_token="hf_…")
    data = app.predict(handle_file("mine.jsonl"), api_name="/upload")           # "upload:mine.jsonl"
    run = app.predict({"dataset": data, "max_steps": 20}, api_name="/start")["run"]
    app.predict(run, api_name="/status")["status"]                  # "running", …
    app.predict("Hello?", run, api_name="/chat")                    # the reply (streamed: app.submit)

Every endpoint that acts on a run takes it as `run`; `settings` is the Configure form as {field: value} (any subset;
the defaults fill in the rest). Each call acts for the visitor who makes it (ui/visitor.py), so a visitor's runs and
uploads are theirs alone: another visitor's run id gets the same refusal as one that does not exist. With `--mcp`
the same functions are the MCP server's tools (gradio's own: their docstrings are the tools' descriptions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.data_classes import FileData

from finetune import objectives
from finetune.errors import UserError
from finetune.studio import IMAGE_TAG, GenerationSettings, Studio
from ui.formatting import one_line
from ui.visitor import for_visitor

HIDDEN_STATE = ("run_dir", "pid")  # server paths and process ids are not a visitor's business


@contextmanager
def refusals() -> Iterator[None]:
    """Any error as one line for the client (`gr.Error`), never a traceback."""
    try:
        yield
    except gr.Error:
        raise
    except UserError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except Exception as exc:
        raise gr.Error(f"{type(exc).__name__}: {one_line(exc)}", print_exception=False) from None


@dataclasses.dataclass
class StudioAPI:
    """The endpoints, bound to the app's studio; each call acts for its own visitor."""

    studio: Studio

    def _for(self, request: gr.Request | None, oauth_token: gr.OAuthToken | None) -> Studio:
        return for_visitor(self.studio, request, oauth_token)

    # ----------------------------------------------------------------------------------------- data and settings
    def upload(self, file: FileData, request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> str:
        """Keep a data file (.jsonl, .json, .csv, .parquet) in your own uploads folder; or a .zip of image data (a
        data file with the pictures it names), unpacked into a folder of its own.

        Args:
            file: the file to upload (gradio_client: handle_file(path)).

        Returns:
            The value to give as the dataset (or eval_split) setting: upload:NAME, your upload's own name (a zip:
            upload:FOLDER/NAME, its data file).
        """
        with refusals():
            return self._for(request, oauth_token).add_uploads([_uploaded(file)])

    def estimate(
        self,
        settings: dict,
        device: str = "cuda",
        gpus: int = 1,
        gpu_gib: float | None = None,
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> dict:
        """Estimate the peak memory of one training step with these settings, and whether it fits.

        Args:
            settings: run settings as {field: value}, e.g. {"model": "HuggingFaceTB/SmolLM2-135M-Instruct"}; the
                defaults fill in the rest.
            device: "cuda" (a GPU) or "cpu".
            gpus: GPUs the run would use (per-GPU figures).
            gpu_gib: memory of one GPU in GiB, for the fit verdict and advice.

        Returns:
            The estimate: total_bytes, components, fits, advice, notes.
        """
        with refusals():
            studio = self._for(request, oauth_token)
            return studio.estimate(_form(settings), device=device, gpus=gpus, gpu_gib=gpu_gib).to_dict()

    def propose(
        self,
        settings: dict,
        goal: str = objectives.DEFAULT_GOAL,
        gpu_gib: float | None = None,
        gpus: int = 1,
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> dict:
        """Propose the settings to run: the Start tab's answer (and `python -m finetune propose --json`'s) for a
        model, data and goal on GPUs of a given size: the fastest settings that fit with headroom, the data kept
        whole where any combination can, the same effective batch; when nothing fits, the hardware that would.

        Args:
            settings: run settings as {field: value}, e.g. {"model": ..., "dataset": ...}; defaults fill in the rest.
            goal: "sft", "dpo", "grpo" or "classification" (a Start tab goal), or "orpo" or "kto".
            gpu_gib: memory of one GPU in GiB (none: this computer's CPU, without a fit verdict).
            gpus: how many such GPUs.

        Returns:
            settings (every field), fits, verdict, total_bytes, headroom_bytes, margin_bytes, rows_kept_whole,
            reasons, needed (when nothing fits) and the estimate.
        """
        with refusals():
            studio = self._for(request, oauth_token)
            values = {**_form(settings), **objectives.goal_settings(str(goal), given=settings)}
            device = "cuda" if gpu_gib else "cpu"
            return studio.propose(values, device=device, gpus=gpus, gpu_gib=gpu_gib).to_dict()

    def preview(
        self, settings: dict, n: int = 3, request: gr.Request = None, oauth_token: gr.OAuthToken | None = None
    ) -> dict:
        """The first examples of the data as the model will see them (what is trained and what is masked).

        Args:
            settings: run settings as {field: value}; dataset may be bundled:pirate, a Hub dataset id or upload:NAME.
            n: how many examples (1 to 50).

        Returns:
            format, rows, eval_rows and the examples.
        """
        with refusals():
            return self._for(request, oauth_token).preview_data(_form(settings), n=n)

    # ----------------------------------------------------------------------------------------- runs
    def start(
        self,
        settings: dict,
        processes: int = 1,
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> dict:
        """Start training a run with these settings (one run at a time on this machine); it belongs to you.

        Args:
            settings: run settings as {field: value}; the defaults fill in the rest.
            processes: processes (GPUs) to train with; more than one launches a process group.

        Returns:
            The new run's state; its run id is under "run".
        """
        with refusals():
            return _state(self._for(request, oauth_token).start(_form(settings), processes=processes))

    def status(self, run: str = "", request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> dict:
        """A run's state: status, step, max_steps, loss, eval_loss, eta_seconds, error, ...

        Args:
            run: the run id; empty: your run training now, else your newest run.

        Returns:
            The run's state ({} when you have no run).
        """
        with refusals():
            studio = self._for(request, oauth_token)
            live = studio.state()
            if not run:
                if live is not None and live.active:
                    return _state(live)
                mine = studio.runs()
                run = mine[0].run_id if mine else ""
                if not run:
                    return {}
            found = _summary(studio.summary(run))
            if live is not None and live.run_id == found["run"]:  # its live state (error, advice, eta …) on top
                return {**found, **_state(live)}
            return found

    def runs(self, request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> list:
        """Your runs, newest first (an admin: every run).

        Returns:
            One entry per run: run, status, step, max_steps, loss, model, method, objective, resumable, final.
        """
        with refusals():
            return [_summary(r) for r in self._for(request, oauth_token).runs()]

    def stop(self, run: str = "", request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> str:
        """Stop a run after its current step; it saves a checkpoint, so it can resume later.

        Args:
            run: the run id; empty: your run training now.

        Returns:
            What happens, in one line.
        """
        with refusals():
            if self._for(request, oauth_token).stop(run or None):
                return f"stopping {run or 'your run'}: the current step finishes and a checkpoint is saved"
            return "nothing of yours is training"

    def resume(self, run: str, request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> dict:
        """Continue a stopped, interrupted or failed run from its last checkpoint.

        Args:
            run: the run id.

        Returns:
            The run's state.
        """
        with refusals():
            return _state(self._for(request, oauth_token).resume(run))

    # ----------------------------------------------------------------------------------------- using a run
    def chat(
        self,
        message: str,
        run: str = "base",
        history: list | None = None,
        settings: dict | None = None,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        system_prompt: str = "",
        image: FileData | None = None,
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> Iterator[str]:
        """Talk to a run's tuned model, or to a base model; the reply streams. A vision-language model (or a run of
        one) also takes a picture with the message.

        Args:
            message: your message.
            run: a run id, "base" (the model in settings) or "base-of:RUN" (the model that run started from).
            history: the conversation so far, as [{"role": "user" | "assistant", "content": text}, ...].
            settings: for run "base": the settings whose model answers ({} : the default model).
            max_new_tokens: the longest reply, in tokens (1 to 1024).
            temperature: 0 answers the same every time; up to 2.
            top_p: with temperature above 0, sample only from the most likely words (above 0, at most 1).
            system_prompt: an instruction for the whole conversation.
            image: a picture sent with this message (gradio_client: handle_file(path)); it goes where the message
                says <image>, else before the text. Kept in your uploads like a data file.

        Returns:
            The reply so far, streamed.
        """
        with refusals():
            studio = self._for(request, oauth_token)
            images, form = [], _form(settings or {})
            if image is not None:
                images.append(studio.add_chat_image(run or "base", form, *_uploaded(image, "image", "images")))
                message = message if IMAGE_TAG in message else f"{IMAGE_TAG}\n{message}"
            conversation = [*(history or []), {"role": "user", "content": message}]
            options = GenerationSettings(
                max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, system_prompt=system_prompt
            )
            yield from studio.chat(run or "base", conversation, options, form, *([images] if images else []))

    def classify(
        self,
        run: str,
        text: str,
        text_pair: str = "",
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> dict:
        """Classify a text (or a pair of texts) with a sequence-classification run.

        Args:
            run: the run id.
            text: the text.
            text_pair: the second text, for pair tasks.

        Returns:
            {label: probability}, most likely first.
        """
        with refusals():
            answer = self._for(request, oauth_token).classify(run, text, text_pair)
            return {label: score for label, score in answer.scores}

    def evaluate(
        self,
        run: str,
        options: dict | None = None,
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> dict:
        """Score a run against its base model on held-out data (kept in the run's eval/ folder).

        Args:
            run: the run id; RUN@STEP for one of its checkpoints.
            options: {option: value}, any of: data (default: the run's evaluation split; bundled:NAME, a Hub id or
                upload:NAME), split, limit, max_new_tokens (64), base (false: also score the base model),
                temperature (0: greedy), lm_eval (task names, e.g. ["pirate_quiz"]), num_fewshot, judge (a model).

        Returns:
            The evaluation: rows, tuned and base scores, flags (what got worse than the base), notes, answers,
            lm_eval, judge, and file (its name in the run's eval/ folder).
        """
        with refusals():
            if options is not None and not isinstance(options, dict):
                raise UserError("options: give the evaluation options as {option: value}", "options")
            view = self._for(request, oauth_token).evaluate(run, options or {})
            return {**view.result, "file": view.file}

    def compare(self, runs: list, request: gr.Request = None, oauth_token: gr.OAuthToken | None = None) -> dict:
        """Two or more runs side by side: loss curves, latest evaluation scores, answers to the same prompts.

        Args:
            runs: two or more run ids.

        Returns:
            runs, metrics (one row per score, a value per run), curves ({step, loss, run}), answers, notes.
        """
        with refusals():
            return dataclasses.asdict(self._for(request, oauth_token).compare(list(runs or [])))

    def export(
        self,
        run: str,
        format: str = "gguf",  # noqa: A002 - the word a user knows; the API's parameter name
        quant: str = "q8_0",
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> str:
        """Export a finished run into its exports/ folder: "merged" (a standalone Transformers model), "gguf"
        (llama.cpp / Ollama, with a Modelfile) or "gguf-lora" (the LoRA adapter alone, for llama.cpp's --lora).

        Args:
            run: the run id.
            format: "merged", "gguf" or "gguf-lora".
            quant: GGUF weights: "f16" or "q8_0".

        Returns:
            What was written, in one line.
        """
        with refusals():
            gguf_quant = quant if str(format).startswith("gguf") else None
            result = self._for(request, oauth_token).export(run, format, gguf_quant)
            written = f"exports/{result.folder.name}/" + (result.main.name if result.main != result.folder else "")
            return f"wrote {written} ({result.size}) in run {run}"

    def publish(
        self,
        run: str,
        repo_id: str,
        token: str = "",
        private: bool = True,
        merged: bool = False,
        gguf: str = "no",
        request: gr.Request = None,
        oauth_token: gr.OAuthToken | None = None,
    ) -> str:
        """Push a finished run's adapter (or merged model) to the Hugging Face Hub with a model card.

        Args:
            run: the run id.
            repo_id: the repository, owner/name (created if it does not exist).
            token: your Hub write token (on a Space, your sign-in's token is used when this is empty).
            private: make a new repository private.
            merged: push the base model with the adapter merged in instead of the adapter.
            gguf: also push a GGUF: "no", "f16" or "q8_0".

        Returns:
            The repository's URL.
        """
        with refusals():
            studio = self._for(request, oauth_token)
            own = (token or "").strip() or (getattr(oauth_token, "token", None) or "").strip() or None
            also = None if not gguf or gguf == "no" else gguf
            return studio.push(run, (repo_id or "").strip(), own, bool(private), bool(merged), gguf=also)

    @property
    def endpoints(self) -> list:
        """Every endpoint, in the order docs/api.md lists them."""
        return [
            self.upload,
            self.estimate,
            self.propose,
            self.preview,
            self.start,
            self.status,
            self.runs,
            self.stop,
            self.resume,
            self.chat,
            self.classify,
            self.evaluate,
            self.compare,
            self.export,
            self.publish,
        ]


# Quick answers never wait in a queue; a model at work (chat, classify) shares the page's one slot ("chat"); the
# rest wait their turn per endpoint (gradio's default: one at a time).
QUICK = ("upload", "start", "status", "runs", "stop", "resume")
MODEL_AT_WORK = ("chat", "classify")


def build(studio: Studio) -> StudioAPI:
    """Register the documented endpoints (inside the app's Blocks); each is named after its function."""
    api = StudioAPI(studio)
    for endpoint in api.endpoints:
        name = endpoint.__name__
        if name in QUICK:
            queueing: dict[str, Any] = {"concurrency_limit": None}
        elif name in MODEL_AT_WORK:
            queueing = {"concurrency_id": "chat", "concurrency_limit": 1}
        else:
            queueing = {}
        gr.api(endpoint, api_name=name, **queueing)
    return api


def _uploaded(file: Any, param: str = "file", field: str = "dataset") -> tuple[Path, str]:
    """(path in gradio's upload folder, the name it was sent with) of an uploaded file, the endpoint's `param`. A
    path anywhere else (a client can send any path as a file's) is refused: only what was uploaded is kept."""
    from gradio.utils import get_upload_folder

    if isinstance(file, dict):
        path, name = file.get("path"), file.get("orig_name")
    else:
        path, name = getattr(file, "path", file), getattr(file, "orig_name", None)
    if not isinstance(path, str) or not path:
        raise UserError(f"{param}: no file was uploaded", field)
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(get_upload_folder()).resolve()):
        raise UserError(f"{param}: send the file itself (gradio_client: handle_file(path))", field)
    return resolved, str(name or resolved.name)


def _form(settings: Any) -> dict[str, Any]:
    """The settings as the form sends them: the defaults with the given fields on top."""
    if not isinstance(settings, dict):
        raise UserError("settings: give the run settings as {field: value}", "config")
    return {**Studio.default_values(), **settings}


def _state(state: Any) -> dict[str, Any]:
    out = {k: v for k, v in state.to_dict().items() if k not in HIDDEN_STATE}
    out["run"] = out.pop("run_id", "")
    return out


def _summary(summary: Any) -> dict[str, Any]:
    out = dataclasses.asdict(summary)
    out["run"] = out.pop("run_id", "")
    return out
