"""Every command's ``--help`` says what the command does now, and every example it shows runs.

The help is rendered in this process (all commands); it must not leak reStructuredText markup
(double backticks, ``:func:`` roles) or the package's internal names (private functions and
classes, module paths, environment variables the docs do not describe). Then every example line
of every help (``mgprof ...`` under ``examples:``) runs as written, in a folder laid out so that
the names the examples use exist there: ``train.py`` (a small loop with a DataLoader that takes
``--lr``), ``mgprof-runs/RUN``, ``BASE``/``NEW`` (copies of one run, so a ``--fail-on`` limit
cannot fail), ``./traces``, ``old/traces``, ``new/traces``. Each must exit 0 and print no
traceback, and a launch must show none of torch's ``USDT:`` lines nor torchrun's
``OMP_NUM_THREADS`` banner (torchrun prints it: the tests run without OMP_NUM_THREADS). An
example that needs CUDA GPUs or serves until stopped is checked for argument parsing only, with
its reason in ``PARSE_ONLY``.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests._spawn import clean_env, write_script

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mgprof"

PARSE_ONLY = {
    "mgprof analyze train.py --gpus 4 --strategy dp": "DataParallel needs CUDA GPUs",
    "mgprof compare train.py --gpus 4 --strategies ddp,fsdp --precision fp32,bf16": (
        "4 GPUs: bf16 against fp32 means something on GPUs only"
    ),
    "mgprof sweep train.py --gpus 8 --range 16:1024 --until-oom": (
        "8 GPUs: the search runs until GPU memory is exhausted"
    ),
    "mgprof view mgprof-runs/RUN": "serves TensorBoard until Ctrl-C and opens a browser",
    "mgprof view mgprof-runs --port 6007 --no-browser": "serves TensorBoard until Ctrl-C",
}
"""Examples not run, and why. Every other example runs."""

LAUNCHING = ("analyze", "compare", "sweep")
STEP_SCRIPT = """
    \"\"\"A small training loop with a DataLoader, as the help examples' train.py.\"\"\"
    import argparse

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 2))
    loader = DataLoader(data, batch_size=32)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    print("train.py done")
"""
NOISE = re.compile(r"^USDT:|Setting OMP_NUM_THREADS environment variable|run\.py:\d+\] \*{5}", re.M)


def _parsers() -> dict[str, object]:
    from mgprof.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {"mgprof": parser, **dict(sub.choices)}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; the same width every time
    try:
        return {name: p.format_help() for name, p in _parsers().items()}  # type: ignore[attr-defined]
    finally:
        del os.environ["COLUMNS"]


def examples(text: str) -> list[str]:
    """The command lines under ``examples:`` (a comment after two spaces is not part of one)."""
    found: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.strip() == "examples:":
            inside = True
            continue
        if inside and not line.startswith(" "):
            inside = False
        stripped = line.strip()
        if inside and stripped.startswith("mgprof "):
            found.append(re.split(r"\s{2,}", stripped)[0])
    return found


def all_examples(helps: dict[str, str]) -> list[str]:
    seen: dict[str, None] = {}
    for text in helps.values():
        for example in examples(text):
            seen.setdefault(example, None)
    return list(seen)


# -- what the help may say ------------------------------------------------------------------


def test_every_command_has_a_help_and_examples(helps: dict[str, str]) -> None:
    from mgprof.cli import COMMANDS

    assert set(helps) == {"mgprof", *COMMANDS}
    without = [name for name in COMMANDS if not examples(helps[name])]
    assert not without, f"commands whose --help shows no example: {without}"
    shown = {ex.split()[1] for ex in all_examples(helps)}
    assert shown == set(COMMANDS), f"commands no example shows: {set(COMMANDS) - shown}"


def _internal_names() -> set[str]:
    """Module-level functions and classes of the package, without the public API's names."""
    import mgprof

    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names - set(mgprof.__all__)


def _documented_env() -> set[str]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in docs if p.is_file())
    return set(re.findall(r"MGPROF_[A-Z0-9_]+", text))


def test_help_texts_leak_no_markup_or_internal_names(helps: dict[str, str]) -> None:
    import mgprof

    internal = _internal_names()
    documented = _documented_env()
    problems = []
    for name, text in helps.items():
        if "``" in text or re.search(r":(func|class|meth|mod|attr):`", text):
            problems.append(f"{name}: reStructuredText markup")
        for word in set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text)):
            if word in internal and ("_" in word or word[:1].isupper()):
                problems.append(f"{name}: internal name {word!r}")
        for dotted in re.findall(r"\bmgprof\.(\w+)", text):
            if dotted not in mgprof.__all__:
                problems.append(f"{name}: module path mgprof.{dotted}")
        for env in set(re.findall(r"MGPROF_[A-Z0-9_]+", text)) - documented:
            problems.append(f"{name}: environment variable {env} the docs do not describe")
    assert not problems, "\n".join(problems)


