"""The gradient-sync A/B of ``mgprof compare``: the same DDP step with and without all-reduce.

After the measured steps, the bootstrap runs M more steps with gradient sync on ("A") and M with
it off ("B", DDP's comm hook hands back the local gradient), alternating in small blocks so drift
(thermal, other load) hits both alike. Each step is timed from one optimizer update to the next.
Before each B block the model and optimizer state are copied to the CPU and restored after it,
so the parameters end bit-identical to a run that made only the A updates: the measurement
never changes the user's model. Results go to ``<run_dir>/nosync/rank<N>.json``.

Limits: only models made by ``mgprof.wrap`` under DDP can switch their sync; a script that
accumulates gradients over several backward passes per update still gets one A or B label per
update; an LR scheduler stepped during B steps keeps its advance (the script is stopped right
after the A/B, so no further training sees it).
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

NOSYNC_DIR = "nosync"
BLOCK_STEPS = 2
"""Steps per A or B block: short blocks interleave the two so slow drift hits both alike."""


class NoSyncResult(msgspec.Struct, kw_only=True):
    """One rank's A/B: step times with gradient sync (A) and without it (B), in milliseconds."""

    available: bool
    reason: str | None = None
    rank: int = 0
    steps_each: int = 0
    block_steps: int = BLOCK_STEPS
    sync_ms: list[float] = msgspec.field(default_factory=list)
    nosync_ms: list[float] = msgspec.field(default_factory=list)
    sync_median_ms: float | None = None
    nosync_median_ms: float | None = None
    state_restored: bool = False


def schedule(steps_each: int, block: int = BLOCK_STEPS) -> list[bool]:
    """Sync flags of the A/B steps: A blocks and B blocks alternate, A first, B last."""
    flags: list[bool] = []
    a = b = steps_each
    while a or b:
        take_a, take_b = min(block, a), min(block, b)
        flags += [True] * take_a + [False] * take_b
        a, b = a - take_a, b - take_b
    return flags


def _to_cpu(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU: the snapshot must not cost device memory."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def _sync_device() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", 0))
    except ValueError:
        return 0


