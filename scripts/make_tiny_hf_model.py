#!/usr/bin/env python3
"""Write a tiny Llama model (random weights) plus a locally trained tokenizer that vLLM can serve.

Usage: make_tiny_hf_model.py OUTDIR [--force]     (run with the vLLM venv's python: needs torch,
                                                    transformers, tokenizers)

No model hub is reachable here, so everything is made on this machine: a ~4k-token byte-level BPE tokenizer
trained on deterministically generated text, a chatml chat template, and a 2-layer Llama (hidden 128,
4 heads / 2 KV heads, 2048 positions) with seeded random weights. About 3 MB. The directory is complete in
itself (config, safetensors, tokenizer, template), so `--model OUTDIR --served-model-name NAME` just works.
Skips when OUTDIR/config.json exists, unless --force.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 20261121
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Common English words (tuner's load prompts use these) and syllables for made-up words, so BPE has
# enough distinct pairs to reach the target vocabulary.
WORDS = (
    "the of and to in is it that for on was with as be at by this from or an are not have but all were they "
    "one had which you can their there more when will what so up out if about who get them some would like "
    "time could into has two other than then its only new see way may these first any work well also back "
    "after use our how over such year most even want because good give day just know request model server "
    "token cache batch queue latency memory prompt prefix throughput decode prefill sequence running waiting"
).split()
SYLLABLES = (
    "ka ri to mo na se lu pe vi da go ne ta ru mi so ke ba lo fi ze an en in on un ar er or st tr pl gr ch sh th qu"
).split()


def corpus(n_lines: int = 20000) -> list[str]:
    """Deterministic training text: words, made-up words, numbers, punctuation and a little code."""
    rng = random.Random(SEED)
    punct = [".", ",", "?", "!", ":", ";", " -", " (x)", " [1]", " {}"]
    lines = []
    for i in range(n_lines):
        parts = []
        for _ in range(rng.randint(6, 18)):
            r = rng.random()
            if r < 0.55:
                parts.append(rng.choice(WORDS))
            elif r < 0.85:
                parts.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
            elif r < 0.95:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 5))))
            else:
                parts.append(f"def f_{rng.randint(0, 99)}(x): return x * {rng.randint(2, 9)}")
        line = " ".join(parts) + rng.choice(punct)
        lines.append(line.capitalize() if i % 3 == 0 else line)
    return lines


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def write_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = build_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="</s>",
        additional_special_tokens=["<|im_start|>", "</s>"],
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,  # halves the file: ~3 MB in float32
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()

    # Write into a temp dir next to OUTDIR and rename: a half-written model never looks finished.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(
            "# tuner tiny-llama\n\nRandom weights (seed %d) and a locally trained %d-token byte-level BPE "  # noqa: UP031
            "tokenizer, made by tuner's scripts/make_tiny_hf_model.py for tests. Output is noise.\n"
            % (SEED, len(tokenizer))
        )
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp makes 0700: let other users (CI runners) read the model
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--force", action="store_true", help="rewrite even if OUTDIR/config.json exists")
    args = ap.parse_args(argv)
    out: Path = args.outdir.resolve()
    if (out / "config.json").exists() and not args.force:
        print(f"exists, skipping: {out}", file=sys.stderr)
    else:
        write_model(out)
        size = sum(p.stat().st_size for p in out.iterdir()) / 1e6
        vocab = json.loads((out / "config.json").read_text())["vocab_size"]
        print(f"wrote {out} ({size:.1f} MB, vocab {vocab})", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
