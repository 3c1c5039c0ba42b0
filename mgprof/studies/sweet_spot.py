"""``mgprof.find_sweet_spot``: the batch-size sweep inside one training process (or DDP job).

The search is ``mgprof.analyze.sweep.result.SweepPlanner``, run identically on every rank:
each trial's
figures are all-reduced or all-gathered before the planner sees them, so every rank takes the same
decision and enters the same collectives.

Safety under DDP: a trial first builds its batch and runs one probe step under ``no_sync()`` (no
collective inside), catching out-of-memory errors locally; then the ranks all-reduce a status flag
(MAX) so that every rank knows the trial failed before any gradient all-reduce is entered. After
every timed step the ranks agree again. Memory is released after every trial (references dropped,
``gc.collect()``, ``torch.cuda.empty_cache()``), so a failed trial does not shrink the next one.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import torch
import torch.distributed as dist
from torch import nn

from mgprof.analyze.sweep.result import (
    DEFAULT_MARGIN,
    DEFAULT_RESOLUTION,
    RankTrial,
    SweepPlanner,
    SweepResult,
    Trial,
    is_oom_error,
    summarize,
)

MIB = 1024.0 * 1024.0
_OK, _OOM, _FAILED = 0, 1, 2

IN_PROCESS_CUDA_MEMORY = "peak memory reserved by PyTorch's CUDA caching allocator during the trial"
IN_PROCESS_CPU_MEMORY = (
    "highest RSS sampled after each forward and backward, minus the RSS at the trial's start "
    "(approximate: the CPU allocator may keep freed memory)"
)


def _rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / MIB


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_error(str(exc))


class _Trial:
    """One batch size on this rank: a probe step, agreement, timed steps, then clean-up."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        device: torch.device,
        distributed: bool,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device
        self.distributed = distributed
        self.ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.rss0 = 0.0
        self.rss_peak = 0.0

    def _sample_rss(self) -> None:
        if self.device.type != "cuda":
            self.rss_peak = max(self.rss_peak, _rss_mib())

    def step(self, batch: Any, sync: bool = True) -> None:
        inputs, targets = batch
        with contextlib.nullcontext() if sync or not self.ddp else self.model.no_sync():  # type: ignore[operator]
            outputs = self.model(inputs)
            loss = self.loss_fn(outputs, targets)
            self._sample_rss()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._sample_rss()
        self.optimizer.step()
        del outputs, loss

    def agree(self, code: int) -> int:
        """Every rank's worst status: a failure anywhere is a failure everywhere."""
        if not self.distributed:
            return code
        flag = torch.tensor([code], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def timed(self, batch: Any, count: int, sync: bool) -> tuple[list[float], int, str | None]:
        """``count`` steps, each timed and followed by an agreement; stops at the first failure."""
        times: list[float] = []
        for _ in range(count):
            code, error = _OK, None
            try:
                _sync(self.device)
                t0 = time.perf_counter()
                self.step(batch, sync=sync)
                _sync(self.device)
                times.append((time.perf_counter() - t0) * 1000.0)
            except Exception as exc:
                code, error = (_OOM if _is_oom(exc) else _FAILED), _describe(exc)
            code = self.agree(code)
            if code != _OK:
                return times, code, error
        return times, _OK, None

    def run(
        self, batch_fn: Callable[[int], Any], size: int, warmup: int, steps: int
    ) -> tuple[int, str | None, dict[str, float | None]]:
        """(status code agreed by all ranks, this rank's error, this rank's figures)."""
        figures: dict[str, float | None] = {"step_ms": None, "nosync_ms": None, "mem": None}
        batch: Any = None
        code, error = _OK, None
        try:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self.rss0 = self.rss_peak = _rss_mib()
            batch = _to(batch_fn(size), self.device)
            self.step(batch, sync=False)  # probe: no collective inside, so failing here is safe
        except Exception as exc:
            code, error = (_OOM if _is_oom(exc) else _FAILED), _describe(exc)
        try:
            code = self.agree(code)
            if code == _OK:
                _, code, error = self.timed(batch, warmup, sync=True)
            if code == _OK:
                times, code, error = self.timed(batch, steps, sync=True)
                figures["step_ms"] = sum(times) / len(times) if times else None
            if code == _OK and self.ddp:
                times, code, error = self.timed(batch, steps, sync=False)
                figures["nosync_ms"] = sum(times) / len(times) if times else None
            figures["mem"] = self._memory()
        finally:
            batch = None
            self.optimizer.zero_grad(set_to_none=True)
            release(self.device)
        return code, error, figures

    def _memory(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_reserved(self.device) / MIB
        return max(0.0, self.rss_peak - self.rss0)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def release(device: torch.device) -> None:
    """Give memory back after a trial: collect cycles, empty the CUDA cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _gather(values: Sequence[float | None], distributed: bool) -> list[list[float | None]]:
    """Every rank's figures, on every rank (NaN stands for None on the wire)."""
    local = torch.tensor([float("nan") if v is None else v for v in values], dtype=torch.float64)
    if not distributed:
        return [list(values)]
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    if dist.get_backend() == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
        out_dev = [t.to(dev) for t in out]
        dist.all_gather(out_dev, local.to(dev))
        out = [t.cpu() for t in out_dev]
    else:
        dist.all_gather(out, local)
    return [[None if v != v else float(v) for v in t.tolist()] for t in out]


def _trial_record(
    size: int, code: int, error: str | None, per_rank: list[list[float | None]], world: int
) -> Trial:
    status: Any = {_OK: "ok", _OOM: "oom", _FAILED: "failed"}[code]
    ranks = []
    for rank, (step_ms, nosync_ms, mem) in enumerate(per_rank):
        rt = RankTrial(rank=rank, step_time_ms=step_ms, peak_memory_mib=mem)
        if step_ms:
            rt.samples_per_s = size / (step_ms / 1000.0)
            if nosync_ms is not None:
                rt.exposed_comm_pct = 100.0 * max(0.0, step_ms - nosync_ms) / step_ms
        ranks.append(rt)
    trial = Trial(
        batch_size=size,
        status=status,
        world_size=world,
        global_batch=size * world,
        ranks=ranks,
        error=error if code != _OK else None,
    )
    if code != _OK:
        if trial.error is None:
            trial.error = f"another rank failed ({status}); this rank had no error"
        return trial
    rates = [r.samples_per_s for r in ranks if r.samples_per_s is not None]
    if len(rates) == world:
        trial.samples_per_s = sum(rates)
        trial.samples_per_s_per_device = trial.samples_per_s / world
    steps = [r.step_time_ms for r in ranks if r.step_time_ms is not None]
    trial.step_time_ms = max(steps) if steps else None
    mems = [r.peak_memory_mib for r in ranks if r.peak_memory_mib is not None]
    trial.peak_memory_mib = max(mems) if mems else None
    exposed = [r.exposed_comm_pct for r in ranks if r.exposed_comm_pct is not None]
    trial.exposed_comm_pct = sum(exposed) / len(exposed) if exposed else None
    trial.note = (
        "in-process: exposed communication = step time with DDP's all-reduce minus the same step "
        "under no_sync(); total communication time (overlapped included) is not measured here"
    )
    return trial


def _capacity_mib(device: torch.device, given: float | None, distributed: bool) -> float | None:
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory / MIB
    if distributed:  # the tightest device bounds the batch
        t = torch.tensor([total], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        total = float(t.item())
    return total


def find_sweet_spot(
    model_fn: Callable[[], nn.Module],
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    *,
    batch_sizes: Sequence[int] | None = None,
    lo: int = 8,
    hi: int = 4096,
    steps: int = 5,
    warmup: int = 2,
    optimizer_fn: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
    margin: float = DEFAULT_MARGIN,
    device: torch.device | str | None = None,
    capacity_mib: float | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    until_oom: bool = False,
) -> SweepResult:
    """Find the batch-size sweet spot in this process (every rank of a DDP job calls it).

    ``model_fn()`` returns the model on its device, wrapped as it will train (e.g.
    ``mgprof.wrap(Net())``); it is built once and trained by the sweep, so build a fresh one
    afterwards. ``batch_fn(size)`` returns ``(inputs, targets)`` for one per-device batch;
    ``loss_fn(model(inputs), targets)`` the loss. ``optimizer_fn(params)`` defaults to SGD.
    On CUDA the capacity is the device's total memory; on CPU pass ``capacity_mib`` for a memory
    boundary (otherwise only real out-of-memory errors bound the search).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    from mgprof.collect.wrapping.wrap import device as default_device

    dev = torch.device(device) if device is not None else default_device()
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    capacity = _capacity_mib(dev, capacity_mib, distributed)
    planner = SweepPlanner(
        lo,
        hi,
        batch_sizes=batch_sizes,
        capacity_mib=capacity,
        margin=margin,
        resolution=resolution,
        stop_on_plateau=not until_oom,
    )
    model = model_fn()
    optimizer = (optimizer_fn or _default_optimizer)(model.parameters())
    runner = _Trial(model, optimizer, loss_fn, dev, distributed)
    while (size := planner.next_size()) is not None:
        code, error, fig = runner.run(batch_fn, size, warmup, steps)
        per_rank = _gather([fig["step_ms"], fig["nosync_ms"], fig["mem"]], distributed)
        planner.record(_trial_record(size, code, error, per_rank, world))
    del runner, optimizer, model
    release(dev)
    result = summarize(planner.trials, capacity, margin, stop_reason=planner.stop_reason)
    return msgspec.structs.replace(
        result,
        mode="in-process",
        device_kind=dev.type,
        world_size=world,
        capacity_source=(
            "capacity_mib argument"
            if capacity_mib is not None
            else ("CUDA device total memory" if capacity is not None else None)
        ),
        memory_definition=IN_PROCESS_CUDA_MEMORY if dev.type == "cuda" else IN_PROCESS_CPU_MEMORY,
    )


def _default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-3)
