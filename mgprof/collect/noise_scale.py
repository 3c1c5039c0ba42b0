"""Gradient norms for the gradient noise scale, taken where mgprof already sits in the gradient's
path, and ``mgprof.noise_scale()`` for the running figure.

Under DDP the comm hook mgprof installs on a model it built (``mgprof.wrap``, auto-wrap) sees
each gradient bucket twice: as this rank's own gradient before the all-reduce and as the average
after it. Their fp32 norms are all the noise scale needs (``mgprof.analyze.run.noise_scale`` has the
estimators). They stay on the device as 0-dim tensors; the host reads them in batches of
``RESOLVE_EVERY`` steps, at the end of the session, or when ``noise_scale()`` is asked, so the
training loop gains no synchronisation per bucket or per step.

The hook averages exactly as DDP's built-in reducer does (the gradient times 1/N before a sum
all-reduce, where torch's ``allreduce_hook`` divides by N: the two differ in the last bit when N
is not a power of two), so training with the hook is bit-identical to training without it.
DDP's built-in path divides instead of multiplying when ``gradient_as_bucket_view=True`` keeps
the gradients inside the buckets; mgprof cannot tell those steps apart from inside a hook, so on
such a model with a world size that is not a power of two (where the two differ) it installs
nothing and says so.

With one process and gradient accumulation, a global optimizer pre-step hook and one gradient
hook on one parameter compare the first micro-batch's gradient with the accumulated one.

By default (``MGPROF_NOISE_SCALE`` unset) the norms are read on one DDP sync in
``MGPROF_NOISE_SCALE_EVERY`` (16), and without a comm hook (``SampledNorms``): on a sampled
sync, a gradient hook per parameter takes this rank's gradient as it reaches the parameter (plus
what ``no_sync`` micro-steps accumulated before it), and a callback after DDP's own finaliser
takes the averaged ``.grad``. The other syncs run DDP's built-in reducer untouched, so they cost
nothing; the model need not be mgprof's (a script's own DDP is measured too, unless it registered
a comm hook of its own, which changes what the average is). ``--noise-scale`` measures every
sync through the comm hook, as before; ``--no-noise-scale`` turns the norms off.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from mgprof.analyze.run.noise_scale import Ema, estimate_pair
from mgprof.collect.batchinfo import batch_size_of
from mgprof.collect.envknobs import (
    NOISE_SCALE_ENV,
    noise_scale_enabled,
    noise_scale_every,
    noise_scale_mode,
)
from mgprof.collect.failopen import report
from mgprof.records import NoiseScaleRecord

RESOLVE_EVERY = 64
"""Steps whose norms are read from the device at once: one host synchronisation per 64 steps."""

ACCUM_GIVE_UP = 3
"""Updates with one backward each after which the one-process probe removes its hooks."""

OFF_REASON = f"turned off (--no-noise-scale, or {NOISE_SCALE_ENV}=0)"
ONE_PROCESS_DEFAULT_REASON = (
    "one process: by default mgprof measures the noise scale on DDP runs; with gradient "
    f"accumulation pass --noise-scale (or set {NOISE_SCALE_ENV}=1) to measure it here"
)
ONE_RANK_REASON = (
    "one rank and one backward per update: the noise scale needs 2 or more DDP ranks, or "
    "gradient accumulation (several backward passes per optimizer step)"
)
OWN_DDP_REASON = (
    "the script builds its own DistributedDataParallel model: mgprof measures the gradient "
    "norms through the comm hook of a model it wraps (mgprof.wrap, or auto-wrap under "
    "mgprof analyze)"
)
NO_DDP_REASON = "no DistributedDataParallel model built by mgprof averaged the gradients"


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    """fp32 2-norm of a flat gradient buffer, left on its device (squared on the host)."""
    return torch.linalg.vector_norm(tensor.detach(), dtype=torch.float32)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class _Sync:
    """One gradient synchronisation of one model (all its buckets), or one accumulated update."""

    __slots__ = (
        "avg",
        "avg_sq",
        "buffers",
        "futures",
        "group_size",
        "local",
        "local_sq",
        "micro_batches",
        "samples",
        "seq",
    )

    def __init__(self) -> None:
        self.local: list[torch.Tensor] = []
        self.avg: list[torch.Tensor] = []
        self.buffers: list[torch.Tensor] = []
        self.futures: list[Any] = []
        self.samples: int | None = None
        self.micro_batches = 1
        self.group_size = 1
        """Ranks DDP averaged over (``ddp``); 1 for an accumulated update."""
        self.seq = -1
        self.local_sq: float | None = None
        self.avg_sq: float | None = None


def _queue_after_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` on the autograd engine's thread when the current backward ends."""
    engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
    engine.queue_callback(callback)


