"""Upload dashboards to Grafana (HTTP API, through grafana-client): folder created if missing, dashboards overwritten.

Idempotent: a second push finds the folder by title and overwrites each dashboard by its uid.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import GrafanaError

__all__ = ["push_dashboards", "PushResult"]


@dataclass(frozen=True)
class PushResult:
    folder_uid: str
    folder_created: bool
    dashboards: tuple[tuple[str, str], ...]  # (uid, url Grafana gave back)


def _folder_uid(title: str) -> str:
    return ("tuner-" + re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-"))[:40]


def push_dashboards(
    url: str, token: str, dashboards: Mapping[str, Mapping[str, Any]], *, folder: str = "tuner", timeout_s: float = 10.0
) -> PushResult:
    """Create ``folder`` if missing, then upload every dashboard with overwrite; errors name the URL."""
    import niquests
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    api = GrafanaApi.from_url(url, credential=token, timeout=timeout_s)
    try:
        existing = {f.get("title"): f.get("uid") for f in api.folder.get_all_folders()}
        created = folder not in existing
        folder_uid = existing.get(folder) or api.folder.create_folder(folder, uid=_folder_uid(folder))["uid"]
        pushed = []
        for uid, model in dashboards.items():
            answer = api.dashboard.update_dashboard(
                {
                    "dashboard": {**model, "id": None},
                    "folderUid": folder_uid,
                    "overwrite": True,
                    "message": "tuner dashboards push",
                }
            )
            pushed.append((uid, str(answer.get("url", ""))))
    except GrafanaException as exc:
        raise GrafanaError(
            url,
            f"HTTP {exc.status_code or '-'}: {exc.message}"
            + ("; check the token in $GRAFANA_TOKEN" if exc.status_code in (401, 403) else ""),
        ) from None
    except niquests.exceptions.RequestException as exc:
        raise GrafanaError(url, f"cannot connect ({type(exc).__name__}); is Grafana running there?") from None
    return PushResult(folder_uid, created, tuple(pushed))
