"""An optional judge: another causal LM compares the base model's and the tuned model's answers to the same prompts.

Pairwise, with the rubric stated in the prompt, in both orders (position swap: answer A is the base's, then the
tuned model's), ties allowed. The judge's verdict is the word among A / B / tie its next token makes most likely
(no sampling: the same answers get the same verdict). Per prompt: both orders agree → that verdict; one says tie →
the other's; they contradict each other (each picks the same position) → a tie, counted as inconsistent.
`judge_win_rate` = (tuned wins + ties / 2) / prompts, with its 95% Wilson interval.

The judge loads as chat loads a base model, by a plan made from the run's own (`RunPlan.replanned`: the same device
and precision, the judge's model, LoRA's base: 16-bit weights on a GPU, fp32 on a CPU). Before it loads, its memory is
estimated from its config (the parameter count of the memory estimator's census, in the dtype it loads in, plus one
forward's logits) and compared with what is free here: a judge that does not fit is refused in one line. A small judge
is a weak one, and the result says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from finetune.errors import UserError
from finetune.evaluation.metrics import wilson_interval

if TYPE_CHECKING:
    from finetune.plan import RunPlan

RUBRIC = (
    "You compare two answers to the same question. The better answer is correct, does what the question asks, and "
    "is clear and fluent; length alone is no merit. If neither answer is better, the verdict is a tie."
)
TEMPLATE = (
    "{rubric}\n\nQuestion: {question}\n\nAnswer A: {a}\n\nAnswer B: {b}\n\n"
    "Which answer is better? Reply with one word: A, B or tie."
)
VERDICT_WORDS = {"A": ("A", " A"), "B": ("B", " B"), "tie": ("tie", " tie", "Tie", " Tie")}
JUDGE_TOKENS = 2048  # the longest judging prompt the estimate allows for (its logits are the largest tensor)
STRONG_JUDGE_PARAMETERS = 7e9  # below this, judges follow position and length more than quality
SMALL_JUDGE = (
    "a small judge is a weak one: models this size often follow an answer's position or length rather than its "
    "quality, so read the win rate as a hint and look at the answers"
)
ANY_JUDGE = "an automatic judge can be wrong: look at the answers too"


@dataclass(frozen=True)
class JudgeFit:
    """The judge's estimated memory against what is free where it would load."""

    model: str
    parameters: int
    estimate_bytes: int
    available_bytes: int
    device: str
    plan: RunPlan  # how the judge loads


def plan_of(model: str, run_plan: RunPlan) -> RunPlan:
    """How the judge `model` loads: the run's plan for that model as a LoRA base (no 4-bit, default adapter targets,
    which a census counts on), on the run's device and precision."""
    from finetune.config import TrainConfig

    defaults = TrainConfig()
    try:
        return run_plan.replanned(
            model=model,
            method="lora",
            lora_target_modules=defaults.lora_target_modules,
            init_lora_weights=defaults.init_lora_weights,
        )
    except Exception as exc:  # the config's own one-line reason (a model value it refuses)
        raise UserError(f"judge: {str(exc).splitlines()[0].split(': ', 1)[-1]}", field="judge") from None


def check_fits(plan: RunPlan) -> JudgeFit:
    """The judge's memory estimate, or a one-line refusal when it cannot be read or would not fit here."""
    from finetune import memory
    from finetune.memory import analytic

    model = plan.config.model
    try:
        model_config = memory.model_config_of(plan.config)
        parameters = analytic.census(model_config, plan).total
    except UserError as exc:
        raise UserError(f"judge: {str(exc).split(': ', 1)[-1]}", field="judge") from None
    weight_bytes = 2 if plan.weight_dtype in ("bfloat16", "float16") else 4
    logits = JUDGE_TOKENS * int(getattr(model_config, "vocab_size", 0) or 0) * 4
    estimate = int((parameters * weight_bytes + logits) * 1.1)
    device = plan.placement()
    if device == "cuda":
        estimate += memory.CUDA_CONTEXT + memory.CUDA_KERNELS
    available = available_bytes(device)
    fit = JudgeFit(model, parameters, estimate, available, device, plan)
    if estimate > available:
        raise UserError(
            f"judge: {model} needs about {_gib(estimate)} GiB to judge here and {_gib(available)} GiB are free on "
            f"the {'GPU' if device == 'cuda' else 'CPU'}; choose a smaller judge",
            field="judge",
        )
    return fit