class HookState:
    """The comm hook's state for one DDP model mgprof built: its group and the sync in flight.

    The averaged norms are taken at the end of the backward, on the autograd engine's thread,
    never inside the all-reduce's completion callback: that runs on the communication
    backend's own thread, where a tensor operation would race the profiler's bookkeeping."""

    def __init__(self, ddp: Any, record: bool) -> None:
        self.process_group = ddp.process_group
        self.size = int(self.process_group.size())
        bucket_views = bool(getattr(ddp, "gradient_as_bucket_view", False))
        self.exact = not bucket_views or _power_of_two(self.size)
        """Multiplying by 1/N reproduces the built-in reducer bit for bit."""
        self.record = record and self.exact and self.size > 1
        self.current = _Sync()
        self.samples = 0
        self.samples_known = True
        self.every = 1 if noise_scale_enabled() else noise_scale_every()
        """Syncs per measured sync (1 with ``--noise-scale``)."""
        self._syncs = 0
        self._first_bucket = True

    def sampled(self) -> bool:
        """Whether the sync whose bucket the hook is handling is one to measure; called once
        per bucket, in order, the last bucket closing the sync."""
        if self._first_bucket:
            self._first_bucket = False
            self._measure = self._syncs % self.every == 0
            self._syncs += 1
        return self._measure

    def bucket_done(self, last: bool) -> None:
        if last:
            self._first_bucket = True

    def count_forward(self, module: Any, args: Any) -> None:
        """Forward pre-hook: samples this rank feeds into the next gradient sync."""
        try:
            recorder.fold_if_idle()
            if torch.is_grad_enabled():
                size = batch_size_of(args)
                if size is None:
                    self.samples_known = False
                else:
                    self.samples += size
        except Exception as exc:
            report("noise scale", exc)

    def note_bucket(self, local: torch.Tensor, buf: torch.Tensor, future: Any, last: bool) -> None:
        """A bucket's local norm (taken before the averaging scaled it); at the last bucket of
        the backward, the averaged norms are queued for the backward's end."""
        sync = self.current
        sync.group_size = self.size
        sync.local.append(local)
        sync.buffers.append(buf)
        sync.futures.append(future)
        if last:
            self.current = _Sync()
            sync.samples = self.samples if self.samples_known and self.samples > 0 else None
            self.samples, self.samples_known = 0, True
            _queue_after_backward(lambda: self._averaged(sync))

    def _averaged(self, sync: _Sync) -> None:
        """End of the backward (queued before DDP's own finaliser, which waits for the same
        all-reduces): wait for them, then take the norms of the averaged buckets."""
        try:
            for future in sync.futures:
                future.wait()
            sync.avg = [_norm(buf) for buf in sync.buffers]
        except Exception as exc:
            self.fail(exc)
            return
        finally:
            sync.buffers, sync.futures = [], []
        recorder.add(sync)

    def fail(self, exc: BaseException) -> None:
        """Stop recording on this model; the averaging goes on untouched."""
        self.record = False
        recorder.drop("a norm could not be computed")
        recorder.reason = f"the gradient norms failed: {type(exc).__name__}: {exc}"
        report("noise scale", exc)


def _value(fut: Any) -> torch.Tensor:
    return fut.value()[0]  # type: ignore[no-any-return]


def averaging_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    """Average a bucket over the ranks as DDP's built-in reducer does, noting the fp32 norm of
    the local gradient before (and, at the backward's end, of the average) when the state
    records.

    Unannotated on purpose: DDP rejects a hook whose annotations are not the real
    ``dist.GradBucket``/``Future`` classes, and this module's annotations are strings.
    """
    import torch.distributed as dist

    buf = bucket.buffer()
    local = None
    measure = state.record and state.sampled()
    state.bucket_done(bucket.is_last())
    if measure:
        try:
            local = _norm(buf)
        except Exception as exc:
            state.fail(exc)
    elif state.record and bucket.is_last():
        state.samples, state.samples_known = 0, True  # an unmeasured sync: its forwards end here
    if state.exact:
        buf.mul_(1.0 / state.size)  # the reducer's own scaling (Reducer::copy_grad_to_bucket)
    else:
        buf.div_(state.size)
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    if local is not None and state.record:
        try:
            state.note_bucket(local, buf, fut, bucket.is_last())
        except Exception as exc:
            state.fail(exc)
    return fut.then(_value)


