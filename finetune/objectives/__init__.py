"""The objectives registry: one record per training objective, the one place that knows what each objective is.

A record says what a person reads (label, goal, card name), what data it reads (kind, columns), how a step is shaped
(sequences per example, the reference it compares against), which trainer runs it (TRL class and config, engine
module), which config fields apply, the estimator's terms, the metrics it logs and the scores an evaluation reports.
The run plan carries the record (`RunPlan.objective`); every other module asks the record, never tests an objective's
name (tests/test_architecture.py greps the source tree for that). Adding an objective is a record here, its engine
module and its estimator terms.

Light on purpose (no torch, no config import): `finetune.config` takes its choices and cross-field rules from here.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from finetune.data.kinds import DataKind
from finetune.errors import UserError

CAUSAL_LM = "causal_lm"
SEQUENCE_CLASSIFICATION = "sequence_classification"
TASKS = (CAUSAL_LM, SEQUENCE_CLASSIFICATION)

# Reference rules: what the objective compares the trained model against.
NO_REFERENCE = "none"
REFERENCE = "always"
REFERENCE_WHEN_BETA = "when beta > 0"  # a KL term weighted by beta: no reference at all when beta is 0

# A DPO config of older runs (every objective's config.yaml wrote it) is accepted for objectives without a loss choice.
LEGACY_LOSS = "rpo"

# Evaluation scores (finetune/evaluation/metrics.py defines and computes each one).
LOSS_METRICS = ("loss", "perplexity")  # the reference answers' likelihood on the tokens training counts
ANSWER_METRICS = ("exact_match", "rouge_l", "number_match")  # generated answers against the reference answers
REWARD_METRICS = ("reward_accuracy", "reward_margin")  # preference pairs, relative to the reference model (the base)
CLASSIFIER_METRICS = ("accuracy", "macro_f1")


@dataclass(frozen=True)
class Objective:
    """Everything about one objective that the rest of the project reads."""

    name: str  # the record's key (the `objective` value; `classification` is the sequence_classification task)
    objective: str  # the config's `objective` value that selects it
    task: str  # the config's `task` value that selects it
    label: str  # plain words for the Train tab: "preferences (DPO)"
    short: str  # in a run's title ("DPO"); empty for the plain objectives
    card_name: str  # the model card's row "Objective" (empty: no such row)
    card_tag: str  # the Hub tag of a published run
    card_phrase: str  # how the card's first line says it was trained ("" for the plain objectives)
    goal: str  # the Start tab's goal this objective belongs to (orpo and kto are preferences, like dpo)
    goal_label: str  # the Start tab's words for that goal (on the record that stands for it)
    data_kinds: tuple[DataKind, ...]  # the kinds of data it learns from, in the order detection tries them
    columns: tuple[str, ...]  # the data roles it reads
    engine: str = "hf_trainer"  # the module under finetune/engines/ that runs it (hf_trainer | preference | grpo)
    trainer: str = "transformers:Trainer"  # "module:Class" of the trainer
    trainer_config: str = "transformers:TrainingArguments"  # "module:Class" of its arguments
    fields: tuple[str, ...] = ()  # the objective-specific config fields that apply to it
    sequences: int = 1  # sequences per example in one forward pass (estimator)
    reference: str = NO_REFERENCE  # NO_REFERENCE | REFERENCE | REFERENCE_WHEN_BETA
    loss_kernel: str = "eager"  # how logits and loss are computed: eager (whole logits) | trl_chunked (fused head)
    fused_outputs: tuple[str, ...] = ()  # what TRL asks its fused log-prob head for (trl_chunked)
    sequential_batches: bool = False  # TRL reads the batches in data order (KTO's KL pairs neighbours)
    # What the Start tab writes into fields still at their defaults when this goal is chosen (a short CPU demo).
    goal_defaults: tuple[tuple[str, Any], ...] = ()
    # Estimator terms: how the replay shapes one step (`finetune.memory.trace`) and what the formulas add.
    # lm_loss (transformers' own) | paired_fused | paired_logits | unpaired_fused | scored_fused (answers only)
    replay: str = "lm_loss"
    kl_pass: bool = False  # a no-grad policy pass over mismatched prompt/answer pairs first (KTO's KL estimate)
    generation: bool = False  # each step first samples answers: the KV cache of the generation batch (GRPO)
    disables_dropout: bool = False  # its TRL trainer turns dropout off (TRL's default for the preference trainers)
    # Bytes per token per vocabulary entry held by the logits and their loss at the start of backward: 12 for
    # transformers' cross-entropy (log-softmax out, its grad, the logits' grad); ORPO (TRL's experimental trainer)
    # keeps 18: logits 4, the chosen half's contiguous copy and its log-softmax 2 + 2, their gradient 2, the logits'
    # gradient 4, the softmax its log-probs' logsumexp backward makes 4 (the CPU replay: 17.9 B).
    logits_bytes: int = 12
    loss_terms: tuple[tuple[str, tuple[str, ...]], ...] = ()  # our loss name -> TRL's loss terms (equal weights)
    default_beta: float = 0.1  # the KL / preference weight when the config leaves beta empty
    loss_types: tuple[str, ...] = ()  # `loss_type` choices (empty: no choice)
    default_loss: str = ""
    # Why this objective's micro batches are padded even with `packing: true` ("": they can be packed, attention
    # confined per example; the plan decides from this, `finetune.plan.packing_for`).
    unpacked_because: str = "its trainer has no padding-free path"
    liger: bool = False  # Liger's fused kernels serve it
    deepspeed_loop: bool = False  # backend: deepspeed (our explicit loop) can run it
    needs_trl: bool = False
    bundled_data: str = ""  # the bundled data set that suits it ("" none)
    metrics: tuple[tuple[str, str], ...] = ()  # TRL log key -> our "log" event key (`*` matches one name part)
    facts: tuple[tuple[str, str], ...] = ()  # event key -> words, for the latest values line (`*` as above)
    plotted: tuple[str, ...] = ()  # event keys drawn in the objective's plot (`*` as above)
    plot_title: str = ""
    percent: tuple[str, ...] = ()  # event keys shown as a percentage
    # Evaluation (`python -m finetune eval`): the scores it reports, in the order shown; the cheap ones computed on the
    # held-out sample answers while the run trains; what its `loss` is the likelihood of, in a warning's words.
    eval_metrics: tuple[str, ...] = (*LOSS_METRICS, *ANSWER_METRICS)
    eval_during_training: tuple[str, ...] = ANSWER_METRICS
    eval_loss_words: str = "the likelihood of the reference answers"
    # The scores that sum an evaluation up in a few words (the run list, the Train tab), in order: the first one the
    # evaluation has is shown.
    headline: tuple[str, ...] = ("rouge_l", "number_match", "exact_match", "loss")

    # ----- what the record decides
    @property
    def is_classifier(self) -> bool:
        """It trains a classification head (labels, not text)."""
        return self.task == SEQUENCE_CLASSIFICATION

    @property
    def is_plain(self) -> bool:
        """Plain supervised training: no objective row on the card, no title tag."""
        return not self.short

    @property
    def eval_rewards(self) -> bool:
        """An evaluation also scores the reference model (the base), asked for or not: rewards are relative to it."""
        return any(name in REWARD_METRICS for name in self.eval_metrics)

    def row_tokens(self, config: Any) -> int:
        """Tokens in one row of a training batch at most: the example, and the sampled answer after the prompt."""
        return config.max_seq_length + (config.max_completion_length if self.generation else 0)

    def beta(self, config: Any) -> float:
        """The beta a run of `config` uses: its own, or this objective's default when left empty."""
        value = getattr(config, "beta", None)
        return self.default_beta if value is None else float(value)

    def loss_type(self, config: Any) -> str:
        """The loss a run of `config` uses: its own, or this objective's default when left empty."""
        value = getattr(config, "loss_type", "") or ""
        return value if value in self.loss_types else self.default_loss

    def trl_loss(self, loss: str) -> list[str]:
        """TRL's `loss_type` for one of our loss names (a sum of its terms, or the name itself)."""
        return list(dict(self.loss_terms).get(loss, (loss,)))

    def reference_kind(self, config: Any) -> str | None:
        """What the run compares against: None, "adapter-off" (the base under the adapter, no second copy) or
        "copy" (full fine-tuning: a frozen copy of the starting weights)."""
        if self.reference == NO_REFERENCE or (self.reference == REFERENCE_WHEN_BETA and self.beta(config) <= 0):
            return None
        return "copy" if getattr(config, "method", "lora") == "full" else "adapter-off"

    def event_metrics(self, logs: dict[str, Any]) -> dict[str, float | None]:
        """What a logged step carries beyond the loss: TRL's names turned into our event keys."""
        out: dict[str, float | None] = {}
        for trl_key, ours in self.metrics:
            for key in fnmatch.filter(logs, trl_key) if "*" in trl_key else [trl_key] if trl_key in logs else []:
                out[_substitute(trl_key, key, ours)] = _float(logs[key])
        return out

    def fact_words(self, key: str) -> str | None:
        """The words for one event key in the latest values line (None: not one of this objective's)."""
        for pattern, words in self.facts:
            if fnmatch.fnmatchcase(key, pattern):
                return _substitute(pattern, key, words)
        return None

    def facts_of(self, values: dict[str, Any]) -> list[tuple[str, str, float]]:
        """(key, words, value) for each of this objective's metrics among `values` (a "log" event), in the record's
        order; a percentage key's value as a fraction."""
        out = []
        for pattern, _ in self.facts:
            for key in sorted(k for k in values if fnmatch.fnmatchcase(k, pattern) and _float(values[k]) is not None):
                out.append((key, self.fact_words(key) or key, float(values[key])))
        return out

    def is_plotted(self, key: str) -> bool:
        """Whether an event key is drawn in this objective's plot."""
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.plotted)

    # ----- what the record refuses
    def problems(self, config: Any) -> list[tuple[str, str]]:
        """(field, message) for every setting this objective cannot run with; each message names the field."""
        out: list[tuple[str, str]] = []
        name = config.objective
        if config.backend == "deepspeed" and not self.deepspeed_loop:
            out.append(
                ("backend", f"{name} runs through TRL's trainer; use backend: trainer (zero_stage 1-3 still works)")
            )
        loss = config.loss_type or ""
        legacy = not self.loss_types and loss == LEGACY_LOSS
        if loss and loss not in self.loss_types and not legacy:
            if self.loss_types:
                out.append(("loss_type", f"{loss!r} is not a {name} loss; choose one of: {', '.join(self.loss_types)}"))
            else:
                out.append(("loss_type", f"applies to objective: {_with_loss_choice()}; leave it empty for {name}"))
        if DataKind.PROMPTS in self.data_kinds:
            out += _reward_problems(config)
        if self.reference_kind(config) == "adapter-off" and config.init_lora_weights in ("pissa", "olora"):
            out.append(
                (
                    "init_lora_weights",
                    f"{config.init_lora_weights} moves part of the base weights into the adapter, so the base with the "
                    f"adapter off is not the starting model {name} compares against; use true or gaussian",
                )
            )
        return out


