"""The kind catalog's cache (``manager.kinds.CatalogCache``): pure logic on a real event loop.

Concurrent creates that find the catalog stale share one load; 64 clients used to start 64
loads at once after a manager start, and dozens every second after."""

from __future__ import annotations

import asyncio

import pytest

from manager.kinds import CatalogCache, KindCatalog


class Loader:
    """Counts its loads; each takes ``delay_s`` and returns a new catalog (or raises)."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.loads = 0
        self.fail: Exception | None = None

    async def __call__(self) -> KindCatalog:
        self.loads += 1
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        return KindCatalog({}, {f"load-{self.loads}"})


async def test_concurrent_callers_share_one_load() -> None:
    loader = Loader()
    cache = CatalogCache(loader, ttl_s=60)
    catalogs = await asyncio.gather(*(cache.get() for _ in range(64)))
    assert loader.loads == 1
    assert all(c is catalogs[0] for c in catalogs)
    assert await cache.get() is catalogs[0]  # cached: no second load
    assert loader.loads == 1


async def test_a_stale_catalog_is_loaded_again_once() -> None:
    loader = Loader(delay_s=0.02)
    cache = CatalogCache(loader, ttl_s=0.1)
    first = await cache.get()
    await asyncio.sleep(0.15)
    again = await asyncio.gather(*(cache.get() for _ in range(20)))
    assert loader.loads == 2
    assert all(c is again[0] for c in again) and again[0] is not first


async def test_fresh_loads_now_even_while_cached() -> None:
    loader = Loader(delay_s=0.01)
    cache = CatalogCache(loader, ttl_s=60)
    cached = await cache.get()
    fresh = await cache.get(fresh=True)
    assert loader.loads == 2 and fresh is not cached
    assert await cache.get() is fresh  # the fresh one is kept


async def test_a_failed_load_fails_its_callers_and_is_tried_again() -> None:
    loader = Loader()
    loader.fail = ConnectionError("database unreachable")
    cache = CatalogCache(loader, ttl_s=60)
    results = await asyncio.gather(*(cache.get() for _ in range(5)), return_exceptions=True)
    assert loader.loads == 1
    assert all(isinstance(r, ConnectionError) for r in results)
    loader.fail = None
    assert (await cache.get()).pools == {"load-2"}


async def test_a_caller_that_goes_away_leaves_the_load_to_the_others() -> None:
    loader = Loader()
    cache = CatalogCache(loader, ttl_s=60)
    leaving = asyncio.create_task(cache.get())
    staying = asyncio.create_task(cache.get())
    await asyncio.sleep(0.01)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert (await staying).pools == {"load-1"}
    assert loader.loads == 1
