"""The analytic memory model: each component from the model's shape and the run settings, in bytes.

It explains the traced figure (what is it made of?), prices the advice (what if?), and is the fallback where a
fake-tensor replay cannot run (ZeRO sharding, CPU offload, unknown architectures). Pure arithmetic: no torch here;
`census()` (parameter counts from a meta-device model) is the only part that imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from finetune.plan import DTYPE_BYTES

BLOCK_4BIT = 64  # bitsandbytes 4-bit block size (one absmax per 64 weights)
BLOCK_NESTED = 256  # double quantisation: one fp32 absmax per 256 first-level constants
BLOCK_8BIT_OPTIM = 256  # bitsandbytes 8-bit optimizer state block size
MIN_8BIT_SIZE = 4096  # bitsandbytes keeps fp32 states for tensors smaller than this
LOGITS_BACKWARD_BYTES = 12  # per token per vocab entry at the start of backward: log-softmax out, its grad, logits grad
TRL_TOKEN_TILE = 4096  # TRL 1.16's chunked log-prob head (DPO, KTO): a [tokens, vocab chunk] tile of this many tokens
TRL_VOCAB_CHUNK = 32768  # ... by this many vocabulary entries, allocated whole whatever the vocabulary size
# Tiles alive at once in its backward: Triton folds a tile in place (1); the torch fallback (CPU) makes the gradient
# and softmax temporaries of a whole tile, 2.8 tiles in the CPU replay of TRL 1.16 (bench/memory_accuracy.py dpo).
TRL_TILES_ALIVE = {"cuda": 1.0, "cpu": 2.8}
GENERATION_PHASE = "sampling the answers (KV cache)"
LIGER_CHUNK_MEM_CONST = 1  # liger-kernel 0.8.5's default budget for its fused linear cross-entropy chunks


# ----------------------------------------------------------------------------- inputs


@dataclass
class Shape:
    """What the activation formulas need from a transformers config."""

    family: str = "llama"  # llama: RMSNorm + gated MLP + RoPE; gpt2: LayerNorm + GELU MLP + fused qkv + dropout
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 16
    intermediate: int = 256
    vocab: int = 1000
    gated: bool = True
    act: str = "silu"
    dropout: float = 0.0  # hidden / residual dropout (GPT-2)

    @property
    def q_dim(self) -> int:
        """Width of the query projection."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and value) projection."""
        return self.kv_heads * self.head_dim


@dataclass
class Census:
    """Parameter counts of the model as the engine builds it (from a meta-device model, no memory)."""

    total: int = 0  # unique base parameters (before LoRA)
    quantized: list[int] = field(default_factory=list)  # numel of each weight QLoRA stores in 4 bits
    trainable: list[int] = field(default_factory=list)  # numel of each trainable tensor for this method
    no_decay: int = 0  # trainable numel in the no-weight-decay group (biases, norms)
    embeddings: list[int] = field(default_factory=list)  # trainable nn.Embedding weights (8-bit optimizers: fp32)
    lora_sites: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # per layer: site -> [(in, r)]
    dora_outputs_per_layer: int = 0  # DoRA: the summed output width of one block's adapted layers
    linear_params_per_layer: int = 0  # base linear weights in one block (autocast makes 16-bit copies of these)
    head_trainable: bool = False  # lm_head (or the tied embedding) gets a gradient
    head_params: int = 0


@dataclass
class Settings:
    """The run settings the formulas use (from TrainConfig + device)."""

    method: str = "lora"
    batch: int = 1
    seq: int = 128
    accumulation: int = 1
    checkpointing: bool = False
    optim: str = "adamw_torch"
    device: str = "cuda"
    half: int = 2  # bytes of the 16-bit dtype in use (0 = fp32 run)
    weight_bytes: int = 4  # bytes per base weight as the plan loads them (a LoRA base is 16-bit under amp)
    lora_r: int = 8
    lora_dropout: float = 0.05
    quant_type: str = "nf4"
    double_quant: bool = True
    classifier: bool = False  # a classification head: no logits over the vocabulary
    gpus: int = 1
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    deepspeed: bool = False
    loss_kernel: str = "eager"  # how logits and loss are computed: eager (transformers'), liger, trl_chunked
    sequences: int = 1  # sequences per example (the objective's record: DPO and ORPO put chosen and rejected in one)
    logits_bytes: int = LOGITS_BACKWARD_BYTES  # per token per vocab entry at the start of backward (the record's)
    reference: str | None = None  # "adapter-off" or "copy" (a frozen copy of the weights) when the objective has one
    completion: int = 0  # tokens of each sampled answer (GRPO), scored by the loss; 0: every token is scored
    generation_rows: int = 0  # answers sampled at once per process before a step (GRPO's generation batch)
    packed_tokens: int = 0  # packing: the real tokens of the largest micro batch (0: rows padded to seq)

    @property
    def tokens(self) -> int:
        """Tokens in one micro batch: packed, its real tokens; padded, every row full length (the worst case)."""
        return self.packed_tokens or self.batch * self.seq * self.sequences

    @property
    def scored_tokens(self) -> int:
        """Tokens the loss scores: the sampled answers only (GRPO), else every token."""
        return self.batch * self.completion * self.sequences if self.completion else self.tokens

    @property
    def amp(self) -> bool:
        """Autocast to 16 bits is on."""
        return self.half > 0


