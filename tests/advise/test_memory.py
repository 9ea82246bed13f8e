"""The memory model against hand arithmetic, the seeds' figures, and vLLM's own KV sizing (recorded).

Model configs in tests/fixtures/models/ were typed in by hand from the published architectures (no hub here).
"""

from __future__ import annotations

import json
import struct

import pytest

from tests.helpers import FIXTURES, VLLM_DIR, series_values
from tuner.advise.facts import load_model
from tuner.advise.memory import plan, weights_bytes
from tuner.errors import ModelFactsError

from .test_scenarios import MODELS

GIB = 2**30


def test_llama3_8b_parameters_and_kv_bytes_by_hand():
    m = load_model(MODELS / "llama-3-8b")
    # per layer: q,o 2 x 4096 x 4096 + k,v 2 x 4096 x 1024 + MLP 3 x 4096 x 14336 + 2 norms x 4096 = 218,112,000
    # x 32 = 6,979,584,000; + embed and untied head 2 x 128256 x 4096 = 1,050,673,152; + final norm 4096
    assert m.params == 8_030_261_248  # Meta publishes 8.03 B
    p = plan(m, gpu_memory_bytes=80 * GIB, max_model_len=8192)
    assert p.weights_bytes == 2 * 8_030_261_248
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB


def test_seed_llama3_8b_on_24gb_at_085_and_8k():
    """Seed: Llama-3-8B on a 24 GB GPU at 0.85, 8K context. By hand, with 24 GiB:
    budget = floor(24 GiB x 0.85) = 21,904,333,209 - weights 16,060,522,496 - overhead (1 GiB + 8192 tokens x
    (4 x 4096 + 2 x 14336) x 2 B = 1,811,939,328) = 4,031,871,385 B; / (16 x 131072 B) = 1922 blocks = 30,752
    tokens = 3.75 sequences of 8192. It fits, with ~3.75 full-length sequences (not "dozens")."""
    p = plan(
        load_model(MODELS / "llama-3-8b"), gpu_memory_bytes=24 * GIB, gpu_memory_utilization=0.85, max_model_len=8192
    )
    assert p.overhead_bytes == 1_811_939_328
    assert p.kv_budget_bytes == 4_031_871_385
    assert (p.kv_blocks, p.kv_capacity_tokens) == (1922, 30_752)
    assert p.max_concurrency == pytest.approx(3.7539, abs=1e-4) and p.fits
    # A "24 GB" card with 24e9 bytes leaves 20.4e9 - 16.06e9 - 1.81e9 = 2.53e9 B: 1205 blocks, 2.35 sequences.
    small = plan(
        load_model(MODELS / "llama-3-8b"), gpu_memory_bytes=24 * 10**9, gpu_memory_utilization=0.85, max_model_len=8192
    )
    assert small.kv_blocks == 1205 and small.fits
    # fp8 KV halves bytes per token: 4,031,871,385 / (16 x 65,536) = 3845.1 -> 3845 blocks (2 x 1922 + the
    # half block the 16-bit layout floored away).
    fp8 = plan(
        load_model(MODELS / "llama-3-8b"),
        gpu_memory_bytes=24 * GIB,
        gpu_memory_utilization=0.85,
        max_model_len=8192,
        kv_cache_dtype="fp8",
    )
    assert fp8.kv_bytes_per_token == 65_536 and fp8.kv_blocks == 3845


def test_seed_70b_at_4bit_is_about_40gb():
    """Seed: 70B at 4-bit ~ 40 GB. Projections 68,451,041,280 params x (0.5 B + (2 B scale + 0.5 B zero)/128) =
    35,562,455,040 B, plus embeddings/head/norms 2,102,665,216 params kept 16-bit = 4,205,330,432 B:
    39,767,785,472 B = 39.8 GB. It survives; the naive 70.55e9 x 0.5 B = 35.3 GB forgets scales and embeddings."""
    m = load_model(MODELS / "llama-3-70b-awq")
    assert m.params == 70_553_706_496 and m.quantization == "awq"
    assert weights_bytes(m) == 39_767_785_472
    assert 39e9 < weights_bytes(m) < 41e9
    # the same architecture quantized on the fly: --quantization awq on the bf16 config gives the same figure
    assert weights_bytes(load_model(MODELS / "llama-3-70b"), "awq") == 39_767_785_472


def test_seed_128k_to_16k_cuts_kv_per_sequence_8x():
    """KV per sequence = max_model_len x 2 x 80 x 8 x 128 x 2 B = 327,680 B/token: 40 GiB at 128K, 5 GiB at 16K."""
    m = load_model(MODELS / "llama-3-70b")
    long = plan(m, gpu_memory_bytes=80 * GIB, tensor_parallel_size=4, max_model_len=131_072)
    short = plan(m, gpu_memory_bytes=80 * GIB, tensor_parallel_size=4, max_model_len=16_384)
    assert long.kv_bytes_per_sequence == 40 * GIB and short.kv_bytes_per_sequence == 5 * GIB
    assert long.kv_bytes_per_sequence / short.kv_bytes_per_sequence == 8
    # Same KV pool, so 8x the full-length sequences fit.
    assert short.max_concurrency == pytest.approx(8 * long.max_concurrency)
    # Per GPU with TP 4: 8 KV heads / 4 = 2 per GPU.
    assert long.kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2


