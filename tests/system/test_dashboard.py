"""The dashboard at ``/``, driven by a real browser (Debian's chromium through playwright)
against a real manager and observer service: create through the form, watch the row go
Processing on its service, stop it, read its history; the files' content types; the token
prompt; and not one request leaving 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Locator, Page, Route, expect, sync_playwright
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from manager.dashboard import STATIC_DIR
from tools import browser as browser_tool
from tools.harness import REPO, System, unique

ARTIFACTS = REPO / "tests" / "artifacts"
TIMEOUT_MS = 20_000  # two cores shared by the browser, broker, database, manager and service
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    try:
        return browser_tool.ensure_chromium()
    except browser_tool.CannotInstall as exc:
        pytest.skip(f"cannot install Debian's chromium here: {exc}")


@pytest.fixture(scope="module")
def browser(chromium_path: Path) -> Iterator[Browser]:
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=str(chromium_path), headless=True, args=list(browser_tool.LAUNCH_ARGS)
        )
        yield launched
        launched.close()


@dataclass
class Watched:
    """A page whose requests are held to loopback (others are aborted and recorded) and whose
    script errors are recorded."""

    page: Page
    outside: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.outside == [], f"requests left 127.0.0.1: {self.outside}"
        assert self.errors == [], f"script errors: {self.errors}"


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    seen = Watched(page)

    def guard(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            seen.outside.append(url)
            route.abort()

    def console(message: ConsoleMessage) -> None:
        # The browser logs every 4xx answer ("Failed to load resource"); the API's errors are
        # part of the tests. Anything else logged as an error is a bug of the page.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            seen.errors.append(message.text)

    context.route("**/*", guard)
    page.on("request", lambda request: seen.urls.append(request.url))
    page.on("pageerror", lambda exc: seen.errors.append(exc.stack or str(exc)))
    page.on("console", console)
    yield seen
    context.close()


def observer_row(page: Page, name: str) -> Locator:
    return page.locator(f'[data-testid="observer-row"][data-name="{name}"]')


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / name, full_page=True)
    page.screenshot(path=tmp_path / name, full_page=True)


def test_create_watch_stop_and_read_history_in_the_dashboard(system: System, watched: Watched, tmp_path: Path) -> None:
    # Given a manager and one service, and the dashboard open
    system.start_manager()
    system.start_service("svc-a", workers=5)
    page = watched.page
    page.goto(system.base_url + "/")
    service = page.locator('[data-testid="service-row"][data-name="svc-a"]')
    expect(service.get_by_test_id("service-status")).to_have_text("alive")
    expect(service.get_by_test_id("service-workers")).to_have_text("5")

    # When a ticker is created through the form (kinds and args inputs come from the API)
    name = unique("dash")
    page.get_by_test_id("create-kind").select_option("ticker")
    page.get_by_test_id("create-name").fill(name)
    page.get_by_test_id("arg-interval_s").fill("1")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/observers")) as posted:
        page.get_by_test_id("create-submit").click()
    # (empty inputs are left out: the kind's defaults apply, as with the API)
    assert posted.value.post_data_json == {"name": name, "kind": "ticker", "args": {"interval_s": 1}, "pool": "default"}

    # Then its row shows it Processing on svc-a, without a reload
    row = observer_row(page, name)
    expect(row.get_by_test_id("observer-status")).to_have_text("Processing")
    expect(row.get_by_test_id("observer-service")).to_have_text("svc-a")
    expect(service.get_by_test_id("service-running")).to_have_text("1")
    expect(page.locator('[data-testid="capacity-row"][data-pool="default"]')).to_contain_text("1 / 5")
    [created] = system.observers(name=name)
    assert created["args"]["interval_s"] == 1
    expect(page.get_by_test_id("error-banner")).to_be_hidden()
    screenshot(page, tmp_path, "dashboard.png")

    # And the API's refusal of a second live observer with the same name shows in the banner
    page.get_by_test_id("create-name").fill(name)
    page.get_by_test_id("create-submit").click()
    expect(page.get_by_test_id("error-banner")).to_be_visible()
    expect(page.get_by_test_id("error-text")).to_contain_text("409")
    expect(page.get_by_test_id("error-text")).to_contain_text(name)

    # When it is stopped from its row, it ends Deleted (restart is offered only for Failed)
    expect(row.get_by_test_id("restart-button")).to_be_hidden()
    row.get_by_test_id("stop-button").click()
    expect(row.get_by_test_id("observer-status")).to_have_text("Deleted")
    expect(row.get_by_test_id("stop-button")).to_be_hidden()
    expect(page.locator('[data-testid="status-count"][data-status="Deleted"] b')).to_have_text("1")

    # And its page shows its fields and its history, oldest first
    row.get_by_test_id("observer-link").click()
    expect(page).to_have_url(f"{system.base_url}/#/observers/{created['id']}")
    detail = page.get_by_test_id("observer-detail")
    expect(detail.get_by_test_id("detail-status")).to_have_text("Deleted")
    expect(detail.get_by_test_id("detail-kind")).to_have_text("ticker")
    expect(detail.get_by_test_id("event-name")).to_contain_text(["created", "started", "stop_requested", "stopped"])
    expect(detail.locator('[data-testid="event-row"][data-event="started"]')).to_contain_text("svc-a")
    screenshot(page, tmp_path, "dashboard-observer.png")

    # And back on the overview, filtering by name and status still finds it
    page.get_by_test_id("detail-back").click()
    page.get_by_test_id("filter-q").fill(name[-6:])
    page.get_by_test_id("filter-status").select_option("Deleted")
    expect(page.get_by_test_id("observer-row")).to_have_count(1)
    expect(observer_row(page, name)).to_be_visible()
    watched.assert_clean()


def test_page_and_assets_are_served_with_their_types_and_nothing_leaves_loopback(
    system: System, watched: Watched
) -> None:
    system.start_manager()

    index = httpx.get(system.base_url + "/", timeout=10)
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in index.headers["content-security-policy"]
    assets = sorted(p.name for p in STATIC_DIR.iterdir() if p.suffix in MEDIA_TYPES and p.name != "index.html")
    assert {"app.js", "style.css"} <= set(assets)
    for asset in assets:
        answer = httpx.get(f"{system.base_url}/static/{asset}", timeout=10)
        assert answer.status_code == 200, asset
        assert answer.headers["content-type"].startswith(MEDIA_TYPES[Path(asset).suffix]), asset
    for missing in ("/static/nope.js", "/static/..%2F__init__.py", "/static/__init__.py"):
        assert httpx.get(system.base_url + missing, timeout=10).status_code == 404, missing
    assert "/" not in httpx.get(system.base_url + "/openapi.json", timeout=10).json()["paths"]

    # In the browser: every file loads, the page reaches the API, and nothing goes elsewhere
    page = watched.page
    page.goto(system.base_url + "/")
    expect(page.get_by_test_id("live-state")).to_contain_text("live")
    expect(page.get_by_test_id("create-kind").locator("option[value=ticker]")).to_have_count(1)
    expect(page.get_by_test_id("arg-interval_s")).to_be_visible()
    loaded = {urlsplit(url).path for url in watched.urls}
    assert {f"/static/{asset}" for asset in assets} <= loaded
    assert {"/api/services", "/api/stats", "/api/observers", "/api/kinds"} <= loaded
    hosts = {urlsplit(url).hostname for url in watched.urls if urlsplit(url).scheme in ("http", "https")}
    assert hosts == {"127.0.0.1"}
    watched.assert_clean()


def test_a_token_is_asked_for_kept_and_used(system: System, watched: Watched) -> None:
    token = f"dashboard-{uuid.uuid4().hex}"
    system.start_manager(ORCH_API_TOKENS=token)
    page = watched.page
    page.goto(system.base_url + "/")

    # The charts' history is read like the rest of the API: with a token
    assert httpx.get(system.base_url + "/api/history", timeout=10).status_code == 401
    # The API answers 401: the page asks for a token instead of showing stale nothing
    form = page.get_by_test_id("token-form")
    expect(form).to_be_visible()
    expect(form).to_contain_text("missing token")
    page.get_by_test_id("token-input").fill("not-the-token")
    page.get_by_test_id("token-submit").click()
    expect(form).to_contain_text("invalid token")

    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-submit").click()
    expect(form).to_be_hidden()
    expect(page.get_by_test_id("live-state")).to_contain_text("live")
    expect(page.get_by_test_id("create-kind").locator("option[value=ticker]")).to_have_count(1)

    # Kept in localStorage: a reload needs no prompt
    assert page.evaluate("() => localStorage.getItem('orch.dashboard.token')") == token
    page.reload()
    expect(page.get_by_test_id("live-state")).to_contain_text("live")
    expect(form).to_be_hidden()
    watched.assert_clean()


def test_a_failed_observer_shows_its_error_and_is_restarted_from_its_row(system: System, watched: Watched) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5, ORCH_PERIODIC_MODULES="tests.periodic_funcs")
    name = unique("fail")
    args = {"function": "tests.periodic_funcs:fail", "kwargs": {"message": "dashboard boom"}, "interval_s": 0.2}
    created = system.create(name, kind="periodic", args=args | {"max_consecutive_errors": 1}, retry={"max_attempts": 1})
    page = watched.page
    page.goto(system.base_url + "/")

    # Failed: its error is shown, restart is offered and stop is not
    row = observer_row(page, name)
    expect(row.get_by_test_id("observer-status")).to_have_text("Failed")
    expect(row.get_by_test_id("observer-error")).to_contain_text("dashboard boom")
    expect(row.get_by_test_id("stop-button")).to_be_hidden()
    row.get_by_test_id("restart-button").click()
    expect(page.get_by_test_id("notice")).to_contain_text(f"Restarted {name}")

    # Its page tells the story (it fails again at once: max_attempts 1)
    page.goto(f"{system.base_url}/#/observers/{created['id']}")
    detail = page.get_by_test_id("observer-detail")
    expect(detail.get_by_test_id("observer-last-error")).to_contain_text("dashboard boom")
    expect(detail.get_by_test_id("event-name")).to_contain_text(["created", "started", "failed", "restarted"])
    watched.assert_clean()


def test_the_last_hours_charts_draw_what_happened(system: System, watched: Watched, tmp_path: Path) -> None:
    # Given a manager sampling every second, a service, and observers created and stopped
    system.start_manager(ORCH_HISTORY_SAMPLE_S="1")
    system.start_service("svc-a", workers=4)
    prefix = unique("chart")
    created = [system.create(f"{prefix}-{i}", args={"interval_s": 1}) for i in range(3)]
    for o in created:
        system.wait_status(o["id"], "Processing")
    assert system.delete(f"/api/observers/{created[0]['id']}").status_code == 202
    system.wait_status(created[0]["id"], "Deleted")

    # When the dashboard is open
    page = watched.page
    page.goto(system.base_url + "/")
    charts = page.get_by_test_id("history")

    # Then each chart is an SVG line through the samples, at the values the API counted
    processing = charts.locator('[data-testid="chart-observers"] path[data-series="Processing"]')
    expect(processing).to_have_attribute("data-last", "2")
    expect(processing).to_have_attribute("d", re.compile(r"^M[\d.]+,[\d.]+( L[\d.]+,[\d.]+)+$"))
    points = int(processing.get_attribute("data-points") or 0)
    assert points >= 2, points
    deleted = charts.locator('[data-testid="chart-observers"] path[data-series="Deleted"]')
    expect(deleted).to_have_attribute("data-last", "1")
    rates = charts.get_by_test_id("chart-rates")
    expect(rates.locator('path[data-series="created"]')).to_have_attribute("data-sum", "3")
    # (a minute's count is a flat segment: one minute of data is still a visible line)
    expect(rates.locator('path[data-series="created"]')).to_have_attribute("d", re.compile(r"^M[\d.]+,[\d.]+ L"))
    expect(rates.locator('path[data-series="stopped"]')).to_have_attribute("data-sum", "1")
    failovers = charts.locator('[data-testid="chart-failovers"] path[data-series="failovers"]')
    expect(failovers).to_have_attribute("data-sum", "0")
    # (the load is the service's heartbeat: 2 of its 4 workers busy)
    load = charts.locator('[data-testid="chart-load"] path[data-series="svc-a"]')
    expect(load).to_have_attribute("data-last", "50")
    expect(charts.locator("#legend-load")).to_contain_text("svc-a")
    screenshot(page, tmp_path, "dashboard-history.png")
    watched.assert_clean()


def test_a_draining_service_and_the_imbalance_are_shown(system: System, watched: Watched) -> None:
    system.start_manager()
    system.start_service("busy", workers=10)
    system.start_service("spare", workers=10)
    for i in range(4):
        system.create(unique(f"imb{i}"))
    spare = system.service_by_name("spare")
    assert spare is not None
    assert system.post(f"/api/services/{spare['id']}/drain", {}).status_code == 202

    page = watched.page
    page.goto(system.base_url + "/")
    row = page.locator('[data-testid="service-row"][data-name="spare"]')
    expect(row.get_by_test_id("service-status")).to_have_text(re.compile(r"^draining: "))
    expect(page.locator('[data-testid="service-row"][data-name="busy"]').get_by_test_id("service-status")).to_have_text(
        "alive"
    )
    expect(page.get_by_test_id("imbalance")).to_have_text(re.compile(r"^\d+ %$"))
    watched.assert_clean()


async def _mark_awaiting_broker(database_url: str, observer_id: str) -> None:
    """What the inventory rule writes when a node's death ended the session holding its start
    (``tests/system/test_session_ended.py`` reaches it on a real cluster)."""
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                text("UPDATE observers SET awaiting_broker_since = now() WHERE id = :id"), {"id": observer_id}
            )
    finally:
        await engine.dispose()


def test_observers_waiting_for_the_broker_are_counted_and_say_why(system: System, watched: Watched) -> None:
    system.start_manager()
    service = system.start_service("gone", workers=2)
    name = unique("held")
    oid = system.create(name)["id"]
    system.wait_status(oid, "Processing")
    service.signal(signal.SIGTERM)  # handed back: Created on no service, as after a node's death
    system.wait_status(oid, "Created")
    page = watched.page
    page.goto(system.base_url + "/")
    expect(observer_row(page, name)).to_be_visible()
    expect(page.get_by_test_id("awaiting-broker")).to_be_hidden()

    # In a thread of its own: Playwright's sync API runs an event loop in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _mark_awaiting_broker(system.database_url, oid)).result()
    expect(page.get_by_test_id("awaiting-broker")).to_have_text("1")
    expect(page.get_by_test_id("awaiting-broker")).to_be_visible()
    status = observer_row(page, name).get_by_test_id("observer-status")
    expect(status).to_have_text("Created · paused")
    expect(status).to_have_attribute("title", re.compile("waits for the broker to hand its start on"))
    watched.assert_clean()
