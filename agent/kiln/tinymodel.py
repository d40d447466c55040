"""Make the tiny-cpu model on this machine: config.json from its profile and a locally trained tokenizer.

No weights are written: vLLM serves it with `--load-format dummy`.
"""

from __future__ import annotations

import json
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
