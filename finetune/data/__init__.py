"""Training data: load (bundled, local file, Hub id), detect the format, render with the chat template, tokenise, mask.

Formats: `messages` (chat), `prompt`/`completion` (loss on the completion only), plain `text`, and text(+pair)/label
for sequence classification. Preference objectives (dpo, orpo, kto) read `prompt`/`chosen`/`rejected` pairs, or for
kto `prompt`/`completion`/true-false `label`, each side as text or as a conversation (TRL's standard and
conversational shapes); TRL tokenises them, this package checks, normalises and previews them.

Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad token is also its EOS, and masking
by id would teach the model never to stop.

Modules, by job:
    loading         bundled sets, local files, Hub datasets; one clear line for each way a file can be wrong
    checks          value and row checks, and what is made uniform
    detection       which format the columns hold
    masking         render as text pieces (trained or not) and tokenise with labels masked by position
    trl_rows        rows TRL's trainers read in their own shape
    preference, prompts, classification    each kind's own preparation
    pipeline        prepare: load, detect, prepare
    previews        what the UI shows of the data
    heldout         the held-out prompts (and reference answers) a run answers while it trains
    collation       how a micro batch is laid out
    stats           token lengths of the data, for the estimate and the advice

The names below are the package's public face (`from finetune import data; data.prepare(...)`); code inside the
package imports each from its own module.
"""

from finetune.data.checks import as_conversation, kto_label, label_names, label_value, message_list, text_value
from finetune.data.collation import collator
from finetune.data.detection import detect_format
from finetune.data.heldout import heldout_prompts, heldout_samples
from finetune.data.kinds import PREFERENCE_KINDS, PROMPTS_KIND, TRL_KINDS, DataFormat, PreparedData
from finetune.data.loading import BUNDLED_DIR, FILE_TYPES, fingerprint, load_raw
from finetune.data.masking import IGNORE, render_segments, to_messages, tokenize_segments
from finetune.data.pipeline import prepare
from finetune.data.previews import preview
from finetune.data.trl_rows import answer_content, reference_answer, render_preference, trl_row

__all__ = [
    "BUNDLED_DIR",
    "FILE_TYPES",
    "IGNORE",
    "PREFERENCE_KINDS",
    "PROMPTS_KIND",
    "TRL_KINDS",
    "DataFormat",
    "PreparedData",
    "answer_content",
    "as_conversation",
    "collator",
    "detect_format",
    "fingerprint",
    "heldout_prompts",
    "heldout_samples",
    "kto_label",
    "label_names",
    "label_value",
    "load_raw",
    "message_list",
    "prepare",
    "preview",
    "reference_answer",
    "render_preference",
    "render_segments",
    "text_value",
    "to_messages",
    "tokenize_segments",
    "trl_row",
]