def _reward_problems(config: Any) -> list[tuple[str, str]]:
    """Learning from rewards: the rewards read, one weight per reward, and each prompt's answers in one batch."""
    from finetune.errors import UserError
    from finetune.objectives import rewards

    out = []
    try:
        specs = rewards.parse(config.rewards)
        rewards.weights(config.reward_weights, len(specs))
    except UserError as exc:
        message = str(exc)
        out.append((exc.field or "rewards", message.split(": ", 1)[1] if ": " in message else message))
    batch = config.per_device_train_batch_size * config.gradient_accumulation_steps
    if batch % config.num_generations:
        fits = [n for n in range(2, batch + 1) if batch % n == 0]
        hint = f"num_generations {', '.join(map(str, fits))}" if fits else "a larger batch"
        out.append(
            (
                "num_generations",
                f"{config.num_generations} answers per prompt do not divide the {batch} completions of a step "
                f"(per_device_train_batch_size {config.per_device_train_batch_size} × gradient_accumulation_steps "
                f"{config.gradient_accumulation_steps}); each prompt's answers are compared within one step: use a "
                f"batch that is a multiple of {config.num_generations}, or {hint}",
            )
        )
    return out


def _substitute(pattern: str, key: str, template: str) -> str:
    """`template` with its `*` replaced by what the pattern's `*` matched in `key`."""
    if "*" not in pattern:
        return template
    head, tail = pattern.split("*", 1)
    return template.replace("*", key[len(head) : len(key) - len(tail) if tail else None])


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _with_loss_choice() -> str:
    return " or ".join(o.name for o in OBJECTIVES.values() if o.loss_types)


