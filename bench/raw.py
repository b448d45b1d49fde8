"""The raw broker limit: how fast can RabbitMQ itself hand out and move N "infinite job" leases?

The product schedules jobs by holding start messages unacked (an unacked delivery is the lease,
``prefetch_count`` is the capacity, and the broker redelivers a dead consumer's unacked messages to
the survivors). This scenario does exactly that with nothing but aio-pika, so that the product's
numbers can be compared with the physical limit of the design on the same machine.

Method (``run_raw``):

1. Declare a fresh durable classic queue ``bench.raw.<uuid>`` (deleted at the end, also on errors).
2. Start ``consumers`` consumer processes first (``python -m bench.raw consumer <queue> <prefetch>``;
   the URL is passed in the environment variable ``BENCH_AMQP_URL`` so the password stays out of the
   process table). Each consumes with manual ack and room for all n (``prefetch_count`` is 16-bit,
   so above 65,535 through several consumers on one channel, as a service does), never acks,
   keeps every delivery, and every ``REPORT_INTERVAL_S`` writes ``held <count> <t_last>`` to stdout,
   where ``t_last`` is ``time.monotonic()`` of its latest delivery. CLOCK_MONOTONIC is system-wide on
   Linux, so these stamps are comparable with the parent's clock: the moment the fleet reached a
   total is the latest ``t_last`` among the counted consumers, exact to the delivery and independent
   of the reporting interval. Publishing starts only when every consumer has said ``ready`` (after
   its ``basic.consume-ok``).
3. The parent publishes N persistent (``delivery_mode=2``) ~250-byte JSON start messages through the
   default exchange on a channel with publisher confirms, keeping ``IN_FLIGHT`` unconfirmed publishes
   in flight. The message objects are built before the clock starts. ``publish_s`` ends at the last
   confirm.
4. ``hold_s``: from the first publish until the consumers together hold all N. Every consumer has
   room for every message, so the split between them is whatever RabbitMQ's round-robin makes of it
   (reported as ``split``).
5. ``kill -9`` the consumer that holds the most (``killed_held``) and measure ``redelivery_s``: from
   just before the SIGKILL until the survivors hold all N again. Survivors can take everything
   because each has room for N.
6. SIGKILL every remaining consumer and reap them.
7. For context (``batched_*``, not the issue's baseline): a fresh fleet on a second queue, and
   the same N published the way the manager publishes the starts of bulk creates
   (``shared.batch_publish``: batches of 1,000, 8 in flight); publish rate and hold rate.
   Then both queues are deleted.

CLI::

    python -m bench.raw run [--n 30000] [--consumers 3]   # URL from ORCH_AMQP_URL or .run/env; JSON out
    python -m bench.raw consumer <queue> <prefetch>       # internal: one consumer process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from bench import broker_work, profile
from observer_service.session import prefetch_chunks
from shared.batch_publish import BatchMessage, publish_batch
from tools import infra

__all__ = ["RawResult", "arun_raw", "default_amqp_url", "main", "run_raw"]

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
URL_ENV = "ORCH_AMQP_URL"
CHILD_URL_ENV = "BENCH_AMQP_URL"
IN_FLIGHT = 1_000  # unconfirmed publishes kept in flight
BATCH, BATCHES_IN_FLIGHT = 1_000, 8  # the batched publisher: like 8 concurrent bulk creates
REPORT_INTERVAL_S = 0.02
READY_TIMEOUT_S = 30.0
HOLD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RawResult:
    n: int
    publish_s: float  # time to publish N persistent messages with publisher confirms
    publish_rate: float  # N / publish_s
    hold_s: float  # from the first publish until the consumers together hold all N unacked
    hold_rate: float  # N / hold_s
    killed_held: int  # messages held by the consumer killed with SIGKILL
    redelivery_s: float  # from kill -9 until the other consumers hold all of them again
    split: tuple[int, ...] = ()  # messages held by each consumer before the kill
    # The same publish and hold with the product's publisher (``shared.batch_publish``):
    # what the broker does when the client's per-message cost is out of the way.
    batched_publish_rate: float = 0.0
    batched_hold_rate: float = 0.0
    # CPU seconds while the survivors took the killed consumer's share over: the broker, and
    # the surviving consumers (a lower bound for the broker: see ``profile.cpu_delta``).
    redelivery_cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # With a node to ask (``arun_raw``'s ``rabbit``): where the broker's time went during the
    # redelivery (``bench/broker_work.py``), to set beside the product's failover.
    redelivery_broker_work: list[dict[str, object]] = dataclasses.field(default_factory=list)


# --- consumer process ------------------------------------------------------------------


class _Holder:
    """Keeps every delivery (never acks) and remembers when the latest one arrived."""

    def __init__(self) -> None:
        self.messages: list[AbstractIncomingMessage] = []
        self.last = 0.0

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        self.messages.append(message)
        self.last = time.monotonic()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _consume(url: str, queue_name: str, prefetch: int) -> None:
    """Hold deliveries and report ``held <count> <t_last>`` until the parent or the channel is gone."""
    holder = _Holder()
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=True)
        # prefetch_count is 16-bit: hold more through several consumers, as a service does.
        for part in prefetch_chunks(prefetch):
            await channel.set_qos(prefetch_count=part)
            await queue.consume(holder.on_message, no_ack=False)
        _emit("ready")
        while not channel.is_closed:  # a write to a pipe whose reader died raises BrokenPipeError: no orphans
            _emit(f"held {len(holder.messages)} {holder.last!r}")
            await asyncio.sleep(REPORT_INTERVAL_S)
    raise RuntimeError("consumer: the channel closed")


def _consumer_main(queue_name: str, prefetch: int) -> int:
    try:
        asyncio.run(_consume(os.environ[CHILD_URL_ENV], queue_name, prefetch))
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silence the flush at exit
        return 1
    return 0


# --- parent: the fleet of consumer processes -------------------------------------------


@dataclass
class _Child:
    proc: asyncio.subprocess.Process
    ready: bool = False
    held: int = 0
    last: float = 0.0
    alive: bool = True  # False once killed on purpose
    eof: bool = False


class _Fleet:
    """Consumer processes and the latest report of each."""

    def __init__(self) -> None:
        self.children: list[_Child] = []
        self._readers: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    async def start(self, url: str, queue_name: str, prefetch: int, count: int) -> None:
        env = {**os.environ, CHILD_URL_ENV: url}
        argv = [sys.executable, "-m", "bench.raw", "consumer", queue_name, str(prefetch)]
        for _ in range(count):
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=env, cwd=REPO
            )
            child = _Child(proc)
            self.children.append(child)
            self._readers.append(asyncio.create_task(self._read(child)))
        await self.wait_for(lambda: all(c.ready for c in self.children), READY_TIMEOUT_S, "consumers ready")

    async def _read(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        async for raw in child.proc.stdout:
            words = raw.decode().split()
            if words == ["ready"]:
                child.ready = True
            elif len(words) == 3 and words[0] == "held":
                child.held, child.last = int(words[1]), float(words[2])
            self._changed.set()
        child.eof = True
        self._changed.set()

    def live(self) -> list[_Child]:
        return [c for c in self.children if c.alive]

    async def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``done()``; a consumer that dies on its own or a timeout is an error."""
        deadline = time.monotonic() + timeout
        while True:
            if any(c.eof for c in self.live()):  # checked first: a dead consumer's last count is stale
                raise RuntimeError(f"a consumer process exited while waiting for {what}")
            if done():
                return
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what}: not reached in {timeout} s ({self.describe()})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def wait_held(self, n: int, what: str) -> float:
        """Wait until the live consumers hold ``n`` in total; return when the last of them arrived."""
        await self.wait_for(lambda: sum(c.held for c in self.live()) == n, HOLD_TIMEOUT_S, what)
        return max(c.last for c in self.live())

    def kill(self, child: _Child) -> float:
        """SIGKILL one consumer; return the moment just before the signal."""
        child.alive = False
        t_kill = time.monotonic()
        child.proc.kill()
        return t_kill

    def describe(self) -> str:
        return ", ".join(f"pid {c.proc.pid}: held {c.held}{'' if c.alive else ' (killed)'}" for c in self.children)

    async def close(self) -> None:
        for child in self.children:
            if child.proc.returncode is None:
                child.proc.kill()
        for child in self.children:
            await child.proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


