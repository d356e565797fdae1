"""The model side: build the tokenizer and model a plan asks for (`loading.py`), the offline catalogue of popular
configs and GPU cards (`catalogue.py`), padding-free packed attention (`packing.py`), and generation for chat and
sample answers (`inference.py`)."""