class AccumulationProbe:
    """One process with gradient accumulation: the first micro-batch's gradient norm (at the end
    of the update's first backward) against the accumulated gradient's (at the optimizer step).

    Needs no model: the first optimizer that steps names the parameters. Removes itself after
    ``ACCUM_GIVE_UP`` updates of a single backward each."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._opt: weakref.ref[torch.optim.Optimizer] | None = None
        self._params: list[torch.nn.Parameter] = []
        self.backwards = 0
        self.first: list[torch.Tensor] | None = None
        self.single_updates = 0
        self.accumulated = False

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._pre_step))

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _norms(self) -> list[torch.Tensor]:
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for p in self._params:
            if p.grad is not None and not p.grad.is_sparse:
                by_device.setdefault(p.grad.device, []).append(p.grad.detach())
        # one fused kernel per device and dtype group, not one per parameter
        return [
            torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
            for grads in by_device.values()
        ]

    def _on_grad(self, param: Any) -> None:
        try:
            self.backwards += 1
            if self.backwards == 1:
                _queue_after_backward(self._after_first_backward)
        except Exception as exc:
            report("noise scale", exc)

    def _after_first_backward(self) -> None:
        try:
            self.first = self._norms()
        except Exception as exc:
            report("noise scale", exc)

    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            if self._opt is None:
                self._attach(opt)
                return
            if self._opt() is not opt:
                return  # the first optimizer is the clock
            recorder.fold_if_idle()
            k, self.backwards = self.backwards, 0
            first, self.first = self.first, None
            if k >= 2 and first is not None:
                self.accumulated = True
                sync = _Sync()
                sync.local, sync.avg, sync.micro_batches = first, self._norms(), k
                recorder.add(sync)
            elif k == 1 and not self.accumulated:
                self.single_updates += 1
                if self.single_updates >= ACCUM_GIVE_UP:
                    self.uninstall()
        except Exception as exc:
            report("noise scale", exc)

    def _attach(self, opt: torch.optim.Optimizer) -> None:
        self._opt = weakref.ref(opt)
        self._params = [p for group in opt.param_groups for p in group["params"] if p.requires_grad]
        sentinel = next((p for p in self._params if p.grad is not None), None)
        if sentinel is None:
            self.uninstall()
            return
        self._handles.append(sentinel.register_post_accumulate_grad_hook(self._on_grad))


class SampledNorms:
    """One sync in ``every`` of a DDP model, measured without a comm hook (module docstring).

    The forward pre-hook counts the samples of each sync and, before a sampled sync's backward,
    adds a gradient hook to every trainable parameter (removed when the backward ends): it takes
    the norm of the gradient reaching the parameter plus what earlier ``no_sync`` micro-steps
    left in ``.grad``, i.e. this rank's own gradient before DDP averages it. The first
    post-accumulate hook queues a callback; that callback queues another, which the autograd
    engine runs after DDP's finaliser (queued when the last bucket became ready), so the
    averaged ``.grad`` is final when its norms are taken. Reading only: the training is
    bit-identical."""

    def __init__(self, ddp: Any, every: int) -> None:
        self.every = max(1, every)
        self.size = int(ddp.process_group.size())
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        self.syncs = 0
        self.samples = 0
        self.samples_known = True
        self._handles: list[Any] = []
        self._current: _Sync | None = None
        self._queued = False
        self.broken = False

    def forward(self, module: Any, args: Any) -> None:
        try:
            recorder.fold_if_idle()
            if not torch.is_grad_enabled() or self.broken:
                return
            size = batch_size_of(args)
            if size is None:
                self.samples_known = False
            else:
                self.samples += size
            if not getattr(module, "require_backward_grad_sync", True):
                return  # a no_sync micro-step: its samples join the next sync
            samples = self.samples if self.samples_known and self.samples > 0 else None
            self.samples, self.samples_known = 0, True
            measure = self.syncs % self.every == 0
            self.syncs += 1
            if measure and self._current is None:
                self._arm(samples)
        except Exception as exc:
            self.fail(exc)

    def _arm(self, samples: int | None) -> None:
        sync = _Sync()
        sync.samples, sync.group_size = samples, self.size
        self._current, self._queued = sync, False
        for p in self.params:
            self._handles.append(p.register_hook(self._local_hook(p, sync)))
            self._handles.append(p.register_post_accumulate_grad_hook(self._after_accumulate))

    def _local_hook(self, param: Any, sync: _Sync) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            try:
                prior = param.grad
                own = grad if prior is None or prior.is_sparse else prior + grad
                sync.local.append(_norm(own))
            except Exception as exc:
                self.fail(exc)

        return hook

    def _after_accumulate(self, param: Any) -> None:
        if self._queued:
            return
        self._queued = True
        try:
            _queue_after_backward(lambda: _queue_after_backward(self._averaged))
        except Exception as exc:
            self.fail(exc)

    def _averaged(self) -> None:
        sync, self._current = self._current, None
        self._remove()
        if sync is None:
            return
        try:
            by_device: dict[torch.device, list[torch.Tensor]] = {}
            for p in self.params:
                if p.grad is not None and not p.grad.is_sparse:
                    by_device.setdefault(p.grad.device, []).append(p.grad.detach())
            sync.avg = [
                torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
                for grads in by_device.values()
            ]
            sync.local = [torch.stack(sync.local)] if sync.local else []
        except Exception as exc:
            self.fail(exc)
            return
        recorder.add(sync)

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def fail(self, exc: BaseException) -> None:
        """Stop measuring this model; its training is untouched."""
        self.broken = True
        self._current = None
        self._remove()
        recorder.drop("a norm could not be computed")
        recorder.reason = f"the gradient norms failed: {type(exc).__name__}: {exc}"
        report("noise scale", exc)


class NoiseRecorder:
    """The process's gradient syncs, which session step each belongs to, and the running EMA."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unstepped: list[_Sync] = []
        self._count = 0
        self._pending: list[tuple[int, int | None, _Sync]] = []
        self._ema = Ema()
        self._ema_seq = -1
        self.states: list[HookState] = []
        self.probes: list[SampledNorms] = []
        self.reason: str | None = None
        self.session = False
        self.probe: AccumulationProbe | None = None
        self._reset_columns()

    def _reset_columns(self) -> None:
        self.index: list[int] = []
        self.local_sq: list[float] = []
        self.avg_sq: list[float] = []
        self.batch_size: list[int | None] = []
        self.micro_batches: list[int] = []
        self.dropped: dict[str, int] = {}
        self.source: str | None = None
        self.group_size = 1

    # -- syncs ---------------------------------------------------------------------------------

    def add(self, sync: _Sync) -> None:
        with self._lock:
            sync.seq = self._count
            self._count += 1
            self._unstepped.append(sync)

    def fold_if_idle(self) -> None:
        """Outside a session no step claims the syncs: fold them into the EMA now and then.
        Called between updates (a forward, an optimizer step), when no sync is in flight."""
        if not self.session and len(self._unstepped) >= RESOLVE_EVERY:
            with self._lock:
                self._fold_unstepped(None)

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1

    def mark(self) -> int:
        """Syncs finished so far: a step boundary takes those before its mark."""
        return self._count

    def step_closed(self, index: int, batch_size: int | None, upto: int) -> None:
        """Attach the syncs finished before ``upto`` to step ``index``."""
        if not self._unstepped:
            return  # the usual case when nothing is measured: no lock, no work
        with self._lock:
            taken = [s for s in self._unstepped if s.seq < upto]
            if not taken:
                return
            self._unstepped = [s for s in self._unstepped if s.seq >= upto]
            if len(taken) > 1:
                self.drop("two or more gradient syncs in one step")
                return
            self._pending.append((index, batch_size, taken[0]))
            if len(self._pending) >= RESOLVE_EVERY:
                self._resolve_pending()

    # -- reading the device --------------------------------------------------------------------

    def _read(self, syncs: list[_Sync]) -> None:
        """Squared norms of the syncs onto the host: one copy per device for all of them."""
        todo = [s for s in syncs if s.local_sq is None and s.local and len(s.local) == len(s.avg)]
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for s in todo:
            for t in (*s.local, *s.avg):
                by_device.setdefault(t.device, []).append(t.reshape(-1))
        values: dict[torch.device, list[float]] = {
            dev: torch.cat(ts).tolist() for dev, ts in by_device.items()
        }
        cursor = {dev: 0 for dev in values}

        def take(ts: list[torch.Tensor]) -> float:
            total = 0.0
            for t in ts:
                n = t.numel()
                start = cursor[t.device]
                total += math.fsum(v * v for v in values[t.device][start : start + n])
                cursor[t.device] = start + n
            return total

        for s in todo:
            s.local_sq = take(s.local)
            s.avg_sq = take(s.avg) / (s.micro_batches * s.micro_batches)
            s.local, s.avg = [], []  # the device memory goes back

    def _resolve_pending(self) -> None:
        pending, self._pending = self._pending, []
        self._read([s for _, _, s in pending])
        for index, batch, sync in pending:
            if sync.local_sq is None or sync.avg_sq is None:
                self.drop("a gradient sync without its averaged norm (sync skipped)")
                continue
            if not (math.isfinite(sync.local_sq) and math.isfinite(sync.avg_sq)):
                self.drop("non-finite gradient norm (an overflow step under AMP)")
                continue
            size = batch if batch is not None else sync.samples
            self.source = "ddp" if sync.group_size > 1 else "accumulation"
            self.group_size = max(self.group_size, sync.group_size)
            self.index.append(index)
            self.local_sq.append(sync.local_sq)
            self.avg_sq.append(sync.avg_sq)
            self.batch_size.append(size)
            self.micro_batches.append(sync.micro_batches)
            self._to_ema(sync, size)

    def _fold_unstepped(self, batch_size: int | None) -> None:
        syncs = [s for s in self._unstepped if s.seq > self._ema_seq]
        self._read(syncs)
        for s in syncs:
            self._to_ema(s, batch_size if batch_size is not None else s.samples)
        if not self.session:
            self._unstepped = []

    def _to_ema(self, sync: _Sync, samples: int | None) -> None:
        if sync.seq <= self._ema_seq or samples is None or samples <= 0:
            return
        if sync.local_sq is None or sync.avg_sq is None:
            return
        self._ema_seq = sync.seq
        k = sync.micro_batches
        if k > 1:
            pair = estimate_pair(sync.local_sq, sync.avg_sq, samples / k, float(samples))
        else:
            big = float(samples * sync.group_size)
            pair = estimate_pair(sync.local_sq, sync.avg_sq, float(samples), big)
        if pair is not None:
            self._ema.update(*pair)

    def current(self, batch_size: int | None = None) -> float | None:
        """B_simple from this rank's norms so far (EMA), reading the device once."""
        with self._lock:
            self._resolve_pending()
            self._fold_unstepped(batch_size)
            return self._ema.b_simple

    # -- sessions ------------------------------------------------------------------------------

    def session_started(self, world_size: int) -> None:
        with self._lock:
            self.session = True
            self._reset_columns()
            self._unstepped = []  # syncs before the first step belong to no step
            self._pending = []
        if world_size <= 1 and noise_scale_enabled() and self.probe is None:
            probe = AccumulationProbe()
            probe.install()
            self.probe = probe

    def session_stopped(self, world_size: int, ddp_forwards: int | None) -> NoiseScaleRecord:
        with self._lock:
            if self.probe is not None:
                self.probe.uninstall()
            self._resolve_pending()
            recording = [s.size for s in self.states if s.record]
            recording += [p.size for p in self.probes if not p.broken]
            if self.source is None and recording:  # measuring, but no step measured yet
                self.source = "ddp"
                self.group_size = max(recording)
            self.session = False
            self._unstepped = []
            every = [getattr(st, "every", 1) for st in self.states] + [p.every for p in self.probes]
            record = NoiseScaleRecord(
                every=max(every, default=1),
                source=self.source,  # type: ignore[arg-type]
                reason=None if self.source else self._why_not(world_size, ddp_forwards),
                group_size=self.group_size,
                index=self.index,
                local_sq=self.local_sq,
                avg_sq=self.avg_sq,
                batch_size=self.batch_size,
                micro_batches=self.micro_batches,
                dropped=dict(self.dropped),
            )
            self.probe = None
            self._reset_columns()
            return record

    def _why_not(self, world_size: int, ddp_forwards: int | None) -> str:
        mode = noise_scale_mode()
        if mode == "off":
            return OFF_REASON
        if self.reason is not None:
            return self.reason
        if world_size <= 1:
            return ONE_RANK_REASON if mode == "every" else ONE_PROCESS_DEFAULT_REASON
        if ddp_forwards and mode == "every":
            return OWN_DDP_REASON
        return NO_DDP_REASON


