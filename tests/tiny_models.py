"""Tiny randomly initialised models of real architectures, and a small byte-level BPE chat tokenizer for them:
test fixtures (fast, offline), not product code."""
from __future__ import annotations

from pathlib import Path

_CORPUS = [
    "def add(a, b):\n    return a + b\n", "def has_close_elements(numbers, threshold):\n",
    "    for idx, elem in enumerate(numbers):\n        if abs(elem - elem2) < threshold:\n            return True\n",
    "Fix the bug in the following function. Reply with the whole corrected function in a ```python block.",
    "You are a helpful assistant that repairs buggy Python code.", "assert candidate([1.0, 2.0], 0.5) == False",
    "import math\nfrom typing import List\n", "The tests failed with AssertionError: expected 3, got -1",
]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_test_tokenizer(vocab_size: int = 512):
    """A small byte-level BPE with ChatML special tokens, trained in milliseconds on a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    return fast


def tiny_qwen2(**overrides):
    """A Qwen2Config small enough to build and run in milliseconds (2 layers, 4 heads over 2 KV heads, untied
    lm_head); `overrides` change any field (a bigger hidden size where a test needs large matrices)."""
    from transformers import Qwen2Config

    fields = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False)
    return Qwen2Config(**{**fields, **overrides})


def make_random_model(config, folder: str | Path, seed: int = 0, tokenizer=None) -> Path:
    """Save a randomly initialised model of `config` (a PretrainedConfig of a real architecture) and a test
    tokenizer to `folder`, loadable with `path: folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    tok = tokenizer or make_test_tokenizer(min(config.vocab_size, 512))
    config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
