"""TLS for the connections the manager and the services open: contexts that verify, and a
refused certificate told apart from an outage.

Every context here verifies the peer's certificate and its host name (Python's
``ssl.create_default_context``): against the CA file given, else the system's trust store. A
client certificate and key are presented when given (mutual TLS). There is no setting that
turns verification off.

A handshake the certificates fail is no outage: waiting does not change a certificate. The
failure is one line naming the setting to fix (``tls_refusal``), where an ``OSError`` would
otherwise read as "unreachable" and be retried for ever.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator


def client_context(ca_file: str | None, cert_file: str | None = None, key_file: str | None = None) -> ssl.SSLContext:
    """A context that verifies the server against ``ca_file`` (else the system's CAs) and
    its host name, presenting ``cert_file`` (with ``key_file``, or a key inside it) if given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps (``__cause__``, ``__context__``, SQLAlchemy's ``orig``)."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [error]
    while todo and len(seen) < 8:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        yield current
        for wrapped in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(wrapped, BaseException):
                todo.append(wrapped)


# The alerts a server sends when it refuses the client's certificate (or its lack of one).
_CLIENT_CERT_REFUSED = ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN")


def tls_refusal(error: BaseException, ca_setting: str, cert_setting: str, host_setting: str) -> str | None:
    """What a failed TLS handshake in ``error`` says, as one line naming the setting to fix,
    or None if ``error`` is no certificate failure (the peer down, a network cut)."""
    for layer in _chain(error):
        if isinstance(layer, ssl.SSLCertVerificationError):
            said = layer.verify_message or str(layer)
            if "mismatch" in said.lower():  # "Hostname mismatch, ...", "IP address mismatch, ..."
                return (
                    f"the server's certificate does not name the host connected to ({said}): connect by a name "
                    f"the certificate holds ({host_setting}), or give the server a certificate for this name"
                )
            return f"the server's certificate is not trusted ({said}): set {ca_setting} to the CA that signed it"
        if isinstance(layer, ssl.SSLError) and any(alert in str(layer).upper() for alert in _CLIENT_CERT_REFUSED):
            return (
                f"the server refused this client's certificate ({layer.reason or layer}): set {cert_setting} "
                "to a certificate the server's CA signed"
            )
    return None
