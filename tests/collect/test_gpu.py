"""GPU telemetry: NVML on this host (real), NVML's mapping (stand-ins), dcgm-exporter (real HTTP)."""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tuner.collect import gpu
from tuner.collect.gpu import GpuCollector, parse_dcgm, read_nvml, scrape_dcgm
from tuner.collect.snapshots import GpuProcess
from tuner.errors import ExpositionError, ScrapeError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dcgm-exporter" / "metrics_2gpus.txt"
MIB = 2**20
NOW = 1_700_000_000.0


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _fresh_nvml_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "_initialised", None)  # each test sees a process that never ran nvmlInit


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _dead_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A second real process, to stand for another program sharing the GPU."""
    proc = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 5
    while _comm(proc.pid) != "sleep" and time.monotonic() < deadline:
        time.sleep(0.01)  # Popen can return (vfork) before the kernel renames the child at exec
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------ NVML, for real


@pytest.mark.skipif(_nvml_library_present(), reason="this host has NVML; see test_read_nvml_on_a_gpu_host")
def test_read_nvml_without_nvml_is_unavailable_with_a_reason() -> None:
    for _ in range(2):  # a second read tries again and answers the same
        reading = read_nvml(NOW)
        assert (reading.source, reading.ts, reading.available, reading.gpus) == ("nvml", NOW, False, ())
        assert "NVML" in reading.reason and "Library Not Found" in reading.reason
        assert "\n" not in reading.reason
    assert GpuCollector("nvml").read(NOW) == reading


@pytest.mark.skipif(not _nvml_library_present(), reason="no NVIDIA driver on this host")
def test_read_nvml_on_a_gpu_host() -> None:
    reading = read_nvml(NOW)
    assert reading.available, reading.reason
    for g in reading.gpus:
        assert g.uuid.startswith(("GPU-", "MIG-")) and g.name
        assert g.memory_total_bytes and 0 <= (g.memory_used_bytes or 0) <= g.memory_total_bytes
        assert g.utilization is None or 0 <= g.utilization <= 1
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return
    query = "--query-gpu=uuid,name,memory.used,memory.total"
    rows = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
    for row, g in zip(rows.stdout.strip().splitlines(), reading.gpus, strict=True):
        uuid, name, used_mib, total_mib = (cell.strip() for cell in row.split(","))
        assert (g.uuid, g.name, round(g.memory_total_bytes / MIB)) == (uuid, name, int(total_mib))
        # used as nvidia-smi counts it (without the driver's reserve); 64 MiB for what moved between the reads
        assert abs((g.memory_used_bytes or 0) / MIB - int(used_mib)) <= 64, (g.memory_used_bytes, used_mib)


# ------------------------------------------------------------------- NVML's mapping, with stand-ins


def _proc(pid: int, used: int | None) -> types.SimpleNamespace:
    # the shape nvidia-ml-py returns: nvmlFriendlyObject(pid, usedGpuMemory, gpuInstanceId, computeInstanceId)
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def _stand_in_pynvml(devices: list[dict[str, Any]], init_error: type[Exception] | None = None) -> types.ModuleType:
    """A stand-in for the ``pynvml`` module of nvidia-ml-py 13.x, because no GPU exists on CI machines.

    Same function names, arguments and return shapes; the exception classes are nvidia-ml-py's own
    (``NVMLError_NotSupported`` is a subclass of ``NVMLError``). A device field holding an exception
    class raises it, as the real call does when the driver refuses that field.
    """
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    for name in dir(pynvml):  # NVMLError, NVMLError_NotSupported, ..., NVMLLibraryMismatchError
        if name.startswith("NVMLError") or name == "NVMLLibraryMismatchError":
            setattr(nv, name, getattr(pynvml, name))
    nv.init_calls = 0

    def nvmlInit() -> None:
        nv.init_calls += 1
        if init_error is not None:
            raise init_error()

    def field(key: str) -> Any:
        def call(handle: dict[str, Any], *args: Any) -> Any:
            if key.startswith("temp"):
                assert args == (pynvml.NVML_TEMPERATURE_GPU,)
            value = handle[key]
            if isinstance(value, type) and issubclass(value, BaseException):
                raise value()
            return value

        return call

    nv.nvmlInit = nvmlInit
    nv.nvmlDeviceGetCount = lambda: len(devices)
    nv.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    for fn, key in [
        ("UUID", "uuid"),
        ("Name", "name"),
        ("UtilizationRates", "util"),
        ("MemoryInfo", "mem"),
        ("TemperatureV", "temp_v"),
        ("Temperature", "temp"),
        ("PowerUsage", "power_mw"),
        ("ComputeRunningProcesses", "compute"),
        ("GraphicsRunningProcesses", "graphics"),
    ]:
        setattr(nv, f"nvmlDeviceGet{fn}", field(key))
    return nv


def test_nvml_mapping_units_fields_and_processes(monkeypatch: pytest.MonkeyPatch, sleeper: int) -> None:
    """With-GPU path on a stand-in pynvml (CI machines have no GPU). Pins the mapping: percent ->
    fraction, mW -> W, bytes as NVML gives them, a field raising NotSupported -> None while the rest
    is read, processes deduped by pid across the compute and graphics lists, a GPU shared with another
    process -> both listed, names from /proc/<pid>/comm ("" when gone), nvmlInit called once.
    """
    me, gone = os.getpid(), _dead_pid()
    h100 = dict(
        uuid="GPU-3f9b2c1e-7a4d-5e8f-9b0c-1d2e3f4a5b6c",
        name="NVIDIA H100 80GB HBM3",
        util=types.SimpleNamespace(gpu=37, memory=21),
        mem=types.SimpleNamespace(total=85_520_809_984, free=8_564_768_768, used=76_956_041_216),
        temp_v=54,
        temp=54,
        power_mw=312_489,
        # vLLM (this process) and another program share the GPU; vLLM is in both lists
        compute=[_proc(me, 72_000_000_000), _proc(sleeper, 1_073_741_824)],
        graphics=[_proc(me, None)],
    )
    old = dict(
        uuid="GPU-a81c6d0f-2b3e-4c5d-8e9f-0a1b2c3d4e5f",
        name="Tesla T4",
        util=pynvml.NVMLError_NotSupported,
        mem=types.SimpleNamespace(total=16_106_127_360, free=16_106_127_360, used=0),
        temp_v=pynvml.NVMLError_FunctionNotFound,
        temp=31,  # a driver without nvmlDeviceGetTemperatureV
        power_mw=pynvml.NVMLError_NotSupported,
        compute=[_proc(gone, None), _proc(gone - 1, 2**64 - 1)],  # 2**64-1: NVML_VALUE_NOT_AVAILABLE
        graphics=pynvml.NVMLError_NoPermission,
    )
    nv = _stand_in_pynvml([h100, old])
    monkeypatch.setitem(sys.modules, "pynvml", nv)

    reading = read_nvml(NOW)
    assert (reading.source, reading.ts, reading.available, reading.reason) == ("nvml", NOW, True, "")
    g0, g1 = reading.gpus
    assert (g0.index, g0.uuid, g0.name) == (0, h100["uuid"], "NVIDIA H100 80GB HBM3")
    assert g0.utilization == pytest.approx(0.37)  # percent -> fraction
    assert (g0.memory_used_bytes, g0.memory_total_bytes) == (76_956_041_216, 85_520_809_984)  # bytes as given
    assert g0.temperature_c == 54.0
    assert g0.power_w == pytest.approx(312.489)  # mW -> W
    assert sorted(g0.processes, key=lambda p: p.pid) == list(g0.processes)
    assert set(g0.processes) == {
        GpuProcess(me, _comm(me), 72_000_000_000),  # deduped, memory kept
        GpuProcess(sleeper, "sleep", 1_073_741_824),
    }

    assert (g1.index, g1.name, g1.memory_used_bytes) == (1, "Tesla T4", 0)
    assert g1.utilization is None and g1.power_w is None  # NotSupported -> None, the rest still read
    assert g1.temperature_c == 31.0  # fell back to the deprecated call
    assert g1.processes == (GpuProcess(gone - 1, "", None), GpuProcess(gone, "", None))

    assert read_nvml(NOW + 1).gpus == reading.gpus
    assert nv.init_calls == 1  # initialised once, kept initialised


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (pynvml.NVMLError_DriverNotLoaded, "Driver Not Loaded"),
        (pynvml.NVMLError_NoPermission, "Insufficient Permissions"),
    ],
)
def test_nvml_that_cannot_start_is_unavailable(monkeypatch: pytest.MonkeyPatch, error: type, words: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _stand_in_pynvml([], init_error=error))
    reading = read_nvml(NOW)
    assert not reading.available and reading.reason.startswith("NVML not available") and words in reading.reason


def test_nvml_with_no_devices_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _stand_in_pynvml([]))
    assert read_nvml(NOW).reason == "NVML found no GPU"


_HANDLE_BASE = 0x5000


class _OldLibNvml:
    """libnvidia-ml.so.1's C entry points, written in Python, for the *real* nvidia-ml-py binding to call.

    A second stand-in (no GPU on CI machines), one layer lower: it pins what the binding itself does
    with NVML's answers — ctypes structs, bytes to str, NVML_VALUE_NOT_AVAILABLE to None, return codes
    to NVMLError subclasses — so a change in nvidia-ml-py shows up here. This one is a driver older
    than nvmlDeviceGetTemperatureV.
    """

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus

    def _gpu(self, handle: Any) -> dict[str, Any]:
        return self.gpus[ctypes.cast(handle, ctypes.c_void_p).value - _HANDLE_BASE]

    def nvmlInitWithFlags(self, flags: int) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        ctypes.cast(ctypes.pointer(device._obj), ctypes.POINTER(ctypes.c_void_p))[0] = _HANDLE_BASE + index.value
        return 0

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(handle)["uuid"].encode()
        return 0

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(handle)["name"].encode()
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle: Any, util: Any) -> int:
        util._obj.gpu, util._obj.memory = self._gpu(handle)["util"], 0
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: Any, mem: Any) -> int:
        total, used, reserved = self._gpu(handle)["mem"]
        mem._obj.total, mem._obj.used, mem._obj.free = total, used + reserved, total - used - reserved
        return 0

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp: Any) -> int:
        assert sensor.value == pynvml.NVML_TEMPERATURE_GPU
        temp._obj.value = self._gpu(handle)["temp"]
        return 0

    def nvmlDeviceGetPowerUsage(self, handle: Any, mw: Any) -> int:
        power = self._gpu(handle)["power_mw"]
        if power is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        mw._obj.value = power
        return 0

    def _procs(self, key: str, handle: Any, count: Any, array: Any) -> int:
        procs = self._gpu(handle)[key]
        if array is None:  # the size query
            count._obj.value = len(procs)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else 0
        for slot, (pid, used) in zip(array, procs):
            slot.pid, slot.usedGpuMemory = pid, used
        count._obj.value = len(procs)
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, array: Any) -> int:
        return self._procs("compute", handle, count, array)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, array: Any) -> int:
        return self._procs("graphics", handle, count, array)


class _NewLibNvml(_OldLibNvml):
    """A current driver: has nvmlDeviceGetTemperatureV and nvmlDeviceGetMemoryInfo_v2."""

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, mem: Any) -> int:
        assert mem._obj.version == pynvml.nvmlMemory_v2
        total, used, reserved = self._gpu(handle)["mem"]
        mem._obj.total, mem._obj.reserved, mem._obj.used = total, reserved, used
        mem._obj.free = total - used - reserved
        return 0

    def nvmlDeviceGetTemperatureV(self, handle: Any, temp: Any) -> int:
        assert temp._obj.sensorType == pynvml.NVML_TEMPERATURE_GPU
        temp._obj.temperature = self._gpu(handle)["temp"]
        return 0


@pytest.mark.parametrize("lib", [_OldLibNvml, _NewLibNvml])
def test_real_binding_over_a_stand_in_library(monkeypatch: pytest.MonkeyPatch, lib: type, sleeper: int) -> None:
    gpus = [
        dict(
            uuid="GPU-3f9b2c1e-7a4d-5e8f-9b0c-1d2e3f4a5b6c",
            name="NVIDIA H100 80GB HBM3",
            util=37,
            mem=(85_520_809_984, 76_956_041_216, 565_182_464),  # total, used, the driver's reserve
            temp=54,
            power_mw=312_489,
            compute=[(sleeper, 1_073_741_824), (os.getpid(), 2**64 - 1)],
            graphics=[(sleeper, 1_073_741_824)],
        ),
        dict(
            uuid="GPU-a81c6d0f-2b3e-4c5d-8e9f-0a1b2c3d4e5f",
            name="NVIDIA H200",  # idle, as one read on a lent machine: nvidia-smi showed 0 MiB used
            util=0,
            mem=(150_754_820_096, 0, 644_939_776),
            temp=31,
            power_mw=None,
            compute=[],
            graphics=[],
        ),
    ]
    monkeypatch.setattr(pynvml, "nvmlLib", lib(gpus))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)

    g0, g1 = read_nvml(NOW).gpus
    assert (g0.uuid, g0.name, g0.utilization, g0.temperature_c) == (gpus[0]["uuid"], gpus[0]["name"], 0.37, 54.0)
    assert (g0.memory_total_bytes, g0.power_w) == (85_520_809_984, 312.489)
    # a current driver: used as nvidia-smi shows it; an older one (no v2 call) counts the reserve as used
    reserve = 0 if lib is _NewLibNvml else 565_182_464
    assert g0.memory_used_bytes == 76_956_041_216 + reserve
    assert g1.memory_used_bytes == (0 if lib is _NewLibNvml else 644_939_776)
    assert set(g0.processes) == {
        GpuProcess(sleeper, "sleep", 1_073_741_824),
        GpuProcess(os.getpid(), _comm(os.getpid()), None),
    }
    assert (g1.name, g1.utilization, g1.power_w, g1.processes) == ("NVIDIA H200", 0.0, None, ())


# --------------------------------------------------------------------------------- dcgm-exporter


def test_parse_dcgm_two_gpus_in_tuner_units() -> None:
    reading = parse_dcgm(FIXTURE.read_text(), NOW)
    assert (reading.source, reading.ts, reading.available, reading.reason) == ("dcgm", NOW, True, "")
    g0, g1 = reading.gpus
    assert (g0.index, g0.uuid, g0.name) == (0, "GPU-3f9b2c1e-7a4d-5e8f-9b0c-1d2e3f4a5b6c", "NVIDIA H100 80GB HBM3")
    assert g0.utilization == pytest.approx(0.37)
    assert g0.memory_used_bytes == 72856 * MIB
    assert g0.memory_total_bytes == (72856 + 8168 + 535) * MIB == 81559 * MIB  # used + free + reserved
    assert (g0.power_w, g0.temperature_c, g0.processes) == (312.489, 54.0, ())
    assert (g1.index, g1.uuid) == (1, "GPU-a81c6d0f-2b3e-4c5d-8e9f-0a1b2c3d4e5f")
    assert (g1.utilization, g1.memory_used_bytes, g1.memory_total_bytes) == (0.0, MIB, 81559 * MIB)
    assert (g1.power_w, g1.temperature_c) == (69.872, 31.0)
    assert g1.memory_used_ratio == pytest.approx(1 / 81559)


def test_parse_dcgm_older_exporter_and_blank_values() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0", UUID="GPU-8c16e996", device="nvidia0"} 1024\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0", UUID="GPU-8c16e996", device="nvidia0"} 3072\n'
        # DCGM's int64 / fp64 "blank" sentinels: the exporter prints them as values
        'DCGM_FI_DEV_GPU_TEMP{gpu="0", UUID="GPU-8c16e996", device="nvidia0"} 9223372036854775794\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0", UUID="GPU-8c16e996", device="nvidia0"} 140737488355328.000000\n'
    )
    (g,) = parse_dcgm(text, NOW).gpus
    assert (g.name, g.memory_used_bytes, g.memory_total_bytes) == ("nvidia0", 1024 * MIB, 4096 * MIB)  # no reserved
    assert g.temperature_c is None and g.power_w is None and g.utilization is None


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} thirty-seven\n',
        '{"gpu": 0, "util": 37}',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1} 37\n',
    ],
)
def test_parse_dcgm_rejects_garbage(text: str) -> None:
    with pytest.raises(ExpositionError, match="not a valid Prometheus text exposition"):
        parse_dcgm(text, NOW)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "no DCGM_FI_DEV_"),
        ('vllm:num_requests_running{engine="0"} 1\n', "is gpu.url the /metrics of a dcgm-exporter"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1"} 37\n', "no numeric gpu label"),
    ],
)
def test_parse_dcgm_rejects_bodies_that_are_not_dcgm(text: str, match: str) -> None:
    with pytest.raises(ExpositionError, match=match):
        parse_dcgm(text, NOW)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/slow":
            time.sleep(2)
        body = {"/metrics": FIXTURE.read_bytes(), "/huge": b"# padding\n" * 10_000}.get(self.path, b"oops\n")
        self.send_response(200 if self.path in ("/metrics", "/huge", "/huge-unsized") else 500)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if self.path == "/huge-unsized":  # no Content-Length: the cap must hold while streaming
            self.end_headers()
            try:
                for _ in range(1_000):
                    self.wfile.write(b"# padding\n" * 10)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading at its cap: what the test wants
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving the fixture as dcgm-exporter would."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_dcgm_over_http(exporter: str) -> None:
    reading = scrape_dcgm(f"{exporter}/metrics", timeout_s=5, max_body_bytes=1 * MIB, now=NOW)
    assert reading == parse_dcgm(FIXTURE.read_text(), NOW)
    assert GpuCollector("dcgm", url=f"{exporter}/metrics").read(NOW) == reading


def test_scrape_dcgm_http_error(exporter: str) -> None:
    with pytest.raises(ScrapeError, match=r"/error answered HTTP 500; check that gpu.url"):
        scrape_dcgm(f"{exporter}/error", timeout_s=5, max_body_bytes=MIB, now=NOW)


def test_scrape_dcgm_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(ScrapeError, match=f"{url}.*refused"):
        scrape_dcgm(url, timeout_s=5, max_body_bytes=MIB, now=NOW)


@pytest.mark.parametrize("path", ["/huge", "/huge-unsized"])
def test_scrape_dcgm_body_over_the_cap(exporter: str, path: str) -> None:
    with pytest.raises(ScrapeError, match=r"exceeds max_body_bytes=50000"):
        scrape_dcgm(f"{exporter}{path}", timeout_s=5, max_body_bytes=50_000, now=NOW)


def test_scrape_dcgm_timeout(exporter: str) -> None:
    started = time.monotonic()
    with pytest.raises(ScrapeError, match=r"/slow.*0\.3s"):
        scrape_dcgm(f"{exporter}/slow", timeout_s=0.3, max_body_bytes=MIB, now=NOW)
    assert time.monotonic() - started < 1.5


# ------------------------------------------------------------------------------------- the source


def test_collector_none_and_bad_settings() -> None:
    assert GpuCollector("none").read(NOW).reason == "GPU telemetry disabled (gpu.source: none)"
    assert not GpuCollector("none").read(NOW).available
    with pytest.raises(ValueError, match="gpu.url"):
        GpuCollector("dcgm")
    with pytest.raises(ValueError, match="none, nvml or dcgm"):
        GpuCollector("rocm")  # type: ignore[arg-type]
