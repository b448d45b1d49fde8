"""The project's error hierarchy.

OrchestratorError
├── DecodeError            a message body that is not a valid contract
├── LeaseLost              an observer tried to act after its service lost the lease (fencing)
├── UnknownKind            no observer kind with that name is installed
├── BrokerUnavailable      the broker could not be reached or did not confirm a publish
│   └── BrokerRefused      it refused a session for a reason no retry heals (the hint says what)
└── EgressDenied           a kind was about to connect where the service's egress policy forbids
"""


class OrchestratorError(Exception):
    """Base of every error this project raises on purpose."""


class DecodeError(OrchestratorError):
    """A message body could not be decoded into one of the contracts."""


class LeaseLost(OrchestratorError):
    """The service no longer holds a valid lease: the observer must not act.

    Raised by ``ctx.ensure_lease()`` and ``ctx.emit()``. Observer code should let it
    propagate: the service then fences itself (drops its broker session, cancels every
    observer) and starts again with whatever the broker hands it.
    """


class UnknownKind(OrchestratorError):
    """No observer kind with the requested name is installed in this service."""


class BrokerUnavailable(OrchestratorError):
    """The broker is unreachable or did not confirm a publish."""


class BrokerRefused(BrokerUnavailable):
    """The broker refused a session for a reason no retry heals: ``hint`` says what to change
    (``shared.amqp_errors.refusal``)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class EgressDenied(OrchestratorError):
    """A network kind (``http_poll``, ``websocket``) was about to connect to an address the
    service's ``ORCH_EGRESS_ALLOW`` / ``ORCH_EGRESS_DENY`` refuse (``shared.egress``). Not a
    network failure: the kind lets it propagate, so the retry policy and then ``Failed``
    (with this message as the reason) answer it."""