# --- parent: publisher and the scenario ------------------------------------------------


def _start_message(i: int) -> aio_pika.Message:
    """A persistent message shaped like the product's StartObserver (~250 bytes of JSON)."""
    message_id = str(uuid.uuid4())
    body = {
        "type": "StartObserver",
        "message_id": message_id,
        "sent_at": datetime.now(UTC).isoformat(),
        "observer_id": str(uuid.uuid4()),
        "name": f"bench-{i:06d}",
        "kind": "ticker",
        "args": {"interval_s": 1.0},
        "pool": "default",
    }
    return aio_pika.Message(
        json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
    )


async def _publish_all(exchange: AbstractExchange, routing_key: str, messages: Sequence[aio_pika.Message]) -> None:
    """Publish every message, ``IN_FLIGHT`` unconfirmed at a time; a nack or a return raises."""
    pending = iter(messages)

    async def worker() -> None:
        for message in pending:  # the iterator is shared: each message is taken by one worker
            await exchange.publish(message, routing_key=routing_key)

    await asyncio.gather(*(worker() for _ in range(min(IN_FLIGHT, len(messages)))))


async def _publish_batched(channel: AbstractChannel, routing_key: str, messages: Sequence[aio_pika.Message]) -> None:
    """Publish in batches of ``BATCH`` with ``BATCHES_IN_FLIGHT`` unconfirmed, as the
    manager publishes the starts of concurrent bulk creates; a nack or a return raises."""
    raw = cast(aiormq.Channel, await channel.get_underlay_channel())
    outgoing = [BatchMessage(routing_key, m.body, m.properties) for m in messages]
    batches = iter(range(0, len(outgoing), BATCH))

    async def worker() -> None:
        for start in batches:  # shared iterator: each batch is taken by one worker
            await publish_batch(raw, outgoing[start : start + BATCH], timeout=HOLD_TIMEOUT_S, mandatory=True)

    await asyncio.gather(*(worker() for _ in range(BATCHES_IN_FLIGHT)))


