"""Each quorum start queue's leader and the work its process did: the figure that shows a pool
spread over several start queues (``ORCH_START_QUEUES``) spreads the broker's work over
several Erlang processes and nodes, where one 2-core machine cannot show the gain in seconds.

A quorum queue's leader is one Ra server process on one node (``amqqueue:get_pid/1`` names
it: ``{RaName, Node}``). Its reductions (function calls, not time: ``bench/broker_work.py``
says why the two differ) are read on that node, and the difference of two reads is what the
queue did between them, as long as its leader did not change: a new leader is a new process,
counted from its election (``elected`` says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools import infra

_LEADER = re.compile(r"\{<<\"([^\"]+)\">>,'?([^',]+)'?,(\d+)\}")


@dataclass(frozen=True)
class Leader:
    node: str
    reductions: int


def leaders(node: infra.RabbitNode, vhost: str, queues: list[str]) -> dict[str, Leader]:
    """Each quorum queue's leader node and its process's reductions so far, asked of ``node``;
    a queue not declared yet is left out."""
    names = ", ".join(f'<<"{queue}">>' for queue in queues)
    expression = (
        f"[begin {{Ra, Node}} = amqqueue:get_pid(Q), Pid = erpc:call(Node, erlang, whereis, [Ra]), "
        "{reductions, R} = erpc:call(Node, erlang, process_info, [Pid, reductions]), "
        f"{{N, Node, R}} end || N <- [{names}], "
        f'{{ok, Q}} <- [rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, N))]].'
    )
    said = node.ctl("eval", expression, timeout=60)
    return {m.group(1): Leader(m.group(2), int(m.group(3))) for m in _LEADER.finditer(said)}


def work(before: dict[str, Leader], after: dict[str, Leader]) -> dict[str, dict[str, object]]:
    """What each queue's leader did between two reads: its node, its reductions, and whether
    it was elected meanwhile (then the reductions count from its election)."""
    done: dict[str, dict[str, object]] = {}
    for queue, now in after.items():
        then = before.get(queue)
        elected = then is None or then.node != now.node or then.reductions > now.reductions
        reductions = now.reductions if elected or then is None else now.reductions - then.reductions
        done[queue] = {"node": now.node, "reductions": reductions, "elected": elected}
    return done
