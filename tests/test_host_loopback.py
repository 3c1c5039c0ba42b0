"""A multi-rank run on a host whose name maps to 127.0.1.1 (Debian's and Ubuntu's default
``/etc/hosts`` line) starts and finishes.

torchrun hosts its store on loopback for a one-node run (``mgprof.run.entry``) but told the
workers to reach it by the host name; where that name resolves to 127.0.1.1 nothing listens and
every ``mgprof analyze --gpus 2`` hung. The test builds that host in a private mount and UTS
namespace (``unshare -m -u``, root only) so the machine's own files are untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _spawn import clean_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="needs root and unshare(1) to give the run a private /etc/hosts and host name",
    ),
]


def test_analyze_finishes_when_the_host_name_maps_to_127_0_1_1(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.1 mgtest\n")
    out = tmp_path / "runs"
    analyze = [
        sys.executable, "-m", "mgprof", "analyze", str(SCRIPTS / "plain_loop.py"), "--gpus", "2",
        "--steps", "4", "--trace-steps", "1", "--quiet", "--out", str(out),
    ]  # fmt: skip
    inner = (
        f"mount --bind {hosts} /etc/hosts && hostname mgtest && "
        'test "$(getent hosts mgtest | cut -d" " -f1)" = 127.0.1.1 && exec "$@"'
    )
    try:
        proc = subprocess.run(
            ["unshare", "-m", "-u", "sh", "-c", inner, "sh", *analyze],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,  # it used to hang for good; a healthy run takes ~15 s
        )
    except subprocess.TimeoutExpired:
        pytest.fail("mgprof analyze --gpus 2 hung with the host name on 127.0.1.1")
    if (
        proc.returncode != 0
        and "unshare" in proc.stderr
        and "Operation not permitted" in (proc.stderr)
    ):
        pytest.skip(f"namespaces not permitted here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_json,) = out.glob("*/run.json")
    assert '"status":"complete"' in run_json.read_text().replace(" ", "")