# TRL's names of what preference trainers log beside the loss, and ours (a contract with the UI: keep them).
_PREFERENCE_METRICS = (
    ("rewards/chosen", "rewards_chosen"),
    ("rewards/rejected", "rewards_rejected"),
    ("rewards/margins", "rewards_margin"),
    ("rewards/accuracies", "rewards_accuracy"),
    ("kl", "kl"),
)
_PREFERENCE_FACTS = (
    ("rewards_margin", "reward margin"),
    ("rewards_accuracy", "chosen preferred"),
    ("rewards_chosen", "reward chosen"),
    ("rewards_rejected", "reward rejected"),
    ("kl", "KL"),
)
_PREFERENCE = {
    "engine": "preference",
    "needs_trl": True,
    "disables_dropout": True,
    "task": CAUSAL_LM,
    "goal": "dpo",
    "metrics": _PREFERENCE_METRICS,
    "facts": _PREFERENCE_FACTS,
    "plotted": ("rewards_margin", "kl"),
    "plot_title": "Preference: reward margin (chosen − rejected) and KL",
    "percent": ("rewards_accuracy",),
    "bundled_data": "bundled:pirate-pairs",
    "eval_metrics": (*REWARD_METRICS, *LOSS_METRICS, *ANSWER_METRICS),  # beside the SFT scores of the chosen answers
    "eval_loss_words": "the likelihood of the chosen answers",
    "headline": ("reward_accuracy", "rouge_l", "number_match", "exact_match", "loss"),  # how often chosen wins
}

