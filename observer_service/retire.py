"""Moving starts off the start queues past ``ORCH_START_QUEUES`` (docs/design.md, "A pool over
several start queues").

Lowered, the setting leaves queues past it that the manager no longer publishes to; the
services keep consuming them, so nothing in them is lost. The heartbeats count the starts a
service holds from each queue (``queue_held``), and the balancer asks a service that holds
some from a queue past the setting to move at most so many (``RetireStarts``), within its
moves per second. Moving one ends the observer, acks its delivery, and only once the broker
has taken the ack says ``StartsGone``: the manager publishes the start again, to its queue
under the setting. In that order no second copy is ever left beside the new one. A session
that dies between the ack and the report leaves the start to the manager's repairs (the row
names a session that no longer holds it). A report is never sent for an ack the broker may
not have taken: the session ends instead, and what it still held goes back to its queue.
"""

from __future__ import annotations

import logging
import uuid

from observer_service.outbox import Outbox
from observer_service.runner import Runner
from observer_service.session import Session
from shared.messages import RetireStarts, StartsGone

logger = logging.getLogger(__name__)


async def retire(runner: Runner, outbox: Outbox, service_id: uuid.UUID, session: Session, ask: RetireStarts) -> int:
    """Move at most ``ask.count`` of the starts ``session`` holds from queues past the first
    ``ask.keep`` (module docstring); how many the manager was told of."""
    if session.id != ask.session_id or session.closed.is_set():
        return 0
    moving = [
        running
        for running in runner.running.values()
        if running.session is session
        and running.ended_by is None
        and (session.queue_index(running.channel) or 0) >= ask.keep
    ][: ask.count]
    if not moving:
        return 0
    for running in moving:
        running.ended_by = "retired"
    await runner.end(moving)
    taken = await session.ack_taken([(running.channel, running.tag) for running in moving])
    if taken is None:
        return 0  # the session is ending: the broker takes those starts back with it
    if not taken:
        # The starts may be acked or still held: a session is whole or gone, so it ends, and
        # whatever it still held goes back to its queue; an acked one to the repairs.
        session.fail(f"moving {len(moving)} start(s) off start queues past {ask.keep}: the acks were not answered")
        return 0
    pools = sorted({running.start().pool for running in moving})
    ids = [running.observer_id for running in moving]
    outbox.put(
        StartsGone(service_id=service_id, session_id=session.id, pools=pools, observer_ids=ids, retired=True), session
    )
    runner.gc.ended(len(moving), len(runner.running))
    logger.info(
        "moved %d start(s) of pool %s off start queues past %d: the manager publishes them again",
        len(ids),
        ", ".join(pools),
        ask.keep,
    )
    return len(ids)