async def _measure_batched(channel: AbstractChannel, fleet: _Fleet, queue_name: str, n: int) -> tuple[float, float]:
    """Publish rate and hold rate of N published with ``_publish_batched``."""
    messages = [_start_message(i) for i in range(n)]
    t0 = time.monotonic()
    await _publish_batched(channel, queue_name, messages)
    publish_s = time.monotonic() - t0
    hold_s = await fleet.wait_held(n, "all batched messages held") - t0
    return n / publish_s, n / hold_s


async def _measure(
    channel: AbstractChannel, fleet: _Fleet, queue_name: str, n: int, rabbit: infra.RabbitNode | None
) -> RawResult:
    messages = [_start_message(i) for i in range(n)]
    t0 = time.monotonic()
    await _publish_all(channel.default_exchange, queue_name, messages)
    publish_s = time.monotonic() - t0
    hold_s = await fleet.wait_held(n, "all messages held") - t0
    split = tuple(c.held for c in fleet.children)
    victim = max(fleet.children, key=lambda c: c.held)
    traced = broker_work.mark(rabbit) if rabbit is not None else ""  # before the CPU is read, as bench.scale does
    cpu_before = _cpu_seconds(fleet, victim)
    t_kill = fleet.kill(victim)
    redelivery_s = max(0.0, await fleet.wait_held(n, "all messages held again after kill -9") - t_kill)
    cpu = profile.cpu_delta(cpu_before, _cpu_seconds(fleet, victim))
    work = broker_work.since(rabbit, traced) if rabbit is not None else []
    return RawResult(
        n=n,
        publish_s=publish_s,
        publish_rate=n / publish_s,
        hold_s=hold_s,
        hold_rate=n / hold_s,
        killed_held=victim.held,
        redelivery_s=redelivery_s,
        split=split,
        redelivery_cpu_s={"rabbitmq": cpu.get("rabbitmq", 0.0), "consumers": cpu.get("bench (load + raw)", 0.0)},
        redelivery_broker_work=work,
    )