# TRL DPOConfig.loss_type names; "rpo" is TRL's ["sigmoid", "sft"]: DPO plus the NLL of the chosen answer. Plain DPO
# (sigmoid) at a LoRA-sized learning rate turned SmolLM2 into nonsense within 20 steps; rpo kept it fluent.
DPO_LOSSES = ("rpo", "sigmoid", "ipo", "hinge", "robust")

# TRL GRPOConfig.loss_type names (dapo is TRL's default: token-level, normalised over the whole accumulated batch).
GRPO_LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")

_RECORDS = (
    Objective(
        name="sft",
        objective="sft",
        task=CAUSAL_LM,
        label="supervised fine-tuning (SFT)",
        short="",
        card_name="",
        card_tag="sft",
        card_phrase="",
        goal="sft",
        goal_label="Style or instructions: answer like the examples (SFT)",
        data_kinds=(DataKind.IMAGES, DataKind.MESSAGES, DataKind.PROMPT_COMPLETION, DataKind.TEXT),
        columns=("messages", "prompt", "completion", "text", "images"),
        unpacked_because="",
        liger=True,
        deepspeed_loop=True,
        bundled_data="bundled:pirate",
    ),
    Objective(
        name="dpo",
        objective="dpo",
        goal_label="Preferences: learn which of two answers is better (DPO)",
        label="preferences (DPO)",
        short="DPO",
        card_name="DPO (direct preference optimisation)",
        card_tag="dpo",
        card_phrase="preference-tuned with DPO",
        data_kinds=(DataKind.PREFERENCE,),
        columns=("prompt", "chosen", "rejected"),
        unpacked_because="TRL 1.16's DPO trainer has padding-free batches switched off (it pads them)",
        trainer="trl:DPOTrainer",
        trainer_config="trl:DPOConfig",
        fields=("beta", "loss_type", "chosen_column", "rejected_column"),
        sequences=2,
        reference=REFERENCE,
        loss_kernel="trl_chunked",
        fused_outputs=("log_probs", "entropy", "mean_logits", "is_top1"),
        replay="paired_fused",
        loss_types=DPO_LOSSES,
        default_loss="rpo",
        loss_terms=(("rpo", ("sigmoid", "sft")),),
        **_PREFERENCE,
    ),
    Objective(
        name="orpo",
        objective="orpo",
        goal_label="",
        label="preferences (ORPO)",
        short="ORPO",
        card_name="ORPO (odds-ratio preference optimisation, no reference model)",
        card_tag="orpo",
        card_phrase="preference-tuned with ORPO",
        data_kinds=(DataKind.PREFERENCE,),
        columns=("prompt", "chosen", "rejected"),
        unpacked_because="TRL 1.16's ORPO trainer has no padding-free path",
        trainer="trl.experimental.orpo:ORPOTrainer",
        trainer_config="trl.experimental.orpo:ORPOConfig",
        fields=("beta", "chosen_column", "rejected_column"),
        sequences=2,
        replay="paired_logits",
        logits_bytes=18,
        **_PREFERENCE,
    ),
    Objective(
        name="kto",
        objective="kto",
        goal_label="",
        label="preferences (KTO)",
        short="KTO",
        card_name="KTO (Kahneman-Tversky optimisation, answers marked good or bad)",
        card_tag="kto",
        card_phrase="preference-tuned with KTO",
        data_kinds=(DataKind.PREFERENCE, DataKind.UNPAIRED),  # pairs are split into good and bad rows
        columns=("prompt", "completion", "label"),
        unpacked_because="TRL 1.16's KTO trainer has no padding-free path",
        trainer="trl:KTOTrainer",
        trainer_config="trl:KTOConfig",
        fields=("beta", "label_column"),
        reference=REFERENCE,
        loss_kernel="trl_chunked",
        fused_outputs=("log_probs", "entropy", "mean_logits"),
        sequential_batches=True,
        replay="unpaired_fused",
        kl_pass=True,
        **_PREFERENCE,
    ),
    Objective(
        name="grpo",
        objective="grpo",
        task=CAUSAL_LM,
        label="rewards (GRPO)",
        short="GRPO",
        card_name="GRPO (group relative policy optimisation: answers sampled and scored by rewards)",
        card_tag="grpo",
        card_phrase="trained with rewards (GRPO)",
        goal="grpo",
        goal_label="Rewards: answers you can check (GRPO)",
        goal_defaults=(("rewards", "number_match"), ("max_completion_length", 32)),
        data_kinds=(DataKind.PROMPTS,),
        columns=("prompt",),
        unpacked_because="TRL 1.16's GRPO trainer has no padding-free path (it pads prompts and sampled answers)",
        engine="grpo",
        trainer="trl:GRPOTrainer",
        trainer_config="trl:GRPOConfig",
        fields=(
            "rewards",
            "reward_weights",
            "num_generations",
            "max_completion_length",
            "temperature",
            "beta",
            "loss_type",
        ),  # fmt: skip
        reference=REFERENCE_WHEN_BETA,
        default_beta=0.0,  # TRL's default: no KL term, no reference in memory
        loss_types=GRPO_LOSSES,
        default_loss="dapo",  # TRL's default
        loss_kernel="trl_chunked",
        fused_outputs=("log_probs", "entropy"),
        replay="scored_fused",
        generation=True,
        # GRPOConfig.disable_dropout defaults to False: dropout stays on
        needs_trl=True,
        bundled_data="bundled:arithmetic",
        metrics=(
            ("reward", "reward"),
            ("reward_std", "reward_std"),
            ("completions/mean_length", "completion_length"),
            ("rewards/*/mean", "rewards/*"),
            ("kl", "kl"),
        ),
        facts=(
            ("reward", "mean reward"),
            ("reward_std", "reward spread"),
            ("rewards/*", "reward: *"),
            ("completion_length", "completion tokens"),
            ("kl", "KL"),
        ),
        plotted=("reward", "rewards/*", "kl"),
        plot_title="Rewards: the mean reward of each step, each reward function's mean, and KL",
        # Generated answers against the `answer` column, as the built-in rewards compare them (ROUGE-L says little
        # of a short checkable answer); the loss where a row has an answer: that answer's likelihood after the prompt.
        eval_metrics=("number_match", "exact_match", *LOSS_METRICS),
        eval_during_training=("number_match", "exact_match"),
        eval_loss_words="the likelihood of the reference answers (the answer column)",
        headline=("number_match", "exact_match", "loss"),  # a sum written out is right, not verbatim
    ),
    Objective(
        name="classification",
        objective="sft",
        task=SEQUENCE_CLASSIFICATION,
        label="classification (a label for each text)",
        short="",
        card_name="",
        card_tag="text-classification",
        card_phrase="",
        goal="classification",
        goal_label="Classification: predict a label for a text",
        data_kinds=(DataKind.CLASSIFICATION,),
        columns=("text", "text_pair", "label"),
        unpacked_because="classification reads one label per padded row, from its last token",
        fields=("num_labels", "text_pair_column", "label_column"),
        deepspeed_loop=True,
        eval_metrics=(*LOSS_METRICS, *CLASSIFIER_METRICS),  # a classifier's loss: the true label's NLL
        eval_during_training=(),
        eval_loss_words="the likelihood of the true labels",
        headline=("accuracy", "macro_f1", "loss"),
    ),
)

