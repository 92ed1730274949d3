"""Guardian mode (``vnpu serve --guardian-mode true``) and alert channels given on the command line
(``--alert-channel slack:#runtime-guard``): what they add to a config's ``self_healing`` spec.

Guardian mode runs the policy with no manual step:

- the policy is enabled (whatever ``self_healing.enabled`` says);
- a lost device is restarted (a ``restart_device`` trigger on ``device_health == lost`` is added when no
  trigger watches ``device_health``) and the engines move back to it by themselves once it has passed the
  deep check for ``recovery.return_after`` (``recovery.move_back`` on), warmed with real requests there,
  moved off again when that fails (``rollback_on_failure``);
- every other trigger of the config acts as configured.

Alert channels: ``slack:#chan`` (a Slack incoming webhook: its URL from ``--alert-webhook-url``, else
``$VNPU_SLACK_WEBHOOK_URL``, else the ``url`` of a ``slack`` sink of the config), ``webhook:URL``,
``file:PATH``, ``log``.
"""
from __future__ import annotations

import dataclasses

from .spec import AlertSpec, Condition, SelfHealingSpec, SpecError, TriggerSpec

#: the trigger guardian mode adds when no trigger watches device health
LOST_DEVICE = TriggerSpec("guardian_device_lost", "device_health", Condition("==", 4.0, "== lost"), "restart_device")
#: the environment variable that may hold the Slack webhook URL
SLACK_URL_ENV = "VNPU_SLACK_WEBHOOK_URL"


def guardian(spec: SelfHealingSpec) -> SelfHealingSpec:
    """``spec`` as guardian mode runs it (see the module)."""
    triggers = spec.triggers
    if not any(t.metric == "device_health" for t in triggers):
        triggers = (*triggers, LOST_DEVICE)
    return dataclasses.replace(spec, enabled=True, triggers=triggers,
                               recovery=dataclasses.replace(spec.recovery, move_back=True))


def alert_channel(text: str, spec: SelfHealingSpec, url: str | None) -> AlertSpec:
    """The sink of one ``--alert-channel`` (``url``: the webhook URL given for a Slack channel, if any).
    :class:`SpecError` (one line) for a channel it cannot deliver to."""
    kind, _, where = str(text).partition(":")
    if kind == "slack":
        if not where.startswith("#") or len(where) < 2:
            raise SpecError(f"--alert-channel {text}: expected slack:#channel")
        url = url or next((a.url for a in spec.alerts if a.kind == "slack"), None)
        if not url:
            raise SpecError(f"--alert-channel {text}: a Slack channel needs its incoming-webhook URL "
                            f"(--alert-webhook-url URL, ${SLACK_URL_ENV}, or a slack sink in self_healing.alerts)")
        if not url.startswith(("http://", "https://")):
            raise SpecError(f"--alert-webhook-url: expected an http:// or https:// URL, got {url!r}")
        return AlertSpec("slack", url=url, channel=where)
    if kind == "webhook" and where.startswith(("http://", "https://")):
        return AlertSpec("webhook", url=where)
    if kind == "file" and where:
        return AlertSpec("file", path=where)
    if kind == "log" and not where:
        return AlertSpec("log")
    raise SpecError(f"--alert-channel {text}: expected slack:#channel, webhook:URL, file:PATH or log")


def with_channels(spec: SelfHealingSpec, channels: list[str], url: str | None) -> SelfHealingSpec:
    """``spec`` with the sinks of ``channels`` added (a config's slack sink of the same channel replaced)."""
    if not channels:
        return spec
    added = [alert_channel(c, spec, url) for c in channels]
    slack = {a.channel for a in added if a.kind == "slack"}
    kept = tuple(a for a in spec.alerts if not (a.kind == "slack" and (a.channel in slack or a.channel is None)))
    return dataclasses.replace(spec, alerts=kept + tuple(added))


__all__ = ["LOST_DEVICE", "SLACK_URL_ENV", "alert_channel", "guardian", "with_channels"]
