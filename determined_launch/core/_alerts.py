"""``core_context.alert()``: Determined posts a webhook event through its master.

Off-cluster an alert is a log line at its level; when ``DET_ALERT_WEBHOOK``
names an ``http(s)://`` URL, it is also POSTed there as JSON (``title``,
``description``, ``level``, ``trial_id``, ``experiment_id``, ``host``). The URL
is never logged in full: webhook URLs usually carry their token.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Optional

from determined_launch import envvars, values
from determined_launch.cluster.info import ClusterInfo

logger = logging.getLogger("determined_launch.core")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "error": logging.ERROR}
TIMEOUT = 10.0


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}"


def send_alert(
    info: ClusterInfo,
    title: Optional[str],
    description: Optional[str],
    level: Optional[str],
    env: Optional[Mapping[str, str]] = None,
) -> None:
    env = os.environ if env is None else env
    level = level or "info"
    if level not in LEVELS:
        raise ValueError(f"alert level must be one of {sorted(LEVELS)}, got {level!r}")
    logger.log(LEVELS[level], "alert: %s%s", title or "",
               f": {description}" if description else "")
    raw = env.get(envvars.ALERT_WEBHOOK, "").strip()
    if not raw:
        return
    try:
        url = values.http_url(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {envvars.ALERT_WEBHOOK}: {e}") from None
    trial = info.trial
    body = json.dumps({
        "title": title or "", "description": description or "", "level": level,
        "trial_id": trial.trial_id if trial else None,
        "experiment_id": trial.experiment_id if trial else None,
        "host": socket.gethostname(),
    }).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            response.read()
    except (urllib.error.URLError, OSError) as e:
        # An unreachable webhook must not end a training run.
        logger.warning("alert: webhook %s failed: %s", _where(url), getattr(e, "reason", e))