OBJECTIVES: dict[str, Objective] = {record.name: record for record in _RECORDS}
# The `objective` config values, in the order the form offers them.
CHOICES: tuple[str, ...] = tuple(dict.fromkeys(r.objective for r in _RECORDS))
DEFAULT = "sft"
# The fields a goal of the Start tab may fill in (`Objective.goal_defaults`).
GOAL_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(k for r in _RECORDS for k, _ in r.goal_defaults))
# Every objective-specific field: a field here applies only where the chosen record lists it (the form hides it).
SPECIFIC_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(f for r in _RECORDS for f in r.fields))
# The Start tab's goals, each with the record that stands for it (the one with the goal's words).
GOALS: dict[str, Objective] = {r.goal: r for r in _RECORDS if r.goal_label}
DEFAULT_GOAL = OBJECTIVES[DEFAULT].goal  # what the Start tab, `propose` and /propose assume when no goal is given


def lookup(objective: str = DEFAULT, task: str = CAUSAL_LM) -> Objective:
    """The record for an `objective` and `task` pair (a task that takes one objective only gives its own record:
    `config_problems` refuses the pair)."""
    for record in _RECORDS:
        if record.task == task and record.objective == objective:
            return record
    for record in _RECORDS:
        if record.task == task:
            return record
    return OBJECTIVES.get(objective, OBJECTIVES[DEFAULT])


