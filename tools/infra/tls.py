"""A server's TLS files, for nodes that listen with TLS (``RabbitNode.tls``,
``PostgresNode.tls``): its certificate and key, and the CA that client certificates must be
signed by (both ask for one: mutual TLS). Made by the caller (the tests use ``trustme``);
each node copies them into a folder its server process can read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tools.infra.system import write_private


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # PEM: the CA client certificates must chain to
    cert: Path  # PEM: the server's certificate chain
    key: Path  # PEM: its private key

    def copy_to(self, folder: Path, owner: tuple[int, int] | None = None) -> TlsFiles:
        """The three files copied into ``folder`` (readable by ``owner`` only, if given)."""
        copies = []
        for source, name in ((self.ca, "ca.pem"), (self.cert, "server.pem"), (self.key, "server.key")):
            target = folder / name
            write_private(target, source.read_text())
            if owner is not None:
                os.chown(target, *owner)
            copies.append(target)
        return TlsFiles(*copies)