def settings_for(plan: Any) -> Settings:
    """`Settings` for a run plan: its device and world, its precision, dtypes, DeepSpeed use and objective as the plan
    decided them (nothing is decided here)."""
    config, objective = plan.config, plan.objective
    return Settings(
        method=config.method,
        batch=config.per_device_train_batch_size,
        seq=objective.row_tokens(config),
        accumulation=config.gradient_accumulation_steps,
        checkpointing=config.gradient_checkpointing,
        optim=plan.optimizer,
        device=plan.device,
        half=0 if plan.autocast_dtype is None else DTYPE_BYTES[plan.autocast_dtype],
        weight_bytes=DTYPE_BYTES[plan.weight_dtype],
        lora_r=config.lora_r,
        lora_dropout=0.0 if objective.disables_dropout else config.lora_dropout,  # TRL's preference trainers: off
        quant_type=config.quant_type,
        double_quant=config.double_quant,
        classifier=objective.is_classifier,
        gpus=plan.world_size,
        zero_stage=config.zero_stage,
        offload_optimizer=config.offload_optimizer != "none",
        offload_param=config.offload_param != "none",
        deepspeed=plan.deepspeed,
        loss_kernel="liger" if plan.liger else objective.loss_kernel,
        sequences=objective.sequences,
        logits_bytes=objective.logits_bytes,
        reference=plan.reference,
        completion=config.max_completion_length if objective.generation else 0,
        generation_rows=config.per_device_train_batch_size * config.gradient_accumulation_steps
        if objective.generation
        else 0,
    )


