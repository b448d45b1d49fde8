"""tools.infra: naming the process that holds a RabbitMQ node name or a port we need.

The scenario: a checkout deleted while its RabbitMQ ran, cloned again at the same path. The
new checkout derives the same node name, epmd already knows it, and nothing in the new
checkout knows that process. ``up`` must say which process it is and how to stop it, at once.
The pure parts (parsing, messages) are tested as they are; the lookups in /proc against a
stand-in for the leftover node (a Python process registered with epmd), not a real broker.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import infra
from tools.harness import free_port, unique
from tools.infra import conflicts
from tools.infra.conflicts import Holder
from tools.partition import Direction, Partition

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1632 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 96951 1 0 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1076 1 0 100 0 0 10 0
   2: 0100007F:1632 0100007F:D0A4 01 00000000:00000000 00:00000000 00000000     0        0 97001 1 0 20 4 30 10 -1
   3: garbage
"""
# The address columns of tcp6 are 32 hex digits wide (header and trailing columns cut here).
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st ...
   0: 00000000000000000000000001000000:1632 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 5387 1
"""


def test_listening_ports_and_their_inodes_are_read_from_proc_net_tcp() -> None:
    # 0x1632 = 5682; the established connection (st 01) on it is not a listener
    assert conflicts.parse_listening(PROC_NET_TCP) == {5682: {96951}, 2024: {1076}}
    assert conflicts.parse_listening(PROC_NET_TCP6) == {5682: {5387}}


def test_epmd_names_answer_is_parsed() -> None:
    answer = b"\x00\x00\x11\x11name orch-fa2e4c at port 25683\nname rabbitmqcli-1-orch at port 41234\n"
    assert conflicts.parse_epmd_names(answer) == {"orch-fa2e4c": 25683, "rabbitmqcli-1-orch": 41234}


def test_a_node_left_by_a_deleted_checkout_is_named_with_the_command_that_clears_it() -> None:
    pid_file = Path("/src/app/.run/rabbitmq/orch-fa2e4c.pid")
    leftover = Holder(
        pid=4242,
        command="/usr/lib/erlang/erts-13.1.5/bin/beam.smp -W w -MBas ageffcbf",
        cwd="/src/app/.run/rabbitmq (deleted)",
        environ={"RABBITMQ_PID_FILE": str(pid_file)},
    )
    message = conflicts.node_name_taken("orch-fa2e4c", 25683, pid_file, leftover)
    assert "'orch-fa2e4c' is already registered with epmd" in message
    assert "pid 4242 (beam.smp, working folder /src/app/.run/rabbitmq (deleted))" in message
    assert "checkout that was deleted" in message
    assert "kill 4242" in message and "kill -9 4242" in message
    assert "python3 -m tools.infra up" in message

    # Same base folder, still there, but its pid file no longer names the node
    kept = Holder(pid=4242, command="beam.smp", cwd="/src/app/.run/rabbitmq", environ=leftover.environ)
    assert f"{pid_file} no longer names it" in conflicts.node_name_taken("orch-fa2e4c", 25683, pid_file, kept)


def test_a_process_that_may_be_someone_elses_is_named_without_insisting_on_kill() -> None:
    pid_file = Path("/src/app/.run/rabbitmq/n.pid")
    other = Holder(pid=7, command="beam.smp", cwd="/x", environ={"RABBITMQ_PID_FILE": "/other/n.pid"})
    message = conflicts.node_name_taken("n", 25683, pid_file, other)
    assert "another base folder (its pid file: /other/n.pid)" in message
    assert "If it should not run" in message and "kill 7" in message and "another name" in message

    web = Holder(pid=8, command="/usr/sbin/nginx -g daemon off;", cwd="/")
    message = conflicts.port_taken("postgres: port", 5442, web)
    assert message.startswith("postgres: port 5442 is in use by pid 8 (nginx, working folder /).")
    assert "another port" in message


def test_a_process_we_cannot_see_gets_the_ss_command() -> None:
    message = conflicts.node_name_taken("orch-fa2e4c", 25683, Path("/a/b.pid"), None)
    assert "a process this user cannot see" in message
    assert "ss -ltnp 'sport = :25683'" in message


# A stand-in for the leftover node: listens on a "distribution port", registers the node name
# with epmd (ALIVE2_REQ; the name stays registered while the connection is open), and prints
# the port. Started with the environment and working folder a RabbitNode would have had.
_LEFTOVER = """
import socket, struct, sys, time
name = sys.argv[1].encode()
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
port = listener.getsockname()[1]
epmd = socket.create_connection(("127.0.0.1", 4369))
request = struct.pack(">BHBBHHH", 120, port, 77, 0, 6, 5, len(name)) + name + struct.pack(">H", 0)
epmd.sendall(struct.pack(">H", len(request)) + request)
answer = epmd.recv(16)
assert answer[1:2] == b"\\0", answer
if len(sys.argv) > 2:  # a node being killed: its port closed, its name let go this much later
    listener.close()
    print(port, flush=True)
    time.sleep(float(sys.argv[2]))
    sys.exit(0)
