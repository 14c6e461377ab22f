"""Which open batches this server may run.

The default data dir is per user, so a server started with other models (a quick experiment)
opens jobs another server took in. A job runs only where every model it needs is served: the
models its lines name that the server it was submitted to served (Store.needs). Otherwise it
stays in_progress with a `pending_reason` and waits for a server that serves them; once past
its expires_at it runs anyway (expiring needs no model).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from openai_compat.batch.store import Store

logger = logging.getLogger("openai_compat.batch")


class Pending:
    def __init__(self, served: Callable[[], frozenset[str]] | None) -> None:
        """`served`: the model names this server serves (None: every job may run here)."""
        self.served = served
        self.waiting: dict[str, list[str]] = {}  # batch id -> the models it waits for

    async def may_run(self, store: Store, obj: dict[str, Any]) -> bool:
        """Whether this server serves every model the batch needs; if not, the batch is
        saved with a `pending_reason` saying why (once, and logged once)."""
        batch_id = obj["id"]
        expired = obj["expires_at"] is not None and time.time() > obj["expires_at"]
        missing: list[str] = []
        if self.served is not None and not expired:
            needs = await asyncio.to_thread(store.needs, batch_id)
            missing = sorted(needs - self.served())
        if not missing:
            self.waiting.pop(batch_id, None)
            if obj.pop("pending_reason", None) is not None:
                await asyncio.to_thread(store.save, obj)
            return True
        reason = (
            f"Waiting for a server that serves {', '.join(map(repr, missing))}: the batch's "
            "lines name it and the server it was submitted to served it; this one does not. "
            "It resumes when a server with that model opens this data dir."
        )
        if self.waiting.get(batch_id) != missing:
            logger.warning("batch %s stays pending: %s", batch_id, reason)
            self.waiting[batch_id] = missing
        if obj.get("pending_reason") != reason:
            obj["pending_reason"] = reason
            await asyncio.to_thread(store.save, obj)
        return False
