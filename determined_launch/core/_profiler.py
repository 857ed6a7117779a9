"""``core_context.profiler``: system metrics sampled with psutil into the run directory.

Determined ships these samples to its master for the web UI; off-cluster
each report is one line of ``<run_dir>/profiler.jsonl``: the averages of
``samples_per_report`` samples taken ``sampling_interval`` seconds apart,
grouped as Determined groups them (``cpu``, ``memory``, ``disk``, ``network``,
and ``gpu`` where NVML sees GPUs: the ``[gpu]`` extra's ``nvidia-ml-py``),
plus the node (``cross_rank``) and host name. Metrics are per machine, so only
each node's ``local_rank`` 0 samples. With ``--report-to mlflow`` the chief's
node's samples also go to MLflow as its system metrics (core/trackers/).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir

logger = logging.getLogger("determined_launch.core")

STREAM = "profiler"
_GiB = 1024.0**3
GROUPS = ("cpu", "memory", "disk", "network", "gpu")


def open_nvml() -> Optional[tuple[Any, list[Any]]]:
    """NVML and its GPU handles, or ``None`` (no package, no driver, no GPU):
    GPU sampling is then off, said once at debug level."""
    try:
        import pynvml  # the [gpu] extra: nvidia-ml-py
    except ImportError:
        logger.debug("profiler: no GPU metrics (the nvidia-ml-py package is not installed: "
                     "pip install 'determined_launch[gpu]')")
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as e:  # pynvml.NVMLError: no driver or library on this machine
        logger.debug("profiler: no GPU metrics (NVML: %s)", e)
        return None
    if not handles:
        logger.debug("profiler: no GPU metrics (NVML sees no GPU)")
        _shutdown(pynvml)
        return None
    return pynvml, handles


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as e:  # only a log line: the sampler is ending anyway
        logger.debug("profiler: NVML shutdown: %s", e)


def gpu_sample(nvml: Any, handles: list[Any]) -> dict[str, float]:
    """Per GPU ``i``: ``gpu_util_<i>`` (percent of time a kernel ran),
    ``gpu_memory_used_<i>`` (GiB) and ``gpu_memory_percent_<i>``; a GPU whose
    query fails (it fell off the bus) is left out of this sample."""
    out: dict[str, float] = {}
    for i, handle in enumerate(handles):
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as e:  # pynvml.NVMLError
            logger.debug("profiler: GPU %d: %s", i, e)
            continue
        out[f"gpu_util_{i}"] = float(util.gpu)
        out[f"gpu_memory_used_{i}"] = mem.used / _GiB
        out[f"gpu_memory_percent_{i}"] = 100.0 * mem.used / mem.total if mem.total else 0.0
    return out


def _sample(psutil: Any, last: dict[str, Any], now: float,
            gpu: Optional[Callable[[], dict[str, float]]] = None) -> dict[str, dict[str, float]]:
    """One sample; disk and network as rates since the previous one."""
    mem = psutil.virtual_memory()
    disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
    out = {
        "cpu": {"cpu_util_simple": float(psutil.cpu_percent(interval=None))},
        "memory": {"free_memory": mem.available / _GiB,
                   "memory_percent": float(mem.percent)},
        "disk": {},
        "network": {},
        "gpu": gpu() if gpu is not None else {},
    }
    dt = now - last.get("time", now)
    if dt > 0 and disk is not None and "disk" in last:
        out["disk"] = {
            "disk_iops": (disk.read_count + disk.write_count
                          - last["disk"].read_count - last["disk"].write_count) / dt,
            "disk_throughput_read": (disk.read_bytes - last["disk"].read_bytes) / dt,
            "disk_throughput_write": (disk.write_bytes - last["disk"].write_bytes) / dt,
        }
    if dt > 0 and net is not None and "net" in last:
        out["network"] = {
            "net_throughput_sent": (net.bytes_sent - last["net"].bytes_sent) / dt,
            "net_throughput_recv": (net.bytes_recv - last["net"].bytes_recv) / dt,
        }
    last.update(time=now, disk=disk, net=net)
    return out


def _average(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for group in GROUPS:
        values: dict[str, list[float]] = {}
        for s in samples:
            for k, v in s.get(group, {}).items():
                values.setdefault(k, []).append(v)
        if values or group != "gpu":  # no "gpu" group on a machine without one
            out[group] = {k: sum(v) / len(v) for k, v in values.items()}
    return out


class ProfilerContext:
    """``on()`` starts a background sampler thread, ``off()`` stops it; both idempotent."""

    def __init__(self, dist: Collectives, run_dir: RunDir,
                 on_report: Optional[Callable[[dict[str, Any]], None]] = None) -> None:
        self._dist = dist
        self._run_dir = run_dir
        self._on_report = on_report  # the chief's trackers (core/trackers: system metrics)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def on(self, sampling_interval: float = 1, samples_per_report: int = 10) -> None:
        if self._thread is not None:
            return
        if sampling_interval < 0.1:
            raise ValueError(f"sampling_interval must be >= 0.1 seconds, got {sampling_interval}")
        if isinstance(samples_per_report, bool) or not isinstance(samples_per_report, int) or (
                samples_per_report < 1):
            raise ValueError(f"samples_per_report must be an int >= 1, got {samples_per_report!r}")
        if getattr(self._dist, "local_rank", self._dist.rank) != 0:
            return
        import psutil  # a dependency, but only samplers need it

        logger.info("profiler: sampling system metrics into %s/%s.jsonl",
                    self._run_dir.path, STREAM)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(psutil, float(sampling_interval), samples_per_report),
            name="det-profiler", daemon=True)
        self._thread.start()

    def off(self) -> None:
        self._close()

    def _close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=10)

    def _run(self, psutil: Any, interval: float, per_report: int) -> None:
        nvml = open_nvml()  # on this thread: NVML's init may take a second
        gpu = (lambda: gpu_sample(*nvml)) if nvml is not None else None
        try:
            last: dict[str, Any] = {}
            psutil.cpu_percent(interval=None)  # the first call only sets the baseline
            _sample(psutil, last, time.monotonic())
            samples: list[dict[str, dict[str, float]]] = []
            while not self._stop.wait(interval):
                samples.append(_sample(psutil, last, time.monotonic(), gpu))
                if len(samples) >= per_report:
                    self._report(samples)
                    samples = []
            if samples:
                self._report(samples)
        finally:
            if nvml is not None:
                _shutdown(nvml[0])

    def _report(self, samples: list[dict[str, dict[str, float]]]) -> None:
        record = {"node": getattr(self._dist, "cross_rank", 0), "host": socket.gethostname(),
                  "time": time.time(), **_average(samples)}
        try:
            self._run_dir.append(STREAM, record)
        except OSError as e:  # a full disk must not kill training from a side thread
            logger.warning("profiler: cannot write %s: %s", self._run_dir.path, e)
        if self._on_report is not None:
            self._on_report(record)  # a queue append (trackers never raise into here)


class DummyProfilerContext(ProfilerContext):
    """A profiler that never samples (``core._dummy_init``)."""

    def __init__(self) -> None:
        self._thread = None

    def on(self, sampling_interval: float = 1, samples_per_report: int = 10) -> None:
        pass
