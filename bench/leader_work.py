"""Each quorum start queue's leader and the work its process did: the figure that shows a pool
spread over several start queues (``ORCH_START_QUEUES``) spreads the broker's work over
several Erlang processes and nodes, where one 2-core machine cannot show the gain in seconds.

A quorum queue's leader is one Ra server process on one node (``amqqueue:get_pid/1`` names
it: ``{RaName, Node}``). Its reductions (function calls, not time: ``bench/broker_work.py``
says why the two differ) are read on that node, and the difference of two reads is what the
queue did between them, as long as its leader did not change: a new leader is a new process,
counted from its election (``elected`` says so).

Beside them, Ra's own counters of that server (``ra_counters:counters/2``, named by the
server id; the fields are ``RA_SRV_COUNTER_FIELDS`` in rabbitmq/ra's ``src/ra.hrl``):
``commands`` a leader received, ``command_flushes`` the batches it appended them in (a
``{commands, Cmds}`` batch counts one flush and ``length(Cmds)`` commands,
``ra_server:handle_leader/2``), and the ``rpcs_sent`` (append-entries to its followers) and
``msgs_sent`` (replies and other sends) that each batch costs. Commands per flush is the
batch size: the figure that says whether three leaders each at a third of the rate pay the
per-batch cost three times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tools import infra

COUNTERS = ("commands", "command_flushes", "rpcs_sent", "msgs_sent")
_LEADER = re.compile(r"\{<<\"([^\"]+)\">>,'?([^',]+)'?,(\d+),\[([\d,]*)\]\}")


@dataclass(frozen=True)
class Leader:
    node: str
    reductions: int
    counters: dict[str, int] = field(default_factory=dict)


def leaders(node: infra.RabbitNode, vhost: str, queues: list[str]) -> dict[str, Leader]:
    """Each quorum queue's leader node, its process's reductions and its Ra counters so far,
    asked of ``node``; a queue not declared yet is left out, a counter Ra did not keep too."""
    names = ", ".join(f'<<"{queue}">>' for queue in queues)
    fields = ", ".join(COUNTERS)
    expression = (
        f"[begin {{Ra, Node}} = amqqueue:get_pid(Q), Pid = erpc:call(Node, erlang, whereis, [Ra]), "
        "{reductions, R} = erpc:call(Node, erlang, process_info, [Pid, reductions]), "
        f"Cs = case erpc:call(Node, ra_counters, counters, [{{Ra, Node}}, [{fields}]]) of "
        f"M when is_map(M) -> [maps:get(K, M, 0) || K <- [{fields}]]; _ -> [] end, "
        f"{{N, Node, R, Cs}} end || N <- [{names}], "
        f'{{ok, Q}} <- [rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, N))]].'
    )
    return parse(node.ctl("eval", expression, timeout=60))


def parse(said: str) -> dict[str, Leader]:
    """The leaders ``rabbitmqctl eval`` printed: ``{<<Queue>>, Node, Reductions, [Counter]}``
    each, the counters in the order of ``COUNTERS`` (none where Ra kept none)."""
    found: dict[str, Leader] = {}
    for m in _LEADER.finditer(re.sub(r"\s+", "", said)):
        values = [int(v) for v in m.group(4).split(",") if v]
        found[m.group(1)] = Leader(m.group(2), int(m.group(3)), dict(zip(COUNTERS, values, strict=False)))
    return found


def work(before: dict[str, Leader], after: dict[str, Leader]) -> dict[str, dict[str, object]]:
    """What each queue's leader did between two reads: its node, its reductions, and whether
    it was elected meanwhile (then the reductions count from its election); its Ra counters
    only if it was not (a server's counters live as long as the server, follower or not)."""
    done: dict[str, dict[str, object]] = {}
    for queue, now in after.items():
        then = before.get(queue)
        elected = then is None or then.node != now.node or then.reductions > now.reductions
        since = Leader(now.node, 0) if elected or then is None else then
        counted: dict[str, object] = {"node": now.node, "reductions": now.reductions - since.reductions}
        if not elected:
            counted |= {k: v - since.counters.get(k, 0) for k, v in now.counters.items()}
        done[queue] = counted | {"elected": elected}
    return done


def batch_line(done: dict[str, object]) -> str:
    """Ra's counters of one leader's work as a sentence: the batches and what each cost."""
    commands, flushes = done.get("commands"), done.get("command_flushes")
    if not isinstance(commands, int) or not isinstance(flushes, int):
        return "no Ra counters"
    per_flush = f"{commands / flushes:,.1f}" if flushes else "-"
    rpcs, msgs = done.get("rpcs_sent", 0), done.get("msgs_sent", 0)
    return f"{commands:,} commands in {flushes:,} batches ({per_flush} per batch), {rpcs:,} rpcs, {msgs:,} msgs sent"
