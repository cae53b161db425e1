"""The dashboard in a real browser: Playwright driving Debian's Chromium
against a real `pgdq serve`; every number it shows is checked against SQL."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from http_server import Server, make_tokens, serve
from pgdq import Message, Queue
from test_http_guard import dead_keys

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian chromium not installed (make deps installs it)"
)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra (make venv)")


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


def _fill(q: Queue) -> None:
    """Two due, three over the next hours, one dead letter."""
    now = datetime.now(UTC)
    q.offer_many([("due-1", 1), ("due-2", 2), ("dead", 3)])
    q.offer_many([Message(f"later-{h}-{i}", h, now + timedelta(hours=h, minutes=10)) for i, h in enumerate((1, 1, 5))])
    for d in q.poll_many(3):
        if d.key == "dead":
            d.dead_letter("boom: 502 from the payment provider")
        else:
            d.nack()  # back to ready


def _csp_refusals(page: sync_api.Page) -> list[str]:
    """What the page's Content-Security-Policy refuses, as Chromium reports it (filled as the page runs)."""
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    return refused


def _shown(page: sync_api.Page, field: str) -> int:
    return int(page.locator(f'[data-field="{field}"] b').inner_text().rstrip("+"))


def test_overview_and_queue_page_match_sql(
    browser: sync_api.Browser, server: Server, q: Queue, queue_name: str, database: str
) -> None:
    _fill(q)
    page = browser.new_page()
    refused = _csp_refusals(page)
    page.goto(server.url + "/")
    row = page.locator(f'tr[data-queue="{queue_name}"]')
    row.wait_for()
    stats = q.stats()
    cells = {f: int(row.locator(f'[data-field="{f}"]').inner_text()) for f in ("ready", "delayed", "leased", "dead")}
    assert cells == {"ready": stats.ready, "delayed": stats.delayed, "leased": stats.leased, "dead": 1}
    q.offer("new", 1)  # the overview refreshes itself
    ready = f'tr[data-queue="{queue_name}"] [data-field="ready"]'
    sync_api.expect(page.locator(ready)).to_have_text(str(stats.ready + 1), timeout=10_000)  # no eval: CSP

    row.locator("a").click()
    page.locator("#due-chart").wait_for()
    assert (_shown(page, "ready"), _shown(page, "delayed"), _shown(page, "dead")) == (
        q.stats().ready,
        q.stats().delayed,
        1,
    )
    drawn = page.evaluate("() => document.getElementById('due-chart').chart.data.datasets[0].data")
    assert drawn == [h.due for h in q.due_hours(24)] and sum(drawn) == 3
    assert "boom: 502" in page.locator('tr[data-key="dead"]').inner_text()
    assert refused == [], "the pages need nothing their policy refuses (no inline script or style)"
    page.close()


