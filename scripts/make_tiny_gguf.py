#!/usr/bin/env python3
"""Write a tiny llama-architecture GGUF with random weights that llama-server can serve.

Usage: make_tiny_gguf.py OUT.gguf [--force] [--vocab-from HF_MODEL_DIR]

Needs only the `gguf` package and numpy; no model hub. The vocabulary is SentencePiece-style: <unk>/<s>/</s>,
the 256 byte-fallback tokens, printable ASCII (space as U+2581) and the chatml markers. Weights are random but
deterministic (fixed seed), so the same file comes out on every machine.

--vocab-from takes the vocabulary instead from a Hugging Face model folder's byte-level BPE tokenizer.json (the tiny
model scripts/make_tiny_hf_model.py writes): llama-server then counts a prompt's tokens as vLLM and vLLM's benchmark
client count them. The SentencePiece vocabulary above spells text almost a character a token, about 4x the BPE's
count, so a workload replayed on llama-server with the HF tokenizer's lengths overflowed its slots (bench/tune.py).

Random weights would sample byte tokens that decode to invalid UTF-8 (llama-server then answers HTTP 500), so
residual dimension 0 is held at a constant and column 0 of the output matrix acts as a per-token bias that
pushes byte and control tokens far down: generated text is always printable ASCII and always runs to
max_tokens (end-of-generation tokens are never sampled), which keeps load tests predictable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

SEED = 20261121
N_EMBD = 128
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 256
N_CTX = 2048
HEAD_DIM = N_EMBD // N_HEAD
BIAS_DIM = 0  # residual dimension held constant and used as the bias input of the output layer
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    """SPM-style vocab: specials, byte fallback, printable ASCII ('\u2581' is the space), chatml markers."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    chars = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    tokens += chars
    types += [gguf.TokenType.NORMAL] * len(chars)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [gguf.TokenType.CONTROL] * 2
    # SPM merges by score; single characters never merge, so equal scores are enough.
    scores = [0.0] * len(tokens)
    return tokens, scores, [int(t) for t in types]


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character a byte-level BPE spells each byte with."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def bpe_vocab(model_dir: Path) -> tuple[list[str], list[int], list[str], dict[str, int], list[bool]]:
    """The byte-level BPE of ``model_dir``/tokenizer.json: tokens by id, their types (the added special tokens are
    control tokens), merges as "a b", the special ids (bos, eos, pad, unk), and which tokens random weights may
    sample: those that spell printable ASCII only (llama-server answers HTTP 500 on invalid UTF-8)."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    conf = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or (tok.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise SystemExit(f"{model_dir}/tokenizer.json: not a byte-level BPE (model {model.get('type')})")
    vocab: dict[str, int] = model["vocab"]
    specials = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    tokens = [""] * (max([*vocab.values(), *specials.values()]) + 1)
    for text, i in {**vocab, **specials}.items():
        tokens[i] = text
    types = [
        int(gguf.TokenType.CONTROL if i in specials.values() else gguf.TokenType.NORMAL) for i in range(len(tokens))
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    byte_of = _byte_decoder()

    def printable(text: str) -> bool:
        return bool(text) and all(c in byte_of and 0x20 <= byte_of[c] < 0x7F for c in text)

    sample = [types[i] == gguf.TokenType.NORMAL and printable(t) for i, t in enumerate(tokens)]
    ids = {
        k: specials[conf[k]] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if conf.get(k) in specials
    }
    return tokens, types, merges, ids, sample


def build_tensors(
    types: list[int], rng: np.random.Generator, sample: list[bool] | None = None
) -> dict[str, np.ndarray]:
    """Random weights; the tokens random sampling may produce are ``sample`` (default: the normal tokens)."""
    n_vocab = len(types)
    n_kv = N_HEAD_KV * HEAD_DIM

    def rand(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # numpy shapes are (rows, cols) = ggml ne reversed: token_embd is ne {n_embd, n_vocab}.
    embd = rand(n_vocab, N_EMBD)
    embd[:, BIAS_DIM] = 1.0  # constant input for the bias column; layers never write this dimension
    out = rand(n_vocab, N_EMBD, std=1.0)
    is_normal = np.array(sample if sample is not None else [t == gguf.TokenType.NORMAL for t in types])
    out[:, BIAS_DIM] = np.where(is_normal, 0.0, -10.0)  # after RMSNorm dim 0 is ~+11: byte/control logits -110
    tensors = {"token_embd.weight": embd}
    for i in range(N_LAYER):
        attn_out = rand(N_EMBD, N_EMBD)
        ffn_down = rand(N_EMBD, N_FF)
        attn_out[BIAS_DIM, :] = 0.0  # keep residual dim 0 constant through the block
        ffn_down[BIAS_DIM, :] = 0.0
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": np.ones(N_EMBD, np.float32),
                f"blk.{i}.attn_q.weight": rand(N_EMBD, N_EMBD),
                f"blk.{i}.attn_k.weight": rand(n_kv, N_EMBD),
                f"blk.{i}.attn_v.weight": rand(n_kv, N_EMBD),
                f"blk.{i}.attn_output.weight": attn_out,
                f"blk.{i}.ffn_norm.weight": np.ones(N_EMBD, np.float32),
                f"blk.{i}.ffn_gate.weight": rand(N_FF, N_EMBD),
                f"blk.{i}.ffn_up.weight": rand(N_FF, N_EMBD),
                f"blk.{i}.ffn_down.weight": ffn_down,
            }
        )
    tensors["output_norm.weight"] = np.ones(N_EMBD, np.float32)
    tensors["output.weight"] = out
    return tensors


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as the GGUF carries it: each token's type, which tokens random weights may sample (None: the
    normal ones), and the tokenizer's keys, written by ``add_to``."""

    types: list[int]
    sample: list[bool] | None
    add_to: Callable[[gguf.GGUFWriter], None]


def spm_vocab() -> Vocab:
    """``build_vocab``'s SentencePiece-style vocabulary."""
    tokens, scores, types = build_vocab()

    def add_to(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    return Vocab(types, None, add_to)


def hf_bpe_vocab(model_dir: Path) -> Vocab:
    """``bpe_vocab``'s byte-level BPE, keyed as llama.cpp's convert_hf_to_gguf.py writes a GPT-2-style one."""
    tokens, types, merges, ids, sample = bpe_vocab(model_dir)

    def add_to(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(ids["bos_token"])
        w.add_eos_token_id(ids["eos_token"])
        if "pad_token" in ids:
            w.add_pad_token_id(ids["pad_token"])
        if "unk_token" in ids:
            w.add_unk_token_id(ids["unk_token"])

    return Vocab(types, sample, add_to)


def write_gguf(path: Path, vocab: Vocab) -> None:
    tensors = build_tensors(vocab.types, np.random.default_rng(SEED), vocab.sample)
    tmp = path.with_suffix(path.suffix + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("tuner-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab.types))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab.add_to(w)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)  # atomic: a half-written file never looks like a finished model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="path of the .gguf to write")
    ap.add_argument("--force", action="store_true", help="rewrite even if the file exists")
    ap.add_argument(
        "--vocab-from",
        type=Path,
        metavar="HF_MODEL_DIR",
        help="take the vocabulary from this model folder's byte-level BPE tokenizer.json (counts as the HF one does)",
    )
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"exists, skipping: {args.out}", file=sys.stderr)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(args.out, hf_bpe_vocab(args.vocab_from) if args.vocab_from else spm_vocab())
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
