#!/usr/bin/env python3
"""Write a tiny llama-architecture GGUF with random weights that llama-server can serve.

Usage: make_tiny_gguf.py OUT.gguf [--force]

Needs only the `gguf` package and numpy; no model hub. The vocabulary is SentencePiece-style: <unk>/<s>/</s>,
the 256 byte-fallback tokens, printable ASCII (space as U+2581) and the chatml markers. Weights are random but
deterministic (fixed seed), so the same file comes out on every machine.

Random weights would sample byte tokens that decode to invalid UTF-8 (llama-server then answers HTTP 500), so
residual dimension 0 is held at a constant and column 0 of the output matrix acts as a per-token bias that
pushes byte and control tokens far down: generated text is always printable ASCII and always runs to
max_tokens (end-of-generation tokens are never sampled), which keeps load tests predictable.
"""

from __future__ import annotations

import argparse
import sys
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


def build_tensors(types: list[int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    n_vocab = len(types)
    n_kv = N_HEAD_KV * HEAD_DIM

    def rand(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # numpy shapes are (rows, cols) = ggml ne reversed: token_embd is ne {n_embd, n_vocab}.
    embd = rand(n_vocab, N_EMBD)
    embd[:, BIAS_DIM] = 1.0  # constant input for the bias column; layers never write this dimension
    out = rand(n_vocab, N_EMBD, std=1.0)
    is_normal = np.array([t == gguf.TokenType.NORMAL for t in types])
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


def write_gguf(path: Path) -> None:
    tokens, scores, types = build_vocab()
    tensors = build_tensors(types, np.random.default_rng(SEED))
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
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
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
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"exists, skipping: {args.out}", file=sys.stderr)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
