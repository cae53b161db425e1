"""examples/tenant_webhooks.py, docs/channels.md's worked example, runs as
the page says: B's and C's webhooks go out early despite A's backlog, the
password reset first among B's, and acme's calls at least 0.25 s apart."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT


def test_the_webhook_example(database: str) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples/tenant_webhooks.py"), "--dsn", database],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    last = {
        channel: int(re.search(r"delivery (\d+)", text).group(1)) for channel, text in lines.items() if "sent" in text
    }  # type: ignore[union-attr]
    assert last["tenant-b"] <= 25 and last["tenant-c"] <= 25, run.stdout
    assert lines["tenant-b's first"] == "b-password-reset"
    gaps = [float(g) for g in re.findall(r"[\d.]+", lines["partner-acme"].split("[", 1)[1])]
    assert len(gaps) == 5 and min(gaps) >= 0.25, run.stdout