def test_70b_bf16_does_not_fit_one_80gb_gpu_and_says_why():
    p = plan(load_model(MODELS / "llama-3-70b"), gpu_memory_bytes=80 * GIB, max_model_len=8192)
    assert not p.fits and "weights" in p.reason
    assert plan(
        load_model(MODELS / "llama-3-70b"), gpu_memory_bytes=80 * GIB, max_model_len=8192, tensor_parallel_size=2
    ).fits


@pytest.mark.parametrize("fixture", ["metrics_idle.txt", "metrics_kv_pressure.txt"])
def test_calibration_against_recorded_vllm_cache_config(fixture, tmp_path):
    """The tiny model (2 layers, 2 KV heads, head_dim 32, float32 served as bf16): 512 B/token, CPU blocks of 128.
    Recorded: 1 GiB -> 16384 blocks / 2,097,152 tokens; 3,000,000 B -> 45 blocks / 5760 tokens."""
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "vocab_size": 4096,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": True,
                "dtype": "float32",
            }
        )
    )
    [(live, _)] = series_values((VLLM_DIR / fixture).read_text(), "vllm:cache_config_info")
    p = plan(
        load_model(tmp_path),
        gpu_memory_bytes=2**34,
        max_model_len=1024,
        block_size=int(live["block_size"]),
        kv_cache_memory_bytes=int(live["kv_cache_memory_bytes"]),
    )
    assert abs(p.kv_blocks - int(live["num_gpu_blocks"])) <= 0.05 * int(live["num_gpu_blocks"])
    assert abs(p.kv_capacity_tokens - int(live["kv_cache_size_tokens"])) <= 0.05 * int(live["kv_cache_size_tokens"])
    assert p.kv_capacity_tokens == int(live["kv_cache_size_tokens"])  # in fact exact
    assert p.max_concurrency == pytest.approx(float(live["kv_cache_max_concurrency"]))


def test_safetensors_and_gguf_sizes_are_read(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((MODELS / "llama-3-8b" / "config.json").read_text())
    header = json.dumps(
        {
            "a": {"dtype": "BF16", "shape": [10], "data_offsets": [0, 20]},
            "b": {"dtype": "BF16", "shape": [5], "data_offsets": [20, 30]},
        }
    ).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 30)
    assert load_model(d).checkpoint_bytes == 30 and weights_bytes(load_model(d)) == 30

    path = tmp_path / "t.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_feed_forward_length(128)
    w.add_context_length(512)
    w.add_file_type(15)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = load_model(path)
    assert (g.num_layers, g.hidden_size, g.num_kv_heads, g.head_dim, g.quantization) == (3, 64, 2, 16, "Q4_K_M")
    assert g.checkpoint_bytes == path.stat().st_size and g.tie_word_embeddings


@pytest.mark.parametrize(
    "content,fragment",
    [
        (None, "expected a model directory"),
        ("{", "cannot read as JSON"),
        ('{"hidden_size": 8}', "no integer num_hidden_layers"),
    ],
)
def test_bad_model_paths_name_the_file_and_the_problem(tmp_path, content, fragment):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelFactsError) as err:
        load_model(path if content is not None else tmp_path / "nowhere")
    assert fragment in str(err.value) and str(tmp_path) in str(err.value)


def test_plan_rejects_bad_arguments():
    m = load_model(MODELS / "llama-3-8b")
    for kwargs in (
        {"gpu_memory_bytes": 0},
        {"gpu_memory_bytes": GIB, "gpu_memory_utilization": 1.5},
        {"gpu_memory_bytes": GIB, "tensor_parallel_size": 0},
        {"gpu_memory_bytes": GIB, "kv_cache_dtype": "q4"},
    ):
        with pytest.raises(ValueError):
            plan(m, **kwargs)


@pytest.mark.parametrize("fixture, blocks", [("metrics_idle.txt", 16384), ("metrics_kv_pressure.txt", 45)])
def test_breakdown_of_a_recorded_vllm_from_its_cache_config_and_kv_use(fixture, blocks):
    """The KV cache the server allocated is its blocks x block size x the KV bytes of a token (512 for the tiny
    model: 2 layers x 2 KV heads x 32 x K and V x 2 bytes); without the model only its budget is known. In use:
    allocated x kv_cache_usage_perc, as recorded."""
    from tuner.advise.memory import OVERHEAD_FIXED_BYTES, breakdown

    text = (VLLM_DIR / fixture).read_text()
    [(live, _)] = series_values(text, "vllm:cache_config_info")
    [(_, usage)] = series_values(text, "vllm:kv_cache_usage_perc")
    model = load_model(FIXTURES / "models" / "tiny-llama")
    b = breakdown(live, usage, model)
    assert int(live["num_gpu_blocks"]) == blocks and b.kv_source == "blocks"
    assert b.kv_cache_allocated_bytes == blocks * 128 * 512 <= int(live["kv_cache_memory_bytes"])
    assert b.kv_cache_used_bytes == int(blocks * 128 * 512 * usage)
    assert b.weights_bytes == weights_bytes(model) and b.overhead_bytes > OVERHEAD_FIXED_BYTES
    unknown = breakdown(live, usage, None)
    assert (unknown.kv_source, unknown.kv_cache_allocated_bytes) == ("budget", int(live["kv_cache_memory_bytes"]))
    assert unknown.weights_bytes is None and unknown.overhead_bytes is None
    assert breakdown({}, None, None).as_json() == {
        "weights_bytes": None,
        "kv_cache_allocated_bytes": None,
        "kv_cache_used_bytes": None,
        "overhead_bytes": None,
        "kv_source": "",
    }
