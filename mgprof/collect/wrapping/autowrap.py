"""Auto-wrap: a script that does not wrap its model itself is put under DDP or DataParallel.

Under ``mgprof analyze --gpus N`` (and every ``compare`` row) a plain single-device script would
otherwise run N independent copies whose gradients are never synchronised, and any "speedup"
measured from them is false. Auto-wrap finds the trained model (the outermost module whose
parameters hold all of an optimizer's trainable parameters) at its first forward after the
optimizer exists, and from then on routes that module's calls through a
``DistributedDataParallel`` (the process group initialised from torchrun's environment when the
script did not) or an ``nn.DataParallel`` built around it. The script keeps its own module
object: ``state_dict`` keys, checkpoints, ``model.eval()`` and the optimizer are unchanged.

How the route works: the module's class is swapped for a subclass whose ``__call__`` calls the
wrapper; the wrapper calls the module again, and that inner call (and DataParallel's replicas,
which run in worker threads) goes the ordinary way. ``nn.Module.__call__`` is patched only until
the decision is made (the first optimizer update at the latest), so the per-step cost after
that is one attribute lookup. Pickling or deep-copying the module gives the original class.

Under ``--strategy fsdp`` / ``fsdp-noreshard`` there is no wrapper: FSDP2's ``fully_shard``
changes the module in place (``mgprof.collect.wrapping.fsdp_wrap``), and the script's optimizer
is pointed at the sharded parameters before its first update.

Under ``--precision`` the same route carries the precision setting
(``mgprof.collect.wrapping.precision``): the trained module is found under every strategy
(single, and a
model the script wrapped in DDP itself, too) and its calls run under mgprof's autocast setting.
"""

from __future__ import annotations

import copyreg
import os
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from mgprof.collect.batchinfo import forward_samples
from mgprof.collect.failopen import emit_line
from mgprof.collect.wrapping import compile_watch, fsdp_watch
from mgprof.records import AutoWrapRecord

AUTO_WRAP_ENV = "MGPROF_AUTO_WRAP"
"""``0`` turns auto-wrap off (``--no-auto-wrap``)."""

_SELF_WRAPPED = "the script wraps its model itself"


class _Route:
    """Global (not thread-local) re-entry flag: DataParallel's replicas run in worker threads
    while the main thread waits inside the wrapper, and they must not route again."""

    inside = False


_routes: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_classes: dict[type, type] = {}
_replica_contexts: dict[type, Callable[[], AbstractContextManager[Any]]] = {}
"""Per original class, the precision context its DataParallel replicas enter: torch's replica
threads re-enter autocast with the outer enable flag but not its dtype (``parallel_apply``),
so a bf16 setting would run fp16 in them."""


def _routed_class(cls: type) -> type:
    """``cls`` with a ``__call__`` that goes through the module's wrapper (cached per class)."""
    routed = _classes.get(cls)
    if routed is not None:
        return routed

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        wrapper = _routes.get(self)
        if wrapper is None or _Route.inside:
            replica = _replica_contexts.get(cls) if wrapper is None and _Route.inside else None
            if replica is not None:  # a DataParallel replica, in its own thread
                with replica():
                    return cls.__call__(self, *args, **kwargs)
            return cls.__call__(self, *args, **kwargs)  # looked up now: never a stale patch
        _Route.inside = True
        try:
            # an FSDP root's forwards are counted by fsdp_watch's hook (--precision routes it too)
            if self.training and torch.is_grad_enabled() and not fsdp_watch.is_fsdp(self):
                try:
                    forward_samples.add(args, kwargs)
                except Exception:  # fail open: the step falls back to the DataLoader's count
                    pass
            return wrapper(*args, **kwargs)
        finally:
            _Route.inside = False

    def __reduce_ex__(self: nn.Module, protocol: Any) -> Any:
        # rebuilt as the script's own class by the standard library alone, so a pickled model
        # loads where mgprof is not installed
        rebuild = copyreg._reconstructor  # type: ignore[attr-defined]
        return (rebuild, (cls, object, None), self.__getstate__())

    routed = type(
        cls.__name__,
        (cls,),
        {
            "__call__": __call__,
            "__reduce_ex__": __reduce_ex__,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_mgprof_routed": True,
        },
    )
    _classes[cls] = routed
    return routed


def enabled() -> bool:
    return os.environ.get(AUTO_WRAP_ENV, "1") != "0"


