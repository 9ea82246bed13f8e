"""tuner's NVML reading beside nvidia-smi's, taken back to back, five times."""

import subprocess
import time

from tuner.collect.gpu import read_nvml

Q = "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
for i in range(5):
    t = time.time()
    r = read_nvml(t)
    smi = subprocess.run(
        ["nvidia-smi", f"--query-gpu={Q}", "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout.strip()
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"--- reading {i} available={r.available} reason={r.reason!r}")
    for g in r.gpus:
        print(
            f"tuner: index={g.index} uuid={g.uuid} name={g.name} util={g.utilization} "
            f"used_MiB={None if g.memory_used_bytes is None else g.memory_used_bytes / 2**20:.0f} "
            f"total_MiB={None if g.memory_total_bytes is None else g.memory_total_bytes / 2**20:.0f} "
            f"temp={g.temperature_c} power_W={g.power_w}"
        )
        for p in g.processes:
            print(
                f"tuner:   pid={p.pid} name={p.name} used_MiB="
                f"{None if p.used_memory_bytes is None else p.used_memory_bytes / 2**20:.0f}"
            )
    print(f"smi:   {smi}")
    print(f"smi apps: {apps or '(none)'}")
    time.sleep(3)
