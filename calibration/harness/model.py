"""A tiny random-weight Llama and a byte-level BPE tokenizer trained locally: no hub downloads.

Run in an environment with torch, transformers and tokenizers (the vLLM environment)::

    python -m calibration.harness.model OUT_DIR [--seed 0] [--layers 4] [--hidden 256]

The folder is a regular Hugging Face model folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ...) that ``vllm serve OUT_DIR`` loads with ``HF_HUB_OFFLINE=1``.  Weights,
tokenizer and the training corpus are deterministic functions of the seed.  A second call with
the same arguments on an existing folder returns at once (``epdsim_model.json`` records them).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

MARKER = "epdsim_model.json"
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """Pseudo-text from a seeded syllable language: words repeat, so BPE learns merges."""
    rng = random.Random(seed)
    onsets = [
        "",
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "st",
        "tr",
        "pl",
        "qu",
        "sh",
        "ch",
        "th",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(3000)
    ]
    punct = [".", ",", "!", "?", ";", ":"]
    lines = []
    for _ in range(n_lines):
        n = rng.randint(5, 25)
        toks = [rng.choice(words) for _ in range(n)]
        if rng.random() < 0.3:
            toks.append(str(rng.randint(0, 99999)))
        lines.append(" ".join(toks).capitalize() + rng.choice(punct))
    return lines


def model_spec(
    seed: int = 0,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 512,
    vocab: int = 2048,
    max_positions: int = 4096,
) -> dict:
    return {
        "seed": seed,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate": intermediate,
        "vocab": vocab,
        "max_positions": max_positions,
    }


def make_tiny_llama(out_dir: str | Path, **kw) -> Path:
    """Write the model folder (idempotent for identical arguments); return its path."""
    spec = model_spec(**kw)
    out = Path(out_dir)
    marker = out / MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()).get("spec") == spec:
                return out
        except json.JSONDecodeError:
            pass
    import torch  # noqa: PLC0415 - heavy, in the vLLM environment only: loaded when the model is not there yet
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415 - as torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415 - as torch

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec["seed"]), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=spec["max_positions"],
    )
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=spec["max_positions"],
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec["seed"])
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    marker.write_text(json.dumps({"spec": spec, "generator": "calibration.harness.model"}, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.harness.model", description=__doc__.splitlines()[0])
    p.add_argument("out")
    for k, v in model_spec().items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v, dest=k)
    a = p.parse_args(argv)
    kw = {k: getattr(a, k) for k in model_spec()}
    path = make_tiny_llama(a.out, **kw)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
