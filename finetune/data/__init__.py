"""Training data: load (bundled, local file, Hub id), detect the format, render with the chat template, tokenise, mask.

Formats: `messages` (chat), `prompt`/`completion` (loss on the completion only), plain `text`, and text(+pair)/label
for sequence classification. Preference objectives (dpo, orpo, kto) read `prompt`/`chosen`/`rejected` pairs, or for
kto `prompt`/`completion`/true-false `label`, each side as text or as a conversation (TRL's standard and
conversational shapes); TRL tokenises them, this package checks, normalises and previews them.

Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad token is also its EOS, and masking
by id would teach the model never to stop.

Each kind of data is a `DataKind` (`kinds.py`) and one module that knows its rows: how its columns are detected and
checked, how a row is rendered and masked (or shaped for TRL), how the train and eval sets are prepared, how a row
looks in the preview, and which held-out prompts (with reference answers) it gives. The module says so in one
`KindHandler` (`handler.py`); `registry.py` lists them, and the shared pipeline asks the registry what to do with a
kind's rows.

    chat                messages: a conversation per row, through the chat template, assistant messages trained
    prompt_completion   a prompt and its answer, the answer trained
    text                plain text, all of it trained
    classification      a text (and a second one) with a class label
    preference          prompt/chosen/rejected pairs (dpo, orpo, kto) and kto's prompt/completion/label rows
    prompts             prompts for learning from rewards (grpo); the other columns go to the reward functions
    images              images with a conversation, a prompt and answer or a caption (vision-language models)

The shared pipeline, by job:

    loading      bundled sets, local files, Hub datasets; one clear line for each way a file can be wrong
    checks       value and row checks, and what is made uniform (numbers as text, "3" as the class 3, ...)
    names        the column names each role is found under
    detection    which kind the columns hold, trying the kinds the objective learns from in its order
    masking      text pieces (trained or not) tokenised with labels masked by position; the chat template's pieces
    trl_rows     rows TRL's trainers read in their own shape (preference, kto, prompts): checked, shaped, rendered
    pipeline     prepare: load, detect, then the kind's own preparation
    previews     what the UI shows of the data
    heldout      the held-out prompts (and reference answers) a run answers while it trains
    collation    how a micro batch is laid out (padded, or packed)
    stats        token lengths of the data, for the estimate and the advice

Adding a kind: write its module with its `KindHandler` (see `chat.py`;
`masking.masked_kind` builds one for a kind whose masking is ours), add its member to `DataKind` and its handler to
`registry.HANDLERS`, then name it in the `data_kinds` of each objective that learns from it (`finetune/objectives/`),
in the order detection should try it.

The names below are the package's public face (`from finetune import data; data.prepare(...)`); code inside the
package imports each from its own module. They load on first use, not with the package: Python runs this file before
any module of the package, `finetune.objectives` imports `finetune.data.kinds`, and importing the other modules here
would import `finetune.config`, which imports `finetune.objectives` (a cycle).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for readers and type checkers (`__getattr__` imports each at run time)
    from finetune.data.collation import collator as collator
    from finetune.data.detection import detect_format as detect_format
    from finetune.data.heldout import heldout_prompts as heldout_prompts
    from finetune.data.heldout import heldout_samples as heldout_samples
    from finetune.data.kinds import DataFormat as DataFormat
    from finetune.data.kinds import DataKind as DataKind
    from finetune.data.kinds import PreparedData as PreparedData
    from finetune.data.loading import FILE_TYPES as FILE_TYPES
    from finetune.data.loading import fingerprint as fingerprint
    from finetune.data.loading import load_raw as load_raw
    from finetune.data.masking import IGNORE as IGNORE
    from finetune.data.masking import tokenize_segments as tokenize_segments
    from finetune.data.pipeline import prepare as prepare
    from finetune.data.previews import preview as preview

_HOMES = {  # each public name and the module that defines it
    "collator": "collation",
    "detect_format": "detection",
    "heldout_prompts": "heldout",
    "heldout_samples": "heldout",
    "DataFormat": "kinds",
    "DataKind": "kinds",
    "PreparedData": "kinds",
    "FILE_TYPES": "loading",
    "fingerprint": "loading",
    "load_raw": "loading",
    "IGNORE": "masking",
    "tokenize_segments": "masking",
    "prepare": "pipeline",
    "preview": "previews",
}


def __getattr__(name: str) -> Any:
    """A public name, from the module that defines it (imported on first use: see above)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value  # later look-ups find it without this function
    return value