class AutoWrap:
    """Watches optimizers and module calls until it has wrapped the trained model or decided
    not to; the outcome is an ``AutoWrapRecord`` (noted in the rank's training facts)."""

    def __init__(
        self,
        strategy: str,
        note: Any = None,
        precision: Any = None,
        wrap: bool = True,
        observe: bool = False,
    ) -> None:
        self.strategy = strategy
        self.observe = observe
        """Route the trained module's calls even when nothing wraps it, to count the samples
        each step trains (``mgprof analyze``: the batch that was trained, not fetched)."""
        self._note = note
        self.precision = precision
        """A ``PrecisionControl`` (``--precision``): the trained module's calls are routed
        through its autocast setting whatever the strategy, the script's own DDP included."""
        self.wrap = wrap
        """False under ``--no-auto-wrap``: the model is found for ``precision`` only."""
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._checked: set[int] = set()
        self._local = threading.local()
        self._orig_call: Any = None
        self._orig_add_group: Any = None
        self.record: AutoWrapRecord | None = None
        self._initialized_pg = False
        self._repointed: int | None = None
        self._ddp: nn.Module | None = None
        self._compile_order: str | None = None
        self.wrapped: list[nn.Module] = []

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        auto = self
        self._orig_add_group = torch.optim.Optimizer.add_param_group
        orig_add = self._orig_add_group

        def add_param_group(opt: torch.optim.Optimizer, group: dict[str, Any]) -> None:
            orig_add(opt, group)
            try:
                auto._watch_optimizer(opt)
            except Exception:
                pass

        torch.optim.Optimizer.add_param_group = add_param_group  # type: ignore[method-assign,assignment]
        self._orig_call = nn.Module.__call__
        orig_call = self._orig_call

        def module_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            local = auto._local
            depth = getattr(local, "depth", 0)
            if depth == 0 and auto.record is None:
                try:
                    if auto._consider(module):
                        return module(*args, **kwargs)  # now routed through the wrapper
                except Exception as exc:  # fail open: the script trains unwrapped
                    auto._decide(None, f"auto-wrap failed: {type(exc).__name__}: {exc}")
            local.depth = depth + 1
            try:
                return orig_call(module, *args, **kwargs)
            finally:
                local.depth = depth

        nn.Module.__call__ = module_call  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Stop watching (the patches cost a little on every module call)."""
        if self._orig_call is not None:
            nn.Module.__call__ = self._orig_call  # type: ignore[method-assign]
            self._orig_call = None
        if self._orig_add_group is not None:
            torch.optim.Optimizer.add_param_group = self._orig_add_group  # type: ignore[method-assign]
            self._orig_add_group = None

    def on_first_update(self) -> None:
        """The first optimizer update: a model not found by now is not going to be wrapped."""
        if self.record is None:
            if not self._optimizers:
                self._decide(None, "no optimizer was seen before the first update")
            else:
                self._decide(
                    None,
                    "no single module called by the script holds all of an optimizer's "
                    "trainable parameters",
                )

    # -- decision -----------------------------------------------------------------------------
    def _watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        if not any(ref() is opt for ref in self._optimizers):
            self._optimizers.append(weakref.ref(opt))
        self._checked.clear()  # a module that did not match may match the new optimizer

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers seen so far (alive)."""
        return [opt for opt in (ref() for ref in self._optimizers) if opt is not None]

    def _trainable_ids(self) -> list[set[int]]:
        sets = []
        for ref in self._optimizers:
            opt = ref()
            if opt is None:
                continue
            ids = {id(p) for group in opt.param_groups for p in group["params"] if p.requires_grad}
            if ids:
                sets.append(ids)
        return sets

    def _consider(self, module: nn.Module) -> bool:
        """Wrap ``module`` if it is the trained model; True when its call must be re-routed."""
        from torch.nn.parallel import DistributedDataParallel

        self_wrapped = isinstance(module, (DistributedDataParallel, nn.DataParallel)) or _is_fsdp(
            module
        )
        if self_wrapped and self.precision is None and not self._observable(module):
            self._decide(None, _SELF_WRAPPED, self_wrapped=module)
            return False
        if id(module) in self._checked or not self._optimizers:
            return False
        self._checked.add(id(module))
        wanted = self._trainable_ids()
        if not wanted:
            return False
        own = {id(p) for p in module.parameters()}
        if not any(ids <= own for ids in wanted):
            return False
        wrapper: nn.Module | None
        reason: str | None
        if self_wrapped:
            wrapper, reason = None, _SELF_WRAPPED
        elif not self.wrap:
            wrapper, reason = None, "auto-wrap is off"
        else:
            wrapper, reason = self._build(module)
        if wrapper is module:  # sharded in place by FSDP: its own class carries the hooks
            if self.precision is not None:
                _routes[module] = self.precision.route(module, module)
                module.__class__ = _routed_class(type(module))
            self.wrapped.append(module)
            self._decide(wrapper, None, module)
            return True
        if self.precision is not None:
            route = self.precision.route(module, wrapper if wrapper is not None else module)
        elif wrapper is None and not self._observable(module):
            self._decide(None, reason, module)
            return False
        else:  # the wrapper, or the module itself: its calls are counted on the way
            route = wrapper if wrapper is not None else module
        _routes[module] = route
        self._replicas_too(module, wrapper)
        module.__class__ = _routed_class(type(module))
        self.wrapped.append(module)
        self._decide(wrapper, reason, module)
        return True

    def _observable(self, module: nn.Module) -> bool:
        """Whether the trained module's calls may be routed only to count the samples it trains
        (``collect.batchinfo.forward_samples``) when nothing wraps it. Not FSDP or DTensor
        modules: their classes are FSDP's own, swapped by FSDP itself."""
        return self.observe and not _is_fsdp(module)

    def _replicas_too(self, module: nn.Module, wrapper: nn.Module | None) -> None:
        """Under a precision setting, DataParallel's replicas get it in their threads too: the
        replicas of the model mgprof wrapped, or of the module inside the script's own
        DataParallel (whose class is then routed, with no wrapper of its own)."""
        if self.precision is None:
            return
        if isinstance(wrapper, nn.DataParallel):
            inner = module
        elif isinstance(module, nn.DataParallel):
            inner = module.module
        else:
            return
        params = list(inner.parameters())
        factory = self.precision.replica_context(params[0].device.type if params else "cpu")
        if factory is None:
            return
        _replica_contexts[type(inner)] = factory
        if inner is not module:
            inner.__class__ = _routed_class(type(inner))

    def _build(self, module: nn.Module) -> tuple[nn.Module | None, str | None]:
        if self.strategy == "ddp":
            return self._build_ddp(module)
        if self.strategy == "dp":
            return self._build_dp(module)
        if self.strategy in ("fsdp", "fsdp-noreshard"):
            return self._build_fsdp(module)
        return None, f"strategy {self.strategy} needs no wrapper"

    def _build_fsdp(self, module: nn.Module) -> tuple[nn.Module | None, str | None]:
        """``fully_shard`` per unit and on the root, in place; the optimizers re-pointed."""
        import torch.distributed as dist

        from mgprof.collect.wrapping import fsdp_wrap

        optimizers = self.optimizers()
        reason = fsdp_wrap.why_not(module, optimizers)
        if reason is not None:
            return None, reason
        reason = self._join_group(module)
        if reason is not None:
            return None, reason
        if dist.get_world_size() < 2:
            return None, "FSDP needs two or more ranks"
        before = fsdp_wrap.names_of(module)
        fsdp_wrap.shard(module, reshard_after_forward=self.strategy == "fsdp")
        self._repointed = fsdp_wrap.repoint(module, before, optimizers)
        return module, None

    def _join_group(self, module: nn.Module) -> str | None:
        """The model on this rank's device and the process group up (gloo for a CPU model,
        NCCL for a CUDA one, from torchrun's environment when the script made none); why not,
        else None. Shared by the DDP and FSDP wrappers."""
        import torch.distributed as dist

        from mgprof.collect.wrapping.wrap import device

        params = list(module.parameters())
        where = params[0].device if params else torch.device("cpu")
        if where.type == "cuda" and where != device():
            return (
                f"the model is on {where} but this rank's device is {device()} (the script pins "
                "a device index); use torch.device('cuda') or mgprof.device()"
            )
        if not dist.is_initialized():
            _init_process_group("nccl" if where.type == "cuda" else "gloo")
            self._initialized_pg = True
        return None

    def _build_ddp(self, module: nn.Module) -> tuple[nn.Module | None, str | None]:
        from torch.nn.parallel import DistributedDataParallel

        from mgprof.collect.wrapping.wrap import enable_sync_ab

        reason = self._join_group(module)
        if reason is not None:
            return None, reason
        params = list(module.parameters())
        where = params[0].device if params else torch.device("cpu")
        inner: nn.Module = module
        options = None
        why_not = None
        if compile_watch.is_compiled(module):
            options = compile_watch.options_of(module)
            why_not = compile_watch.why_not_around_ddp(module, options)
            if why_not is None:  # compile(DDP(model)), as PyTorch advises, not DDP(compiled)
                inner = getattr(module, "_orig_mod")  # noqa: B009 (dynamo's attribute, untyped)
        if where.type == "cuda":
            ddp = DistributedDataParallel(inner, device_ids=[where.index])
        else:
            ddp = DistributedDataParallel(inner)
        enable_sync_ab(ddp)
        self._ddp = ddp
        wrapped: nn.Module = ddp
        if compile_watch.is_compiled(module):
            if why_not is not None or options is None:
                self._compile_order = f"ddp(compiled): {why_not}"
            else:
                self._compile_order = "compile(ddp(model)) with the script's compile options"
                wrapped = compile_watch.compile_again(ddp, options)
        return wrapped, None

    def _build_dp(self, module: nn.Module) -> tuple[nn.Module | None, str | None]:
        from mgprof.collect.wrapping.wrap import _gpu_limit

        if not torch.cuda.is_available():
            return None, "DataParallel needs CUDA devices"
        params = list(module.parameters())
        if not params or params[0].device.type != "cuda":
            return None, "the model is not on a CUDA device, so DataParallel cannot replicate it"
        count = torch.cuda.device_count()
        first = params[0].device.index or 0
        ids = [first] + [i for i in range(count) if i != first]
        return nn.DataParallel(module, device_ids=ids[: _gpu_limit(count)]), None

    def _decide(
        self,
        wrapper: nn.Module | None,
        reason: str | None,
        module: nn.Module | None = None,
        self_wrapped: nn.Module | None = None,
    ) -> None:
        if self.record is not None:
            return
        if self.precision is not None and module is None:
            self.precision.not_applied(reason or "the trained module was not found")
        if wrapper is None:
            self.record = AutoWrapRecord(reason=reason)
        else:
            target = module if module is not None else wrapper
            kind = _kind(wrapper, target)
            self.record = AutoWrapRecord(
                wrapper=kind,
                module_class=_script_class(target),
                parameters=_global_numel(target),
                bucket_cap_mb=_bucket_cap_mb(self._ddp or wrapper) if kind == "ddp" else None,
                devices=list(getattr(wrapper, "device_ids", None) or []),
                initialized_process_group=self._initialized_pg,
                optimizer_params_repointed=self._repointed if kind == "fsdp" else None,
                compile_order=self._compile_order,
            )
        wrapping = self.wrap and self.strategy in ("ddp", "dp", "fsdp", "fsdp-noreshard")
        if self._note is not None and wrapping:
            self._note("auto_wrap", self.record)
        if wrapping and reason is not None and reason != _SELF_WRAPPED and wrapper is None:
            emit_line(f"mgprof auto-wrap: nothing wrapped: {reason}")
        own = self_wrapped or (module if reason == _SELF_WRAPPED else None)
        if (
            wrapping
            and self.strategy in ("fsdp", "fsdp-noreshard")
            and own is not None
            and not _is_fsdp(own)
            and os.environ.get("RANK", "0") == "0"  # one line for the job, not one per rank
        ):
            emit_line(
                f"mgprof: --strategy {self.strategy}: the script wraps its model in "
                f"{type(own).__name__} itself, so nothing was sharded; measure it "
                "with --strategy ddp, or let mgprof wrap an unwrapped model"
            )
        self.uninstall()