recorder = NoiseRecorder()


def install(ddp: Any, hook: Callable[..., Any], *, record: bool) -> HookState | None:
    """Register ``hook`` (mgprof's averaging all-reduce) with a fresh state on ``ddp``.

    ``record`` False registers it for the no-sync A/B alone. Returns the state, or None, having
    registered nothing, when the averaging could not stay bit-identical to DDP's own."""
    state = HookState(ddp, record)
    if not state.exact:
        if record:
            recorder.reason = (
                f"gradient_as_bucket_view=True on {state.size} ranks: DDP's own averaging then "
                "divides where a comm hook cannot tell, so mgprof kept DDP's built-in path"
            )
        return None
    ddp.register_comm_hook(state, hook)
    ddp._mgprof_hooked = True  # the sampled probe leaves this model to the hook
    if state.record:
        ddp.register_forward_pre_hook(state.count_forward)
        recorder.states.append(state)
    return state


def install_at_first_forward(ddp: Any, hook: Callable[..., Any]) -> None:
    """Install the recording hook at the model's first forward, unless the script registered a
    comm hook of its own by then (DDP takes one hook per model, and the script's must win)."""
    handle: Any = None

    def first_forward(module: Any, args: Any) -> None:
        handle.remove()
        try:
            own = list(getattr(module, "_comm_hooks", []) or [])
            if own:
                name = getattr(own[0][0], "__qualname__", "a comm hook")
                recorder.reason = (
                    f"the script registered its own DDP comm hook ({name}); DDP takes one hook "
                    "per model, so mgprof did not add the one that measures the gradient norms"
                )
                return
            state = install(module, hook, record=True)
            if state is not None and state.record:
                state.count_forward(module, args)  # this forward already passed its hooks
        except Exception as exc:  # fail open: DDP's own averaging runs
            report("noise scale", exc)

    handle = ddp.register_forward_pre_hook(first_forward)