class NoSyncAB:
    """Drives the A/B from the optimizer step hook: ``start`` once, then ``on_update`` per step."""

    def __init__(self, steps_each: int, run_dir: Path | None) -> None:
        self.steps_each = steps_each
        self.run_dir = run_dir
        self.active = False
        self._flags = schedule(steps_each)
        self._i = 0
        self._t = 0.0
        self._models: list[Any] = []
        self._optimizers: list[Any] = []
        self._saved: tuple[list[Any], list[Any]] | None = None
        self._times: dict[bool, list[float]] = {True: [], False: []}

    def start(self, optimizers: list[Any]) -> bool:
        """Begin after the measured steps; False (and a note on disk) when it cannot apply.
        Never raises (it runs in the optimizer's step hook): a failure ends the A/B."""
        try:
            return self._start(optimizers)
        except Exception as exc:
            self._fail(exc)
            return False

    def on_update(self) -> bool:
        """One A/B step ended (an optimizer update); True once the last one is done (or the A/B
        failed: the script is then stopped as after a finished A/B). Never raises."""
        try:
            return self._on_update()
        except Exception as exc:
            self._fail(exc)
            return True

    def abandon(self) -> None:
        """The script ended mid-A/B: put the state back if a B block was open, keep the times.
        Never raises."""
        try:
            self._abandon()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Fail open: the model's state back (sync on, a B block's updates undone), one warning,
        and the A/B result says it failed."""
        from mgprof.collect.failopen import report

        report("sync A/B", exc)
        self.active = False
        try:
            if self._saved is not None:
                self._leave_b_block()
        except Exception as err:
            report("sync A/B state restore", err)
        finally:
            from mgprof.collect.wrapping.wrap import set_grad_sync

            set_grad_sync(True)
        self._write(
            NoSyncResult(
                available=False,
                rank=_rank(),
                reason=f"the A/B failed: {type(exc).__name__}: {exc}",
            )
        )

    def _start(self, optimizers: list[Any]) -> bool:
        from mgprof.collect.wrapping.wrap import switchable_models

        self._models = switchable_models()
        self._optimizers = optimizers
        if not self._models:
            self._write(
                NoSyncResult(
                    available=False,
                    rank=_rank(),
                    reason="no DDP model made by mgprof.wrap in this process: gradient sync "
                    "cannot be switched off (single device, DataParallel, or a script that "
                    "builds DistributedDataParallel itself)",
                )
            )
            return False
        self.active = True
        self._enter(0)
        _sync_device()
        self._t = time.perf_counter()
        return True

    def _on_update(self) -> bool:
        _sync_device()
        now = time.perf_counter()
        self._times[self._flags[self._i]].append((now - self._t) * 1000.0)
        self._i += 1
        done = self._i >= len(self._flags)
        self._leave(self._i - 1, done)
        if done:
            self.active = False
            self._write(self._result())
            return True
        self._enter(self._i)
        _sync_device()
        self._t = time.perf_counter()
        return False

    def _abandon(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._saved is not None:
            self._leave_b_block()
        done = len(self._times[True]) + len(self._times[False])
        result = self._result()
        result.reason = (
            f"the script ended after {done} of {len(self._flags)} A/B steps "
            "(give it more steps, e.g. through its own arguments after --)"
        )
        result.available = bool(self._times[True] and self._times[False])
        self._write(result)

    def _enter(self, i: int) -> None:
        """Before step i: a B step that opens a block first saves the state, then sync goes off."""
        from mgprof.collect.wrapping.wrap import set_grad_sync

        sync = self._flags[i]
        if not sync and (i == 0 or self._flags[i - 1]):
            self._saved = (
                [_to_cpu(m.state_dict()) for m in self._models],
                [_to_cpu(o.state_dict()) for o in self._optimizers],
            )
        set_grad_sync(sync)

    def _leave(self, i: int, done: bool) -> None:
        """After step i: the last step of a B block puts the saved state back (every rank)."""
        if self._flags[i] or not (done or self._flags[i + 1]) or self._saved is None:
            return
        self._leave_b_block()

    def _leave_b_block(self) -> None:
        import torch

        from mgprof.collect.wrapping.wrap import set_grad_sync

        assert self._saved is not None
        models, optimizers = self._saved
        with torch.no_grad():
            for m, state in zip(self._models, models):
                m.load_state_dict(state)
            for o, state in zip(self._optimizers, optimizers):
                o.load_state_dict(state)
        self._saved = None
        set_grad_sync(True)

    def _result(self) -> NoSyncResult:
        a, b = self._times[True], self._times[False]
        return NoSyncResult(
            available=True,
            rank=_rank(),
            steps_each=self.steps_each,
            sync_ms=[round(t, 6) for t in a],
            nosync_ms=[round(t, 6) for t in b],
            sync_median_ms=statistics.median(a) if a else None,
            nosync_median_ms=statistics.median(b) if b else None,
            state_restored=True,
        )

    def _write(self, result: NoSyncResult) -> None:
        if self.run_dir is None:
            return
        from mgprof.atomic import write_bytes_atomic

        try:
            write_bytes_atomic(
                self.run_dir / NOSYNC_DIR / f"rank{result.rank}.json", msgspec.json.encode(result)
            )
        except Exception as exc:  # fail open: compare reports the A/B as missing
            from mgprof.collect.failopen import report

            report("sync A/B result", exc)


def read_result(run_dir: Path, rank: int = 0) -> NoSyncResult | None:
    """A rank's A/B result from a run directory; None when there is none or it is unreadable."""
    path = run_dir / NOSYNC_DIR / f"rank{rank}.json"
    try:
        return msgspec.json.decode(path.read_bytes(), type=NoSyncResult)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
