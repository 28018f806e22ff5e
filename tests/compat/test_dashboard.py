"""The dashboard in a real browser (issue 31 §1): headless Chromium, driven
by Selenium with Debian's chromedriver, opens every page against a broker
holding real data made by the official client, checks the numbers against
what was pushed, consumed and dead-lettered, performs a seek and a DLQ retry
through the page, and saves a screenshot of each page under target/."""

import base64
import hashlib
import hmac
import json
import os
import time

import httpx
import pytest

from conftest import run
from queen import Queen

SHOTS = os.path.join("target", "dashboard")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1400,1000"]:
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def wait_for(driver, check, what, seconds=15):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = check(driver)
            if last:
                return last
        except Exception as e:  # the page is still rendering
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r}); page: {driver.find_element('tag name', 'body').text[:2000]}")


def text_of(driver, css):
    return driver.find_element("css selector", css).text


def shot(driver, name):
    os.makedirs(SHOTS, exist_ok=True)
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def open_page(driver, url, page):
    """Opens `page` and waits until the dashboard has rendered it."""
    driver.get(url + "/#/" + page)
    driver.refresh()
    wait_for(driver, lambda d: d.find_element("id", "view").get_attribute("data-loaded"), f"page {page}")


def seed(url):
    """35 messages in two queues; billing consumed 10 of orders; two of
    orders dead-lettered for the group `risk`."""
    async def go():
        async with Queen(url) as q:
            for p in range(3):
                await q.queue("orders").partition(f"p{p}").push([{"data": {"order": p * 100 + i}} for i in range(10)])
            await q.queue("audit").partition("<b>bold</b>").push([{"data": {"n": i}} for i in range(5)])
        async with httpx.AsyncClient(base_url=url) as http:
            got = 0
            while got < 10:
                r = await http.get("/api/v1/pop/queue/orders", params={"consumerGroup": "billing", "batch": 10 - got})
                body = r.json()
                for m in body["messages"]:
                    a = await http.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                                            "leaseId": body.get("leaseId"), "status": "completed", "consumerGroup": "billing"})
                    assert a.status_code == 200
                got += len(body["messages"])
            for _ in range(2):
                r = await http.get("/api/v1/pop/queue/orders", params={"consumerGroup": "risk", "batch": 1})
                body = r.json()
                m = body["messages"][0]
                a = await http.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                                        "leaseId": body.get("leaseId"), "status": "dlq", "error": "card declined",
                                                        "consumerGroup": "risk"})
                assert a.json()[0]["dlq"] is True
            return m
    return run(go())


