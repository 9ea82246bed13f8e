"""GPU telemetry → GpuReading: NVML on this host, or a dcgm-exporter's /metrics.

"No GPU here" (no NVML library, no driver, no device, ``gpu.source: none``) is a reading with
``available=False`` and a one-line reason, never an exception: tuner runs on CPU-only hosts too.
A configured dcgm-exporter that cannot be read is an error (ScrapeError / ExpositionError): the
operator asked for it, so the caller records why it failed.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from tuner.collect import http
from tuner.collect.exposition import decode_body
from tuner.collect.snapshots import GpuProcess, GpuReading, GpuSnapshot
from tuner.errors import ExpositionError, ScrapeError

__all__ = ["read_nvml", "parse_dcgm", "scrape_dcgm", "GpuCollector", "DEFAULT_MAX_BODY_BYTES"]

MIB = 2**20
DEFAULT_MAX_BODY_BYTES = 10 * MIB  # same as defaults.max_body_bytes
_U64_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as the unsigned long long the driver returns

# ---------------------------------------------------------------------------------------------- NVML


class _NoGpu(Exception):
    """NVML cannot be used on this host; the message is the reading's reason."""


_init_lock = threading.Lock()
_initialised: Any = None  # the pynvml module nvmlInit succeeded on; stays initialised for the process

_INIT_HINTS = {
    "NVMLError_LibraryNotFound": "libnvidia-ml.so.1 could not be loaded: no NVIDIA driver on this host",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel module is not loaded",
    "NVMLError_NoPermission": "this user cannot open /dev/nvidia*",
}


def _nvml() -> Any:
    """The initialised ``pynvml`` module, or _NoGpu saying why not."""
    global _initialised
    try:
        import pynvml  # imported here so a host without nvidia-ml-py still runs every other collector
    except ImportError:
        raise _NoGpu("NVML not available: the nvidia-ml-py package is not installed") from None
    with _init_lock:  # nvmlInit once per process, even when two threads read at once
        if _initialised is not pynvml:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                hint = _INIT_HINTS.get(type(exc).__name__)
                raise _NoGpu(f"NVML not available: {exc}" + (f" ({hint})" if hint else "")) from None
            _initialised = pynvml
    return pynvml


def _forget_nvml() -> None:
    global _initialised
    with _init_lock:
        _initialised = None  # init again next read: the driver may have been reloaded


def _nvml_errors(nv: Any) -> tuple[type[BaseException], ...]:
    # NVMLLibraryMismatchError (unversioned call on an old driver) is not an NVMLError subclass
    found = (getattr(nv, "NVMLError", None), getattr(nv, "NVMLLibraryMismatchError", None))
    return tuple(e for e in found if isinstance(e, type))


def read_nvml(now: float) -> GpuReading:
    """Every GPU NVML sees. A field the driver refuses (NotSupported, NoPermission...) is None."""
    try:
        nv = _nvml()
    except _NoGpu as exc:
        return GpuReading(source="nvml", ts=now, available=False, reason=str(exc))
    errors = _nvml_errors(nv)
    try:
        count = nv.nvmlDeviceGetCount()
    except errors as exc:
        _forget_nvml()
        return GpuReading(source="nvml", ts=now, available=False, reason=f"NVML could not count GPUs: {exc}")
    gpus, refused = [], []
    for index in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except errors as exc:
            refused.append(f"GPU {index}: {exc}")
            continue
        gpus.append(_nvml_device(nv, errors, index, handle))
    if not gpus:
        why = f" it could open ({'; '.join(refused)})" if refused else ""
        return GpuReading(source="nvml", ts=now, available=False, reason=f"NVML found no GPU{why}")
    return GpuReading(source="nvml", ts=now, available=True, gpus=tuple(gpus))


def _nvml_device(nv: Any, errors: tuple[type[BaseException], ...], index: int, handle: Any) -> GpuSnapshot:
    def ask(fn: Any, *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except errors:
            return None  # this GPU or this user cannot have that field: unknown, not a failed reading

    util = ask(nv.nvmlDeviceGetUtilizationRates)
    mem = _nvml_memory(nv, errors, handle)
    power_mw = ask(nv.nvmlDeviceGetPowerUsage)
    return GpuSnapshot(
        index=index,
        uuid=_text(ask(nv.nvmlDeviceGetUUID)),
        name=_text(ask(nv.nvmlDeviceGetName)),
        utilization=util.gpu / 100 if util is not None else None,
        memory_used_bytes=int(mem.used) if mem is not None else None,
        memory_total_bytes=int(mem.total) if mem is not None else None,
        temperature_c=_nvml_temperature(nv, errors, handle),
        power_w=power_mw / 1000 if power_mw is not None else None,
        processes=_nvml_processes(nv, errors, handle),
    )


def _nvml_memory(nv: Any, errors: tuple[type[BaseException], ...], handle: Any) -> Any:
    """Memory as nvidia-smi and DCGM's FB_USED count it: ``used`` without the driver's reserve (v2).

    The v1 call counts that reserve as used (about 615 MiB on an idle H200 that nvidia-smi shows at
    0 MiB); a driver or binding without v2 still gives v1.
    """
    v2 = getattr(nv, "nvmlMemory_v2", None)
    for args in ((v2,), ()) if v2 is not None else ((),):
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, *args)
        except errors:
            continue
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def _nvml_temperature(nv: Any, errors: tuple[type[BaseException], ...], handle: Any) -> float | None:
    # nvmlDeviceGetTemperature is deprecated (to go in CUDA 14); older drivers lack the V call
    for name in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            return float(fn(handle, nv.NVML_TEMPERATURE_GPU))
        except getattr(nv, "NVMLError_FunctionNotFound", ()):
            continue
        except errors:
            return None
    return None


