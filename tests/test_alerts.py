"""The alert sensor against a real webhook server on 127.0.0.1 and a real Dagster instance: a failed run
(one small Spark run), a failed blocking check and a late date each send one alert, and repeated ticks
send none again; a webhook that fails is tried again on the next tick; without a URL, alerts go to the log.
A run failed by a duplicate key leaves no key value in the runs log nor in the alert. The webhook's URL
is checked when the code location loads and when a tick sets it up, a redirect is never followed, one
timeout bounds a whole POST, and no message or log shows the URL's path or query."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import traceback
from datetime import date, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetCheckEvaluation, AssetCheckKey, AssetCheckSeverity, AssetMaterialization, DagsterInstance, build_sensor_context, job, op
)

from cdc_assets.defs.alerts import ALERT_WEBHOOK_KEY, build_alert_sensor, watched_table
from cdc_assets.core.capture.erasure import erased_key_hashes
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from cdc_assets.defs.freshness import FRESHNESS_CHECK, build_freshness_sensor
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, PUBLISHED
import resources.alerts
from resources.alerts import UI_BASE_URL_ENV, WEBHOOK_URL_ENV, AlertDeliveryError, AlertWebhook
from tests.pipeline import write_table_config

HEADER = "id,name\n"
TOKEN = "s3cr3t-t0ken"  # in a webhook URL's query: no message or log may show it


class Webhook:
    """An HTTP server on a free loopback port that keeps every POSTed JSON body with the status it answered,
    and every request's method and path (``requests``); with ``location`` set, it answers with that
    Location header."""

    def __init__(self):
        received, webhook = [], self
        self.received: list[tuple[int, dict]] = received
        self.requests: list[str] = []
        self.status = 200
        self.location: str | None = None

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                webhook.requests.append(f"POST {self.path}")
                received.append((webhook.status, body))
                self.send_response(webhook.status)
                if webhook.location:
                    self.send_header("Location", webhook.location)
                self.end_headers()

            def do_GET(self):  # where a followed redirect would land
                webhook.requests.append(f"GET {self.path}")
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # the test's output is not the place
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hooks/cdc"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self) -> list[dict]:
        return [body for status, body in self.received if status == 200]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def webhook():
    server = Webhook()
    yield server
    server.close()


def _table(tmp_path, today: date, **fields):
    """``shop`` (id key, name) reading landing/<date>.csv from three days before ``today``, each date due
    at midnight UTC when it ends: three dates due, whatever the time of day."""
    source = f"{tmp_path / 'landing'}/{{date}}.csv"
    start = (today - timedelta(days=3)).isoformat()
    return write_table_config(
        tmp_path / "configs", "shop", source, start_date=start, keys=[{"name": "id", "type": "int"}],
        non_keys=[{"name": "name", "type": "string"}], freshness={"expected_by": "00:00", "timezone": "UTC"}, **fields
    )


def _failed_check(instance: DagsterInstance, config, day: str, name: str, severity=AssetCheckSeverity.ERROR) -> None:
    instance.report_runless_asset_event(
        AssetCheckEvaluation(
            asset_key=asset_key(config, CURRENT), check_name=name, passed=False, partition=day, severity=severity,
            blocking=True, description="current_table rows = I + U + N + X: 4 != 5",
        )
    )


def test_each_cause_sends_one_alert_and_ticks_repeat_none(spark, warehouse, tmp_path, webhook, monkeypatch, capfd):
    now = datetime.now(timezone.utc)
    today = now.date()
    days = [(today - timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    config = _table(tmp_path, today, bad_records="fail")
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / f"{days[0]}.csv").write_text(HEADER + "1,a\nnot a number,b\n")
    monkeypatch.setenv(WEBHOOK_URL_ENV, f"{webhook.url}?token={TOKEN}")
    monkeypatch.setenv(UI_BASE_URL_ENV, "http://dagster.example:3000/")
    table = build_table_definitions(config)
    defs = build_definitions([table])
    instance = DagsterInstance.ephemeral()

    # A failed run: the first date's extract has a bad record, and the table fails on those.
    failed = defs.resolve_job_def("shop_job").execute_in_process(partition_key=days[0], instance=instance, raise_on_error=False)
    assert not failed.success
    # The run planned the freshness check and ended before it: the freshness sensor does not wait for it.
    freshness_key = AssetCheckKey(asset_key(config, CURRENT), FRESHNESS_CHECK)
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([freshness_key])[freshness_key].status.value == "PLANNED"
    freshness_tick = build_freshness_sensor(config, clock=lambda: now).evaluate_tick(build_sensor_context(instance=instance))
    assert freshness_tick.skip_message.startswith(f"shop: reported {days[2]} is late")
    # A failed blocking check on the second date (and one of severity WARN, which is no alert).
    _failed_check(instance, config, days[1], "row_count_reconciles")
    _failed_check(instance, config, days[1], "keys_not_null", severity=AssetCheckSeverity.WARN)
    # The third date arrived (published); the first two did not (both are late).
    instance.report_runless_asset_event(AssetMaterialization(asset_key(config, PUBLISHED), partition=days[2]))

    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: now)
    cursor = None

    def tick() -> str:
        nonlocal cursor
        context = build_sensor_context(instance=instance, cursor=cursor, resources={ALERT_WEBHOOK_KEY: defs.resources[ALERT_WEBHOOK_KEY]})
        result = sensor.evaluate_tick(context)
        cursor = result.cursor
        return result.skip_message

    webhook.status = 500  # the webhook is down: nothing counts as sent
    capfd.readouterr()
    assert "0 alert(s) sent" in tick() and "3 left for the next tick" in tick()
    assert len(webhook.received) == 2 and webhook.accepted() == []
    host = webhook.url.removesuffix("/hooks/cdc")  # a webhook's path may hold its secret: logs show the host only
    logged = capfd.readouterr().err
    undelivered = [line for line in logged.splitlines() if "Alert not delivered" in line]
    assert len(undelivered) == 2 and all(f"({host}: HTTP Error 500" in line and "/hooks/cdc" not in line for line in undelivered)
    # The log names the alert it keeps for later, not its content; nor the URL's query.
    assert all(re.search(r"; it \(shop, (late|run_failed|check_failed), \d{4}-", line) for line in undelivered), undelivered
    assert not [line for line in undelivered if "business_dates" in line or "run_url" in line] and TOKEN not in logged
    webhook.status = 200
    assert tick().startswith(f"3 alert(s) sent to {host},")
    for _ in range(3):
        assert tick().startswith("0 alert(s) sent")
    alerts = {alert["cause"]: alert for alert in webhook.accepted()}
    assert len(webhook.accepted()) == len(alerts) == 3

    run_failed = alerts["run_failed"]
    assert run_failed["table"] == "shop" and run_failed["business_date"] == days[0] and run_failed["business_dates"] == [days[0]]
    assert run_failed["run_id"] == failed.run_id
    assert run_failed["run_url"] == f"http://dagster.example:3000/runs/{failed.run_id}"
    assert run_failed["what"].startswith("step shop__hashed_incoming failed:") and "bad record" in run_failed["what"]
    assert "not a number" not in run_failed["what"]  # the bad record is in the run's own log only
    assert alerts["check_failed"] == {
        "table": "shop",
        "business_date": days[1],
        "business_dates": [days[1]],
        "cause": "check_failed",
        "what": f"current_table:row_count_reconciles failed on {days[1]}: current_table rows = I + U + N + X: 4 != 5",
        "run_id": None,
        "run_url": "http://dagster.example:3000/assets/shop/current_table",
    }
    late = alerts["late"]
    assert late["business_date"] == days[0] and late["business_dates"] == days[:2] and late["run_id"] is None
    assert late["what"] == (
        f"not published for {days[0]}, {days[1]}: each was due by 00:00 (UTC) on the next day"
    )

    # A new failure of a date already alerted for the same cause is no new alert; another date's is.
    again = defs.resolve_job_def("shop_job").execute_in_process(partition_key=days[0], instance=instance, raise_on_error=False)
    assert not again.success
    _failed_check(instance, config, days[2], "key_hash_unique")
    assert tick().startswith("1 alert(s) sent")
    assert [(a["cause"], a["business_date"]) for a in webhook.accepted()[3:]] == [("check_failed", days[2])]
    assert tick().startswith("0 alert(s) sent")
    # Entries older than the look-back are forgotten, and so are their events: nothing is sent again.
    later = now + timedelta(days=8)
    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: later)
    assert tick().startswith("1 alert(s) sent")  # only the dates that became late since
    assert [a["cause"] for a in webhook.accepted()[4:]] == ["late"]
    assert days[0] not in webhook.accepted()[4]["business_dates"]
    assert json.loads(cursor) and all(key.split("|")[1] > days[2] for key in json.loads(cursor))


def test_without_a_webhook_url_each_alert_is_logged_once(tmp_path, monkeypatch, capfd):
    now = datetime.now(timezone.utc)
    today = now.date()
    config = _table(tmp_path, today)
    monkeypatch.delenv(WEBHOOK_URL_ENV, raising=False)
    table = build_table_definitions(config)
    defs = build_definitions([table])
    instance = DagsterInstance.ephemeral()
    _failed_check(instance, config, (today - timedelta(days=2)).isoformat(), "key_hash_unique")
    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: now)
    cursor = None
    messages = []
    for _ in range(3):
        context = build_sensor_context(instance=instance, cursor=cursor, resources={ALERT_WEBHOOK_KEY: defs.resources[ALERT_WEBHOOK_KEY]})
        result = sensor.evaluate_tick(context)
        cursor = result.cursor
        messages.append(result.skip_message)
    assert messages == [
        "2 alert(s) sent to the log (no webhook URL set), 0 left for the next tick",
        "0 alert(s) sent to the log (no webhook URL set), 0 left for the next tick",
        "0 alert(s) sent to the log (no webhook URL set), 0 left for the next tick",
    ]
    logged = [line for line in capfd.readouterr().err.splitlines() if "ALERT {" in line]
    assert len(logged) == 2 and all(" - WARNING - " in line for line in logged), logged
    payloads = [json.loads(line[line.index("ALERT {") + len("ALERT "):]) for line in logged]
    assert sorted(p["cause"] for p in payloads) == ["check_failed", "late"]
    assert all(p["run_url"] == "http://127.0.0.1:3000/assets/shop/current_table" for p in payloads)


# --- no key value leaves the run (issue 33, point 2) ---------------------------------------------------

SECRET_KEY = 4242424  # a key value no summary, date, count or id could contain by chance


def test_a_duplicate_key_failure_leaves_no_key_value_in_the_runs_log_nor_the_alert(spark, warehouse, tmp_path, webhook, monkeypatch):
    now = datetime.now(timezone.utc)
    day = (now.date() - timedelta(days=3)).isoformat()
    config = _table(tmp_path, now.date(), duplicate_keys="fail")
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / f"{day}.csv").write_text(HEADER + f"1,a\n{SECRET_KEY},b\n{SECRET_KEY},c\n")
    monkeypatch.setenv(WEBHOOK_URL_ENV, webhook.url)
    table = build_table_definitions(config)
    defs = build_definitions([table])
    instance = DagsterInstance.ephemeral()
    failed = defs.resolve_job_def("shop_job").execute_in_process(partition_key=day, instance=instance, raise_on_error=False)
    assert not failed.success
    (key_hash,) = [row["key_hash"] for row in erased_key_hashes(
        spark.createDataFrame([(str(SECRET_KEY),)], ["id"]), [("id", "int")], "shop", "the test's key").collect()]
    summary = (
        f"table shop, {day}: 1 key(s) occur more than once in the input (identical rows count too), e.g. key_hash "
        f"{key_hash} x2. Nothing was written for this date"
    )
    # The run's own log (Dagster keeps it beyond an erase) shows the key masked (issue 46, point 5).
    (failure,) = [event for event in failed.all_events if event.is_step_failure]
    assert "{id=(masked)} x2" in failure.step_failure_data.error.to_string()
    assert str(SECRET_KEY) not in failure.step_failure_data.error.to_string()

    # The runs log (the catalog's runs_log reads the same files) has the summary, not the key.
    (row,) = pq.read_table(warehouse / "_runs").to_pylist()
    assert (row["status"], row["step"], row["run_id"]) == ("failed", "intake", failed.run_id)
    assert row["error"].startswith(f"DuplicateKeysError: {summary}") and str(SECRET_KEY) not in row["error"]

    # So has the alert: one POST to a webhook on 127.0.0.1, as the real sensor sends it.
    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: now)
    context = build_sensor_context(instance=instance, resources={ALERT_WEBHOOK_KEY: defs.resources[ALERT_WEBHOOK_KEY]})
    assert sensor.evaluate_tick(context).skip_message.startswith("2 alert(s) sent")  # the failed run, the late dates
    (alert,) = [alert for alert in webhook.accepted() if alert["cause"] == "run_failed"]
    assert alert["what"].startswith("step shop__hashed_incoming failed: ") and summary in alert["what"]
    assert not [body for body in webhook.accepted() if str(SECRET_KEY) in json.dumps(body)]


# --- the webhook (issue 33, point 4) -----------------------------------------------------------------------

PAYLOAD = {"table": "shop", "cause": "late", "business_dates": ["2024-01-01"]}


@pytest.mark.parametrize(
    "url",
    [
        f"hooks.example.com/hooks/cdc?token={TOKEN}",  # no scheme: urllib would fail on it in the sensor's tick
        f"file:///etc/hostname?token={TOKEN}",  # urllib would read a local file
        f"ftp://hooks.example.com/hooks/cdc?token={TOKEN}",
        f"https://{TOKEN}@hooks.example.com/hooks/cdc",  # a token before the host is no credential urllib sends
    ],
)
def test_a_webhook_url_that_cannot_take_alerts_fails_the_load_naming_the_variable_not_the_url(url, tmp_path, monkeypatch):
    monkeypatch.setenv(WEBHOOK_URL_ENV, url)
    table = build_table_definitions(_table(tmp_path, date.today()))
    with pytest.raises(ValueError) as raised:
        build_definitions([table])
    message = str(raised.value)
    assert message.startswith(WEBHOOK_URL_ENV) and TOKEN not in message and "/hooks/cdc" not in message, message
    assert "https://" in message  # what it should be


def test_a_webhook_url_set_after_the_load_is_checked_when_the_tick_sets_it_up(tmp_path, monkeypatch):
    now = datetime.now(timezone.utc)
    config = _table(tmp_path, now.date())
    monkeypatch.setenv(WEBHOOK_URL_ENV, "https://hooks.example.com/hooks/cdc")
    table = build_table_definitions(config)
    defs = build_definitions([table])
    instance = DagsterInstance.ephemeral()
    _failed_check(instance, config, (now.date() - timedelta(days=2)).isoformat(), "key_hash_unique")  # alerts to send
    monkeypatch.setenv(WEBHOOK_URL_ENV, f"hooks.example.com/hooks/cdc?token={TOKEN}")
    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: now)
    context = build_sensor_context(instance=instance, resources={ALERT_WEBHOOK_KEY: defs.resources[ALERT_WEBHOOK_KEY]})
    with pytest.raises(Exception) as raised:
        sensor.evaluate_tick(context)
    text = "".join(traceback.format_exception(raised.value))  # the tick's error, causes included
    assert f"{WEBHOOK_URL_ENV} must be" in text and TOKEN not in text and "/hooks/cdc" not in text


@pytest.mark.parametrize("code, other_host", [(302, True), (307, False)])
def test_a_redirect_is_not_followed(code, other_host, webhook):
    """A 302 would be followed as a GET without the alert, a 307 not at all: both are a failed delivery.
    Every redirect is refused, to another host name (localhost) or to the same host and port."""
    target = Webhook()
    try:
        elsewhere = f"http://localhost:{target.port}" if other_host else f"http://127.0.0.1:{webhook.port}"
        webhook.status, webhook.location = code, f"{elsewhere}/elsewhere?token={TOKEN}"
        with pytest.raises(AlertDeliveryError) as raised:
            AlertWebhook(webhook_url=f"{webhook.url}?token={TOKEN}").send(PAYLOAD)
        assert str(raised.value) == (
            f"http://127.0.0.1:{webhook.port}: answered HTTP {code}, a redirect, which is not followed: set "
            f"{WEBHOOK_URL_ENV} to the address that takes the alert"
        )
        assert webhook.requests == [f"POST /hooks/cdc?token={TOKEN}"] and target.requests == []
    finally:
        target.close()


class TricklingServer:
    """A server on a free loopback port that answers 200, a byte every ``pause`` seconds: slow enough that
    the whole answer takes longer than the webhook's timeout, fast enough that no single read times out."""

    def __init__(self, pause: float = 0.1):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.pause = pause
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                try:
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Padding: " + b"." * 20 + b"\r\n\r\n":
                        connection.sendall(bytes([byte]))
                        time.sleep(self.pause)
                except OSError:
                    pass  # the client gave up

    def close(self):
        self.socket.close()


