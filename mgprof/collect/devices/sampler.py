"""Background samplers: NVML readings of this rank's GPUs, or process/system CPU figures without.

A sampler is a daemon thread that reads every ``interval_s`` and stores columns (one list per
metric). It fails open: whatever breaks inside it (a lost GPU, a driver error) becomes one line in
``SamplerRecord.errors`` and the training thread never sees an exception, from ``start()``,
from the thread, or from ``stop()``.
"""

from __future__ import annotations

import csv
import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import psutil

from mgprof.atomic import write_text_atomic
from mgprof.collect.devices.device_map import (
    DeviceMapError,
    cuda_device_identity,
    resolve_nvml_device,
)
from mgprof.collect.devices.nvml import (
    FALLBACK_HINT,
    PCIE_COLUMNS,
    READ_COLUMNS,
    NvmlSession,
    clock_event_reason_bits,
    decode_clock_event_reasons,
)
from mgprof.errors import UsageError
from mgprof.records import DeviceSamples, SamplerRecord

__all__ = [
    "CPU_COLUMNS",
    "CpuSampler",
    "NvmlSampler",
    "Sampler",
    "read_samples_csv",
    "start_sampler",
    "summarize_columns",
    "write_samples_csv",
]

Clock = Callable[[], float]
CPU_COLUMNS: tuple[str, ...] = ("cpu_pct", "rss_mib", "sys_cpu_pct")
_NO_MEAN = frozenset({"clock_event_reasons"})  # a bitmask: mean/max mean nothing


PCIE_EVERY_TICKS = 50
"""PCIe throughput is read every 50th tick (every 5 s at 10 Hz): NVML averages it over a 20 ms
window per call, which measured ~46 ms of sampler time on an H200, against ~3 ms for all the
other queries together."""

ENERGY_EVERY_TICKS = 10
"""The energy counter is read on the first tick, every 10th after it (1 Hz at 10 Hz) and the
last: one read measured ~3.2 ms on an H200 (the other per-tick queries: ~30 µs together), and
energy over the run needs only the cumulative counter's first and last readings; the ones
between keep a partial figure when a run ends without its last tick."""


class _Series:
    """One device's columns, appended under the sampler's lock."""

    def __init__(self, device: str, columns: Sequence[str], facts: dict[str, Any]) -> None:
        self.device = device
        self.t_s: list[float] = []
        self.columns: dict[str, list[float | None]] = {c: [] for c in columns}
        self.facts = facts
        self.active = True

    def append(self, t_s: float, values: dict[str, float | None]) -> None:
        self.t_s.append(t_s)
        for name, column in self.columns.items():
            column.append(values.get(name))


def summarize_columns(columns: dict[str, list[float | None]]) -> dict[str, float | None]:
    """``<col>_mean`` and ``<col>_max`` over the non-missing values of each column."""
    summary: dict[str, float | None] = {}
    for name, values in columns.items():
        if name in _NO_MEAN:
            continue
        present = [v for v in values if v is not None]
        summary[f"{name}_mean"] = sum(present) / len(present) if present else None
        summary[f"{name}_max"] = max(present) if present else None
    return summary


def _energy_j(energy_mj: list[float | None]) -> float | None:
    """Energy over the run from the counter's first and last readings; None if not measurable."""
    present = [v for v in energy_mj if v is not None]
    if len(present) < 2:
        return None
    delta = present[-1] - present[0]
    return delta / 1000.0 if delta >= 0 else None  # a counter reset mid-run: no honest figure


