"""Where alerts go: a webhook that takes one JSON document per alert, and the UI its links point into.

A webhook URL often holds its secret in its path or query (or before the host), so nothing here
shows more of it than its scheme, host and port (:attr:`AlertWebhook.shown`): not an invalid URL's
error, not a failed delivery's. The URL is checked when the resource is built (the code location
loads) and again when a tick sets it up: ``http`` or ``https`` with a host, nothing else (a
``file://`` URL would read a local file). A POST is never redirected: urllib would follow a 301,
302 or 303 as a GET without the alert, to wherever the answer points, so any redirect, to the same
host or another, is a failed delivery. The whole POST (connecting, sending, reading the answer's
head) has one deadline, however slowly the receiver answers.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field

from cdc_assets.model import settings
from resources.fields import resolved_field

WEBHOOK_URL_ENV = settings.ALERT_WEBHOOK_URL.name
UI_BASE_URL_ENV = settings.UI_BASE_URL.name
DEFAULT_UI_BASE_URL = settings.UI_BASE_URL.default
# Long enough for a slow receiver, short enough that a dead one leaves the sensor's tick (60 s) time.
POST_TIMEOUT_SECONDS = 5.0
WEBHOOK_SCHEMES = ("http", "https")
# Schemes an invalid URL's error may name: any other text before a colon may be a user name or a token.
_NAMED_SCHEMES = frozenset({"file", "ftp", "ftps", "sftp", "ws", "wss", "data", "mailto", "smtp"})
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
_REDIRECTS = (301, 302, 303, 307, 308)


class AlertDeliveryError(RuntimeError):
    """The webhook did not take an alert (unreachable, timed out, redirected, or answered with an error status)."""


class AlertWebhookURLError(ValueError):
    """``CDC_ALERT_WEBHOOK_URL`` is not a URL an alert can be POSTed to; the error shows at most its scheme and host."""


def shown_url(url: str) -> str:
    """A URL as logs and errors may show it: its scheme, host and port only (its user part, path and
    query may hold a secret token); of a URL that is not http(s), only a scheme from a short list."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return "a URL that cannot be parsed"
    scheme = parts.scheme.lower()
    if scheme in WEBHOOK_SCHEMES and parts.hostname:
        return f"{scheme}://{parts.hostname}{f':{port}' if port else ''}"
    if scheme in WEBHOOK_SCHEMES or scheme in _NAMED_SCHEMES:
        return f"{scheme}://… without a host" if not parts.hostname else f"{scheme}://…"
    return "a URL without an http:// or https:// scheme"


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot take alerts (naming :data:`WEBHOOK_URL_ENV`, showing at most its scheme and
    host), or None when it can: http or https, a host, a valid port, no user part, no spaces."""
    text = url.strip()
    if not text:
        return None  # no webhook: alerts go to the sensor's log
    expected = f"an {' or '.join(f'{scheme}://' for scheme in WEBHOOK_SCHEMES)} URL with a host, e.g. https://hooks.example.com/..."
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return f"{WEBHOOK_URL_ENV} must be {expected}; it cannot be parsed (its port?). Its path and query are not shown."
    if parts.scheme.lower() not in WEBHOOK_SCHEMES or not parts.hostname:
        return f"{WEBHOOK_URL_ENV} must be {expected}; it is {shown_url(text)}. Its path and query are not shown."
    if "@" in parts.netloc:
        return (
            f"{WEBHOOK_URL_ENV} ({shown_url(text)}) has a user part before the host (user:password@), which is not sent "
            "as credentials; put the token where the webhook expects it (its path or query)."
        )
    if _SPACE_OR_CONTROL.search(text):
        return f"{WEBHOOK_URL_ENV} ({shown_url(text)}) holds a space or a control character; quote it (%20)."
    return None


class AlertWebhook(ConfigurableResource):
    """Sends the alert sensor's alerts as JSON POSTs to ``webhook_url``; with none set, they go to the
    sensor's log only. Links in an alert point into the Dagster UI at ``ui_base_url``."""

    webhook_url: str = Field(
        default="",
        description=(
            f"http(s) URL that receives each alert as a JSON POST ({WEBHOOK_URL_ENV}); redirects are not followed; "
            "empty: the log only."
        ),
    )
    ui_base_url: str = Field(
        default=DEFAULT_UI_BASE_URL, description=f"The Dagster UI's address, for links in alerts ({UI_BASE_URL_ENV})."
    )

    def __init__(self, **fields):
        super().__init__(**fields)
        self._check_url()  # when the code location loads: an EnvVar field is read from the environment here

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._check_url()  # the value the tick resolved, which may not be the one the code location loaded with

    def _check_url(self) -> None:
        problem = webhook_url_problem(self.target)
        if problem is not None:
            raise AlertWebhookURLError(problem)

    @property
    def target(self) -> str:
        """The webhook URL, empty when alerts go to the log only."""
        return resolved_field(self.webhook_url).strip()

    @property
    def shown(self) -> str:
        """The webhook's scheme and host, for logs: its path, query or user part may hold a secret token."""
        return shown_url(self.target)

    def run_url(self, run_id: str) -> str:
        return f"{self._base()}/runs/{quote(run_id)}"

    def asset_url(self, path: list[str]) -> str:
        return f"{self._base()}/assets/{'/'.join(quote(part) for part in path)}"

    def send(self, payload: dict) -> None:
        """POST ``payload`` as JSON, all of it within ``POST_TIMEOUT_SECONDS``; raises :class:`AlertDeliveryError`
        unless the webhook answers 2xx. The error shows the webhook as :attr:`shown`, never the URL."""
        timeout = POST_TIMEOUT_SECONDS
        attempt = _Attempt(timeout)
        worker = threading.Thread(target=attempt.run, args=(self.target, payload), name="cdc-alert-post", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            attempt.abandon()  # the worker ends as soon as its socket is shut; its answer no longer counts
            raise AlertDeliveryError(f"{self.shown}: no answer within {timeout:g} s")
        if attempt.failure is not None:
            raise AlertDeliveryError(f"{self.shown}: {attempt.failure}")

    def _base(self) -> str:
        return (resolved_field(self.ui_base_url).strip() or DEFAULT_UI_BASE_URL).rstrip("/")


class _Redirected(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Any redirect is a failure: not followed, and its Location (which may hold a token) never read."""

    def http_error_302(self, req, fp, code, msg, headers):
        fp.close()
        raise _Redirected(code)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Attempt:
    """One POST, run on a worker thread so that the caller's wait bounds all of it; ``abandon`` shuts
    the connection's socket, so the worker does not linger on a receiver that trickles its answer."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._abandoned = False
        self._sockets: list[socket.socket] = []

    def run(self, url: str, payload: dict) -> None:
        try:
            request = urllib.request.Request(
                url, data=json.dumps(payload).encode("utf-8"), headers={"Content-Type": "application/json"}, method="POST"
            )
            with self._opener().open(request, timeout=self.timeout) as response:
                status = response.status
            if not 200 <= status < 300:
                self.failure = f"HTTP {status}"
        except _Redirected as redirect:
            self.failure = (
                f"answered HTTP {redirect.code}, a redirect, which is not followed: set {WEBHOOK_URL_ENV} to the "
                "address that takes the alert"
            )
        except urllib.error.HTTPError as error:
            self.failure = f"HTTP Error {error.code}"  # its reason only: the error's text would name the URL
        except urllib.error.URLError as error:
            reason = error.reason
            self.failure = f"{type(reason).__name__}: {reason}" if isinstance(reason, OSError) else "unreachable"
        except (TimeoutError, socket.timeout):
            self.failure = f"no answer within {self.timeout:g} s"
        except (OSError, http.client.HTTPException, ValueError) as error:
            self.failure = type(error).__name__  # its text may quote the URL or what the receiver sent
        finally:
            self._close()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
        self._close()

    def _close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _opener(self) -> urllib.request.OpenerDirector:
        # Built by hand, not by build_opener: only http and https, never file:// or ftp://, and no redirects.
        opener = urllib.request.OpenerDirector()
        for handler in (
            urllib.request.ProxyHandler(),
            _HTTPHandler(self),
            _HTTPSHandler(self),
            urllib.request.HTTPDefaultErrorHandler(),
            _RefuseRedirects(),
            urllib.request.HTTPErrorProcessor(),
        ):
            opener.add_handler(handler)
        return opener

    def connection_class(self, base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
        attempt = self

        class Connection(base):  # type: ignore[valid-type, misc]  # over the connection class given: HTTP or HTTPS
            def connect(self):
                super().connect()
                with attempt._lock:
                    if not attempt._abandoned:
                        attempt._sockets.append(self.sock)
                        return
                self.sock.close()
                raise TimeoutError("abandoned")

        return Connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, attempt: _Attempt):
        super().__init__()
        self._attempt = attempt

    def http_open(self, req):
        return self.do_open(self._attempt.connection_class(http.client.HTTPConnection), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, attempt: _Attempt):
        super().__init__()
        self._attempt = attempt

    def https_open(self, req):
        return self.do_open(self._attempt.connection_class(http.client.HTTPSConnection), req, context=self._context)
