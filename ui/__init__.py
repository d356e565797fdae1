"""The Gradio web UI: one module per tab, each building its components and wiring its events at the bottom.

The UI holds no training logic: it talks to `finetune.studio.Studio` with plain form values. Importing it does not
import torch or transformers; models load on first use.
"""

from ui.app import build_app, launch

__all__ = ["build_app", "launch"]