def test_one_timeout_bounds_the_whole_post_however_slowly_the_answer_comes(monkeypatch):
    server = TricklingServer()  # about 6 s for the whole answer, 0.1 s a byte
    monkeypatch.setattr(resources.alerts, "POST_TIMEOUT_SECONDS", 1.0)
    try:
        started = time.monotonic()
        with pytest.raises(AlertDeliveryError) as raised:
            AlertWebhook(webhook_url=f"http://127.0.0.1:{server.port}/hooks/cdc?token={TOKEN}").send(PAYLOAD)
        assert time.monotonic() - started < 2.0
        assert str(raised.value) == f"http://127.0.0.1:{server.port}: no answer within 1 s"
    finally:
        server.close()


def test_a_webhook_that_is_down_or_fails_is_named_by_its_host_only(webhook):
    with socket.create_server(("127.0.0.1", 0)) as unused:
        closed = unused.getsockname()[1]
    webhook.status = 503
    for port, ending in ((closed, "ConnectionRefusedError: [Errno 111] Connection refused"), (webhook.port, "HTTP Error 503")):
        with pytest.raises(AlertDeliveryError) as raised:
            AlertWebhook(webhook_url=f"http://127.0.0.1:{port}/hooks/cdc?token={TOKEN}").send(PAYLOAD)
        assert str(raised.value) == f"http://127.0.0.1:{port}: {ending}"