def _cpu_seconds(fleet: _Fleet, victim: _Child) -> dict[tuple[str, int], float]:
    """CPU seconds so far of the broker (every RabbitMQ on the machine: the bench runs one)
    and of the consumers that survive the kill."""
    survivors = {c.proc.pid for c in fleet.children if c is not victim}
    return {key: s for key, s in profile.cpu_seconds().items() if key[0] == "rabbitmq" or key[1] in survivors}


async def _delete_queue(url: str, queue_name: str) -> None:
    """Delete the queue on a fresh connection (the scenario's own may be the thing that failed)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue_name)


async def _delete_queue_quietly(url: str, queue_name: str) -> None:
    try:
        await _delete_queue(url, queue_name)
    except Exception:
        log.warning("could not delete queue %s; delete it by hand", queue_name, exc_info=True)


def _check_size(n: int, consumers: int) -> None:
    if consumers < 2:
        raise ValueError("at least 2 consumers are needed (one is killed)")
    if n < 1:
        raise ValueError("n must be at least 1")


async def arun_raw(
    amqp_url: str, n: int, consumers: int = 3, *, batched: bool = True, rabbit: infra.RabbitNode | None = None
) -> RawResult:
    """The scenario (see the module docstring), for callers already inside an event loop;
    without ``batched``, the second pass (the manager's batch publisher) is skipped; with
    ``rabbit`` (the node behind ``amqp_url``), the redelivery's broker work is recorded."""
    _check_size(n, consumers)
    queue_name = f"bench.raw.{uuid.uuid4()}"
    batched_queue = f"{queue_name}.batched"
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        try:
            await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "classic"})
            async with _fleet(amqp_url, queue_name, n, consumers) as fleet:
                result = await _measure(channel, fleet, queue_name, n, rabbit)
            publish_rate = hold_rate = 0.0
            if batched:
                await channel.declare_queue(batched_queue, durable=True, arguments={"x-queue-type": "classic"})
                async with _fleet(amqp_url, batched_queue, n, consumers) as fleet:
                    publish_rate, hold_rate = await _measure_batched(channel, fleet, batched_queue, n)
        except BaseException:
            for name in (queue_name, batched_queue):
                await _delete_queue_quietly(amqp_url, name)  # never hide the original error
            raise
    for name in (queue_name, batched_queue):
        await _delete_queue(amqp_url, name)
    return dataclasses.replace(result, batched_publish_rate=publish_rate, batched_hold_rate=hold_rate)


@contextlib.asynccontextmanager
async def _fleet(amqp_url: str, queue_name: str, n: int, consumers: int) -> AsyncIterator[_Fleet]:
    fleet = _Fleet()
    try:
        await fleet.start(amqp_url, queue_name, n, consumers)  # each could hold all: the survivors must
        yield fleet
    finally:
        await fleet.close()


def run_raw(amqp_url: str, n: int, consumers: int = 3) -> RawResult:
    """Run the raw broker limit scenario with ``n`` messages and ``consumers`` consumer processes."""
    return asyncio.run(arun_raw(amqp_url, n, consumers))


# --- CLI -------------------------------------------------------------------------------


def default_amqp_url() -> str:
    """ORCH_AMQP_URL from the environment, else from ``.run/env`` (written by ``tools.infra up``)."""
    if url := os.environ.get(URL_ENV):
        return url
    env_file = REPO / ".run" / "env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == URL_ENV and (words := shlex.split(value)):
                return words[0]
    raise SystemExit(f"{URL_ENV} is not set and {env_file} does not define it (run: python3 -m tools.infra up)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__.splitlines()[0] if __doc__ else "")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the scenario and print the result as JSON")
    run.add_argument("--n", type=int, default=30_000, help="number of messages (default 30000)")
    run.add_argument("--consumers", type=int, default=3, help="consumer processes (default 3)")
    consumer = commands.add_parser("consumer", help="internal: one consumer process (URL in $BENCH_AMQP_URL)")
    consumer.add_argument("queue")
    consumer.add_argument("prefetch", type=int)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "consumer":
        return _consumer_main(args.queue, args.prefetch)
    result = run_raw(default_amqp_url(), args.n, args.consumers)
    print(json.dumps(dataclasses.asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