def shape_of(model_config: Any) -> Shape:
    """Read the dimensions the formulas need from a transformers config (Llama-like unless it is GPT-2-like)."""
    get_text = getattr(model_config, "get_text_config", None)
    model_config = get_text() if callable(get_text) else model_config  # a vision-language model's language model
    g = lambda *names, default=None: next(  # noqa: E731
        (getattr(model_config, n) for n in names if getattr(model_config, n, None) is not None), default
    )
    hidden = int(g("hidden_size", "n_embd", "d_model"))
    heads = int(g("num_attention_heads", "n_head", "num_heads"))
    gpt2 = getattr(model_config, "model_type", "") in ("gpt2", "gpt_neo", "gptj", "gpt_bigcode") or (
        g("n_embd") is not None and g("intermediate_size") is None
    )
    act = str(g("hidden_act", "activation_function", default="silu"))
    return Shape(
        family="gpt2" if gpt2 else "llama",
        hidden=hidden,
        layers=int(g("num_hidden_layers", "n_layer", "num_layers")),
        heads=heads,
        kv_heads=int(g("num_key_value_heads", default=heads) or heads),
        head_dim=int(g("head_dim", default=hidden // heads) or hidden // heads),
        intermediate=int(g("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden) or 4 * hidden),
        vocab=int(g("vocab_size")),
        gated=not gpt2,
        act=act,
        dropout=float(g("resid_pdrop", "hidden_dropout", default=0.0) or 0.0) if gpt2 else 0.0,
    )


# ----------------------------------------------------------------------------- parameter census (meta model)


def census(model_config: Any, plan: Any) -> Census:
    """Count parameters as the engine builds the plan's model (meta device: instant, no memory)."""
    import copy

    import torch
    from transformers.pytorch_utils import Conv1D

    config = plan.config
    cfg = copy.deepcopy(model_config)
    seq_cls = plan.is_classifier
    if seq_cls:
        cfg.num_labels = config.num_labels or 2
        if getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = 0
    with torch.device("meta"):  # (accelerate's init_empty_weights would leave tied embeddings untied)
        model = plan.auto_class().from_config(cfg, trust_remote_code=config.trust_remote_code, dtype=torch.float32)
    out = Census(total=sum(p.numel() for p in model.parameters()))
    skip = _not_quantized(model)
    linear = (torch.nn.Linear, Conv1D)
    out.quantized = [
        m.weight.numel() for n, m in model.named_modules() if isinstance(m, linear) and not _skipped(n, skip)
    ]
    head = model.get_output_embeddings() if not seq_cls else getattr(model, "score", getattr(model, "classifier", None))
    out.head_params = head.weight.numel() if head is not None else 0
    layers = _layers(model)
    if layers is not None and len(layers):
        out.linear_params_per_layer = sum(m.weight.numel() for m in layers[-1].modules() if isinstance(m, linear))
    if config.method == "full":
        out.trainable = [p.numel() for p in model.parameters()]
        out.embeddings = [m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        out.no_decay = sum(p.numel() for n, p in model.named_parameters() if _no_decay(n))
        out.head_trainable = True
        return out
    from peft import LoraConfig, get_peft_model

    # The plan's adapter settings; counting needs no PiSSA / OLoRA start (values only, and none on the meta device).
    lc = LoraConfig(**{**plan.lora.kwargs(), "init_lora_weights": True})
    with torch.device("meta"):
        peft_model = get_peft_model(model, lc)
    out.trainable = [p.numel() for p in peft_model.parameters() if p.requires_grad]
    out.no_decay = sum(p.numel() for n, p in peft_model.named_parameters() if p.requires_grad and _no_decay(n))
    out.head_trainable = seq_cls
    layers = _layers(peft_model)
    if layers is not None and len(layers):
        out.lora_sites = _lora_sites(layers[-1], config.lora_r)
        if config.use_dora:
            out.dora_outputs_per_layer = sum(
                int(next(iter(m.lora_B.values())).out_features)
                for m in layers[-1].modules()
                if getattr(m, "lora_B", None) is not None and len(m.lora_B)
            )
    return out


def _layers(model: Any) -> Any:
    """The decoder blocks (`finetune.memory.trace.decoder_layers`: a vision-language model's language model's)."""
    from finetune.memory.trace import decoder_layers

    return decoder_layers(model)


def _not_quantized(model: Any) -> list[str]:
    """Modules bitsandbytes leaves unquantised (output head, tied weights), as transformers decides."""
    try:
        from transformers.quantizers.base import get_keys_to_not_convert

        return get_keys_to_not_convert(model)
    except Exception:  # noqa: BLE001 - an older/newer transformers: keep the output head only
        return ["lm_head"]


def _skipped(name: str, skip: list[str]) -> bool:
    """transformers' rule: a module is skipped when a skip key matches its name or a dotted suffix of it."""
    return any(name == s or name.endswith("." + s) or name.startswith(s + ".") for s in skip)


def _no_decay(name: str) -> bool:
    """Trainer's no-weight-decay group: biases and norms."""
    from finetune.memory.trace import no_decay as rule

    return rule(name)


def _lora_sites(layer: Any, r: int) -> dict[str, list[tuple[int, int]]]:
    """LoRA modules of one block grouped by the tensor they read (q,k,v read the same normed input)."""
    sites: dict[str, list[tuple[int, int]]] = {}
    for name, module in layer.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if lora_a is None or not len(lora_a):
            continue
        a = next(iter(lora_a.values()))
        leaf = name.split(".")[-1]
        site = {
            "q_proj": "attn_in",
            "k_proj": "attn_in",
            "v_proj": "attn_in",
            "c_attn": "attn_in",
            "query_key_value": "attn_in",
            "qkv_proj": "attn_in",
            "o_proj": "attn_out",
            "dense": "attn_out",
            "gate_proj": "mlp_in",
            "up_proj": "mlp_in",
            "c_fc": "mlp_in",
            "gate_up_proj": "mlp_in",
            "fc1": "mlp_in",
            "down_proj": "mlp_out",
            "fc2": "mlp_out",
        }.get(leaf)
        if leaf == "c_proj":
            site = "attn_out" if ".attn." in f".{name}." else "mlp_out"
        sites.setdefault(site or "attn_in", []).append((int(a.in_features), int(r)))
    return sites


# ----------------------------------------------------------------------------- state components


def weights_bytes(c: Census, s: Settings) -> int:
    """Base weights as stored: fp32, a 16-bit LoRA base, or 4-bit packed (QLoRA, other tensors fp32)."""
    if s.method == "qlora":
        q = sum(c.quantized)
        return sum(math.ceil(n / 2) for n in c.quantized) + 4 * (c.total - q)
    return c.total * s.weight_bytes


def quant_constants_bytes(c: Census, s: Settings) -> int:
    """bitsandbytes 4-bit constants: an fp32 absmax per 64 weights, or 8-bit ones + fp32 per 256 (double quant)."""
    if s.method != "qlora":
        return 0
    total = 0
    for n in c.quantized:
        blocks = math.ceil(n / BLOCK_4BIT)
        code = 16 * 4  # the 16-entry NF4/FP4 code book each layer keeps
        if s.double_quant:
            total += blocks + 4 * math.ceil(blocks / BLOCK_NESTED) + 256 * 4 + 4 + code
        else:
            total += 4 * blocks + code
    return total


def lora_bytes(c: Census, s: Settings) -> int:
    """Trainable adapter (and, for classification, head copy) weights: fp32 (PEFT upcasts adapters)."""
    return 0 if s.method == "full" else 4 * sum(c.trainable)


def gradients_bytes(c: Census, s: Settings) -> int:
    """One gradient per trainable parameter, in its dtype: fp32 (full fine-tuning keeps fp32 weights, adapters and
    QLoRA's trainable parts are fp32)."""
    return 4 * sum(c.trainable)


def optimizer_bytes(c: Census, s: Settings, momentum: bool = False) -> int:
    """Optimizer state: AdamW 2 fp32 moments; 8-bit AdamW 2 bytes + fp32 absmax per 256 (fp32 below 4096 and, as
    Trainer asks, for embeddings); SGD none (or a momentum buffer)."""
    if s.optim == "sgd":
        return 4 * sum(c.trainable) if momentum else 0
    if s.optim in ("adamw_8bit", "paged_adamw_8bit"):
        total, fp32 = 0, list(c.embeddings)
        for n in c.trainable:
            if n in fp32:
                fp32.remove(n)
                total += 8 * n
            elif n < MIN_8BIT_SIZE:
                total += 8 * n
            else:
                total += 2 * n + 8 * math.ceil(n / BLOCK_8BIT_OPTIM)
        return total
    return 8 * sum(c.trainable) + 4 * len(c.trainable)  # + one fp32 step counter per tensor


def optimizer_temporaries_bytes(c: Census, s: Settings) -> int:
    """Transient buffers of the optimizer step: foreach AdamW on a GPU sqrt()s a whole group; on CPU one tensor."""
    if not c.trainable:
        return 0
    largest = max(c.trainable)
    if s.optim == "adamw_torch":
        if s.device == "cuda":
            return 4 * max(sum(c.trainable) - c.no_decay, c.no_decay)
        return 2 * 4 * largest  # sqrt(v) and sqrt(v)/bc2 of the largest tensor
    if s.optim in ("adamw_8bit", "paged_adamw_8bit") and s.device == "cpu":
        return cpu_8bit_temporaries(c)
    return 0


def cpu_8bit_temporaries(c: Census) -> int:
    """bitsandbytes' CPU 8-bit AdamW dequantises both states, the grad and sqrt(v) of a tensor to fp32 (20 B each)."""
    big = [n for n in c.trainable if n >= MIN_8BIT_SIZE]
    return 20 * max(big) if big else 0


def zero_split(c: Census, s: Settings) -> dict[str, int]:
    """DeepSpeed ZeRO per GPU: 16-bit model, fp32 master + optimizer states sharded from stage 1, gradients from
    stage 2 (plus reduce buckets), parameters from stage 3 (plus the gathered layers); offload moves them to CPU."""
    n, p16 = s.gpus, (2 if s.amp else 4)
    trainable, largest = sum(c.trainable), max(c.trainable or [0])
    weights = c.total * p16 if s.method == "full" else weights_bytes(c, s)
    if s.zero_stage >= 3:
        weights = min(weights, weights // n + 2 * largest * p16)
    if s.offload_param:
        weights = min(weights, 2 * largest * p16)
    master = 4 * trainable if s.amp else 0
    optim = optimizer_bytes(c, s)
    grads = trainable * p16
    if s.zero_stage >= 1:
        master, optim = master // n, optim // n
    if s.zero_stage >= 2:
        grads = grads // n + 2 * min(largest, 5 * 10**8) * p16  # own shard + two reduce buckets
    if s.offload_optimizer:
        master, optim = 0, 0
    out = {"weights": weights, "master_weights": master, "optimizer": optim, "gradients": grads}
    if s.method != "full":
        out["lora"] = trainable * p16  # DeepSpeed casts the adapters to 16 bits too (the fp32 copy is the master)
    return out


# ----------------------------------------------------------------------------- activations


@dataclass
class Dtypes:
    """Bytes per element of the tensors a block keeps, for a run's precision and method."""

    res: int  # residual stream and norm inputs: follows the embedding weights (16-bit only for a LoRA 16-bit base)
    lo: int  # outputs of base linear layers: 16-bit under autocast, fp32 for bitsandbytes 4-bit (it casts back)
    att: int  # what attention keeps (autocast feeds sdpa 16-bit copies)
    la: int  # what lora_A keeps as its input (autocast casts the fp32 dropout output back to 16 bits)
    mask: int  # a dropout mask: CUDA keeps bool, the CPU kernel an fp32 noise tensor

    @classmethod
    def of(cls, s: Settings) -> Dtypes:
        """The dtypes for settings `s`."""
        lo = 4 if (not s.amp or s.method == "qlora") else 2
        return cls(
            res=s.weight_bytes, lo=lo, att=2 if s.amp else 4, la=2 if s.amp else 4, mask=1 if s.device == "cuda" else 4
        )


def layer_activation_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Bytes one block keeps for backward, per token (op by op, as in transformers' Llama and GPT-2 code)."""
    d, full, h, i = Dtypes.of(s), s.method == "full", sh.hidden, sh.intermediate
    llama = sh.family != "gpt2"
    total = 0
    # two norms: the fp32 input (or its fp32 copy) and 1/rms (RMSNorm) or mean and rstd (LayerNorm); x/rms if it trains
    norm_out = d.res if llama else (4 if s.amp else d.res)  # LayerNorm runs fp32 under autocast
    for _ in range(2):
        total += 4 * h + (4 if llama else 8) + (d.res * h if (full and llama) else 0)
    # attention keeps q, k, v, the output and the fp32 log-sum-exp (sdpa / flash: never the S x S scores)
    if llama:
        total += d.att * (2 * sh.q_dim + 2 * sh.kv_dim) + 4 * sh.heads
    else:  # fused qkv: the views keep the whole c_attn output alive (16-bit copies if autocast had to cast)
        total += (d.lo if d.lo == d.att else d.att) * (sh.q_dim + 2 * sh.kv_dim) + d.att * sh.q_dim + 4 * sh.heads
        if sh.dropout > 0:
            total += 2 * d.mask * h  # two residual dropout masks
            if s.device != "cuda":  # CPU sdpa with dropout runs the math kernel: probabilities, noise, dropped
                total += 12 * sh.heads * s.seq
    # MLP: SwiGLU keeps gate, act(gate), up; GELU-new (the python tanh form) 4 tensors; exact GELU its input
    total += (3 if sh.gated else (4 if sh.act == "gelu_new" else 1)) * d.lo * i
    # inputs of linear layers: kept when their weights train (under autocast a 16-bit copy per consumer)
    sites = {
        "attn_in": (norm_out, h, 3 if llama else 1),
        "attn_out": (d.att, sh.q_dim, 1),
        "mlp_in": (norm_out, h, 2 if sh.gated else 1),
        "mlp_out": (d.lo, i, 1),
    }
    # DoRA rescales each adapted layer's output by magnitude / |W + BA| (an fp32 vector): the product keeps the
    # layer's output and the adapter's scaled output for backward (fitted to the replay of a 4-layer Llama: 8 B per
    # output feature per token in fp32 runs, 4.6 B under bf16 autocast, where part of them stays 16-bit)
    total += int((4.6 if s.amp else 8) * c.dora_outputs_per_layer)
    for site, (dtype, width, consumers) in sites.items():
        saved = site == "attn_out"  # attention already keeps its output
        if full and not saved:
            total += consumers * 2 * width if (s.amp and dtype == 4) else dtype * width
            saved = True
        for n_in, r in c.lora_sites.get(site, []):
            if s.lora_dropout > 0:
                total += n_in * (d.mask + d.la)  # dropout mask + the dropped input lora_A keeps
            elif s.amp:
                total += 2 * n_in  # peft casts to fp32, autocast back: a 16-bit copy per adapter
            elif not saved:
                total += dtype * n_in
                saved = True
            total += d.la * r  # lora_A's output, kept for lora_B
    return total


def head_activation_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Per token outside the blocks: final norm, lm_head input (if the head trains), input ids, embedding dropout."""
    d = Dtypes.of(s)
    total = 4 * sh.hidden + 4 + 8  # final norm input + 1/rms, input ids (int64)
    if s.method == "full" and sh.family != "gpt2":
        total += d.res * sh.hidden
    if c.head_trainable:
        total += (2 if s.amp else d.res) * sh.hidden
    if sh.family == "gpt2" and sh.dropout > 0:
        total += d.mask * sh.hidden + 4  # embedding dropout mask; LayerNorm keeps mean and rstd
    return total


def activations_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Saved tensors at the end of the forward pass (all blocks, or only block inputs with checkpointing)."""
    per_layer = Dtypes.of(s).res * sh.hidden if s.checkpointing else layer_activation_bytes(sh, c, s)
    first = 0 if (s.checkpointing or s.method == "full") else first_layer_savings(sh, c, s)
    return s.tokens * (sh.layers * per_layer - first + head_activation_bytes(sh, c, s)) + autocast_copies_bytes(
        sh, c, s
    )


def first_layer_savings(sh: Shape, c: Census, s: Settings) -> int:
    """With a frozen embedding the first block's input needs no gradient: its first norm keeps nothing, and its
    first adapters' dropouts keep no mask (per token)."""
    masks = sum(n_in for n_in, _ in c.lora_sites.get("attn_in", [])) if s.lora_dropout > 0 else 0
    return 4 * sh.hidden + (4 if sh.family != "gpt2" else 8) + Dtypes.of(s).mask * masks


def autocast_copies_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Autocast's 16-bit copies of fp32 block weights, kept for backward (none with checkpointing; the output
    head's copy is counted with the logits)."""
    if not s.amp or s.method != "full" or s.checkpointing:
        return 0
    return 2 * sh.layers * c.linear_params_per_layer


def logits_loss_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Logits and cross-entropy buffers at their peak (start of backward), for the run's loss kernel.

    The one place the loss kernel changes the estimate: `eager` (transformers' own) materialises the logits; `liger`
    holds one chunk of them (`liger_logits_bytes`; the traced path takes this term instead of the replay's logits, as
    a replay cannot run a Triton kernel); `trl_chunked` is TRL's log-prob head, one fixed tile."""
    if s.classifier:
        return 0
    if s.loss_kernel == "liger":
        return liger_logits_bytes(sh, c, s)
    head_copy = 2 * c.head_params if (s.amp and s.weight_bytes == 4) else 0
    if s.loss_kernel == "trl_chunked":
        compute = 2 if s.amp else 4
        tile = int(min(s.scored_tokens, TRL_TOKEN_TILE) * TRL_VOCAB_CHUNK * compute * TRL_TILES_ALIVE[s.device])
        head_grad = 4 * c.head_params if c.head_trainable else 0  # accumulated in fp32 by the backward
        return tile + 4 * s.tokens * sh.hidden + head_grad + head_copy  # + the fp32 gradient of the hidden states
    if s.loss_kernel != "eager":
        raise ValueError(f"loss kernel {s.loss_kernel!r}: no memory formula yet")
    return s.logits_bytes * s.tokens * sh.vocab + head_copy  # 12 B per token per vocab entry + a 16-bit head


def liger_chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Rows of logits Liger's fused linear cross-entropy holds at once (liger-kernel 0.8.5): the tokens split so a
    chunk of logits is about the size of the hidden states, rounded up to a power of two, at most all tokens."""
    inc_factor = -(-vocab // (LIGER_CHUNK_MEM_CONST * hidden))
    rows = 1 << max(0, (-(-tokens // inc_factor) - 1).bit_length())
    return min(rows, tokens)


def liger_logits_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Liger's fused linear cross-entropy at its peak (it computes the gradients in the forward): one chunk of logits,
    the gradient of the hidden states, the per-token loss, and the head's gradient when the head trains."""
    io = 2 if s.amp else 4  # the hidden states reach the head in the autocast dtype
    rows = liger_chunk_rows(s.tokens, sh.hidden, sh.vocab)
    head_grad = c.head_params * (4 if s.method == "full" else 2) if c.head_trainable else 0
    return rows * sh.vocab * io + s.tokens * sh.hidden * io + 4 * s.tokens + head_grad


def generation_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """Sampling the answers before a step (GRPO): the KV cache of the whole generation batch (keys and values of every
    layer for prompt + answer, in the dtype the layers compute in: the weights' under no autocast), plus the last
    position's logits, their processed copy and the sampling probabilities in fp32."""
    if not s.generation_rows:
        return 0
    kv_per_token = 2 * sh.layers * sh.kv_dim * s.weight_bytes
    return s.generation_rows * (s.seq * kv_per_token + 3 * 4 * sh.vocab)


def recompute_bytes(sh: Shape, c: Census, s: Settings) -> int:
    """With checkpointing: one block's activations rebuilt during its backward, plus the gradient buffers of its MLP
    (twice as many as without checkpointing: the recomputed forward's own temporaries overlap them)."""
    if not s.checkpointing:
        return 0
    lo = Dtypes.of(s).lo
    copies = 2 * c.linear_params_per_layer if (s.amp and s.method == "full") else 0
    return s.tokens * (layer_activation_bytes(sh, c, s) + 6 * lo * sh.intermediate + lo * sh.hidden) + copies


def backward_layer_bytes(sh: Shape, s: Settings) -> int:
    """Gradient buffers of one block in flight (the MLP-wide gradients)."""
    return s.tokens * 3 * Dtypes.of(s).lo * sh.intermediate


# ----------------------------------------------------------------------------- the whole picture


@dataclass
class Analytic:
    """Components (bytes) and the peak they add up to."""

    components: dict[str, int]
    peak: int
    peak_phase: str
    phases: dict[str, int]


def analyse(sh: Shape, c: Census, s: Settings) -> Analytic:
    """All components, and the peak as the max over the step's phases."""
    comp: dict[str, int] = {
        "weights": weights_bytes(c, s),
        "quant_constants": quant_constants_bytes(c, s),
        "lora": lora_bytes(c, s),
        "gradients": gradients_bytes(c, s),
        "optimizer": optimizer_bytes(c, s),
        "master_weights": 0,
        "activations": activations_bytes(sh, c, s),
        "logits_loss": logits_loss_bytes(sh, c, s),
        "optimizer_temporaries": optimizer_temporaries_bytes(c, s),
    }
    if s.reference == "copy":  # full fine-tuning's reference (DPO, KTO, GRPO): a frozen copy of the starting weights
        comp["reference_model"] = weights_bytes(c, s)
    if s.generation_rows:
        comp["generation_cache"] = generation_bytes(sh, c, s)
    if s.deepspeed:
        comp.update(zero_split(c, s))
    if s.gpus > 1 and not s.deepspeed:
        comp["ddp_buckets"] = comp["gradients"]  # DDP's gradient buckets: a second copy of the gradients
    static = sum(comp.get(k, 0) for k in ("weights", "reference_model", "quant_constants", "lora", "optimizer"))
    static += comp["master_weights"]
    static += comp.get("ddp_buckets", 0)
    grads_always = comp["gradients"] if s.accumulation > 1 else 0
    acts = comp["activations"]
    phases = {
        "start of backward (logits and loss)": static + grads_always + acts + comp["logits_loss"],
        "backward through the blocks": static + grads_always + acts + backward_layer_bytes(sh, s),
    }
    if s.checkpointing:
        phases["backward with recomputation"] = static + grads_always + acts + recompute_bytes(sh, c, s)
    phases["optimizer step"] = static + comp["gradients"] + comp["optimizer_temporaries"]
    if s.generation_rows:  # before the step's forward, after the last step's gradients were freed
        phases[GENERATION_PHASE] = static + comp["generation_cache"]
    if s.method == "full" and not s.classifier and s.loss_kernel == "eager":
        head_grad = 4 * c.head_params + s.tokens * sh.vocab * (6 if s.amp else 4)
        phases["backward through the output head"] = static + grads_always + acts + head_grad
    phase = max(phases, key=phases.get)
    return Analytic({k: v for k, v in comp.items()}, phases[phase], phase, phases)