def of(config: Any) -> Objective:
    """The record a config (or any object with `objective` and `task`) trains with."""
    return lookup(getattr(config, "objective", DEFAULT) or DEFAULT, getattr(config, "task", CAUSAL_LM) or CAUSAL_LM)


def of_values(values: dict[str, Any]) -> Objective:
    """The record for form values (a dict keyed by field name)."""
    return lookup(values.get("objective") or DEFAULT, values.get("task") or CAUSAL_LM)


def goal_settings(goal: str, given: Any = ()) -> dict[str, Any]:
    """The task and objective a goal sets: a Start tab goal (sft, dpo, grpo, classification) or an objective's record
    name (orpo, kto), with what suits the goal (its `goal_defaults`) for the fields not in `given` (those the caller
    set); a UserError naming `goal` and the choices else."""
    record = GOALS.get(goal) or OBJECTIVES.get(goal)
    if record is None:
        choices = ", ".join(dict.fromkeys([*GOALS, *OBJECTIVES]))
        raise UserError(f"goal: {goal!r} is not one of {choices}", field="goal")
    suits = {name: value for name, value in record.goal_defaults if name not in given}
    return {**suits, "task": record.task, "objective": record.objective}


def fields_not_applying(values: dict[str, Any]) -> set[str]:
    """The objective-specific fields that do not apply to form values (another objective's or task's knobs)."""
    return set(SPECIFIC_FIELDS) - set(of_values(values).fields)


def label(name: str) -> str:
    """Plain words for an objective by its record name (the name itself when unknown)."""
    record = OBJECTIVES.get(name)
    return record.label if record else name


def config_problems(config: Any) -> list[tuple[str, str]]:
    """(field, message) for every objective rule `config` breaks."""
    record = of(config)
    out = []
    if record.objective != config.objective:
        out.append(
            (
                "objective",
                f"{config.objective} trains a causal LM on answers; use objective: {record.objective} for "
                f"{config.task}",
            )
        )
    return out + record.problems(config)
