"""GPU load for scripts/gpu-check/check.sh: hold 30 GiB and multiply bf16 matrices for argv[1] seconds."""

import sys
import time

import torch

hold = torch.empty(30 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
open("/tmp/g/load-ready", "w").write(str(time.time()))
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(f"{n} products, {torch.cuda.memory_reserved() / 2**30:.2f} GiB reserved by torch")
