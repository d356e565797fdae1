"""Finetune Studio backend: config, models, data, training engines, runs, memory, inference, Hub.

Never imports gradio; heavy libraries (torch, transformers) are imported lazily so the UI starts fast.
"""

__version__ = "0.1.0"
