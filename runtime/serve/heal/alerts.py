"""Alert sinks (a registry, :data:`SINKS`): where the policy engine says what it did.

An alert is a JSON object: ``{"ts", "severity", "trigger", "action", "value", "diagnosis", "result",
"duration_s", "event_id", "server"}``.

- ``log``: one WARNING line on the ``vnpu.serve.alerts`` logger;
- ``file {path}``: one JSON line appended (the file is created mode 0600);
- ``webhook {url}``: an HTTP POST of the JSON (``Content-Type: application/json``), ``timeout_s`` at most;
  a non-2xx answer or a connection error is a failed delivery (reported, never raised into the policy);
- ``slack {url, channel}``: a Slack incoming webhook: an HTTP POST of ``{"text": "<one line>"}`` (and
  ``"channel"`` when given -- ``vnpu serve --alert-channel slack:#runtime-guard``), the line
  ``[severity] trigger: diagnosis -> action (result)``; delivered as a webhook is.

Blocking: ``send`` blocks for the write or the POST (up to its timeout).
"""
from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from .spec import AlertSpec

log = logging.getLogger("vnpu.serve.alerts")


class Sink:
    kind = ""

    def __init__(self, spec: AlertSpec):
        self.spec = spec

    def send(self, alert: dict) -> None:
        """Deliver ``alert`` (raises on a failed delivery)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.kind


class LogSink(Sink):
    kind = "log"

    def send(self, alert: dict) -> None:
        log.warning("vnpu alert [%s] %s: %s -> %s (%s)", alert.get("severity"), alert.get("trigger") or "-",
                    alert.get("diagnosis"), alert.get("action") or "-", alert.get("result") or "pending")


class FileSink(Sink):
    kind = "file"

    def send(self, alert: dict) -> None:
        p = Path(self.spec.path or "alerts.jsonl")
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(alert, default=str) + "\n")

    def __str__(self) -> str:
        return f"file {self.spec.path}"


class WebhookSink(Sink):
    kind = "webhook"

    def body(self, alert: dict) -> dict:
        return alert

    def send(self, alert: dict) -> None:
        req = urllib.request.Request(str(self.spec.url), data=json.dumps(self.body(alert), default=str).encode(),
                                     method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "vnpu-alerts"})
        try:
            with urllib.request.urlopen(req, timeout=self.spec.timeout_s) as r:
                if not 200 <= r.status < 300:
                    raise OSError(f"webhook {self.spec.url} answered {r.status}")
        except urllib.error.HTTPError as e:
            raise OSError(f"webhook {self.spec.url} answered {e.code}") from None

    def __str__(self) -> str:
        return f"webhook {self.spec.url}"


def slack_text(alert: dict) -> str:
    """The one line a Slack message says of ``alert``."""
    value = alert.get("value")
    at = f" (value {value:.4g})" if isinstance(value, (int, float)) else ""
    server = f" on {alert['server']}" if alert.get("server") else ""
    return (f"[{alert.get('severity')}] vnpu{server}: {alert.get('trigger') or '-'}{at}: {alert.get('diagnosis')} "
            f"-> {alert.get('action') or '-'} ({alert.get('result') or 'pending'})")


class SlackSink(WebhookSink):
    kind = "slack"

    def body(self, alert: dict) -> dict:
        out = {"text": slack_text(alert)}
        if self.spec.channel:
            out["channel"] = self.spec.channel
        return out

    def __str__(self) -> str:
        return f"slack {self.spec.channel or self.spec.url}"


#: alert kind -> sink class (a registry)
SINKS: dict[str, type[Sink]] = {s.kind: s for s in (LogSink, FileSink, WebhookSink, SlackSink)}
#: what each kind needs
REQUIRED: dict[str, tuple[str, ...]] = {"log": (), "file": ("path",), "webhook": ("url",), "slack": ("url",)}


def make_sink(spec: AlertSpec) -> Sink:
    return SINKS[spec.kind](spec)