def available_bytes(device: str) -> int:
    """Memory free for a new model: the GPU's free memory, or the machine's available RAM."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    import psutil

    return int(psutil.virtual_memory().available)


def judge(
    fit: JudgeFit,
    questions: list[str],
    base_answers: list[str],
    tuned_answers: list[str],
    tick: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Both orders for every question; the win rate of the tuned model with its interval, and how it was made."""
    from finetune.model import loading

    plan = fit.plan
    tokenizer = loading.load_tokenizer(plan.config)
    model = loading.load_base(plan).eval()
    if plan.placement() == "cuda":  # (never 4-bit: plan_of plans LoRA's base)
        model = model.to("cuda")
    choices = {verdict: _token_ids(tokenizer, words) for verdict, words in VERDICT_WORDS.items()}
    outcomes = []
    for question, base, tuned in zip(questions, base_answers, tuned_answers, strict=True):
        first = _verdict(model, tokenizer, choices, question, base, tuned)  # A is the base
        second = _verdict(model, tokenizer, choices, question, tuned, base)  # A is the tuned model
        outcomes.append(
            combine({"A": "base", "B": "tuned"}.get(first, "tie"), {"A": "tuned", "B": "base"}.get(second, "tie"))
        )
        if tick is not None:
            tick(1)
    return summary(fit, outcomes)


def combine(first: str, second: str) -> tuple[str, bool]:
    """One prompt's result from its two orders' verdicts ("tuned", "base" or "tie" each), and whether they agree."""
    if first == second:
        return first, True
    if "tie" in (first, second):
        return (second if first == "tie" else first), False
    return "tie", False  # each order picked the answer in the same position: position, not quality


def summary(fit: JudgeFit, outcomes: list[tuple[str, bool]]) -> dict[str, Any]:
    """The judge's result as the evaluation stores it."""
    n = len(outcomes)
    wins = sum(1 for verdict, _ in outcomes if verdict == "tuned")
    ties = sum(1 for verdict, _ in outcomes if verdict == "tie")
    rate = (wins + ties / 2) / n if n else 0.0
    low, high = wilson_interval(wins + ties / 2, n)
    return {
        "model": fit.model,
        "parameters": fit.parameters,
        "rubric": RUBRIC,
        "prompts": n,
        "wins": wins,
        "ties": ties,
        "losses": n - wins - ties,
        "consistent": sum(1 for _, agree in outcomes if agree) / n if n else 0.0,
        "judge_win_rate": rate,
        "interval": [low, high],
        "note": SMALL_JUDGE if fit.parameters < STRONG_JUDGE_PARAMETERS else ANY_JUDGE,
    }


def _verdict(model: Any, tokenizer: Any, choices: dict[str, list[int]], question: str, a: str, b: str) -> str:
    """The verdict word the judge's next token makes most likely, for answer A = `a` and B = `b`."""
    import torch

    from finetune.model.inference import prompt_text

    text = prompt_text(
        tokenizer, TEMPLATE.format(rubric=RUBRIC, question=question, a=a or "(no answer)", b=b or "(no answer)")
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, -JUDGE_TOKENS:]
    with torch.no_grad():
        logits = model(input_ids=ids.to(next(model.parameters()).device)).logits[0, -1].float()
    return max(choices, key=lambda verdict: max(float(logits[i]) for i in choices[verdict]))


def _token_ids(tokenizer: Any, words: tuple[str, ...]) -> list[int]:
    """The first token of each spelling of a verdict word."""
    ids = {tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in words}
    return sorted(ids)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"
