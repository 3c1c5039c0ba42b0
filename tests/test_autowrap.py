"""Auto-wrap in a real process (a gloo world of one), and the gradient-sync verdict on records."""

from __future__ import annotations

import pytest

from mgprof.analyze.run.grad_sync import grad_sync, strategy_label
from mgprof.records import AutoWrapRecord, RankRecord, RunRecord, TrainingFacts
from tests._spawn import clean_env, python_args, run, write_script

IN_PROCESS = """
import copy, os, pickle, sys, warnings
import torch
import torch.distributed as dist
from torch import nn
from mgprof.collect.wrapping.autowrap import AutoWrap

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
original_call = nn.Module.__call__

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

# 1. a plain model is found at its first forward after the optimizer exists, and wrapped
auto = AutoWrap("ddp")
auto.install()
model = Net()
keys = list(model.state_dict())
calls = []

def count_call(module, inputs, output):
    calls.append(1)

model.register_forward_hook(count_call)
model(torch.randn(2, 4))  # before any optimizer: nothing to match yet
assert auto.record is None
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.MSELoss()  # a module with no parameters is never the trained model
loss_fn(torch.zeros(1), torch.zeros(1))
calls.clear()
out = model(torch.randn(2, 4))
assert auto.record is not None and auto.record.wrapper == "ddp", auto.record
assert auto.record.module_class == "__main__.Net", auto.record.module_class
assert auto.record.parameters == 4 * 4 + 4 + 4 + 1
assert auto.record.initialized_process_group is True and dist.is_initialized()
assert nn.Module.__call__ is original_call, "the global patch must be gone after the decision"
assert calls == [1], calls  # the script's own forward hook ran once, not twice
out.sum().backward()
opt.step()
assert list(model.state_dict()) == keys  # checkpoints keep their keys (no "module." prefix)
assert type(model).__name__ == "Net" and isinstance(model, Net)
clone = pickle.loads(pickle.dumps(model))
assert type(clone) is Net, type(clone)
twin = copy.deepcopy(model)
assert type(twin) is Net
twin(torch.randn(2, 4))  # an EMA-style copy runs on its own, never through the DDP
model.eval()
with torch.no_grad():
    model(torch.randn(2, 4))

# 2. a script that wraps its model itself is left alone
auto2 = AutoWrap("ddp")
auto2.install()
m2 = nn.Linear(3, 3)
ddp = nn.parallel.DistributedDataParallel(m2)
opt2 = torch.optim.SGD(ddp.parameters(), lr=0.1)
ddp(torch.randn(2, 3))
assert auto2.record is not None and auto2.record.wrapper is None
assert "wraps its model itself" in auto2.record.reason
assert nn.Module.__call__ is original_call

# 3. no optimizer before the first update: nothing wrapped, and the reason says why
auto3 = AutoWrap("ddp")
auto3.install()
nn.Linear(2, 2)(torch.randn(1, 2))
auto3.on_first_update()
assert auto3.record.wrapper is None and "no optimizer" in auto3.record.reason
assert nn.Module.__call__ is original_call
dist.destroy_process_group()
print("autowrap-ok")
"""


def test_autowrap_in_a_real_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = write_script(tmp_path, "autowrap_check.py", IN_PROCESS)
    result = run(python_args(script, str(port)), tmp_path, clean_env())
    assert result.returncode == 0, result.explain()
    assert "autowrap-ok" in result.stdout


def _rank(rank: int, **facts: object) -> RankRecord:
    base: dict[str, object] = {"cpu_threads": 1}
    base.update(facts)
    return RankRecord(rank=rank, world_size=2, training=TrainingFacts(**base))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "status", "how"),
    [
        ({"ddp_sync_forwards": 10}, "synchronised", "ddp"),
        ({"script_all_reduces": 4}, "synchronised", "script all_reduce"),
        ({}, "independent", None),
    ],
)
def test_grad_sync_verdict(facts: dict[str, int], status: str, how: str | None) -> None:
    run = RunRecord(strategy="ddp", world_size=2, ranks=[_rank(0, **facts), _rank(1, **facts)])
    sync = grad_sync(run)
    assert sync.status == status and sync.how == how
    label = strategy_label(run, sync)
    if status == "independent":
        assert label == "independent replicas (launched as ddp)"
    else:
        assert label == "ddp"


def test_one_rank_synchronised_and_one_not_is_partial() -> None:
    run = RunRecord(strategy="ddp", world_size=2, ranks=[_rank(0, ddp_sync_forwards=3), _rank(1)])
    sync = grad_sync(run)
    assert sync.status == "partial" and sync.independent_ranks == [1]


def test_records_without_evidence_are_unknown_not_independent() -> None:
    """A run.json from before the evidence was recorded must not be called independent."""
    old = RankRecord(rank=0, world_size=2)
    run = RunRecord(strategy="ddp", world_size=2, ranks=[old, RankRecord(rank=1, world_size=2)])
    assert grad_sync(run).status == "unknown"
    assert strategy_label(run, grad_sync(run)) == "ddp"


def test_auto_wrapped_runs_are_labelled_so() -> None:
    wrap = AutoWrapRecord(wrapper="ddp", module_class="x.Net", parameters=10)
    ranks = [_rank(r, ddp_sync_forwards=5, auto_wrap=wrap) for r in (0, 1)]
    run = RunRecord(strategy="ddp", world_size=2, ranks=ranks)
    sync = grad_sync(run)
    assert sync.auto_wrap is not None and sync.auto_wrap.module_class == "x.Net"
    assert strategy_label(run, sync) == "ddp (auto-wrapped)"


@pytest.mark.parametrize(
    ("strategy", "facts", "label"),
    [
        # --strategy fsdp on a script that wraps DDP itself: what ran was the script's DDP
        ("fsdp", {"ddp_sync_forwards": 5}, "ddp (the script's own; launched as fsdp)"),
        ("fsdp", {"fsdp_forwards": 5}, "fsdp (the script's own FSDP)"),
        ("ddp", {"fsdp_forwards": 5}, "fsdp (the script's own; launched as ddp)"),
    ],
)
def test_what_ran_names_the_strategy_not_the_flag(
    strategy: str, facts: dict[str, int], label: str
) -> None:
    run = RunRecord(strategy=strategy, world_size=2, ranks=[_rank(r, **facts) for r in (0, 1)])
    assert strategy_label(run, grad_sync(run)) == label


def test_single_and_one_device_dp_need_no_sync() -> None:
    single = RunRecord(strategy="single", world_size=1, ranks=[_rank(0)])
    assert grad_sync(single).status == "not applicable"
    dp_one = RunRecord(strategy="dp", world_size=1, ranks=[_rank(0)])
    assert grad_sync(dp_one).status == "not applicable"
