"""The pirate_quiz questions for lm-evaluation-harness (its `custom_dataset`), read from beside this file."""

from pathlib import Path


def load(**_: object):
    """The quiz as a DatasetDict with one `test` split."""
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(Path(__file__).with_name("questions.jsonl"))})