def enabled() -> bool:
    """Every sync is measured through mgprof's comm hook (``--noise-scale``)."""
    return noise_scale_enabled()


def mode() -> str:
    return noise_scale_mode()


def attach_sampled(ddp: Any) -> None:
    """Measure ``ddp``'s syncs without a comm hook (``SampledNorms``), decided at its first
    forward: not when a comm hook is registered by then (the script's own changes what the
    average is; mgprof's A/B hook measures itself), nor a model mgprof built under
    ``--noise-scale`` (its comm hook measures every sync), nor with the norms off."""
    current = mode()
    if current == "off" or getattr(ddp, "_mgprof_noise", False):
        return
    ddp._mgprof_noise = True
    handle: Any = None

    def first_forward(module: Any, args: Any) -> None:
        handle.remove()
        try:
            if getattr(module, "_mgprof_hooked", False):
                return  # mgprof's comm hook measures this model
            if current == "every" and getattr(module, "_mgprof_built", False):
                return  # --noise-scale: the comm hook mgprof installs measures every sync
            own = list(getattr(module, "_comm_hooks", []) or [])
            if own:
                name = getattr(own[0][0], "__qualname__", "a comm hook")
                recorder.reason = (
                    f"the script registered its own DDP comm hook ({name}): the gradient DDP "
                    "averages is then the hook's, so mgprof did not measure the norms"
                )
                return
            if int(module.process_group.size()) < 2:
                return
            probe = SampledNorms(module, 1 if current == "every" else noise_scale_every())
            recorder.probes.append(probe)
            module.register_forward_pre_hook(probe.forward)
            probe.forward(module, args)  # this forward already passed its hooks
        except Exception as exc:  # fail open: DDP's own averaging runs, unmeasured
            report("noise scale", exc)

    handle = ddp.register_forward_pre_hook(first_forward)


def noise_scale(batch_size: int | None = None) -> float | None:
    """This rank's current estimate of the gradient noise scale B_simple, or None.

    An exponential moving average (about the last 20 updates) of the |G|² and tr(Σ) estimates
    from this rank's own gradient and the DDP-averaged one (or, in one process, the first
    micro-batch's and the accumulated one), as McCandlish et al. 2018 (App. A.1) advise. The
    report's figure combines all ranks and is less noisy; this one is for logging inside the
    loop. ``batch_size``: this rank's samples per update, when the leading dimension of the
    model's input is not the batch. Reads the norms from the device (one synchronisation): call
    it when you log, not every step. None until an update has been measured, when mgprof does
    not measure the norms in this process (see the report's reason), or while the estimate of
    |G|² is not positive. Never raises.
    """
    try:
        return recorder.current(batch_size)
    except Exception as exc:
        report("noise scale", exc)
        return None
