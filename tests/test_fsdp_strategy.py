"""``--strategy fsdp`` on an unmodified single-device script: mgprof shards it with FSDP2.

Real 2-rank gloo runs on CPU: the plain script trains, under ``fsdp``, to the parameters the
``ddp`` run reaches (every rank alike); each rank holds about half of DDP's parameters,
gradients and optimizer state (read from the tensors' own sizes, not from RSS); ``compare`` gives
ddp, fsdp and fsdp-noreshard rows with that memory; bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _spawn import clean_env
from torch import nn

from mgprof.collect.wrapping.fsdp_wrap import choose_units

SCRIPTS = Path(__file__).resolve().parent / "scripts"


# -- the unit rule, on models of the shapes people write ---------------------------------


class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)


class Tied(nn.Module):
    """A GPT-like model: blocks in a ModuleList, the head's weight tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(100, 8)
        self.h = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 100, bias=False)
        self.head.weight = self.wte.weight


def test_units_are_the_repeated_blocks_not_the_layers_inside_them() -> None:
    names = [n for n, _ in choose_units(Tied())]
    assert names == ["h.0", "h.1", "h.2"]  # the tied embedding and head stay with the root


def test_a_model_without_repeated_blocks_gets_its_sizeable_children() -> None:
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.LayerNorm(256))
    # Linear repeats (2 instances) and holds most parameters: each is a unit
    assert [n for n, _ in choose_units(model)] == ["0", "2"]
    odd = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Conv1d(256, 64, 3), nn.LayerNorm(4))
    assert [n for n, _ in choose_units(odd)] == ["0", "2"]  # LayerNorm(4): under 5 %
    assert choose_units(nn.ReLU()) == []


