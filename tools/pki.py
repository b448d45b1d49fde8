"""Certificates made per run by ``trustme`` (a dev dependency), for the TLS tests and the TLS
benchmark: one CA for the servers and the client, and a second CA that signed nothing here.

The server certificate names 127.0.0.1 only, so a server reached as ``localhost`` is one
whose certificate does not name the host connected to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from tools.harness import free_port, unique
from tools.infra import PostgresNode, RabbitNode
from tools.infra.tls import TlsFiles


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA of the servers and of the client
    other_ca: Path  # a CA that signed nothing here
    client_cert: Path
    client_key: Path
    server: TlsFiles  # for RabbitNode.tls and PostgresNode.tls

    def env(self) -> dict[str, str]:
        """The settings of a manager or a service that speaks TLS to both servers."""
        return {
            "ORCH_AMQP_CA_FILE": str(self.ca),
            "ORCH_AMQP_CERT_FILE": str(self.client_cert),
            "ORCH_AMQP_KEY_FILE": str(self.client_key),
            "ORCH_DATABASE_CA_FILE": str(self.ca),
            "ORCH_DATABASE_CERT_FILE": str(self.client_cert),
            "ORCH_DATABASE_KEY_FILE": str(self.client_key),
        }


def tls_nodes(base: Path, pki: Pki, *, tls_only: bool = True) -> tuple[RabbitNode, PostgresNode]:
    """A RabbitMQ node with a TLS listener beside its plain one, and a PostgreSQL that takes
    TLS clients (only those, with ``tls_only``), both asking for a client certificate and
    both under ``base``; not started."""
    rabbit = RabbitNode(
        name=unique("orch-tls"),
        base=base / "rabbitmq",
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="tls-password",
        tls=pki.server,
        tls_port=free_port(),
    )
    return rabbit, PostgresNode(base=base / "postgres", port=free_port(), tls=pki.server, tls_only=tls_only)


def make_pki(folder: Path) -> Pki:
    """A new CA, a server certificate for 127.0.0.1 and a client certificate, in ``folder``."""
    folder.mkdir(parents=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("orch-client")
    paths = {name: folder / name for name in ("ca", "other", "server", "server.key", "client", "client.key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other.cert_pem.write_to_path(str(paths["other"]))
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(paths["server"]), append=True)
    server.private_key_pem.write_to_path(str(paths["server.key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client"]))
    client.private_key_pem.write_to_path(str(paths["client.key"]))
    return Pki(
        paths["ca"],
        paths["other"],
        paths["client"],
        paths["client.key"],
        TlsFiles(paths["ca"], paths["server"], paths["server.key"]),
    )
