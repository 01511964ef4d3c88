"""The alert sensor against a real webhook server on 127.0.0.1 and a real Dagster instance: a failed run
(one small Spark run), a failed blocking check and a late date each send one alert, and repeated ticks
send none again; a webhook that fails is tried again on the next tick; without a URL, alerts go to the log."""

from __future__ import annotations

import json
import threading
from datetime import date, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from dagster import AssetCheckEvaluation, AssetCheckKey, AssetCheckSeverity, AssetMaterialization, DagsterInstance, build_sensor_context

from cdc_assets.alerts import ALERT_WEBHOOK_KEY, build_alert_sensor, watched_table
from cdc_assets.definitions import build_definitions
from cdc_assets.factory import build_table_definitions
from cdc_assets.freshness import FRESHNESS_CHECK, build_freshness_sensor
from cdc_assets.names import CURRENT, asset_key
from resources.alerts import UI_BASE_URL_ENV, WEBHOOK_URL_ENV
from tests.pipeline import write_table_config

HEADER = "id,name\n"


class Webhook:
    """An HTTP server on a free loopback port that keeps every POSTed JSON body with the status it answered."""

    def __init__(self):
        received, webhook = [], self
        self.received: list[tuple[int, dict]] = received
        self.status = 200

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.append((webhook.status, body))
                self.send_response(webhook.status)
                self.end_headers()

            def log_message(self, *args):  # the test's output is not the place
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/cdc"
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
    monkeypatch.setenv(WEBHOOK_URL_ENV, webhook.url)
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
    # The third date arrived; the first two did not (both are late).
    instance.report_runless_asset_event(AssetMaterialization(asset_key(config, CURRENT), partition=days[2]))

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
    undelivered = [line for line in capfd.readouterr().err.splitlines() if "Alert not delivered" in line]
    assert len(undelivered) == 2 and all(f"({host}: HTTP Error 500" in line and "/hooks/cdc" not in line for line in undelivered)
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
        f"current_table is not materialized for {days[0]}, {days[1]}: each was due by 00:00 (UTC) on the next day"
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