def test_an_alert_of_a_run_that_failed_on_any_other_error_names_its_type_not_its_message(tmp_path, monkeypatch, capfd):
    """An error that is not a SummarizedError may carry anything in its message: the alert gives its type."""
    now = datetime.now(timezone.utc)
    day = (now.date() - timedelta(days=1)).isoformat()
    config = _table(tmp_path, now.date())
    monkeypatch.delenv(WEBHOOK_URL_ENV, raising=False)
    table = build_table_definitions(config)
    defs = build_definitions([table])
    instance = DagsterInstance.ephemeral()

    @op
    def read_extract():
        raise ValueError(f"cannot cast {SECRET_KEY} to a date")

    @job(name="shop_job")
    def shop_job():
        read_extract()

    assert not shop_job.execute_in_process(instance=instance, raise_on_error=False, tags={"dagster/partition": day}).success
    sensor = build_alert_sensor([watched_table(config, table.asset_checks)], clock=lambda: now)
    capfd.readouterr()
    sensor.evaluate_tick(build_sensor_context(instance=instance, resources={ALERT_WEBHOOK_KEY: defs.resources[ALERT_WEBHOOK_KEY]}))
    logged = [line[line.index("ALERT {") + len("ALERT "):] for line in capfd.readouterr().err.splitlines() if "ALERT {" in line]
    (alert,) = [json.loads(line) for line in logged if '"run_failed"' in line]
    assert alert["what"] == "step read_extract failed: ValueError (its message, which may hold row values, is in the run's own log only)"
