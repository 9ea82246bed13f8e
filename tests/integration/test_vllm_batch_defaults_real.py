"""tuner's reading of "max-num-seqs / max-num-batched-tokens left out" against the vLLM it runs: the installed
vLLM's own ``EngineArgs.get_batch_defaults``, asked on this CPU host as it is, and with its platform made to report
each kind of GPU (no GPU here: only the device query is replaced, the rule that reads it is vLLM's own code)."""

from __future__ import annotations

import json
import subprocess

import realservers
from conftest import require

from tuner.advise.memory import GIB, vllm_batch_defaults

_ASK = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform as p
from vllm.usage.usage_lib import UsageContext
out = {"cpu": p.is_cpu()}
for label, gib, name, tp in json.loads(sys.argv[1]):
    if gib is not None:
        p.__class__.is_cpu = lambda self: False
        p.__class__.get_device_total_memory = classmethod(lambda cls, device_id=0, g=gib: g * 2**30)
        p.__class__.get_device_name = classmethod(lambda cls, device_id=0, n=name: n)
    batched, seqs = EngineArgs.get_batch_defaults(tp)
    out[label] = [seqs[UsageContext.OPENAI_API_SERVER], batched[UsageContext.OPENAI_API_SERVER]]
print(json.dumps(out))
"""

# label, GPU memory in GiB (None: this host as it is), device name, tensor-parallel size; the CPU cases come first
_CASES = [
    ("this CPU host", None, "", 1),
    ("this CPU host, tp 2", None, "", 2),
    ("L4 24 GiB", 24, "NVIDIA L4", 1),
    ("A100 80 GiB", 80, "NVIDIA A100-SXM4-80GB", 1),
    ("H100 80 GiB", 80, "NVIDIA H100 80GB HBM3", 1),
    ("H100 80 GiB, tp 2", 80, "NVIDIA H100 80GB HBM3", 2),
    ("H200 141 GiB", 141, "NVIDIA H200", 1),
    ("B200 180 GiB", 180, "NVIDIA B200", 1),
]


def test_the_batch_defaults_tuner_assumes_are_the_ones_vllm_takes():
    require(realservers.VLLM_PYTHON)
    got = subprocess.run(
        [str(realservers.VLLM_PYTHON.path()), "-c", _ASK, json.dumps(_CASES)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    vllm = json.loads(got.stdout.strip().splitlines()[-1])
    assert vllm.pop("cpu") is True  # the first two cases ask the host as vLLM sees it: a CPU platform
    assert set(vllm) == {c[0] for c in _CASES}
    for label, gib, name, tp in _CASES:
        mine = vllm_batch_defaults(None if gib is None else gib * GIB, name, tensor_parallel_size=tp)
        assert list(mine) == vllm[label], label
    # ... and they differ where it matters: a search from vLLM's defaults on this host sizes its steps by 128
    assert len({tuple(v) for v in vllm.values()}) >= 4
