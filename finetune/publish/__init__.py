"""Publishing a run: what may leave the machine (`public`), the model card (`model_card`), the Hub push (`hub`)."""