class Sampler:
    """Thread, schedule, locking and fail-open handling shared by the NVML and CPU samplers.

    ``tick()`` takes one sample synchronously (what the thread calls); tests drive it directly
    with a :class:`mgprof.testing.ManualClock`. ``stop()`` takes a last sample so even a run
    shorter than one interval has a first and a last reading.
    """

    kind: Literal["nvml", "cpu", "none"] = "none"

    def __init__(
        self,
        *,
        interval_s: float = 0.1,
        clock: Clock = time.monotonic,
        reason: str = "",
        errors: Sequence[str] = (),
    ) -> None:
        if not interval_s > 0:
            raise UsageError(f"sampler interval_s must be > 0 seconds, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.reason = reason
        self._clock = clock
        self._lock = threading.RLock()  # guards the stored samples and errors
        self._tick_lock = threading.Lock()  # one reader of the devices at a time
        self._stop_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._series: list[_Series] = []
        self._errors: list[str] = list(errors)
        self._t0: float | None = None
        self._started_unix_s: float | None = None
        self._record: SamplerRecord | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Sampler:
        """Start the sampling thread (idempotent while running). Never raises on sampler faults."""
        with self._lock:
            if self._record is not None:
                raise UsageError("this sampler was stopped; start a new one with start_sampler()")
            if self._thread is not None:
                return self
            self._t0 = self._clock()
            self._started_unix_s = time.time()
            thread = threading.Thread(target=self._run, name=f"mgprof-{self.kind}-sampler")
            thread.daemon = True
            try:
                thread.start()
            except RuntimeError as exc:  # e.g. "can't start new thread": run on, unsampled
                self._error(f"sampler thread could not start: {exc}")
                return self
            self._thread = thread
        return self

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop_event.is_set():
                began = self._clock()
                self.tick()
                spent = self._clock() - began
                self._stop_event.wait(max(0.0, self.interval_s - spent))
        except Exception as exc:  # the sampler dies, the training goes on
            self._error(f"sampler thread stopped: {type(exc).__name__}: {exc}")

    def stop(self) -> SamplerRecord:
        """Stop, take a last sample, return the record. Idempotent, thread-safe, never raises."""
        with self._stop_lock:
            if self._record is not None:
                return self._record
            try:
                self._stop_event.set()
                thread = self._thread
                hung = False
                if thread is not None:
                    thread.join(timeout=self.interval_s + 5.0)
                    hung = thread.is_alive()
                if hung:
                    self._error(
                        "sampler thread did not stop within "
                        f"{self.interval_s + 5.0:.1f} s (a hung driver call?); samples so far kept"
                    )
                else:
                    if thread is not None:
                        self.tick()
                    self._close()  # not under a hung call: shutting NVML down beneath it is unsafe
            except Exception as exc:
                self._error(f"stopping the sampler failed: {type(exc).__name__}: {exc}")
            self._record = self._build_record()
            return self._record

    def _close(self) -> None:
        """Release resources (NVML session) after the last sample."""

    # --- sampling --------------------------------------------------------------------------

    def tick(self) -> None:
        """Take one sample of every active device; faults are recorded, never raised.

        Reads happen outside the data lock, so a driver call that hangs cannot block ``stop()``.
        """
        with self._tick_lock:
            if self._t0 is None:
                self._t0 = self._clock()
            for series in self._series:
                if not series.active:
                    continue
                t_s = self._clock() - self._t0
                try:
                    values = self._read(series)
                except Exception as exc:
                    series.active = False
                    series.facts["stopped"] = f"{type(exc).__name__}: {exc}"
                    self._error(
                        f"{series.device}: sampling stopped after {len(series.t_s)} sample(s): "
                        f"{exc}"
                    )
                    continue
                with self._lock:
                    series.append(t_s, values)

    def _read(self, series: _Series) -> dict[str, float | None]:
        raise NotImplementedError

    def _error(self, message: str) -> None:
        with self._lock:
            if message not in self._errors:
                self._errors.append(message)

    # --- record ----------------------------------------------------------------------------

    def _summary(self, series: _Series) -> dict[str, float | None]:
        summary = summarize_columns(series.columns)
        summary["samples"] = float(len(series.t_s))
        return summary

    def _build_record(self) -> SamplerRecord:
        with self._lock:
            devices = []
            for series in self._series:
                summary = self._summary(series)  # may add facts (throttle reasons seen)
                facts = dict(series.facts)
                if self._started_unix_s is not None:
                    facts["started_unix_s"] = self._started_unix_s
                devices.append(
                    DeviceSamples(
                        device=series.device,
                        t_s=list(series.t_s),
                        columns={k: list(v) for k, v in series.columns.items()},
                        summary=summary,
                        facts=facts,
                    )
                )
            return SamplerRecord(
                kind=self.kind,
                reason=self.reason,
                interval_s=self.interval_s,
                devices=devices,
                errors=list(self._errors),
            )

    def snapshot(self) -> SamplerRecord:
        """The record so far, without stopping (for live views)."""
        return self._build_record()


class NvmlSampler(Sampler):
    """Samples the NVML devices of this rank.

    ``devices`` pairs the label stored in the record (``cuda:N``, this process's CUDA index) with
    the NVML index of the same GPU (see :mod:`mgprof.collect.devices.device_map`).
    ``pcie_every`` reads
    the PCIe counters on every Nth tick only (each read blocks ~20 ms on a real GPU; 0 = never).
    The session is shut down by :meth:`stop`.
    """

    kind = "nvml"

    def __init__(
        self,
        session: NvmlSession,
        devices: Sequence[tuple[str, int]],
        *,
        interval_s: float = 0.1,
        pcie_every: int = PCIE_EVERY_TICKS,
        energy_every: int = ENERGY_EVERY_TICKS,
        clock: Clock = time.monotonic,
        reason: str = "",
        errors: Sequence[str] = (),
    ) -> None:
        super().__init__(interval_s=interval_s, clock=clock, reason=reason, errors=errors)
        if pcie_every < 0:
            raise UsageError(f"pcie_every must be >= 0 ticks, got {pcie_every}")
        if energy_every < 1:
            raise UsageError(f"energy_every must be >= 1 tick, got {energy_every}")
        self.energy_every = energy_every
        self._session = session
        self.pcie_every = pcie_every
        self._handles: dict[str, Any] = {}
        self._skip: dict[str, set[str]] = {}
        self._ticks: dict[str, int] = {}
        for label, nvml_index in devices:
            facts: dict[str, Any] = {
                "nvml_index": nvml_index,
                "pcie_every_ticks": pcie_every,
                "energy_every_ticks": energy_every,
            }
            series = _Series(label, READ_COLUMNS, facts)
            self._series.append(series)
            try:
                self._handles[label] = session.handle(nvml_index)
                facts.update(session.device_facts(nvml_index))
            except Exception as exc:
                series.active = False
                self._error(f"{label}: NVML device {nvml_index} not readable: {exc}")
            self._skip[label] = set()
            self._ticks[label] = 0

    def _read(self, series: _Series) -> dict[str, float | None]:
        tick = self._ticks[series.device]
        self._ticks[series.device] = tick + 1
        pcie = self.pcie_every > 0 and tick % self.pcie_every == 0
        # the stop event is set before stop()'s last tick: the counter's last reading is kept
        energy = tick % self.energy_every == 0 or self._stop_event.is_set()
        values = self._session.read(
            self._handles[series.device], pcie=pcie, energy=energy, skip=self._skip[series.device]
        )
        if not pcie:
            for name in PCIE_COLUMNS:
                values[name] = None
        return values

    def _close(self) -> None:
        self._session.shutdown()

    def _summary(self, series: _Series) -> dict[str, float | None]:
        summary = super()._summary(series)
        summary["energy_j"] = _energy_j(series.columns["energy_mj"])
        # An idle GPU lowers its clocks on purpose; only reasons seen while it works matter.
        module = self._session.module
        idle = clock_event_reason_bits(module)["gpu_idle"]
        seen = 0
        for mask in series.columns["clock_event_reasons"]:
            if mask is not None and not int(mask) & idle:
                seen |= int(mask)
        series.facts["throttle_reasons_seen"] = decode_clock_event_reasons(seen, module)
        return summary


class CpuSampler(Sampler):
    """Process CPU (% of one core, like ``top``), resident memory, and system CPU, via psutil.

    The first reading of each CPU percentage is None: psutil needs two points to measure.
    """

    kind = "cpu"

    def __init__(
        self,
        *,
        interval_s: float = 0.1,
        clock: Clock = time.monotonic,
        reason: str = "",
        errors: Sequence[str] = (),
        pid: int | None = None,
    ) -> None:
        super().__init__(interval_s=interval_s, clock=clock, reason=reason, errors=errors)
        facts: dict[str, Any] = {"pid": pid or os.getpid()}
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
            facts["cpu_count_logical"] = psutil.cpu_count(logical=True)
            facts["cpu_count_physical"] = psutil.cpu_count(logical=False)
            facts["memory_total_mib"] = psutil.virtual_memory().total / 2**20
        except Exception as exc:
            self._process = None
            self._error(f"cpu: psutil cannot read process {pid or os.getpid()}: {exc}")
        series = _Series("cpu", CPU_COLUMNS, facts)
        series.active = self._process is not None
        self._series.append(series)
        self._primed = False

    def _read(self, series: _Series) -> dict[str, float | None]:
        assert self._process is not None
        with self._process.oneshot():
            cpu = self._process.cpu_percent(None)
            rss = self._process.memory_info().rss / 2**20
        system = psutil.cpu_percent(None)
        if not self._primed:
            self._primed = True
            return {"cpu_pct": None, "rss_mib": rss, "sys_cpu_pct": None}
        return {"cpu_pct": cpu, "rss_mib": rss, "sys_cpu_pct": system}


def start_sampler(
    cuda_indices: list[int] | None,
    interval_s: float = 0.1,
    nvml_module: Any = None,
    clock: Clock = time.monotonic,
    *,
    pcie_every: int = PCIE_EVERY_TICKS,
    energy_every: int = ENERGY_EVERY_TICKS,
    identify: Callable[[int], tuple[str | None, str | None]] = cuda_device_identity,
    environ: dict[str, str] | None = None,
    start: bool = True,
) -> Sampler:
    """Start the best sampler this rank can have: NVML for its GPUs, else the CPU sampler.

    The choice and its reason land in ``SamplerRecord.reason``. Never raises for an environment
    problem (no driver, unmappable device): those pick the CPU sampler and say why.
    ``identify`` gives (uuid, pci_bus_id) of a CUDA index; ``environ`` defaults to os.environ.
    """
    env = os.environ if environ is None else environ

    def cpu(reason: str, errors: Sequence[str] = ()) -> Sampler:
        sampler = CpuSampler(interval_s=interval_s, clock=clock, reason=reason, errors=errors)
        return sampler.start() if start else sampler

    if not cuda_indices:
        return cpu("no CUDA devices in use; CPU sampler used")
    session = NvmlSession(nvml_module)
    why = session.init()
    if why is not None:
        return cpu(
            f"NVML not available: {why.removesuffix('; ' + FALLBACK_HINT)}; CPU sampler used"
        )
    errors: list[str] = []
    devices: list[tuple[str, int]] = []
    try:
        facts = session.all_device_facts()
        for index in cuda_indices:
            uuid, pci = identify(index)
            try:
                match = resolve_nvml_device(
                    facts,
                    uuid=uuid,
                    pci_bus_id=pci,
                    cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                    cuda_index=index,
                    cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
                )
            except DeviceMapError as exc:
                errors.append(f"cuda:{index}: {exc}")
                continue
            devices.append((f"cuda:{index}", match.index))
    except Exception as exc:
        session.shutdown()
        return cpu(f"NVML not available: {exc}; CPU sampler used", errors)
    if not devices:
        session.shutdown()
        return cpu("NVML cannot tell which GPU this rank uses; CPU sampler used", errors)
    sampler = NvmlSampler(
        session,
        devices,
        interval_s=interval_s,
        pcie_every=pcie_every,
        energy_every=energy_every,
        clock=clock,
        reason=f"NVML sampler on {', '.join(label for label, _ in devices)}",
        errors=errors,
    )
    return sampler.start() if start else sampler


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def write_samples_csv(record: SamplerRecord, path: str | os.PathLike[str]) -> Path:
    """Write all devices' samples as one CSV: ``device,t_s,<columns...>``; empty cell = no value.

    Written atomically, so a reader never sees half a file.
    """
    names: list[str] = []
    for dev in record.devices:
        names.extend(c for c in dev.columns if c not in names)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["device", "t_s", *names])
    for dev in record.devices:
        for i, t in enumerate(dev.t_s):
            row = [dev.device, repr(float(t))]
            for name in names:
                column = dev.columns.get(name)
                row.append(_cell(column[i] if column is not None and i < len(column) else None))
            writer.writerow(row)
    return write_text_atomic(path, buf.getvalue())


def read_samples_csv(path: str | os.PathLike[str]) -> list[DeviceSamples]:
    """Read a file written by :func:`write_samples_csv` back into per-device columns."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise UsageError(f"{path} is empty; expected a samples CSV from mgprof") from None
        if header[:2] != ["device", "t_s"]:
            raise UsageError(f"{path} does not start with 'device,t_s': not an mgprof samples CSV")
        names = header[2:]
        devices: dict[str, DeviceSamples] = {}
        for row in reader:
            dev = devices.get(row[0])
            if dev is None:
                dev = devices[row[0]] = DeviceSamples(device=row[0], columns={n: [] for n in names})
            dev.t_s.append(float(row[1]))
            for name, cell in zip(names, row[2:]):
                dev.columns[name].append(float(cell) if cell != "" else None)
    return list(devices.values())
