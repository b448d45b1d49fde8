"""``observer_service.session``: a pool's prefetch split into consumers of at most 16 bits."""

from __future__ import annotations

from observer_service.session import prefetch_chunks


def test_prefetch_is_split_into_16_bit_consumers() -> None:
    assert prefetch_chunks(1) == [1]
    assert prefetch_chunks(65_535) == [65_535]
    assert prefetch_chunks(100_000) == [65_535, 34_465]
    assert sum(prefetch_chunks(200_000)) == 200_000
    assert prefetch_chunks(10_000, 4_096) == [4_096, 4_096, 1_808]
    assert prefetch_chunks(100_000, 100_000) == [65_535, 34_465]