@pytest.mark.broker_env({"METRICS_FLUSH_MS": "500"})
def test_every_page_shows_the_brokers_numbers_and_acts_through_the_api(broker):
    last_dead = seed(broker.url)
    time.sleep(1.2)  # a traffic sample or two for the charts
    driver = browser()
    try:
        # Overview: the totals.
        open_page(driver, broker.url, "overview")
        wait_for(driver, lambda d: text_of(d, "#total-queues .v") == "2", "two queues")
        assert text_of(driver, "#total-messages .v") == "35"
        assert text_of(driver, "#total-dlq .v") == "2"
        assert len(driver.find_elements("css selector", ".chart canvas")) >= 2, "two charts drawn"
        live = wait_for(driver, lambda d: d.find_elements("css selector", "table.brokers tbody tr"), "the brokers list")
        assert len(live) == 1 and "(this one)" in live[0].text and "live" in live[0].text
        shot(driver, "overview")

        # Queues: both, then a search.
        open_page(driver, broker.url, "queues")
        rows = wait_for(driver, lambda d: d.find_elements("css selector", "table.queues tbody tr[data-key]"), "queue rows")
        assert sorted(r.get_attribute("data-key") for r in rows) == ["audit", "orders"]
        orders = [r for r in rows if r.get_attribute("data-key") == "orders"][0]
        assert orders.find_elements("tag name", "td")[2].text == "3", "three partitions"
        box = driver.find_element("id", "queue-filter")
        box.send_keys("aud")
        wait_for(driver, lambda d: [r.get_attribute("data-key") for r in d.find_elements("css selector", "table.queues tbody tr[data-key]")] == ["audit"], "the search")
        shot(driver, "queues")
        driver.execute_script("sessionStorage.removeItem('queen-filter')")

        # A queue page: its partitions, with a name that is text, not markup.
        open_page(driver, broker.url, "queue/audit")
        wait_for(driver, lambda d: text_of(d, "#queue-name") == "audit", "the audit page")
        cells = [td.text for td in driver.find_elements("css selector", "table.partitions tbody td")]
        assert "<b>bold</b>" in cells, cells
        assert not driver.find_elements("css selector", "table.partitions b"), "a partition name is never HTML"
        open_page(driver, broker.url, "queue/orders")
        wait_for(driver, lambda d: text_of(d, "#queue-name") == "orders", "the orders page")
        assert len(driver.find_elements("css selector", "table.partitions tbody tr")) == 3
        shot(driver, "queue")
        # Its configuration, edited through the page.
        lease = driver.find_element("css selector", "form.options input[name=leaseTime]")
        lease.clear()
        lease.send_keys("77")
        driver.find_element("css selector", "form.options button").click()
        wait_for(driver, lambda d: httpx.get(f"{broker.url}/api/v1/resources/queues/orders").json()["options"]["leaseTime"] == 77, "the configure")

        # Consumer groups, and a seek through the page.
        open_page(driver, broker.url, "groups")
        names = wait_for(driver, lambda d: [a.text for a in d.find_elements("css selector", "table.groups tbody td a")], "group rows")
        assert "billing" in names and "risk" in names
        shot(driver, "groups")
        open_page(driver, broker.url, "group/billing")
        lags = [int(r.find_elements("tag name", "td")[2].text) for r in driver.find_elements("css selector", "table.cursors tbody tr")]
        assert sum(lags) == 20, lags
        driver.find_element("css selector", "button.seek-end").click()
        driver.switch_to.alert.accept()
        wait_for(driver, lambda d: sum(int(r.find_elements("tag name", "td")[2].text) for r in d.find_elements("css selector", "table.cursors tbody tr")) == 0, "the seek")
        cursors = httpx.get(f"{broker.url}/api/v1/consumer-groups/billing").json()
        assert sum(p["offsetLag"] for p in cursors["orders"]["partitions"]) == 0
        shot(driver, "group")

        # Dead letters: the two, then a retry through the page.
        driver.execute_script("sessionStorage.setItem('queen-dlq-queue', 'orders')")
        open_page(driver, broker.url, "dlq")
        wait_for(driver, lambda d: text_of(d, "#dlq-total") == "2 dead letters", "two dead letters")
        assert "card declined" in text_of(driver, "table.dlq")
        shot(driver, "dlq")
        driver.find_element("css selector", "table.dlq button.retry").click()
        driver.switch_to.alert.accept()
        wait_for(driver, lambda d: text_of(d, "#dlq-total") == "1 dead letters", "the retry")
        assert httpx.get(f"{broker.url}/api/v1/dlq", params={"queue": "orders"}).json()["total"] == 1

        # A message and its payload.
        open_page(driver, broker.url, f"message/{last_dead['partitionId']}/{last_dead['transactionId']}")
        payload = wait_for(driver, lambda d: text_of(d, "#msg-payload"), "the payload")
        assert json.loads(payload) == last_dead["data"]
        shot(driver, "message")

        # System: the switches and this broker.
        open_page(driver, broker.url, "system")
        assert "push maintenance" in text_of(driver, "#view")
        assert "ephemeral queues" in text_of(driver, "#view")
        shot(driver, "system")
    finally:
        driver.quit()


SECRET = "dashboard-test-secret"


