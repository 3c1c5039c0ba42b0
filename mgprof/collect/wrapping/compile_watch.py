"""``torch.compile`` watched: the options each compiled module was made with, and dynamo's own
counts of graphs, graph breaks and recompilations.

Auto-wrap needs the options: a script that compiles its model (``model = torch.compile(model)``)
and trains it unwrapped would otherwise be put under DDP from outside, ``DDP(compiled)``, the
order PyTorch advises against (DDP's graph splitting at bucket boundaries needs
``torch.compile(DDP(model))``: compiled from outside, the all-reduce overlapped 4.6 % on a
2-rank run). With the options known, auto-wrap builds ``DDP(original)`` and compiles that the
way the script compiled its module. The counts come from ``torch._dynamo.utils.counters`` when
the rank's record is made.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from torch import nn

from mgprof.records import CompileRecord

_options: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
_original: Any = None
_seen_compile = False


def is_compiled(module: Any) -> bool:
    """An ``OptimizedModule`` (what ``torch.compile(module)`` returns)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def options_of(module: Any) -> dict[str, Any] | None:
    """The keyword arguments ``module`` was compiled with (None: not seen being made)."""
    try:
        found = _options.get(module)
    except TypeError:
        return None
    return dict(found) if found is not None else None


def why_not_around_ddp(module: Any, options: dict[str, Any] | None) -> str | None:
    """Why ``compile(DDP(original))`` would not do what the script's ``compile(original)`` did
    (None: it would). DDP calls the inner module's forward through a frame dynamo does not
    trace (``_inside_ddp_forward``), so that forward is compiled as a frame of its own, and
    dynamo skips the frames of torch's own modules: a bare ``nn.Sequential`` would then run
    uncompiled (measured: 0 graphs against 1 for a model class of the script's own)."""
    if options is None:
        return "the compile options were not seen"
    inner = getattr(module, "_orig_mod", None)
    home = type(inner).__module__ if inner is not None else ""
    if home == "torch" or home.startswith("torch."):
        return (
            f"the model is torch's own {type(inner).__name__}, whose forward dynamo would skip "
            "inside DDP; the script's order keeps it compiled"
        )
    return None


def compile_again(module: nn.Module, options: dict[str, Any]) -> nn.Module:
    """``torch.compile(module, **options)`` through torch's own function (not recorded)."""
    import torch

    compile_fn: Any = _original if _original is not None else torch.compile
    out: nn.Module = compile_fn(module, **options)
    return out


def _recording(original: Any) -> Any:
    @functools.wraps(original)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        global _seen_compile
        out = original(model, **kwargs)
        try:
            _seen_compile = True
            if isinstance(model, nn.Module) and isinstance(out, nn.Module) and out is not model:
                _options[out] = dict(kwargs)
        except Exception:  # fail open: the compiled module is the script's either way
            pass
        return out

    compile._mgprof_recording = True  # type: ignore[attr-defined]
    return compile


def patch() -> None:
    """Record what ``torch.compile`` makes from now on."""
    global _original
    import torch

    if getattr(torch.compile, "_mgprof_recording", False):
        return
    _original = torch.compile
    torch.compile = _recording(_original)


def unpatch() -> None:
    global _original
    import torch

    if _original is not None:
        torch.compile = _original
        _original = None


def record() -> CompileRecord | None:
    """Dynamo's counts so far in this process (None: nothing was compiled)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    stats = dict(counters.get("stats", {}))
    breaks = dict(counters.get("graph_break", {}))
    frames = dict(counters.get("frames", {}))
    aot = dict(counters.get("aot_autograd", {}))
    graphs = int(stats.get("unique_graphs", 0) or aot.get("total", 0) or 0)
    if not graphs and not _seen_compile and not breaks:
        return None
    reasons = sorted(breaks.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    recompiles = dict(counters.get("recompiles", {}))
    return CompileRecord(
        graphs=graphs,
        graph_breaks=int(sum(breaks.values())),
        break_reasons=[f"{count}x {_first_line(reason)}" for reason, count in reasons],
        frames_ok=int(frames.get("ok", 0) or 0),
        frames_total=int(frames.get("total", 0) or 0),
        recompiles=int(sum(recompiles.values())) if recompiles else None,
    )


def _first_line(reason: str) -> str:
    """A break reason's first line (the rest explains dynamo and names files of this machine)."""
    return reason.strip().split("\n", 1)[0][:160]
