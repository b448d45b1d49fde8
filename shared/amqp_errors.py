"""What a failed attempt to connect to RabbitMQ, or a connection that ended, means, in a line
an operator can act on.

aiormq reports a virtual host that the broker refuses (it does not exist, or the user has
no permissions on it) as ``InvalidFrameError: Invalid frame received: "Expected one of
['Connection.OpenOk'], got <Connection.Close object at 0x...>"``: the broker's reason is
lost with the frame, so a mistyped vhost in ``ORCH_AMQP_URL`` is named here. Every other
failure (refused, bad credentials, timed out) already names itself and is quoted as it is,
but a TLS handshake the certificates failed, which names the setting to fix (``amqp_tls_refusal``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import aiormq

from shared.tls import tls_refusal

_VHOST_REFUSED = ("Connection.OpenOk", "Connection.Close")


def vhost_refused(error: BaseException | str) -> bool:
    """Whether ``error`` (or a line quoting it) is the broker closing the connection in
    answer to opening the virtual host."""
    text = str(error)
    return all(marker in text for marker in _VHOST_REFUSED)


def vhost_refused_text(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    user = unquote(parts.username or "guest")
    return (
        f"the broker refused the virtual host {vhost!r} to user {user!r}: it does not exist, or the user has "
        f"no permissions on it (rabbitmqctl add_vhost / set_permissions, or fix the vhost in the AMQP URL)"
    )


def amqp_tls_refusal(error: BaseException) -> str | None:
    """A TLS handshake with the broker that the certificates failed, in one line naming the
    setting to fix; None for any other failure."""
    return tls_refusal(error, "ORCH_AMQP_CA_FILE", "ORCH_AMQP_CERT_FILE", "the host in ORCH_AMQP_URL or ORCH_AMQP_URLS")


def describe_connect_failure(error: BaseException, amqp_url: str) -> str:
    """``error`` (an attempt to connect to ``amqp_url`` that failed) in one line."""
    if vhost_refused(error):
        return vhost_refused_text(amqp_url)
    return amqp_tls_refusal(error) or repr(error)


def describe_close(error: BaseException | None, heartbeat_s: int) -> str:
    """Why a connection with AMQP heartbeat ``heartbeat_s`` ended, in one line.

    When no frame arrives for aiormq's grace (``(heartbeat + 1) x 3`` seconds) it cancels its
    reader, and the connection's close callbacks get a bare ``CancelledError``: a network
    partition said only "closed by broker or network: CancelledError(CancelledError())"
    (``tests/system/test_fencing.py``, the partitioned service)."""
    if isinstance(error, asyncio.CancelledError):
        grace = (heartbeat_s + 1) * aiormq.Connection.HEARTBEAT_GRACE_MULTIPLIER
        return (
            f"no frame from the broker for {grace}s (the AMQP heartbeat's grace): "
            "the network to it, or the broker, stopped answering"
        )
    return f"closed by broker or network: {error!r}"


class ConnectionCancelled(Exception):
    """An AMQP call ended because its connection was given up under it, not because its
    caller was cancelled."""


@contextlib.contextmanager
def cancelled_calls_as_errors() -> Iterator[None]:
    """Turn a ``CancelledError`` that the current task was not asked for into
    ``ConnectionCancelled``, an ordinary error its caller handles like any other failure of
    the broker.

    When aiormq gives a stuck connection up it cancels its reader, and every call waiting on
    the connection (an RPC, a confirm) raises ``CancelledError`` in its caller; taken for a
    cancellation of the caller it would pass every ``except Exception`` and end the process
    (docs/design.md, "Broker facts the code depends on")."""
    try:
        yield
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        raise ConnectionCancelled("the call was cut short: its broker connection stopped answering") from e


# Refusals that no retry heals: what the broker said, and what to change.
_REFUSED: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (
        aiormq.exceptions.ChannelPreconditionFailed,
        "the broker refuses a queue's arguments or type: a queue of that name exists with other arguments "
        "(delete it, or fix what declared it), or a policy or this RabbitMQ version rejects them "
        "(docs/broker-versions.md)",
    ),
    (
        aiormq.exceptions.ChannelAccessRefused,
        "the broker refuses the user access: rabbitmqctl set_permissions on the virtual host",
    ),
    (
        aiormq.exceptions.ConnectionNotAllowed,
        "the broker does not allow the connection: the virtual host and the user's permissions on it",
    ),
    (
        (aiormq.exceptions.ProbableAuthenticationError, aiormq.exceptions.AuthenticationError),
        "the broker refuses the credentials: the user and password in the AMQP URL",
    ),
)


def refusal(error: BaseException | None, amqp_url: str = "") -> str | None:
    """``error`` as one line naming what to change, if it is a refusal that retrying cannot
    heal (a queue argument or type, a permission, the credentials, a deprecated feature the
    broker denies); None for a failure that may pass (the broker down, a network cut)."""
    if error is None:
        return None
    if vhost_refused(error):
        return vhost_refused_text(amqp_url)
    tls = amqp_tls_refusal(error)
    if tls is not None:
        return tls
    said = str(error.args[0]) if error.args else str(error)
    if isinstance(error, aiormq.exceptions.ConnectionInternalError) and "deprecated" in said:
        return (
            f"{said.splitlines()[0]} the broker denies a deprecated feature the orchestrator used: "
            "run a release of the orchestrator that supports this RabbitMQ (docs/broker-versions.md)"
        )
    for kind, what in _REFUSED:
        if isinstance(error, kind):
            return f"{said}: {what}"
    return None
