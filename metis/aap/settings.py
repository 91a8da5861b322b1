"""The `aap` section of `METIS_HOME/config.yaml`.

Every AAP default lives here. Unknown keys are refused so a typo stops the daemon instead of
silently widening CORS or the workspace roots. `METIS_AAP_CORS_ORIGINS` (comma-separated)
overrides `cors_origins` when set, so a browser app can be allowed without editing the file.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from metis.core.canonical import MAX_IMAGE_BYTES

CORS_ENV = "METIS_AAP_CORS_ORIGINS"


class AapSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cors_origins: tuple[str, ...] = ()
    workspace_roots: tuple[str, ...] = ()
    page_size: int = Field(default=20, ge=1, le=200)
    max_request_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, ge=1, le=MAX_IMAGE_BYTES)
    sse_heartbeat_seconds: float = Field(default=15.0, gt=0)
    stream_queue_limit: int = Field(default=10_000, ge=1)

    def effective_cors_origins(self) -> tuple[str, ...]:
        """The env override wins over the file; empty entries are ignored."""
        raw = os.environ.get(CORS_ENV)
        if raw is None:
            return self.cors_origins
        return tuple(o.strip() for o in raw.split(",") if o.strip())