def test_help_says_what_the_commands_do_now(helps: dict[str, str]) -> None:
    """Lines that were true once: the scripts are wrapped automatically, the sweep's batch is set
    on the DataLoader, compare and sweep stop after their own default steps."""
    assert "mgprof.wrap" not in helps["compare"]
    assert "unmodified" in helps["compare"]
    assert "reads its batch size with" not in helps["sweep"]
    assert "DataLoader" in helps["sweep"]
    assert "(default: 10)" in helps["compare"] and "(default: 8)" in helps["sweep"]
    assert "run to end" not in helps["compare"] + helps["sweep"]
    for name in ("compare", "sweep"):  # one node only: the multi-node flags are refused there
        assert "--nnodes" not in helps[name] and "--rdzv" not in helps[name]
    assert "--rdzv-endpoint HOST:PORT" in helps["analyze"]
    assert "status line" in helps["analyze"] and "logs/rank<N>.log" in helps["analyze"]


def test_parse_only_examples_are_all_shown(helps: dict[str, str]) -> None:
    """A reason kept for an example no help shows any more is a stale line here."""
    assert set(PARSE_ONLY) <= set(all_examples(helps))


# -- every example runs -----------------------------------------------------------------------


def _argv(example: str) -> tuple[list[str], str | None]:
    """``mgprof ... > FILE`` -> the arguments after ``mgprof`` and the file stdout goes to."""
    words = shlex.split(example)
    assert words[0] == "mgprof"
    out = None
    if ">" in words:
        at = words.index(">")
        words, out = words[:at], words[at + 1]
    return words[1:], out


def _run(example: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args, out = _argv(example)
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out is not None:
        (cwd / out).write_text(proc.stdout)
    return proc


def _lay_out(folder: Path, made: subprocess.CompletedProcess[str]) -> None:
    """The names the examples use, from the run ``made`` (an ``mgprof analyze``) made: its
    first line names the run directory."""
    found = re.search(r"run directory (\S+)$", (made.stderr.splitlines() or [""])[0])
    assert found, f"the first line names no run directory:\n{made.stderr}"
    first = folder / found.group(1)
    for name in ("mgprof-runs/RUN", "mgprof-runs/BASE", "mgprof-runs/NEW", "BASE", "NEW"):
        shutil.copytree(first, folder / name)
    for name in ("traces", "old/traces", "new/traces"):
        shutil.copytree(first / "traces", folder / name)


def _lanes(todo: list[str]) -> tuple[list[str], list[str]]:
    """Two queues run side by side (a launch waits on its processes as much as it computes):
    the first makes the run the others read (the first ``mgprof analyze`` on 2 ranks), then
    runs the examples that read it, ``mgprof doctor`` and the example that reads the bandwidth
    baseline ``mgprof doctor`` writes; the second runs the other launches."""
    launches = [ex for ex in todo if ex.split()[1] in LAUNCHING]
    maker = next(ex for ex in launches if "--gpus 2" in ex and ex.split()[1] == "analyze")
    doctor = [ex for ex in todo if ex.split()[1] == "doctor"]
    readers = [ex for ex in todo if ex not in launches and ex not in doctor]
    needs_baseline = [ex for ex in readers if "bw.json" in ex]
    readers = [ex for ex in readers if ex not in needs_baseline]
    return [maker, *readers, *doctor, *needs_baseline], [ex for ex in launches if ex != maker]


@pytest.fixture(scope="module")
def ran(helps: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every example that runs, in two lanes (``_lanes``); the folder is laid out for the
    examples that read a run as soon as the first launch has made one."""
    folder = tmp_path_factory.mktemp("examples")
    write_script(folder, "train.py", STEP_SCRIPT)
    env = clean_env()
    env.pop("OMP_NUM_THREADS")  # so that torchrun prints its banner, which must not show
    todo = [ex for ex in all_examples(helps) if ex not in PARSE_ONLY]
    first, second = _lanes(todo)
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    laid_out = threading.Event()

    def lane(queue: list[str], lays_out: bool) -> None:
        for example in queue:
            if example.split()[1] not in LAUNCHING and example.split()[1] != "doctor":
                laid_out.wait(timeout=600)
            results[example] = _run(example, folder, env)
            if lays_out and not laid_out.is_set():
                _lay_out(folder, results[example])
                laid_out.set()

    other = threading.Thread(target=lane, args=(second, False))
    other.start()
    try:
        lane(first, True)
    finally:
        laid_out.set()  # the other lane never waits for a layout that failed
        other.join()
    return results


def _example_ids() -> list[str]:
    os.environ["COLUMNS"] = "100"
    try:
        texts = {name: p.format_help() for name, p in _parsers().items()}  # type: ignore[attr-defined]
    finally:
        del os.environ["COLUMNS"]
    return all_examples(texts)


@pytest.mark.parametrize("example", _example_ids())
def test_example_runs(example: str, ran: dict, helps: dict[str, str]) -> None:
    if example in PARSE_ONLY:
        from mgprof.cli import build_parser

        args, _ = _argv(example)
        if "--" in args:
            args = args[: args.index("--")]
        parsed = build_parser(args[0]).parse_args(args)  # SystemExit (code 2) on a bad flag
        assert parsed.command == args[0] and callable(parsed.func)
        pytest.skip(f"arguments parse; not run: {PARSE_ONLY[example]}")
    proc = ran[example]
    shown = f"{example} -> exit {proc.returncode}\n--- stdout\n{proc.stdout}"
    shown += f"\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, shown
    assert "Traceback (most recent call last)" not in proc.stderr, shown
    if example.split()[1] in LAUNCHING:
        assert not NOISE.search(proc.stdout + proc.stderr), shown
        first = (proc.stderr.splitlines() or [""])[0]
        assert first.startswith(f"mgprof {example.split()[1]}: running "), shown
