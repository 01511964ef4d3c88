"""Where alerts go: a webhook that takes one JSON document per alert, and the UI its links point into."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

from dagster import ConfigurableResource
from pydantic import Field

from resources.fields import resolved_field

WEBHOOK_URL_ENV = "CDC_ALERT_WEBHOOK_URL"
UI_BASE_URL_ENV = "CDC_UI_BASE_URL"
DEFAULT_UI_BASE_URL = "http://127.0.0.1:3000"
# Long enough for a slow receiver, short enough that a dead one leaves the sensor's tick (60 s) time.
POST_TIMEOUT_SECONDS = 5.0


class AlertDeliveryError(RuntimeError):
    """The webhook did not take an alert (unreachable, timed out, or answered with an error status)."""


class AlertWebhook(ConfigurableResource):
    """Sends the alert sensor's alerts as JSON POSTs to ``webhook_url``; with none set, they go to the
    sensor's log only. Links in an alert point into the Dagster UI at ``ui_base_url``."""

    webhook_url: str = Field(
        default="", description=f"URL that receives each alert as a JSON POST ({WEBHOOK_URL_ENV}); empty: the log only."
    )
    ui_base_url: str = Field(
        default=DEFAULT_UI_BASE_URL, description=f"The Dagster UI's address, for links in alerts ({UI_BASE_URL_ENV})."
    )

    @property
    def target(self) -> str:
        """The webhook URL, empty when alerts go to the log only."""
        return resolved_field(self.webhook_url).strip()

    @property
    def shown(self) -> str:
        """The webhook's scheme and host, for logs: its path or user part may hold a secret token."""
        parts = urlsplit(self.target)
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}" if parts.hostname else "the webhook"

    def run_url(self, run_id: str) -> str:
        return f"{self._base()}/runs/{quote(run_id)}"

    def asset_url(self, path: list[str]) -> str:
        return f"{self._base()}/assets/{'/'.join(quote(part) for part in path)}"

    def send(self, payload: dict) -> None:
        """POST ``payload`` as JSON; raises :class:`AlertDeliveryError` unless the webhook answers 2xx."""
        request = urllib.request.Request(
            self.target,
            data=json.dumps(payload).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_SECONDS) as response:  # noqa: S310 - the configured URL
                status = response.status
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise AlertDeliveryError(f"{self.shown}: {error}") from None
        if not 200 <= status < 300:
            raise AlertDeliveryError(f"{self.shown}: HTTP {status}")

    def _base(self) -> str:
        return (resolved_field(self.ui_base_url).strip() or DEFAULT_UI_BASE_URL).rstrip("/")