def _kind(wrapper: nn.Module, target: nn.Module) -> Any:
    if wrapper is target:
        return "fsdp"
    return "dp" if isinstance(wrapper, nn.DataParallel) else "ddp"


def _script_class(module: nn.Module) -> str:
    """The script's own class (FSDP2 swaps in ``FSDP<Class>``, a subclass of it)."""
    cls = fsdp_watch.script_class(module) if _is_fsdp(module) else type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _global_numel(module: nn.Module) -> int:
    """Trainable elements of the whole model (a DTensor shard counts as its global shape)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _bucket_cap_mb(ddp: Any) -> float | None:
    cap = getattr(ddp, "bucket_bytes_cap", None)
    return round(cap / (1024 * 1024), 3) if isinstance(cap, (int, float)) else None


def _is_fsdp(module: nn.Module) -> bool:
    """FSDP2 (``fully_shard``: its class is a subclass of ``FSDPModule``, made per module class),
    FSDP1 (``FullyShardedDataParallel``), or any module holding DTensor parameters (tensor or
    sequence parallelism): already distributed by the script, never put under DDP."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        if isinstance(module, (FSDPModule, FullyShardedDataParallel)):
            return True
    except ImportError:  # a torch built without distributed
        pass
    if hasattr(module, "_fsdp_wrapped_module"):
        return True
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def _init_process_group(backend: str) -> None:
    """The default group from torchrun's environment (``mgprof.wrap``'s own initialiser, with
    the backend the model's device needs); a later ``init_process_group`` of the script reuses
    it (``mgprof.collect.hooks``)."""
    from mgprof.collect import hooks
    from mgprof.collect.wrapping.wrap import init_process_group

    init_process_group(backend)
    hooks.mark_process_group_by_mgprof()