def test_redrive_through_the_button(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    _fill(q)
    page = browser.new_page()
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.goto(f"{server.url}/queues/{q.name}")
    page.locator('tr[data-key="dead"] button', has_text="Redrive").click()
    page.locator('tr[data-key="dead"]').wait_for(state="detached", timeout=10_000)
    assert asked == ["Offer dead again, due now?"]
    assert q.get("dead") is not None and q.dead_letters() == []
    page.close()


def _bury_keyless(q: Queue, *payloads: int) -> list[int]:
    """One keyless dead letter per payload (on a queue with nothing due); their ids, ascending."""
    for payload in payloads:
        q.send(payload)
    for d in q.poll_many(len(payloads)):
        d.dead_letter(f"boom: keyless {d.raw_payload}")
    return sorted(d.id for d in q.dead_letters() if d.key is None and d.id is not None)


def test_keyless_dead_letters_show_their_id_and_act_by_it(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    first, second = _bury_keyless(q, 7, 8)
    _fill(q)
    page = browser.new_page()
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.goto(f"{server.url}/queues/{q.name}")
    row = page.locator(f'tr[data-id="{first}"]')
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[:2] == ["–", str(first)] and "boom: keyless 7" in cells[3], "no key: a dash, then the id"
    keyed_id = next(d.id for d in q.dead_letters() if d.key == "dead")
    assert page.locator('tr[data-key="dead"] td').nth(1).inner_text() == str(keyed_id)
    assert "None" not in page.locator("#summary table").last.inner_text()
    row.locator("button", has_text="Redrive").click()
    row.wait_for(state="detached", timeout=10_000)
    assert asked == [f"Offer the keyless dead letter {first} again, due now?"]
    assert [m.raw_payload for m in q.peek() if m.key is None] == [7], "redriven as a keyless message"
    page.locator(f'tr[data-id="{second}"] button', has_text="Purge").click()
    page.locator(f'tr[data-id="{second}"]').wait_for(state="detached", timeout=10_000)
    assert asked[1] == f"Delete the keyless dead letter {second} for good?"
    assert [d.key for d in q.dead_letters()] == ["dead"], "the keyed dead letter stays"
    assert [m.raw_payload for m in q.peek() if m.key is None] == [7], "purged, not redriven"
    page.close()


def test_keyless_actions_need_admin_on_the_queue(database: str, q: Queue, tmp_path: Path) -> None:
    first, second = _bury_keyless(q, 1, 2)
    wanted = {"reader": (["consume"], [q.name]), "other": (["admin"], ["elsewhere"]), "admin": (["admin"], [q.name])}
    secrets = make_tokens(tmp_path / "tokens.json", wanted)
    s = serve(database, "--tokens", str(tmp_path / "tokens.json"))
    base = f"{s.url}/dashboard/queues/{q.name}/dead-letters/by-id"
    try:
        for action in ("redrive", "purge"):
            assert httpx.post(f"{base}/{first}/{action}").status_code == 401, "no token"
            for name in ("reader", "other"):
                r = httpx.post(f"{base}/{first}/{action}", headers={"Authorization": f"Bearer {secrets[name]}"})
                assert r.status_code == 403 and "admin" in r.json()["error"], (name, action)
            cookie = {"pgdq_token": secrets["admin"]}
            foreign = httpx.post(f"{base}/{first}/{action}", cookies=cookie, headers={"Origin": "http://evil.example"})
            assert foreign.status_code == 403 and "another site or origin" in foreign.text, action
        assert sorted(d.id or 0 for d in q.dead_letters()) == [first, second], "nothing redriven or purged"
        admin = {"Authorization": f"Bearer {secrets['admin']}"}
        assert httpx.post(f"{base}/{first}/redrive", headers=admin).status_code == 200
        assert httpx.post(f"{base}/{second}/purge", headers=admin).status_code == 200
        assert q.dead_letters() == [] and [m.raw_payload for m in q.peek()] == [1]
        for bad in ("0", "x", str(2**63)):
            r = httpx.post(f"{base}/{bad}/purge", headers=admin)
            assert r.status_code == 400 and "id" in r.json()["error"], bad
    finally:
        s.stop()


def test_tokens_login_and_scopes(browser: sync_api.Browser, database: str, q: Queue, tmp_path: Path) -> None:
    _fill(q)
    secrets = make_tokens(tmp_path / "tokens.json", {"reader": (["consume"], [q.name])})
    s = serve(database, "--tokens", str(tmp_path / "tokens.json"))
    try:
        page = browser.new_page()
        page.on("dialog", lambda d: d.accept())
        page.goto(s.url + "/")
        assert page.url.endswith("/login"), "no token: the page asks for one"
        page.fill('input[name="token"]', "pgdq_wrong")
        page.click('button[type="submit"]')
        assert "not a valid token" in page.content()
        page.fill('input[name="token"]', secrets["reader"])
        page.click('button[type="submit"]')
        page.locator(f'tr[data-queue="{q.name}"]').wait_for()
        cookie = next(c for c in page.context.cookies() if c["name"] == "pgdq_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        page.goto(f"{s.url}/queues/{q.name}")
        page.locator('tr[data-key="dead"] button', has_text="Redrive").click()
        page.locator("#message").wait_for()
        assert "403" in page.locator("#message").inner_text() and "admin" in page.locator("#message").inner_text()
        assert [d.key for d in q.dead_letters()] == ["dead"], "a consume token redrives nothing"
        page.click("#logout")
        page.wait_for_url(s.url + "/login")
        assert [c["name"] for c in page.context.cookies()] == [], "signed out: the cookie is gone"
        page.goto(f"{s.url}/queues/{q.name}")
        assert page.url.endswith("/login")
        page.close()
        assert httpx.get(f"{s.url}/dashboard/queues/{q.name}").status_code == 401
    finally:
        s.stop()


def test_bad_input_is_4xx(server: Server, q: Queue) -> None:
    r = httpx.post(f"{server.url}/dashboard/queues/{q.name}/dead-letters/redrive", params={"key": ""})
    assert r.status_code == 400 and "key" in r.json()["error"]
    assert httpx.get(f"{server.url}/queues/{'x' * 101}").status_code == 400


@pytest.fixture(scope="module")
def other_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A plain http.server on another port of 127.0.0.1 (another origin, the same site): its URL and folder."""
    root = tmp_path_factory.mktemp("other_origin")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", root
    httpd.shutdown()
    httpd.server_close()


def _submit_from(page: sync_api.Page, other_origin: tuple[str, Path], action: str) -> int:
    """Open a page of the other origin whose form POSTs itself to action; the status of that POST."""
    url, root = other_origin
    (root / "attack.html").write_text(
        f'<form method="post" action="{action}"><input name="all" value="true"></form>'
        "<script>document.forms[0].submit()</script>"
    )
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.goto(url + "/attack.html")
    return answer.value.status


def test_another_origin_cannot_purge(
    browser: sync_api.Browser, server: Server, q: Queue, database: str, other_origin: tuple[str, Path]
) -> None:
    _fill(q)
    page = browser.new_page()
    status = _submit_from(page, other_origin, f"{server.url}/dashboard/queues/{q.name}/dead-letters/purge?all=true")
    assert status == 403 and "another site or origin" in page.content()
    assert dead_keys(database, q.name) == ["dead"], "nothing purged"
    page.close()


def test_another_origin_cannot_use_the_cookie(
    browser: sync_api.Browser, database: str, q: Queue, tmp_path: Path, other_origin: tuple[str, Path]
) -> None:
    _fill(q)
    secrets = make_tokens(tmp_path / "tokens.json", {"admin": (["admin"], [])})
    s = serve(database, "--tokens", str(tmp_path / "tokens.json"))
    try:
        page = browser.new_page()
        page.goto(s.url + "/login")
        page.fill('input[name="token"]', secrets["admin"])
        page.click('button[type="submit"]')
        page.locator(f'tr[data-queue="{q.name}"]').wait_for()
        purge = f"{s.url}/dashboard/queues/{q.name}/dead-letters/purge?all=true"
        assert _submit_from(page, other_origin, purge) == 403, "SameSite=Strict sent the cookie (same site), refused"
        assert _submit_from(page, other_origin, f"{s.url}/logout") == 403, "nor signed out from elsewhere"
        assert dead_keys(database, q.name) == ["dead"], "nothing purged"
        page.goto(f"{s.url}/queues/{q.name}")
        page.on("dialog", lambda d: d.accept())
        page.locator("button", has_text="Purge all").click()  # the page's own button still works
        page.locator('tr[data-key="dead"]').wait_for(state="detached", timeout=10_000)
        assert dead_keys(database, q.name) == []
        page.close()
    finally:
        s.stop()