print(port, flush=True)
time.sleep(600)
"""


@pytest.fixture
def leftover_node(rabbit: infra.RabbitNode, tmp_path: Path) -> Iterator[tuple[infra.RabbitNode, subprocess.Popen[str]]]:
    """A node name held by a process from a checkout deleted since; ``rabbit`` (the session's
    broker) only makes sure that epmd runs."""
    node = infra.RabbitNode(
        name=unique("orch-leftover"),
        base=tmp_path / "checkout" / ".run" / "rabbitmq",
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="test-password",
    )
    old = tmp_path / "old-checkout"
    old.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEFTOVER, node.name],
        cwd=old,
        env={"PATH": "/usr/bin:/bin", "RABBITMQ_PID_FILE": str(node.pid_file)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        int(proc.stdout.readline())  # registered
        shutil.rmtree(old)  # the checkout is deleted; the process runs on
        yield node, proc
    finally:
        proc.kill()
        proc.wait()


def test_up_names_the_leftover_node_at_once(leftover_node: tuple[infra.RabbitNode, subprocess.Popen[str]]) -> None:
    node, proc = leftover_node
    began = time.monotonic()
    with pytest.raises(infra.InfraError) as refused:
        node.start()
    assert time.monotonic() - began < 10  # no boot attempt, no timeout
    message = str(refused.value)
    assert f"{node.name!r} is already registered with epmd" in message
    assert f"pid {proc.pid} (python" in message and "(deleted)" in message
    assert "checkout that was deleted" in message and f"kill {proc.pid}" in message
    assert not node.pid_file.exists()  # nothing written for a start that cannot happen


def test_a_port_held_by_another_process_is_named(rabbit: infra.RabbitNode, tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        node = infra.RabbitNode(
            name=unique("orch-port"),
            base=tmp_path / "rabbitmq",
            port=port,
            dist_port=free_port(),
            user="orch",
            password="test-password",
        )
        with pytest.raises(infra.InfraError) as refused:
            node.start()
    message = str(refused.value)
    # This test process holds it: named, but not called a leftover of ours
    assert f"AMQP port {port} is in use by pid {os.getpid()} (python" in message
    assert "Nothing says it is one of ours" in message and "another port" in message


def test_a_killed_nodes_name_that_epmd_still_lists_does_not_stop_a_start(
    rabbit: infra.RabbitNode, tmp_path: Path
) -> None:
    # A test's power cut (kill -9 of the broker, then start) was refused: epmd still listed the
    # killed node's name, with nobody on its distribution port, and the rest of the suite ran
    # without a broker or a database. The start waits for epmd to let the name go.
    node = infra.RabbitNode(
        name=unique("orch-killed"),
        base=tmp_path / "rabbitmq",
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="test-password",
    )
    dying = subprocess.Popen([sys.executable, "-c", _LEFTOVER, node.name, "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert dying.stdout is not None
        int(dying.stdout.readline())  # registered, and its listener closed
        assert node.name in conflicts.epmd_names()
        node._check_nothing_in_the_way()  # no InfraError: it waited for epmd
        assert node.name not in conflicts.epmd_names()
    finally:
        dying.kill()
        dying.wait()


def test_a_cut_partition_carries_nothing_and_a_healed_one_carries_on_in_order() -> None:
    # Given an echo server behind the relay, and a client connected through it
    with socket.create_server(("127.0.0.1", 0)) as server, Partition("127.0.0.1", server.getsockname()[1]) as network:
        client = socket.create_connection(("127.0.0.1", network.port), timeout=5)
        peer, _ = server.accept()
        client.sendall(b"before ")
        assert peer.recv(100) == b"before "

        # When the network is cut, what is sent arrives nowhere, and nothing is closed
        network.cut()
        time.sleep(0.1)  # the cut reaches the relay's loop
        client.sendall(b"during ")
        peer.settimeout(0.5)
        with pytest.raises(TimeoutError):
            peer.recv(100)

        # Then, healed, it arrives in order, and the connection goes on
        network.heal()
        peer.settimeout(5)
        client.sendall(b"after")
        received = b""
        while len(received) < len(b"during after"):
            received += peer.recv(100)
        assert received == b"during after"
        client.close()
        peer.close()


def _cut_one_way(network: Partition, direction: Direction, unheard: socket.socket, hearing: socket.socket) -> None:
    """Cut ``direction``: what ``unheard`` sends does not reach ``hearing``, and what
    ``hearing`` sends still reaches ``unheard``."""
    network.cut(direction)
    time.sleep(0.1)  # the cut reaches the relay's loop
    unheard.sendall(b"unheard")
    with pytest.raises(TimeoutError):
        hearing.recv(100)
    hearing.sendall(b"heard")
    assert unheard.recv(100) == b"heard"


def test_a_partition_cut_one_way_carries_the_other_way() -> None:
    # Given an echo server behind the relay, and a client connected through it
    with socket.create_server(("127.0.0.1", 0)) as server, Partition("127.0.0.1", server.getsockname()[1]) as network:
        client = socket.create_connection(("127.0.0.1", network.port), timeout=5)
        peer, _ = server.accept()
        peer.settimeout(0.5)
        client.settimeout(0.5)

        # When only the way to the server is cut, the client is not heard and still hears
        _cut_one_way(network, "to_server", unheard=client, hearing=peer)

        # And when only the way to the client is cut, the other way round
        network.heal()
        assert peer.recv(100) == b"unheard"
        _cut_one_way(network, "to_client", unheard=peer, hearing=client)

        # Then a close by the side still heard reaches the other at once
        client.close()
        peer.settimeout(5)
        assert peer.recv(100) == b""
        peer.close()
