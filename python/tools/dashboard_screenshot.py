"""Write docs/dashboard.png: the dashboard of `make serve-demo`'s queues
(examples/serve_demo.py seeds them) in Debian's Chromium, driven by Playwright.

    DATABASE_URL=... .venv/bin/python python/tools/dashboard_screenshot.py [OUT.png]
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    """Serve the demo on a free port, open the orders queue's page, save it."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/dashboard.png"
    port = _free_port()
    demo = subprocess.Popen([sys.executable, str(ROOT / "examples/serve_demo.py"), "--port", str(port)], env=os.environ)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(url + "/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
            page.goto(f"{url}/queues/pgdq_demo_orders")
            page.locator("#due-chart").wait_for()
            page.wait_for_timeout(500)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
    finally:
        demo.terminate()
        demo.wait(10)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