def plain_blocks_start() -> dict[str, torch.Tensor]:
    """The script's initial parameters (its seed and model), to show the runs moved them."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import plain_blocks
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(0)
    return plain_blocks.Net().state_dict()


# -- real processes ------------------------------------------------------------------------


def _mgprof(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The plain script under ddp and fsdp, each saving its ranks' final parameters."""
    root = tmp_path_factory.mktemp("fsdp-strategy")
    saved = root / "params"
    saved.mkdir()
    runs = {}
    for strategy in ("ddp", "fsdp"):
        out = root / strategy
        # fsdp under --precision fp32 too: the precision route must not count FSDP's batch twice
        precision = ["--precision", "fp32"] if strategy == "fsdp" else []
        proc = _mgprof(
            "analyze", str(SCRIPTS / "plain_blocks.py"), "--gpus", "2", "--strategy",
            strategy, "--trace-steps", "1", "--quiet", "--out", str(out), *precision, "--",
            "--steps", "8", "--save", str(saved),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        (run_json,) = out.glob("*/run.json")
        runs[strategy] = run_json.parent
    runs["params"] = saved
    return runs


pytestmark = pytest.mark.slow


def test_fsdp_trains_to_the_parameters_ddp_reaches_on_every_rank(
    trained: dict[str, Path],
) -> None:
    saved = trained["params"]
    ddp = [torch.load(saved / f"ddp-rank{r}.pt") for r in (0, 1)]
    fsdp = [torch.load(saved / f"fsdp-rank{r}.pt") for r in (0, 1)]
    for name, value in ddp[0].items():
        for other in (ddp[1], fsdp[0], fsdp[1]):
            torch.testing.assert_close(other[name], value, rtol=1e-4, atol=1e-5)
    start = plain_blocks_start()
    assert any(not torch.equal(start[k], ddp[0][k]) for k in start)  # it did train


def test_fsdp_ranks_hold_about_half_of_ddps_model_state(trained: dict[str, Path]) -> None:
    def state(strategy: str) -> list[dict[str, float]]:
        run = json.loads((trained[strategy] / "run.json").read_text())
        return [r["training"]["model_state"] for r in run["ranks"]]

    ddp, fsdp = state("ddp"), state("fsdp")
    for d, f in zip(ddp, fsdp, strict=True):
        assert not d["sharded"] and f["sharded"]
        assert d["parameters"] == f["parameters"]  # the same model, counted whole
        for part in ("parameters_mib", "gradients_mib", "optimizer_mib"):
            # about 1/N of DDP's: FSDP splits each tensor's rows, an odd row count unevenly
            assert 0.45 * d[part] <= f[part] <= 0.55 * d[part], (part, d, f)
        assert f["optimizer_mib"] == pytest.approx(2 * f["parameters_mib"], rel=1e-3)  # AdamW
    for part in ("parameters_mib", "gradients_mib", "optimizer_mib"):
        # the shards together are the whole model's state, with no copy beyond it
        together = sum(f[part] for f in fsdp)
        assert ddp[0][part] <= together + 1e-6 <= 1.01 * ddp[0][part] + 1e-6, (part, together)


def test_the_run_reads_as_fsdp_auto_wrapped(trained: dict[str, Path]) -> None:
    run = json.loads((trained["fsdp"] / "run.json").read_text())
    job = run["analysis"]["job"]
    assert job["strategy_label"] == "fsdp (auto-wrapped)"
    sync = job["grad_sync"]
    assert (sync["status"], sync["how"]) == ("synchronised", "fsdp")
    assert sync["auto_wrap"]["wrapper"] == "fsdp"
    assert sync["auto_wrap"]["optimizer_params_repointed"] == 20  # 4 blocks x 4 + 2 x 2
    fsdp = run["ranks"][0]["training"]["fsdp"]
    assert fsdp["units"] == 5 and fsdp["unit_classes"] == {"Block": 4, "Net": 1}
    for rank in run["ranks"]:  # the script's 32 per rank, counted once (not by both hooks)
        assert {s["batch_size"] for s in rank["steps"]} == {32}, rank["steps"]
    assert fsdp["reshard_after_forward"] == [True]
    report = " ".join(_mgprof("report", str(trained["fsdp"])).stdout.split())  # unwrapped
    assert "FSDP2 (fully_shard per unit and on the root)" in report
    assert "optimizer re-pointed at the shards (20 parameters)" in report


def test_compare_gives_ddp_and_both_fsdp_rows_with_memory(tmp_path: Path) -> None:
    proc = _mgprof(
        "compare", str(SCRIPTS / "plain_blocks.py"), "--gpus", "2", "--strategies",
        "ddp,fsdp,fsdp-noreshard", "--rounds", "1", "--trace-steps", "1", "--steps", "4",
        "--nosync-steps", "0", "--out", str(tmp_path), "--", "--steps", "50",
    timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = tmp_path.glob("*/comparison.json")
    comp = json.loads(found.read_text())
    rows = {r["strategy"]: r for r in comp["rows"]}
    assert set(rows) == {"ddp", "fsdp", "fsdp-noreshard"}
    for name, row in rows.items():
        assert row["status"] == "complete", row["notes"]
        assert row["step_time_ms"] and row["comm_mib_per_step"], name
    assert rows["fsdp"]["state_sharded"] and not rows["ddp"]["state_sharded"]
    assert rows["fsdp"]["params_mib"] < 0.55 * rows["ddp"]["params_mib"]
    # fsdp all-gathers the parameters again in backward; noreshard keeps them: less traffic
    assert rows["fsdp"]["comm_mib_per_step"] > rows["fsdp-noreshard"]["comm_mib_per_step"]
    assert "memory: fsdp holds" in comp["verdict"] and "ddp's" in comp["verdict"]
    assert "params" in proc.stdout and "optim" in proc.stdout  # the memory table
    # the fsdp run's own report cites the measured rows: ddp was faster and fit
    fsdp_run = json.loads((found.parent / rows["fsdp"]["run"] / "run.json").read_text())
    slower = [f for f in fsdp_run["analysis"]["findings"] if f["rule"] == "fsdp_slower_than_ddp"]
    assert len(slower) == 1, [f["rule"] for f in fsdp_run["analysis"]["findings"]]
    figs = slower[0]["figures"]
    assert figs["ddp_over_fsdp_low"] > 1.0 and "--strategy ddp" in slower[0]["fix"]
    assert figs["fsdp_model_state_mib"] < figs["ddp_model_state_mib"]
    ddp_run = json.loads((found.parent / rows["ddp"]["run"] / "run.json").read_text())
    assert not [f for f in ddp_run["analysis"]["findings"] if f["rule"].startswith("fsdp")]


def test_unit_layout_fires_only_when_one_unit_holds_most_parameters(
    trained: dict[str, Path],
) -> None:
    import msgspec

    from mgprof.analyze.findings import findings_of
    from mgprof.analyze.run.schema import decode_analysis
    from mgprof.records import read_run

    run = read_run(trained["fsdp"])
    analysis = decode_analysis(run.analysis or {})
    fsdp = run.ranks[0].training.fsdp
    assert fsdp is not None and len(fsdp.unit_parameters) == 5  # 4 blocks and the root's rest
    assert "fsdp_unit_layout" not in {f.rule for f in findings_of(run, analysis)}
    # the same run had the script sharded only its root: one unit, nothing overlaps
    root_only = msgspec.structs.replace(fsdp, units=1, unit_parameters=[sum(fsdp.unit_parameters)])
    ranks = [
        msgspec.structs.replace(r, training=msgspec.structs.replace(r.training, fsdp=root_only))
        for r in run.ranks
    ]
    found = {f.rule: f for f in findings_of(msgspec.structs.replace(run, ranks=ranks), analysis)}
    layout = found["fsdp_unit_layout"]
    assert "only the root is sharded" in layout.evidence
    assert layout.figures["largest_unit_share_pct"] == 100.0


def test_fsdp_on_one_rank_is_refused_before_launch(tmp_path: Path) -> None:
    proc = _mgprof(
        "analyze", str(SCRIPTS / "plain_blocks.py"), "--gpus", "1", "--strategy", "fsdp",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "needs at least 2" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing launched, nothing written


def test_exposed_comm_advice_on_fsdp_cites_the_phases(trained: dict[str, Path]) -> None:
    from mgprof.analyze.findings.strategy import _comm_advice, _fsdp_phases
    from mgprof.analyze.run.schema import decode_analysis
    from mgprof.records import read_run

    run = read_run(trained["fsdp"])
    analysis = decode_analysis(run.analysis or {})
    figs: dict[str, object] = {"rank": 0}
    phases = _fsdp_phases(analysis, figs)
    assert {"forward_all_gather", "post_backward_reduce_scatter"} <= set(phases), phases
    (summary,) = analysis.traces.ranks["0"]
    exposed_ms = summary.totals.exposed_comm_us / 1000.0 / len(summary.steps)
    listed = sum(v for k, v in phases.items() if k != "first_all_gather")
    assert listed <= exposed_ms * 1.001  # the phases are parts of the rank's exposed comm
    assert phases["first_all_gather"] <= phases["forward_all_gather"] + 1e-9
    advice = _comm_advice(run, analysis, dict(figs))
    assert "exposed per traced step: forward all-gather" in advice.evidence
    assert "model.no_sync()" not in " ".join(advice.change)  # DDP's advice is not FSDP's
    assert any("reshard_after_forward=False" in c for c in advice.change)
    assert "model.set_requires_gradient_sync(False)" in advice.fix
