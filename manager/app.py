"""The manager's FastAPI application: wiring only.

The lifespan checks the schema, connects to the broker (in the background, retrying),
starts the state side (the state consumer and the background loops: in a child process by
default, see ``manager/state_side.py``) and closes everything on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from manager.admission import Admission
from manager.api import dashboard, health, history, kinds, metrics, observers, services
from manager.api.auth import require_token, warn_if_open
from manager.api.limits import BodySizeLimit
from manager.broker import BrokerLink
from manager.commands import ObserverCommands
from manager.db.engine import check_schema, make_engine, make_sessionmaker
from manager.db.errors import DATABASE_ERRORS, describe, is_transient
from manager.errors import RETRY_AFTER_S, ManagerError
from manager.history.sampler import Sampler
from manager.metrics import STATE_REGISTRY
from manager.settings import ManagerSettings, get_manager_settings
from manager.state.supervisor import StateSupervisor
from manager.state_side import StateSide
from shared import __version__, tracing
from shared.broker_nodes import warn_if_classic_on_cluster

logger = logging.getLogger(__name__)

_CLIENT_TIMEOUT_MARGIN_S = 5.0


def _stop_if_the_side_ended(task: asyncio.Task[None]) -> None:
    """``ORCH_STATE_PROCESS=false``: the state side ended while the API serves. An API whose
    reports nobody applies would accept creates that never run, with nothing said: the
    process stops instead, for its supervisor to start it again (the child process of the
    default mode is restarted by the API, ``manager/state/supervisor.py``)."""
    why = "cancelled from within" if task.cancelled() else repr(task.exception())
    logger.critical("the state side stopped (%s): stopping the manager for its supervisor to restart it", why)
    os.kill(os.getpid(), signal.SIGTERM)


async def _local_state_metrics() -> str:
    return generate_latest(STATE_REGISTRY).decode()


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    """The database down, refusing connections or busy answers like a service that is down
    (503, Retry-After); the pool (pre-ping, invalidation on disconnect) reconnects by itself.
    Any other database failure is a bug: a JSON 500, never the server's plain-text one."""
    if is_transient(exc):
        logger.warning("database unavailable: %s", describe(exc))
        return JSONResponse(
            {"detail": "the database is unreachable or busy; retry later"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    logger.error("database error", exc_info=exc)
    return JSONResponse({"detail": "internal error: a database operation failed"}, status_code=500)


# The collector's thresholds in the API process (Python's defaults: 700, 10, 10). A bulk
# create builds objects for each of its observers that live until its answer; with a young
# collection every 700 allocations they are promoted within the request, and since the
# start-up freeze leaves the oldest generation nearly empty, every tenth middle collection is
# a full one walking all the requests in flight, blocking them all (figures:
# docs/bench-history.md, "2026-11-27, sixth session").
_GC_THRESHOLDS = (50_000, 20, 10)


def create_app(settings: ManagerSettings | None = None, state_supervisor: StateSupervisor | None = None) -> FastAPI:
    """The API; with ``settings.state_process``, its lifespan starts and watches ``state.supervisor``
    (spawned already by ``python -m manager``) or a new one."""
    settings = settings or get_manager_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warn_if_open(settings)
        warn_if_classic_on_cluster(settings.broker_urls(), settings.queue_type)
        # The API's creates and stops give up on a lock held longer than the timeout. With the
        # state side in this process (``ORCH_STATE_PROCESS=false``) the engine is shared, and
        # the state side's transactions may wait for locks as long as they must: no timeout.
        lock_timeout_s = settings.api_db_timeout_s if settings.state_process else None
        # The client's own bound, for a database that answers nothing: later than the
        # server's, which says why (a lock, a slow statement) and keeps the connection.
        client_timeout_s = settings.api_db_timeout_s + _CLIENT_TIMEOUT_MARGIN_S
        tls = settings.database_tls_context()
        engine = make_engine(
            settings.database_url,
            tls=tls,
            lock_timeout_s=lock_timeout_s,
            client_timeout_s=client_timeout_s if settings.state_process else None,
        )
        await check_schema(engine)
        sessions = make_sessionmaker(engine)
        # A read that waits past the timeout (a table locked by a migration or an operator's
        # session, a database too busy to answer) is refused with a 503 rather than holding
        # the client and a pooled connection for as long as the lock lasts: held, requests
        # fill the read pool and the rest wait out the pool's timeout for a connection.
        read_engine = make_engine(
            settings.database_url,
            tls=tls,
            read_only=True,
            statement_timeout_s=settings.api_db_timeout_s,
            client_timeout_s=client_timeout_s,
        )
        broker = BrokerLink(settings)
        commands = ObserverCommands(
            sessions,
            broker,
            settings.default_retry(),
            Admission(settings.api_in_flight),
            settings.schedule_max_ahead_days,
        )
        app.state.sessions = sessions
        app.state.read_sessions = make_sessionmaker(read_engine)
        app.state.broker = broker
        app.state.commands = commands
        app.state.history = Sampler(app.state.read_sessions, settings.history_sample_s)
        sampling = asyncio.create_task(app.state.history.run(), name="history")
        child: StateSupervisor | None = None
        task: asyncio.Task[None] | None = None
        if settings.state_process:
            broker.start()
            child = state_supervisor or StateSupervisor()
            child.start()
            app.state.state_metrics = child.metrics_text
        else:
            side = StateSide(settings, engine, sessions, broker, commands.starts)
            broker.start()
            task = asyncio.create_task(side.run(), name="state-side")
            task.add_done_callback(_stop_if_the_side_ended)
            app.state.state_metrics = _local_state_metrics
        # Move what start-up made (~130,000 objects of FastAPI, SQLAlchemy, pydantic) out of
        # the collector's sight: every full collection walked them again.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*_GC_THRESHOLDS)
        try:
            yield
        finally:
            sampling.cancel()
            with contextlib.suppress(BaseException):
                await sampling
            if child is not None:
                await child.stop()
            if task is not None:
                task.remove_done_callback(_stop_if_the_side_ended)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await broker.close()
            await engine.dispose()
            await read_engine.dispose()

    app = FastAPI(title="Observer orchestrator manager", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(dashboard.router)  # public: / and /static/* (no data)
    app.include_router(metrics.router)
    app.add_middleware(metrics.LatencyMetrics)
    protected = [Depends(require_token)]
    app.include_router(observers.router, dependencies=protected)
    app.include_router(services.router, dependencies=protected)
    app.include_router(kinds.router, dependencies=protected)
    app.include_router(history.router, dependencies=protected)

    @app.exception_handler(ManagerError)
    async def _domain_error(_: Request, exc: ManagerError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if exc.status_code == 503:
            headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 400 and detail == "There was an error parsing the body":
            detail = "the request body is not valid JSON: send a UTF-8 JSON document (Content-Type: application/json)"
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        return JSONResponse({"detail": f"invalid request: {problems}"}, status_code=422)

    # A refused connection is a bare OSError and a full pool is not a DBAPIError: register
    # every family a database call raises, not only DBAPIError.
    for family in DATABASE_ERRORS:
        app.add_exception_handler(family, _database_error)
    tracing.instrument_app(app)  # traces on (``python -m manager``): a span per request

    return app
