"""The dashboard in a real browser: Playwright driving Debian's Chromium
against a real `pgdq serve`; every number it shows is checked against SQL.
Refusals (scopes, the CSRF token) are checked with httpx, as a page would
send them, and what they did not change in SQL."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

import httpx
import psycopg
import pytest
from conftest import owner
from http_server import Server, make_tokens, serve, sign_in
from pgdq import Client, Message, Queue
from pgdq.errors import StaleToken
from test_http_guard import dead_keys
from waiting import PATIENCE

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian chromium not installed (make deps installs it)"
)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra (make venv)")


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    # what a page shows is waited for as long as any state in the tests (5 s, Playwright's default, is
    # not long on a busy 2-core machine)
    sync_api.expect.set_options(timeout=PATIENCE * 1000)
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
    page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
    row = page.locator(f'tr[data-queue="{queue_name}"]')
    row.wait_for()
    stats = q.stats()
    cells = {f: int(row.locator(f'[data-field="{f}"]').inner_text()) for f in ("ready", "delayed", "leased", "dead")}
    assert cells == {"ready": stats.ready, "delayed": stats.delayed, "leased": stats.leased, "dead": 1}
    q.offer("new", 1)  # the overview refreshes itself
    ready = f'tr[data-queue="{queue_name}"] [data-field="ready"]'
    sync_api.expect(page.locator(ready)).to_have_text(str(stats.ready + 1), timeout=PATIENCE * 1000)  # no eval: CSP

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
    page.locator('tr[data-key="dead"]').wait_for(state="detached", timeout=PATIENCE * 1000)
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
    row.wait_for(state="detached", timeout=PATIENCE * 1000)
    assert asked == [f"Offer the keyless dead letter {first} again, due now?"]
    assert [m.raw_payload for m in q.peek() if m.key is None] == [7], "redriven as a keyless message"
    page.locator(f'tr[data-id="{second}"] button', has_text="Purge").click()
    page.locator(f'tr[data-id="{second}"]').wait_for(state="detached", timeout=PATIENCE * 1000)
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
        page = _page_client(s.url)
        for action in ("redrive", "purge"):
            assert page.post(f"{base}/{first}/{action}").status_code == 401, "no token (the page's CSRF token)"
            r = httpx.post(f"{base}/{first}/{action}")
            assert r.status_code == 403 and "CSRF" in r.json()["error"], "no token, no CSRF token"
            for name in ("reader", "other"):
                r = httpx.post(f"{base}/{first}/{action}", headers={"Authorization": f"Bearer {secrets[name]}"})
                assert r.status_code == 403 and "admin" in r.json()["error"], (name, action)
            cookie = {"pgdq_token": sign_in(s.url, secrets["admin"])}
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
        page.close()
    finally:
        s.stop()


def test_tokens_login_and_scopes(browser: sync_api.Browser, database: str, q: Queue, tmp_path: Path) -> None:
    _fill(q)
    other = Queue(f"{q.name[:90]}-other", database)
    _bury(other, 2, "boom")  # another queue's failures: not the reader's to see
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
        assert page.locator(f'tr[data-queue="{other.name}"]').count() == 0
        assert page.locator('#failure-totals [data-field="failed-day"]').inner_text() == "1", (
            "its queue's failures only"
        )
        cookie = next(c for c in page.context.cookies() if c["name"] == "pgdq_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != secrets["reader"]
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
        other.purge_dead_letters()
        other.close()


def test_bad_input_is_4xx(server: Server, q: Queue) -> None:
    page = _page_client(server.url)
    r = page.post(f"/dashboard/queues/{q.name}/dead-letters/redrive", params={"key": ""})
    assert r.status_code == 400 and "key" in r.json()["error"]
    for bad in ("0", "x", str(2**63)):
        r = page.post(f"/dashboard/queues/{q.name}/messages/{bad}/run-now")
        assert r.status_code == 400 and "id" in r.json()["error"], bad
    page.close()
    assert httpx.get(f"{server.url}/queues/{'x' * 101}").status_code == 400
    messages = f"{server.url}/queues/{q.name}/messages"
    later = datetime.now(UTC).isoformat()
    for params, says in (
        ({"state": "bogus"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"prefix": "x" * 201}, "prefix"),
        ({"after_id": "3"}, "after_due and after_id"),
        ({"after_due": later}, "after_due and after_id"),
        ({"after_due": "2030-01-01T00:00:00", "after_id": "3"}, "time zone"),
    ):
        r = httpx.get(messages, params=params)
        assert r.status_code == 400 and says in r.json()["error"], (params, r.text)
    assert httpx.get(f"{server.url}/queues/{q.name}/messages/0").status_code == 400


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
        page.goto(f"{s.url}/?search={q.name}")  # the overview shows 100 queues a page
        page.locator(f'tr[data-queue="{q.name}"]').wait_for()
        purge = f"{s.url}/dashboard/queues/{q.name}/dead-letters/purge?all=true"
        assert _submit_from(page, other_origin, purge) == 403, "SameSite=Strict sent the cookie (same site), refused"
        assert _submit_from(page, other_origin, f"{s.url}/logout") == 403, "nor signed out from elsewhere"
        assert dead_keys(database, q.name) == ["dead"], "nothing purged"
        page.goto(f"{s.url}/queues/{q.name}")
        page.on("dialog", lambda d: d.accept())
        page.locator("button", has_text="Purge all").click()  # the page's own button still works
        page.locator('tr[data-key="dead"]').wait_for(state="detached", timeout=PATIENCE * 1000)
        assert dead_keys(database, q.name) == []
        page.close()
    finally:
        s.stop()


# --- helpers of the tests below ---------------------------------------------------------------


def _page_client(url: str, secret: str | None = None) -> httpx.Client:
    """An httpx client that sends what the dashboard's page sends: Origin and Sec-Fetch-Site of
    this server, the login cookie (secret, if given), and the CSRF token the page gave it."""
    client = httpx.Client(base_url=url, headers={"origin": url, "sec-fetch-site": "same-origin"})
    if secret is not None:
        client.cookies.set("pgdq_token", sign_in(url, secret))
    client.get("/")  # a page sets the CSRF cookie (none is given without a valid token: the client makes its own)
    if "pgdq_csrf" not in client.cookies:
        client.cookies.set("pgdq_csrf", token_urlsafe(32))
    client.headers["x-csrf-token"] = client.cookies["pgdq_csrf"]
    return client


def _finish(database: str, queue: str, at: datetime, acked: int = 0, dead: int = 0) -> None:
    """acked + dead messages of queue that finish at at (the database's clock pinned with dq.now),
    each delivered 5 s after it fell due and finished 2 s after that: lateness 5 s, run time 2 s."""
    with psycopg.connect(owner(database, queue), autocommit=True) as c:
        pinned = Queue(queue, c)

        def clock(when: datetime) -> None:
            """Pin the database's clock of c at when."""
            c.execute("SELECT set_config('dq.now', %s, false)", (when.isoformat(),))

        clock(at - timedelta(seconds=7))
        pinned.offer_many([(f"{at.isoformat()}-{n}", n) for n in range(acked + dead)])
        clock(at - timedelta(seconds=2))
        deliveries = pinned.poll_many(acked + dead)
        clock(at)
        for n, d in enumerate(deliveries):
            d.ack() if n < acked else d.dead_letter("boom: at the pinned clock")


def _drawn(page: sync_api.Page, chart: str) -> dict[str, list[Any]]:
    """The nonzero buckets of a drawn chart: each label's values, by dataset."""
    spec = page.evaluate(
        "(id) => { const c = document.getElementById(id).chart;"
        " return {labels: c.data.labels, data: c.data.datasets.map((d) => d.data)}; }",
        chart,
    )
    columns = zip(*spec["data"], strict=True)
    return {label: list(v) for label, v in zip(spec["labels"], columns, strict=True) if any(v)}


def _seconds(text: str) -> float:
    """A percentile as the dashboard shows it ("850 ms", "4.9 s") in seconds."""
    number, unit = text.split()
    return float(number) * {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}[unit]


def _id_of(q: Queue, key: str) -> int:
    """The id of the live message of key."""
    (found,) = [m for m in q.browse(key_prefix=key) if m.key == key]
    assert found.id is not None
    return found.id


# --- the overview -------------------------------------------------------------------------------


def test_overview_totals_and_a_queue_with_only_a_schedule(
    browser: sync_api.Browser, server: Server, q: Queue, database: str
) -> None:
    q.schedule("nightly-report", "0 2 * * *", "UTC", {"report": "sales"})
    try:
        page = browser.new_page()
        page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
        row = page.locator(f'tr[data-queue="{q.name}"]')
        sync_api.expect(row.locator('[data-field="schedules"]')).to_have_text("1")
        assert [row.locator(f'[data-field="{f}"]').inner_text() for f in ("ready", "delayed", "leased", "dead")] == [
            "0"
        ] * 4, "a queue with a schedule and nothing else is listed"
        row.locator("a").click()
        sync_api.expect(page.locator("h1")).to_have_text(q.name)
        assert "nightly-report" in page.locator("#summary").inner_text()

        with Client(database) as client:
            stats, dead, schedules = client.stats(), client.dead_stats(), client.schedules()
        with psycopg.connect(database) as c:  # queues that only keep history or are paused are listed too
            settled = {
                r[0] for r in c.execute("SELECT queue FROM dq_queues WHERE retain IS NOT NULL OR paused_at IS NOT NULL")
            }
        names = {s.queue for s in stats} | {d.queue for d in dead} | {s.queue for s in schedules} | settled
        expected = {
            "queues": len(names),
            "ready": sum(s.ready for s in stats),
            "delayed": sum(s.delayed for s in stats),
            "leased": sum(s.leased for s in stats),
            "dead": sum(d.dead for d in dead),
            "schedules": len(schedules),
        }
        page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
        shown = {f: page.locator(f'#totals [data-field="{f}"] b').inner_text() for f in expected}
        assert shown == {f: f"{n:,}" for f, n in expected.items()}
        page.close()
    finally:
        q.unschedule("nightly-report")


def test_throughput_chart_with_history_and_what_to_do_without(
    browser: sync_api.Browser, server: Server, q: Queue, database: str
) -> None:
    page = browser.new_page()
    page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
    sync_api.expect(page.locator("#throughput-empty")).to_contain_text("pgdq retain QUEUE 7d")
    assert page.locator("#throughput-chart").count() == 0, "no empty chart"

    q.retain(timedelta(days=1))
    now = datetime.now(UTC)
    events = [(now - timedelta(minutes=10), 2, 0), (now - timedelta(minutes=3), 1, 1), (now - timedelta(hours=3), 5, 0)]
    for at, acked, dead in events:
        _finish(database, q.name, at, acked, dead)
    page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
    sync_api.expect(page.locator('#throughput-totals [data-field="acked"]')).to_have_text("3")
    assert page.locator('#throughput-totals [data-field="failed"]').inner_text() == "1"
    expected = {at.strftime("%H:%M"): [acked, dead, 0] for at, acked, dead in events[:2]}
    assert _drawn(page, "throughput-chart") == expected, "per minute, the 3 hours old ones are not in the last hour"
    row = page.locator(f'tr[data-queue="{q.name}"] [data-field="last-hour"]')
    assert row.inner_text() == "3 / 1"
    page.close()


# --- a queue's history ------------------------------------------------------------------------


def test_queue_page_charts_and_percentiles(browser: sync_api.Browser, server: Server, q: Queue, database: str) -> None:
    q.offer("here", 1)  # a queue with nothing at all is no queue: its page is 404
    page = browser.new_page()
    page.goto(f"{server.url}/queues/{q.name}")
    sync_api.expect(page.locator("#history-empty")).to_contain_text(f"pgdq retain {q.name} 7d")

    q.retain(timedelta(days=7))
    now = datetime.now(UTC)
    events = [(now - timedelta(minutes=10), 2, 0), (now - timedelta(minutes=3), 1, 1), (now - timedelta(hours=5), 4, 0)]
    for at, acked, dead in events:
        _finish(database, q.name, at, acked, dead)
    page.goto(f"{server.url}/queues/{q.name}")
    sync_api.expect(page.locator("#retention")).to_contain_text("History kept for 7 days")
    cards = {f: page.locator(f'[data-field="{f}"] b').inner_text() for f in ("acked-hour", "dead-hour", "acked-day")}
    assert cards == {"acked-hour": "3", "dead-hour": "1", "acked-day": "7"}
    minutes = {at.strftime("%H:%M"): [acked, dead, 0] for at, acked, dead in events[:2]}
    assert _drawn(page, "minute-chart") == minutes
    hours: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for at, acked, dead in events:
        hours[at.strftime("%H:00")] += acked
        failed[at.strftime("%H:00")] += dead
    assert _drawn(page, "hour-chart") == {h: [hours[h], failed[h], 0] for h in hours}
    timings = _drawn(page, "timing-chart")
    assert sorted(timings) == sorted(minutes), "lateness and run time in the minutes with deliveries"
    for values in timings.values():  # lateness p50, p99, run p50, p99: within the histogram's 5%
        assert values == pytest.approx([5, 5, 2, 2], rel=0.05), values

    old = page.locator(f'#hourly tr[data-hour="{events[2][0].replace(minute=0, second=0, microsecond=0).isoformat()}"]')
    cells = {f: _seconds(old.locator(f'[data-field="{f}"]').inner_text()) for f in ("lateness-p50", "run-p99")}
    assert cells == pytest.approx({"lateness-p50": 5, "run-p99": 2}, rel=0.05)
    outcomes = page.locator("#recent tr[data-id] .badge").all_inner_texts()
    assert Counter(outcomes) == {"acked": 7, "dead": 1}, "the latest to leave"
    page.close()


# --- browsing messages --------------------------------------------------------------------------


def test_browse_by_state_key_prefix_and_pages(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    now = datetime.now(UTC)
    q.offer("c-1", 0)
    (held,) = q.poll_many(1, lease=600)
    q.offer_many([Message(f"a-{n}", n, now + timedelta(minutes=n)) for n in range(1, 6)])
    q.offer("b-1", {"due": True})
    q.send({"keyless": True}, scheduled_at=now + timedelta(minutes=30))
    page = browser.new_page()
    keys = page.locator("#messages tr[data-id] td:first-child")

    page.goto(f"{server.url}/queues/{q.name}/messages?prefix=a-&limit=2")
    sync_api.expect(keys).to_have_text(["a-1", "a-2"])
    page.locator("#next-page").click()
    sync_api.expect(keys).to_have_text(["a-3", "a-4"])
    page.locator("#next-page").click()
    sync_api.expect(keys).to_have_text(["a-5"])
    assert page.locator("#next-page").count() == 0, "the last page"
    page.locator("#first-page").click()
    sync_api.expect(keys).to_have_text(["a-1", "a-2"])

    page.goto(f"{server.url}/queues/{q.name}/messages")
    # due order, a leased message at its lease's end (in 10 minutes)
    sync_api.expect(keys).to_have_text(["b-1", "a-1", "a-2", "a-3", "a-4", "a-5", "c-1", "–"])
    sync_api.expect(page.locator('[data-state="all"] .count')).to_have_text("8")
    page.locator('[data-state="leased"]').click()
    sync_api.expect(keys).to_have_text(["c-1"])
    page.locator('[data-state="delayed"]').click()
    sync_api.expect(keys).to_have_text(["a-1", "a-2", "a-3", "a-4", "a-5", "–"])
    page.locator('input[name="prefix"]').fill("a-4")
    page.locator('button[type="submit"]', has_text="Search").click()
    sync_api.expect(keys).to_have_text(["a-4"])
    assert "state=delayed" in page.url, "the search keeps the state"
    page.locator('[data-state="due"]').click()
    sync_api.expect(page.locator("#messages-empty")).to_contain_text("has a key starting with a-4")
    page.locator('input[name="prefix"]').fill("b-")
    page.locator('button[type="submit"]', has_text="Search").click()
    sync_api.expect(keys).to_have_text(["b-1"])
    page.locator("#messages a", has_text="b-1").click()
    sync_api.expect(page.locator("#payload")).to_contain_text('"due": true')
    held.ack()
    page.close()


# --- one message -------------------------------------------------------------------------------


def test_message_page_shows_payload_headers_and_history(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    q.retain(timedelta(days=1))
    q.offer("order-7", {"total": 12}, headers={"traceparent": "00-first"})
    (first,) = q.poll_many(1)
    first.nack(error="card declined")
    (again,) = q.poll_many(1)
    again.ack()
    q.offer("order-7", {"total": 13, "note": "größer"}, datetime.now(UTC) + timedelta(hours=1), headers={"h": "v"})
    live = _id_of(q, "order-7")
    gone = q.send({"keyless": 1})
    assert q.cancel_id(gone)

    page = browser.new_page()
    page.goto(f"{server.url}/queues/{q.name}/messages/{live}")
    sync_api.expect(page.locator('[data-field="status"]')).to_contain_text("delayed")
    assert page.locator('[data-field="key"]').inner_text() == "order-7"
    assert '"note": "größer"' in page.locator("#payload").inner_text()
    assert page.locator("#headers").inner_text() == '{\n  "h": "v"\n}'
    (record,) = q.history("order-7")
    history = page.locator(f'#history tr[data-id="{record.id}"]')
    assert "acked" in history.inner_text() and "card declined" in history.inner_text()
    assert history.locator("td").nth(3).inner_text() == "2", "two attempts"
    history.locator("a").click()  # the earlier message of the key: its record
    sync_api.expect(page.locator('[data-field="status"]')).to_contain_text("left the queue: acked")
    assert '"total": 12' in page.locator("#payload").inner_text()
    assert "00-first" in page.locator("#headers").inner_text()
    assert page.locator("#run-now, #cancel, #redrive").count() == 0, "nothing to do to a finished message"

    page.goto(f"{server.url}/queues/{q.name}/messages/{gone}")  # keyless: found by its id among the records
    sync_api.expect(page.locator('[data-field="status"]')).to_contain_text("cancelled")
    assert '"keyless": 1' in page.locator("#payload").inner_text()
    response = page.goto(f"{server.url}/queues/{q.name}/messages/{gone + 1000}")
    assert response is not None and response.status == 404
    sync_api.expect(page.locator("#message-missing")).to_contain_text(f"no live message {gone + 1000}")
    page.close()


# --- actions: with the admin scope and the CSRF token only -----------------------------------------


@pytest.fixture(scope="module")
def secured(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A `pgdq serve` with tokens: admin and reader of every queue, admin of the queue "elsewhere"."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    wanted = {"admin": (["admin"], ["*"]), "reader": (["consume"], ["*"]), "other": (["admin"], ["elsewhere"])}
    secrets = make_tokens(path, wanted)
    s = serve(database, "--tokens", str(path))
    yield s, secrets
    s.stop()


def _sign_in(browser: sync_api.Browser, url: str, secret: str) -> sync_api.Page:
    """A page signed in with secret, confirming every dialog."""
    page = browser.new_page()
    page.on("dialog", lambda d: d.accept())
    page.goto(url + "/login")
    page.fill('input[name="token"]', secret)
    page.click('button[type="submit"]')
    sync_api.expect(page.locator("h1")).to_have_text("Queues")
    return page


def test_actions_with_an_admin_token(
    browser: sync_api.Browser, secured: tuple[Server, dict[str, str]], q: Queue
) -> None:
    s, secrets = secured
    q.offer("later", 1, datetime.now(UTC) + timedelta(hours=1))
    q.offer("doomed", 2)
    (d,) = q.poll_many(1)
    d.dead_letter("boom")
    page = _sign_in(browser, s.url, secrets["admin"])
    csrf = next(c for c in page.context.cookies() if c["name"] == "pgdq_csrf")
    assert csrf["httpOnly"] and csrf["sameSite"] == "Strict", "no script reads it, no other site sends it"

    page.goto(f"{s.url}/queues/{q.name}/messages/{_id_of(q, 'later')}")
    page.locator("#run-now").click()
    sync_api.expect(page.locator("#notice")).to_have_text("Due now: the next poll may lease it.")
    info = q.get("later")
    assert info is not None and info.due_at <= datetime.now(UTC)
    sync_api.expect(page.locator('[data-field="status"]')).to_contain_text("due")
    page.locator("#cancel").click()
    sync_api.expect(page.locator("#message-view")).to_contain_text("Cancelled.")
    assert q.get("later") is None

    (dead,) = q.dead_letters()
    page.goto(f"{s.url}/queues/{q.name}/messages/{dead.id}")
    page.locator("#redrive").click()
    sync_api.expect(page.locator("#notice")).to_contain_text(f"Redriven: dead letter {dead.id} is message")
    assert q.dead_letters() == [] and q.get("doomed") is not None
    sync_api.expect(page).to_have_url(re.compile(rf"/messages/{_id_of(q, 'doomed')}$"))

    page.goto(f"{s.url}/queues/{q.name}")
    page.locator("#pause").click()
    sync_api.expect(page.locator("#pause-state")).to_contain_text("Paused.")
    assert q.stats().paused is True and q.poll() is None
    page.locator("#resume").click()
    sync_api.expect(page.locator("#pause-state")).to_contain_text("Running")
    assert q.stats().paused is False
    page.close()


def test_actions_refused_without_admin_or_the_csrf_token(secured: tuple[Server, dict[str, str]], q: Queue) -> None:
    """Each action: refused (403, 401 without a token) for a reader, another queue's admin, an admin
    without the page's CSRF token or with a wrong one; alike for a queue and a message that exist and
    for ones that do not; nothing changed."""
    s, secrets = secured
    q.offer("later", 1, datetime.now(UTC) + timedelta(hours=1))
    q.offer("doomed", 2)
    (d,) = q.poll_many(1)
    d.dead_letter("boom")
    later, (dead,) = _id_of(q, "later"), q.dead_letters()
    before = (q.get("later"), q.dead_letters(), q.stats())
    missing = f"missing-{q.name}"[:100]
    admin = _page_client(s.url, secrets["admin"])
    no_csrf = _page_client(s.url, secrets["admin"])
    del no_csrf.headers["x-csrf-token"]
    wrong = _page_client(s.url, secrets["admin"])
    wrong.headers["x-csrf-token"] = _page_client(s.url).headers["x-csrf-token"]  # another session's
    callers = {
        "reader": (_page_client(s.url, secrets["reader"]), 403, "no admin scope"),
        "other queue": (_page_client(s.url, secrets["other"]), 403, "no admin scope"),
        "reader, bearer": (
            httpx.Client(base_url=s.url, headers={"authorization": f"Bearer {secrets['reader']}"}),
            403,
            "admin",
        ),
        "no token": (_page_client(s.url), 401, "token"),
        "admin, no CSRF token": (no_csrf, 403, "CSRF"),
        "admin, a wrong CSRF token": (wrong, 403, "CSRF"),
    }
    actions = [
        "messages/{later}/run-now",
        "messages/{later}/cancel",
        "messages/{later}/release",
        "running/{later}/release",
        "running/{later}/cancel",
        "messages/{dead}/redrive",
        "pause",
        "resume",
    ]
    for action in actions:
        for who, (client, status, says) in callers.items():
            answers = []
            for queue, ids in ((q.name, (later, dead.id)), (missing, (2**62, 2**62 + 1))):
                path = f"/dashboard/queues/{queue}/" + action.format(later=ids[0], dead=ids[1])
                r = client.post(path)
                said = r.json()["error"] if r.headers["content-type"] == "application/json" else "(a page)"
                answers.append((r.status_code, said.replace(missing, q.name)))
            assert answers[0] == answers[1], (who, action, answers)
            assert answers[0][0] == status and says in answers[0][1], (who, action, answers[0])
            assert q.name not in answers[0][1], (who, action)
    assert (q.get("later"), q.dead_letters(), q.stats()) == before, "nothing run, cancelled, redriven or paused"
    assert admin.post(f"/dashboard/queues/{q.name}/pause").status_code == 200, "the admin's page may"
    assert q.stats().paused is True
    for client, _, _ in callers.values():
        client.close()
    admin.close()


# --- no script needed to read ---------------------------------------------------------------------


def test_first_paint_without_javascript_has_the_data(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    _fill(q)
    q.offer("with-headers", {"total": 99}, headers={"traceparent": "00-xyz"})
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{server.url}/?search={q.name}")  # one page of 100 queues
    row = page.locator(f'tr[data-queue="{q.name}"]')
    stats = q.stats()
    cells = [row.locator(f'[data-field="{f}"]').inner_text() for f in ("ready", "delayed", "leased", "dead")]
    assert cells == [str(stats.ready), str(stats.delayed), str(stats.leased), "1"]
    page.goto(f"{server.url}/queues/{q.name}")
    assert (_shown(page, "ready"), _shown(page, "delayed"), _shown(page, "dead")) == (stats.ready, stats.delayed, 1)
    assert "boom: 502" in page.locator('tr[data-key="dead"]').inner_text()
    page.goto(f"{server.url}/queues/{q.name}/messages?prefix=with-")
    page.locator("#messages a", has_text="with-headers").click()  # links, not scripts
    assert '"total": 99' in page.locator("#payload").inner_text() and "00-xyz" in page.locator("#headers").inner_text()
    context.close()


# --- errors, what runs and what fails (issue 38) ---------------------------------------------------

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/pgdq/worker.py", line 412, in _run\n'
    "    await handler(delivery)\n"
    '  File "/srv/app/handlers.py", line 7, in charge\n'
    "    raise ValueError(reason)\n"
    "ValueError: {reason}"
)


def _refreshed(page: sync_api.Page, path: str) -> None:
    """Wait until the page's next live refresh (a GET of path, every 5 s) has been swapped in and settled."""
    with page.expect_response(lambda r: path in r.url and r.request.method == "GET", timeout=PATIENCE * 1000):
        settled = "() => document.body.addEventListener('htmx:afterSettle', () => done(), {once: true})"
        page.evaluate(f"() => new Promise((done) => ({settled})())")


def _bury(q: Queue, count: int, error: str) -> None:
    """count keyed dead letters of q (dead-000, ...), each failing with error."""
    q.offer_many([(f"dead-{n:03}", n) for n in range(count)])
    for d in q.poll_many(count):
        d.dead_letter(error.format(reason=f"card {d.key} declined"))


def test_errors_show_their_last_line_and_the_whole_text_on_demand(
    browser: sync_api.Browser, server: Server, q: Queue
) -> None:
    _bury(q, 100, TRACEBACK)
    q.offer("flaky", {"n": 1})
    for _ in range(7):  # 7 attempts, the last error kept on the live message
        (d,) = q.poll_many(1)
        d.nack(error=TRACEBACK.format(reason="timeout after 30 s"))
    page = browser.new_page()
    page.goto(f"{server.url}/queues/{q.name}")
    row = page.locator('tr[data-key="dead-003"]')
    summary = row.locator("details summary")
    sync_api.expect(summary).to_have_text("ValueError: card dead-003 declined")
    whole = row.locator("details pre")
    assert not whole.is_visible(), "the traceback waits for a click"
    summary.click()
    sync_api.expect(whole).to_be_visible()
    assert whole.inner_text() == TRACEBACK.format(reason="card dead-003 declined"), "whole, its line breaks kept"
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height < 9000, f"100 dead letters, one line each: {height} px"

    retry = page.locator('#retrying tr[data-key="flaky"]')
    sync_api.expect(retry.locator("summary")).to_have_text("ValueError: timeout after 30 s")
    retry.locator("a").first.click()
    sync_api.expect(page.locator('[data-field="attempts"]')).to_have_text("7")
    error = page.locator('[data-field="last-error"] pre')
    sync_api.expect(error).to_have_text(TRACEBACK.format(reason="timeout after 30 s"))  # the live message's error
    page.close()


def test_an_acked_message_with_an_earlier_error_is_not_shown_as_failed(
    browser: sync_api.Browser, server: Server, q: Queue
) -> None:
    q.retain(timedelta(days=1))
    q.offer("second-try", 1)
    (d,) = q.poll_many(1)
    d.nack(error=TRACEBACK.format(reason="first try failed"))
    (d,) = q.poll_many(1)
    d.ack()
    page = browser.new_page()
    page.goto(f"{server.url}/queues/{q.name}")
    earlier = page.locator("#recent tr[data-id] details")
    sync_api.expect(earlier.locator("summary")).to_have_text("ValueError: first try failed")
    assert "muted" in (earlier.get_attribute("class") or ""), "an acked message's earlier error is not red"
    page.close()


def test_running_now_retrying_and_release(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    q.offer_many([("stuck", 1), ("busy", 2), ("failing", 3)])
    held = {d.key: d for d in q.poll_many(3, lease=3600)}
    held["failing"].nack(datetime.now(UTC) + timedelta(minutes=5), error="boom: 503")
    page = browser.new_page()
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.goto(f"{server.url}/queues/{q.name}")
    running = page.locator("#running tr[data-id] td:first-child")
    sync_api.expect(running).to_have_text(sorted(["stuck", "busy"], key=lambda k: held[k].id))  # delivered at once
    stuck = page.locator('#running tr[data-key="stuck"]')
    assert stuck.locator('[data-field="running-for"]').inner_text().endswith("s"), "for how long"
    assert "in 59m" in stuck.inner_text(), "its lease ends in an hour"
    retrying = page.locator('#retrying tr[data-key="failing"]')
    assert "boom: 503" in retrying.inner_text() and "in 4m" in retrying.inner_text()

    stuck.locator("button", has_text="Release").click()
    sync_api.expect(page.locator("#notice")).to_contain_text(f"Released message {held['stuck'].id}")
    sync_api.expect(running).to_have_text(["busy"])
    assert asked[0].startswith(f"Release message {held['stuck'].id} now?")
    info = q.get("stuck")
    assert info is not None and not info.leased and info.due_at <= datetime.now(UTC) and info.attempts == 1
    sync_api.expect(page.locator('#retrying tr[data-key="stuck"]')).to_be_visible()  # tried once, due now

    page.locator('#running tr[data-key="busy"] button', has_text="Cancel").click()
    sync_api.expect(page.locator("#notice")).to_have_text(f"Cancelled message {held['busy'].id}.")
    sync_api.expect(page.locator("#running-empty")).to_be_visible()
    assert q.get("busy") is None
    with pytest.raises(StaleToken):  # its holder's ack finds no lease
        held["stuck"].ack()
    page.close()


def test_release_from_the_message_page(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    q.offer("hung", 1)
    (held,) = q.poll_many(1, lease=3600)
    page = browser.new_page()
    page.on("dialog", lambda d: d.accept())
    page.goto(f"{server.url}/queues/{q.name}/messages/{held.id}")
    sync_api.expect(page.locator('[data-field="leased-at"]')).to_contain_text("running for")
    page.locator("#release").click()
    sync_api.expect(page.locator("#notice")).to_contain_text("due now, the next poll may lease it")
    sync_api.expect(page.locator('[data-field="status"]')).to_contain_text("due")
    assert page.locator("#release").count() == 0
    (again,) = q.poll_many(1)
    assert again.id == held.id and again.attempts == 2
    again.ack()
    page.close()


def test_failures_over_time_without_history(browser: sync_api.Browser, server: Server, q: Queue, database: str) -> None:
    now = datetime.now(UTC)
    with psycopg.connect(owner(database, q.name), autocommit=True) as c:
        pinned = Queue(q.name, c)
        for hours_ago, count in ((0, 2), (3, 4)):
            c.execute("SELECT set_config('dq.now', %s, false)", ((now - timedelta(hours=hours_ago)).isoformat(),))
            pinned.offer_many([(f"f-{hours_ago}-{n}", n) for n in range(count)])
            for d in pinned.poll_many(count):
                d.dead_letter("boom")
    with Client(database) as client:  # the overview counts every queue's
        since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
        every = sum(c.dead for c in client.dead_counts(since, timedelta(hours=1)))
    page = browser.new_page()
    page.goto(f"{server.url}/?search={q.name}")
    sync_api.expect(page.locator(f'tr[data-queue="{q.name}"] [data-field="failed-day"]')).to_have_text("6")
    assert page.locator('#failure-totals [data-field="failed-day"]').inner_text() == f"{every:,}" and every >= 6
    page.goto(f"{server.url}/queues/{q.name}")
    sync_api.expect(page.locator('[data-field="failed-day"] b')).to_have_text("6")
    assert page.locator('[data-field="failed-hour"] b').inner_text() == "2"
    drawn = {(now - timedelta(hours=3)).strftime("%H:00"): [4], now.strftime("%H:00"): [2]}
    assert _drawn(page, "failure-chart") == drawn
    page.close()


def test_counts_agree_and_actions_say_what_they_did(browser: sync_api.Browser, server: Server, q: Queue) -> None:
    _bury(q, 150, "boom: {reason}")
    page = browser.new_page()
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.goto(f"{server.url}/queues/{q.name}")
    sync_api.expect(page.locator('[data-field="dead"] b')).to_have_text("150")
    assert page.locator("#summary table").last.locator("tr[data-id]").count() == 100, "the oldest 100 listed"

    page.locator('tr[data-key="dead-007"] button', has_text="Purge").click()
    sync_api.expect(page.locator("#notice")).to_have_text("Purged: 1 dead letter deleted.")
    page.locator('tr[data-key="dead-008"] button', has_text="Redrive").click()
    sync_api.expect(page.locator("#notice")).to_have_text("Redriven: 1 dead letter offered again, due now.")
    sync_api.expect(page.locator('[data-field="dead"] b')).to_have_text("148")
    page.locator("#redrive-all").click()
    assert asked[-1].startswith(f"Offer all 148 dead letters of {q.name} again (not only the 100 shown)?")
    sync_api.expect(page.locator("#notice")).to_have_text("Redriven: 148 dead letters offered again, due now.")
    assert q.dead_letters() == [] and q.stats().ready == 149
    page.locator("#pause").click()
    sync_api.expect(page.locator("#notice")).to_have_text(f"Paused {q.name}.")
    _refreshed(page, f"/dashboard/queues/{q.name}")  # the live refresh leaves the notice
    sync_api.expect(page.locator("#notice")).to_have_text(f"Paused {q.name}.")
    page.locator("#resume").click()
    sync_api.expect(page.locator("#notice")).to_have_text(f"Resumed {q.name}.")
    _bury(q, 2, "boom")
    page.reload()
    page.locator("#purge-all").click()
    assert asked[-1] == f"Delete all 2 dead letters of {q.name} for good?"
    sync_api.expect(page.locator("#notice")).to_have_text("Purged: 2 dead letters deleted.")
    page.close()


def test_an_action_far_down_the_page_shows_its_notice_where_the_operator_is(
    browser: sync_api.Browser, server: Server, q: Queue
) -> None:
    """The notice sits at the top of the page; a dead letter's buttons are thousands of pixels
    below it. Clicking one there must not leave its notice out of sight (it stays in view)."""
    _bury(q, 100, "boom: {reason}")
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.on("dialog", lambda d: d.accept())
    page.goto(f"{server.url}/queues/{q.name}")
    row = page.locator('tr[data-key="dead-090"]')
    row.scroll_into_view_if_needed()
    assert page.evaluate("scrollY") > 1000, "the row is far below the notice"
    row.locator("button", has_text="Purge").click()
    sync_api.expect(page.locator("#notice")).to_have_text("Purged: 1 dead letter deleted.")
    sync_api.expect(page.locator("#notice")).to_be_in_viewport()
    page.close()


def test_overdue_schedules_are_flagged(browser: sync_api.Browser, server: Server, q: Queue, database: str) -> None:
    with psycopg.connect(owner(database, q.name), autocommit=True) as c:
        c.execute("SELECT set_config('dq.now', %s, false)", ((datetime.now(UTC) - timedelta(hours=1)).isoformat(),))
        Queue(q.name, c).schedule("every-minute", "* * * * *", "UTC", {"tick": True})
    q.schedule("nightly", "0 2 * * *", "UTC", {"report": True})
    page = browser.new_page()
    page.goto(f"{server.url}/queues/{q.name}")
    overdue = page.locator('tr[data-schedule="every-minute"] [data-field="overdue"]')
    sync_api.expect(overdue).to_contain_text("overdue: fires at the next poll")
    assert "ago" in page.locator('tr[data-schedule="every-minute"]').inner_text()
    assert page.locator('tr[data-schedule="nightly"] [data-field="overdue"]').count() == 0
    sync_api.expect(page.locator("#overdue-note")).to_contain_text("when something polls")
    page.close()
    q.unschedule("every-minute")
    q.unschedule("nightly")


def test_next_page_after_a_message_due_at_infinity(
    browser: sync_api.Browser, server: Server, q: Queue, database: str
) -> None:
    q.offer_many([("a", 1), ("b", 2), ("c", 3)])
    with psycopg.connect(owner(database, q.name), autocommit=True) as c:  # as stored before 1.2
        c.execute("UPDATE dq_messages SET due_at = 'infinity' WHERE queue = %s AND key IN ('b', 'c')", (q.name,))
    page = browser.new_page()
    keys = page.locator("#messages tr[data-id] td:first-child")
    page.goto(f"{server.url}/queues/{q.name}/messages?limit=1")
    seen = []
    for _ in range(5):
        sync_api.expect(keys).to_have_count(1)
        seen.append(keys.inner_text())
        if page.locator("#next-page").count() == 0:
            break
        page.locator("#next-page").click()
    assert seen == ["a", "b", "c"], "each once, then no Next link"
    page.close()


def test_next_page_at_the_first_and_last_finite_times_and_the_infinities(
    server: Server, q: Queue, database: str
) -> None:
    """Messages due at -infinity, at 0001-01-01 00:00 UTC (the earliest time an offer takes), at
    9999-12-31 23:59:59.999999 UTC and at infinity: the Next links go through each once (a finite
    time that Python reads as an infinite one's looped, 1.3)."""
    q.offer_many([(k, 1) for k in ("m1", "m2", "y1", "y2", "e1", "e2", "i1", "i2")])
    with psycopg.connect(owner(database, q.name), autocommit=True) as c:
        for keys, at in (
            (["m1", "m2"], "-infinity"),
            (["y1", "y2"], "0001-01-01 00:00:00+00"),
            (["e1", "e2"], "9999-12-31 23:59:59.999999+00"),
            (["i1", "i2"], "infinity"),
        ):
            c.execute("UPDATE dq_messages SET due_at = %s WHERE queue = %s AND key = ANY(%s)", (at, q.name, keys))
    url, seen = f"/queues/{q.name}/messages?limit=1", []
    for _ in range(12):
        page = httpx.get(server.url + url)
        assert page.status_code == 200, page.text
        seen += re.findall(r'<tr data-id="\d+" data-key="([^"]*)"', page.text)
        found = re.search(r'<a href="([^"]+)" id="next-page">', page.text)
        if found is None:
            break
        url = found.group(1).replace("&amp;", "&")
    assert seen == ["m1", "m2", "y1", "y2", "e1", "e2", "i1", "i2"], "each once, then no Next link"


def test_the_overview_shows_a_page_of_queues_and_finds_one(
    browser: sync_api.Browser, server: Server, q: Queue, database: str
) -> None:
    names = [f"{q.name[:80]}-page-{n:03}" for n in range(130)]
    with psycopg.connect(owner(database, q.name), autocommit=True) as c:
        c.execute("SELECT dq_offer(n, 'k', '1') FROM unnest(%s::text[]) AS n", (names,))
    try:
        page = browser.new_page()
        page.goto(f"{server.url}/?search={q.name[:80]}-page-")
        rows = page.locator("#queues tr[data-queue]")
        sync_api.expect(rows).to_have_count(100)
        assert page.locator("#queues-shown").inner_text() == "(1–100 of 130, by name)"
        assert rows.first.get_attribute("data-queue") == names[0]
        page.locator("#next-queues").click()
        sync_api.expect(rows).to_have_count(30)
        assert rows.first.get_attribute("data-queue") == names[100]
        _refreshed(page, "/dashboard/queues?")  # the live refresh re-reads this page, not the first
        sync_api.expect(rows).to_have_count(30)
        page.locator('input[name="search"]').fill(names[42][-12:].upper())
        page.locator('button[type="submit"]', has_text="Search").click()
        sync_api.expect(rows).to_have_count(1)
        assert rows.first.get_attribute("data-queue") == names[42], "any case"
        assert page.locator('#totals [data-field="queues"] b').inner_text() != "1", "the totals count every queue"
        page.close()
    finally:
        with psycopg.connect(owner(database, q.name), autocommit=True) as c:
            c.execute("SELECT dq_purge(n) FROM unnest(%s::text[]) AS n", (names,))


def test_a_paused_queue_with_no_messages_is_listed_and_has_a_page(server: Server, q: Queue) -> None:
    """Review: a paused queue with no messages was missing from the overview (and a page of a
    queue pgdq does not know is 404, so an idle paused queue must still be known)."""
    assert q.pause() and q.stats().ready == 0
    page = _page_client(server.url)
    overview = page.get("/", params={"search": q.name})
    assert overview.status_code == 200 and f'data-queue="{q.name}"' in overview.text
    assert page.get(f"/queues/{q.name}").status_code == 200
    page.close()


def test_the_messages_page_of_a_typo_is_404_like_its_queue_page(
    browser: sync_api.Browser, server: Server, q: Queue
) -> None:
    """/queues/paymnets was 404 but /queues/paymnets/messages rendered "No messages in paymnets
    now.", tabs and a search, as if the queue existed. A queue that exists with no messages
    (paused, dead letters only) keeps its page."""
    page = browser.new_page()
    typo = page.goto(f"{server.url}/queues/{q.name}-typo/messages")
    assert typo is not None and typo.status == 404
    sync_api.expect(page.locator("#error-page")).to_contain_text("No such queue")
    assert page.locator("form.search").count() == 0
    _bury(q, 1, "boom")  # dead letters only: no live message, but the queue exists
    shown = page.goto(f"{server.url}/queues/{q.name}/messages")
    assert shown is not None and shown.status == 200
    sync_api.expect(page.locator("body")).to_contain_text(f"No messages in {q.name} now.")
    page.close()
