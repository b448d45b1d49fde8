"""The digest of what the manager's rows say a service's session runs: the same XOR of
128-bit ids a service sends (``shared.messages.digest_of``), with the count.

Processing and OnDeleting rows both count: a service runs an observer whose stop has not
reached it yet, and a stop it already ended was reported before its digest (the outbox keeps
order), so its row is Deleted by the time the digest is compared.

Kept by triggers (migration 0008) in ``held_digests`` plus the deltas not folded yet, so a
comparison reads a row or two instead of aggregating the service's rows, which was most of
what an idle fleet cost PostgreSQL (figures: docs/design.md, "What grows with the fleet").
``tests/system/test_digest.py`` checks the kept digest against that aggregate after every
kind of write.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import BigInteger, column, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.ext.asyncio import AsyncSession

from shared.messages import digest_text

_HOLDER = "service_id = :service_id AND host_session_id = :session_id"

_READ = text(
    f"""
    SELECT coalesce(sum(n), 0), coalesce(bit_xor(xor_hi), 0), coalesce(bit_xor(xor_lo), 0) FROM (
        SELECT n, xor_hi, xor_lo FROM held_digests WHERE {_HOLDER}
        UNION ALL
        SELECT n, xor_hi, xor_lo FROM held_digest_deltas WHERE {_HOLDER}
    ) AS d
    """
)

# Like the counts' fold (``manager/db/counts.py``): deleting the deltas and adding them up
# is one statement, so concurrent folds (two managers) each move only the rows they deleted.
# Rows are locked in key order, so two folds never wait for each other in a cycle. The rows it
# returns empty (a session that ended and whose observers moved away) are deleted next.
_FOLD = text(
    """
    WITH moved AS (DELETE FROM held_digest_deltas RETURNING service_id, host_session_id, n, xor_hi, xor_lo)
    INSERT INTO held_digests (service_id, host_session_id, n, xor_hi, xor_lo)
    SELECT service_id, host_session_id, sum(n), bit_xor(xor_hi), bit_xor(xor_lo) FROM moved
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (service_id, host_session_id) DO UPDATE SET
        n = held_digests.n + EXCLUDED.n,
        xor_hi = held_digests.xor_hi # EXCLUDED.xor_hi,
        xor_lo = held_digests.xor_lo # EXCLUDED.xor_lo
    RETURNING service_id, host_session_id, n = 0 AND xor_hi = 0 AND xor_lo = 0
    """
)
# Only rows this fold just locked: a delete that scanned for empty rows could lock them in
# another order than a concurrent fold.
_FORGET = text(
    "DELETE FROM held_digests WHERE (service_id, host_session_id) IN "
    "(SELECT * FROM unnest(CAST(:services AS uuid[]), CAST(:sessions AS uuid[])))"
)

_HELD_PER_SERVICE = text(
    """
    SELECT service_id, sum(n) AS running FROM (
        SELECT service_id, n FROM held_digests
        UNION ALL
        SELECT service_id, n FROM held_digest_deltas
    ) AS d
    GROUP BY service_id
    """
)

_MASK = (1 << 64) - 1


async def held_digest(session: AsyncSession, service_id: uuid.UUID, session_id: uuid.UUID) -> tuple[int, str]:
    """(count, digest) of the rows held by ``service_id`` in its broker session ``session_id``."""
    holder = {"service_id": service_id, "session_id": session_id}
    count, high, low = (await session.execute(_READ, holder)).one()
    return int(count), digest_text(((high & _MASK) << 64) | (low & _MASK))


def held_per_service() -> Any:
    """A subquery of (service_id, running): the observers each service runs in any of its
    sessions, from the kept digests rather than a count over the observers table on every
    ``GET /api/services``."""
    return _HELD_PER_SERVICE.columns(column("service_id", UUID(as_uuid=True)), column("running", BigInteger)).subquery()


async def fold_digest_deltas(session: AsyncSession) -> None:
    """Move the pending deltas into the digests (the fold_counts repair, every round)."""
    folded = (await session.execute(_FOLD)).all()
    empty = [(service_id, session_id) for service_id, session_id, is_empty in folded if is_empty]
    if empty:
        services, sessions = zip(*empty, strict=True)
        await session.execute(_FORGET, {"services": list(services), "sessions": list(sessions)})