def _nvml_processes(nv: Any, errors: tuple[type[BaseException], ...], handle: Any) -> tuple[GpuProcess, ...]:
    found: dict[int, GpuProcess] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(nv, name)(handle)
        except errors:
            continue  # the graphics list is NotSupported on many datacenter GPUs
        for proc in procs:
            pid, used = int(proc.pid), proc.usedGpuMemory
            used = None if used is None or used >= _U64_NOT_AVAILABLE else int(used)
            seen = found.get(pid)
            if seen is None or (seen.used_memory_bytes is None and used is not None):
                found[pid] = GpuProcess(pid=pid, name=seen.name if seen else _comm(pid), used_memory_bytes=used)
    return tuple(sorted(found.values(), key=lambda p: p.pid))


def _comm(pid: int) -> str:
    try:  # NVML reports host pids: in another pid namespace /proc may not show them
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------------------- dcgm-exporter

_UTIL, _TEMP, _POWER = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"
_FB_USED, _FB_FREE, _FB_RESERVED = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
_WANTED = frozenset({_UTIL, _TEMP, _POWER, _FB_USED, _FB_FREE, _FB_RESERVED})
_DCGM_BLANK_MIN = 0x7FFFFFF0  # DCGM's BLANK / NOT_SUPPORTED sentinels (int32, int64, fp64) all sit above


def parse_dcgm(text: str, now: float) -> GpuReading:
    """One GpuSnapshot per ``gpu`` label. dcgm-exporter cannot attribute processes, so none are listed."""
    values: dict[int, dict[str, float | None]] = {}
    ident: dict[int, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in _WANTED:
                    continue
                gpu = s.labels.get("gpu", "")
                if not gpu.isdigit():
                    raise ExpositionError(f"{s.name} sample has no numeric gpu label: {dict(s.labels)}")
                value = float(s.value)
                # with Kubernetes pod labels a GPU can repeat per pod, always with the same value
                values.setdefault(int(gpu), {})[s.name] = (
                    value if math.isfinite(value) and value < _DCGM_BLANK_MIN else None
                )
                ident.setdefault(int(gpu), {}).update(
                    {k: v for k, v in s.labels.items() if k in ("UUID", "modelName", "device") and v}
                )
    except ExpositionError:
        raise
    except (ValueError, IndexError, TypeError) as exc:
        raise ExpositionError(f"not a valid Prometheus text exposition ({exc})") from None
    if not values:
        raise ExpositionError(
            "no DCGM_FI_DEV_* GPU samples in the body: is gpu.url the /metrics of a dcgm-exporter (default port 9400)?"
        )
    return GpuReading(
        source="dcgm", ts=now, available=True, gpus=tuple(_dcgm_gpu(i, values[i], ident[i]) for i in sorted(values))
    )


def _dcgm_gpu(index: int, v: dict[str, float | None], labels: dict[str, str]) -> GpuSnapshot:
    used, free, reserved = v.get(_FB_USED), v.get(_FB_FREE), v.get(_FB_RESERVED)
    total = used + free + (reserved or 0.0) if used is not None and free is not None else None
    util = v.get(_UTIL)
    return GpuSnapshot(
        index=index,
        uuid=labels.get("UUID", ""),
        name=labels.get("modelName") or labels.get("device", ""),
        utilization=util / 100 if util is not None else None,
        memory_used_bytes=round(used * MIB) if used is not None else None,
        memory_total_bytes=round(total * MIB) if total is not None else None,
        temperature_c=v.get(_TEMP),
        power_w=v.get(_POWER),
        processes=(),
    )


def scrape_dcgm(url: str, *, timeout_s: float, max_body_bytes: int, now: float) -> GpuReading:
    """GET a dcgm-exporter's /metrics (bounded in time and size) and parse it."""
    resp = http.get(url, timeout_s=timeout_s, max_bytes=max_body_bytes)
    if resp.status != 200:
        raise ScrapeError(
            f"{url} answered HTTP {resp.status}; check that gpu.url is dcgm-exporter's "
            "/metrics (default port 9400) and that the exporter is healthy"
        )
    return parse_dcgm(decode_body(resp.body), now)


# ---------------------------------------------------------------------------------------- the source


class GpuCollector:
    """Reads GPU telemetry from the configured ``gpu.source``; the daemon calls ``read(now)``."""

    def __init__(
        self,
        source: Literal["none", "nvml", "dcgm"],
        url: str | None = None,
        timeout_s: float = 3.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if source not in ("none", "nvml", "dcgm"):
            raise ValueError(f"gpu.source must be none, nvml or dcgm, got {source!r}")
        if source == "dcgm" and not url:
            raise ValueError("gpu.source dcgm needs gpu.url, e.g. http://127.0.0.1:9400/metrics")
        self.source, self.url = source, url
        self.timeout_s, self.max_body_bytes = timeout_s, max_body_bytes

    def read(self, now: float) -> GpuReading:
        """NVML never raises; dcgm raises ScrapeError / ExpositionError for the caller to record."""
        if self.source == "nvml":
            return read_nvml(now)
        if self.source == "dcgm":
            assert self.url is not None
            return scrape_dcgm(self.url, timeout_s=self.timeout_s, max_body_bytes=self.max_body_bytes, now=now)
        return GpuReading(source="none", ts=now, available=False, reason="GPU telemetry disabled (gpu.source: none)")
