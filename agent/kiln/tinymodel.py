"""Make the tiny-cpu model on this machine: config.json from its profile and a locally trained tokenizer.

No weights are written: vLLM serves it with `--load-format dummy`.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.profiles.schema import Profile

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CORPUS = (
    "kiln bakes GPU machine images that serve large language models with vLLM. "
    "The agent detects the GPUs, reads the user's choice, plans tensor parallelism and starts the engines. "
    "Throughput and latency are measured, not assumed. The quick brown fox jumps over the lazy dog. "
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`"
)


def config_json(profile: Profile) -> dict[str, object]:
    a = profile.architecture
    return {
        "architectures": [a.hf_architecture],
        "model_type": "llama",
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": a.max_position_embeddings,
        "tie_word_embeddings": a.tie_word_embeddings,
        "torch_dtype": a.torch_dtype,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def make_tiny_model(profile: Profile, target: Path) -> Path:
    """Write config.json and a BPE tokenizer for `profile` into `target` (idempotent)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config_json(profile), indent=2) + "\n")
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=profile.architecture.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>",
        "model_max_length": profile.architecture.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    return target


def make_tiny_adapter(profile: Profile, target: Path, rank: int = 8, seed: int = 0) -> Path:
    """A LoRA adapter of the tiny model (PEFT's files: adapter_config.json, adapter_model.safetensors), its
    attention's query and value projections changed by random weights, so that its answers differ from the base's."""
    a = profile.architecture
    head_dim = a.head_dim or a.hidden_size // a.num_attention_heads
    outputs = {"q_proj": a.num_attention_heads * head_dim, "v_proj": a.num_kv_heads * head_dim}
    rng = random.Random(seed)
    tensors: dict[str, tuple[list[int], list[float]]] = {}
    for layer in range(a.num_layers):
        for module, out in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = ([rank, a.hidden_size],
                                                  [rng.gauss(0, 1) for _ in range(rank * a.hidden_size)])
            tensors[f"{prefix}.lora_B.weight"] = ([out, rank], [rng.gauss(0, 1) for _ in range(out * rank)])
    target.mkdir(parents=True, exist_ok=True)
    (target / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "bias": "none", "target_modules": sorted(outputs), "base_model_name_or_path": profile.name,
        "fan_in_fan_out": False, "use_dora": False, "modules_to_save": None}, indent=2) + "\n")
    write_safetensors(target / "adapter_model.safetensors", tensors)
    return target


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], list[float]]]) -> None:
    """float32 tensors in the safetensors format: an 8-byte header length, a JSON header, then the data."""
    header: dict[str, object] = {}
    blobs = []
    offset = 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