def jwt(role):
    def b64(raw):
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "viewer", "role": role, "exp": int(time.time()) + 600}).encode())
    sig = b64(hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


@pytest.mark.broker_env({"JWT_ENABLED": "true", "JWT_SECRET": SECRET})
def test_with_jwt_the_page_asks_for_a_token_and_a_read_only_role_sees_no_buttons(broker):
    token = jwt("read-only")
    r = httpx.post(f"{broker.url}/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]}, headers={"authorization": f"Bearer {jwt('admin')}"})
    assert r.status_code == 201
    driver = browser()
    try:
        driver.get(broker.url + "/#/overview")
        wait_for(driver, lambda d: d.find_element("id", "signin").is_displayed(), "the sign-in button")
        assert "401" in text_of(driver, "#error") or "token" in text_of(driver, "#error")
        driver.execute_script("sessionStorage.setItem('queen-token', arguments[0])", token)
        open_page(driver, broker.url, "queue/q")
        wait_for(driver, lambda d: text_of(d, "#queue-name") == "q", "the queue page")
        saves = driver.find_elements("css selector", "form.options button")
        assert saves and not any(b.is_displayed() for b in saves), "no Save for a read-only role"
        assert text_of(driver, "#whoami") == "viewer · read-only", "who is signed in, as /auth/me names them"
        shot(driver, "read-only")
    finally:
        driver.quit()


def test_when_the_broker_stops_answering_the_page_keeps_its_numbers_and_says_they_are_stale(broker):
    """What an operator sees while PostgreSQL fails over or the broker
    restarts (issue 50): the last numbers stay, and the header says since
    when they are stale and why, instead of a page that looks live."""
    httpx.post(f"{broker.url}/api/v1/push", json={"items": [{"queue": "q", "payload": i} for i in range(3)]}).raise_for_status()
    driver = browser()
    try:
        open_page(driver, broker.url, "overview")
        wait_for(driver, lambda d: text_of(d, "#total-queues .v") == "1", "the overview's numbers")
        assert text_of(driver, "#live") == "live"
        broker.stop()
        # The next refresh (every 5 s) fails.
        live = wait_for(driver, lambda d: (t := text_of(d, "#live")).startswith("stale since") and t, "the stale mark", seconds=20)
        assert "fetch" in live.lower(), live
        assert "stale" in driver.find_element("id", "live").get_attribute("class")
        assert text_of(driver, "#total-queues .v") == "1", "the last numbers stay on the page"
        shot(driver, "stale")
    finally:
        driver.quit()


OTHER_TENANT = "6f1c2a34-0000-4000-8000-00000000abcd"


@pytest.mark.broker_env({"QUEEN_TENANCY_HEADER": "true", "QUEEN_TRUSTED_PROXY": "true", "QUEEN_TENANCY_ADMIN_ALL": "true"})
def test_an_admin_across_tenants_picks_the_tenant_the_page_shows(broker):
    """Tenancy on (issue 49): the page shows one tenant's queues, says
    whose, and an admin across tenants switches tenant in the selector."""
    for tenant, queue in [(None, "ours-only"), (OTHER_TENANT, "theirs-only")]:
        headers = {"x-queen-tenant": tenant} if tenant else {}
        r = httpx.post(f"{broker.url}/api/v1/push", json={"items": [{"queue": queue, "payload": 1}]}, headers=headers)
        assert r.status_code == 201, r.text
    driver = browser()
    try:
        open_page(driver, broker.url, "queues")
        wait_for(driver, lambda d: "ours-only" in text_of(d, "#view"), "the default tenant's queue")
        assert "theirs-only" not in text_of(driver, "#view")
        assert "tenant 00000000-0000-0000-0000-000000000001" in text_of(driver, "#whoami")
        select = wait_for(driver, lambda d: d.find_element("id", "tenant") if d.find_element("id", "tenant").is_displayed() else None, "the tenant selector")
        options = [o.get_attribute("value") for o in select.find_elements("tag name", "option")]
        assert OTHER_TENANT in options, options
        from selenium.webdriver.support.ui import Select
        Select(select).select_by_value(OTHER_TENANT)
        wait_for(driver, lambda d: "theirs-only" in text_of(d, "#view") and "ours-only" not in text_of(d, "#view"), "the other tenant's queues")
        assert OTHER_TENANT in text_of(driver, "#whoami")
        shot(driver, "tenant-selector")
    finally:
        driver.quit()
