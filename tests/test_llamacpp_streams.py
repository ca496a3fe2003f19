"""llama.cpp per-sequence KV streams: how slots map onto streams and how the prefix cache is served from them
(StreamCells against a model of llama.cpp's cells), then the engine over real streams under pressure."""
from __future__ import annotations

import random

import pytest

from evenflow.backends.llamacpp.streams import StreamCells

BS = 4


class FakeCells:
    """llama.cpp's per-stream cells as position -> the block that wrote it."""

    def __init__(self, n: int) -> None:
        self.cells: list[dict[int, int]] = [{} for _ in range(n)]
        self.copies: list[tuple[int, int]] = []

    def remove(self, s: int, p0: int, p1: int) -> None:
        hi = float("inf") if p1 < 0 else p1
        self.cells[s] = {p: b for p, b in self.cells[s].items() if not max(p0, 0) <= p < hi}

    def copy(self, src: int, dst: int) -> None:
        self.cells[dst] = dict(self.cells[src])
        self.copies.append((src, dst))

    def write(self, s: int, table: list[int], p0: int, n: int) -> None:
        for p in range(p0, p0 + n):
            self.cells[s][p] = table[p // BS]

    def blocks(self, s: int) -> list[int]:
        return [self.cells[s][p] for p in sorted(self.cells[s])][::BS]


def run(sc: StreamCells, fake: FakeCells, spans: list[tuple[int, int, int, list[int]]]) -> list[int]:
    streams = sc.place(spans)
    for (slot, start, n, table), s in zip(spans, streams):
        assert all(fake.cells[s].get(p) == table[p // BS] for p in range(start))  # the prefix really is there
        assert not [p for p in fake.cells[s] if p >= start]  # and nothing beyond it
        fake.write(s, table, start, n)
    return streams


@pytest.fixture()
def cells() -> tuple[StreamCells, FakeCells]:
    fake = FakeCells(3)
    return StreamCells(3, BS, fake.remove, fake.copy), fake


def test_a_parked_stream_is_taken_over_in_place_for_its_prefix(cells):
    sc, fake = cells
    doc = [10, 11, 12]
    (s,) = run(sc, fake, [(0, 0, 12, doc)])
    sc.free(0)
    assert sc.num_parked == 1
    (s2,) = run(sc, fake, [(2, 8, 2, [10, 11, 20])])  # slot 2 hits the first two blocks, then diverges
    assert s2 == s and fake.copies == []
    assert sc.take_uncached() == [12]  # the cells of block 12 went with the truncation
    assert sc.stream_of(2) == s and sc.stream_of(0) is None


def test_a_prefix_held_by_a_running_sequence_is_copied_and_cut_to_the_hit(cells):
    sc, fake = cells
    (a,) = run(sc, fake, [(0, 0, 12, [10, 11, 12])])
    (b,) = run(sc, fake, [(1, 8, 3, [10, 11, 30])])
    assert b != a and fake.copies == [(a, b)]
    assert fake.blocks(b) == [10, 11, 30] and fake.blocks(a) == [10, 11, 12]
    assert sc.take_uncached() == []


def test_two_hits_on_one_parked_chain_in_one_step(cells):
    sc, fake = cells
    (a,) = run(sc, fake, [(0, 0, 12, [10, 11, 12])])
    sc.free(0)
    short, long_ = (1, 4, 2, [10, 40]), (2, 12, 1, [10, 11, 12, 50])
    s_short, s_long = run(sc, fake, [short, long_])
    assert s_long == a and s_short != a and fake.copies == [(a, s_short)]  # the longer hit keeps the stream
    assert sc.take_uncached() == []


def test_an_unrelated_sequence_takes_the_oldest_parked_stream_not_needed_this_step(cells):
    sc, fake = cells
    for slot, table in enumerate([[1, 2], [3, 4], [5, 6]]):
        run(sc, fake, [(slot, 0, 8, table)])
    for slot in range(3):
        sc.free(slot)
    # slot 0 hits [1] (oldest parked stream, taken in place); slot 1 starts fresh: the next oldest, [3, 4], goes
    streams = run(sc, fake, [(1, 0, 4, [7]), (0, 4, 1, [1, 8])])
    assert streams[1] == 0 and streams[0] == 1
    assert sorted(sc.take_uncached()) == [2, 3, 4]
    assert sc.num_parked == 1 and fake.blocks(2) == [5, 6]


def test_a_fresh_sequence_takes_the_stream_that_keeps_the_running_ones_consecutive():
    # llama.cpp runs only consecutive stream ids in one micro-batch: a decode in stream 6 beside 1, 3, 4 would cost
    # a pass of its own, in stream 2 it closes the gap. Parked streams are taken from the older half only.
    fake = FakeCells(7)
    sc = StreamCells(7, BS, fake.remove, fake.copy)
    for slot in range(7):
        run(sc, fake, [(slot, 0, 4, [10 + slot])])
    for slot in (6, 2, 0, 5):
        sc.free(slot)
    # parked, oldest first: 6, 2, 0, 5; live: 1, 3, 4. Older half: 6 (no live neighbour), 2 (between 1 and 3)
    (s,) = run(sc, fake, [(7, 0, 4, [30])])
    assert s == 2 and sc.take_uncached() == [12]
    # parked: 6, 0, 5; the older half is 6 alone: 5 would join 4, but it is among the recently parked
    (s,) = run(sc, fake, [(8, 0, 4, [31])])
    assert s == 6 and sc.take_uncached() == [16]


def test_forgotten_blocks_leave_parked_streams_and_never_running_ones(cells):
    sc, fake = cells
    (a,) = run(sc, fake, [(0, 0, 8, [1, 2])])
    (b,) = run(sc, fake, [(1, 0, 8, [3, 4])])
    sc.free(0)
    sc.drop_blocks([2])
    assert fake.blocks(a) == [1] and sc.num_parked == 1
    sc.drop_blocks([1])
    assert fake.cells[a] == {} and sc.num_parked == 0
    with pytest.raises(RuntimeError, match="live sequence"):
        sc.drop_blocks([3])
    assert fake.blocks(b) == [3, 4]


def test_random_traffic_keeps_every_prefix_exact():
    """Random admissions with hits on whatever the engine-like model still caches, frees and drops: every span
    finds its prefix in its stream (checked in `run`), and what is reported uncached is really gone."""
    rng = random.Random(5)
    fake = FakeCells(4)
    sc = StreamCells(4, BS, fake.remove, fake.copy)
    live: dict[int, list[int]] = {}
    cached: set[tuple[int, ...]] = set()  # chains the "engine" may hit: prefixes of finished tables
    next_block = 100
    for _ in range(400):
        if live and (len(live) == 4 or rng.random() < 0.4):
            slot = rng.choice(list(live))
            table = live.pop(slot)
            sc.free(slot)
            cached.update(tuple(table[:k]) for k in range(1, len(table) + 1))
            continue
        slot = next(s for s in range(4) if s not in live)
        base = list(rng.choice(sorted(cached))) if cached and rng.random() < 0.7 else []
        base = base[: rng.randint(0, len(base))]
        tail = list(range(next_block, next_block + rng.randint(1, 3)))
        next_block += len(tail)
        table = base + tail
        live[slot] = table
        run(sc, fake, [(slot, len(base) * BS, len(tail) * BS, table)])
        gone = set(sc.take_uncached())
        cached = {c for c in cached if not gone.intersection(c)}
        held = {b for s in range(4) for b in fake.blocks(s)}
        assert not gone & held
        assert all(set(c) <= held for c in cached)


def test_micro_batches_keep_decodes_together_and_apart_from_chunks_and_long_streams():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from evenflow.backends.base import SeqSpan
    from evenflow.backends.llamacpp.runner import micro_batch_order

    def span(length: int, ctx: int) -> SeqSpan:
        return SeqSpan(slot=0, start=0, length=length, start_pos=ctx - length, block_table=[], need_logits=True)

    # 4 chats decoding in streams 0-3 and a document's chunk in stream 4: the chunk first, alone
    spans = [span(1, 500), span(1, 510), span(1, 520), span(1, 530), span(16, 9000)]
    assert micro_batch_order(spans, [0, 1, 2, 3, 4]) == [4, 0, 1, 2, 3]
    # the document's answer decoding in stream 2, between chats: it runs alone, the chats in two runs
    spans = [span(1, 500), span(1, 600), span(1, 16000), span(1, 700)]
    assert micro_batch_order(spans, [0, 1, 2, 3]) == [3, 2, 0, 1]
    # contexts close enough share a micro-batch; streams that are not consecutive cannot
    spans = [span(1, 3000), span(1, 3500), span(1, 100)]
    assert micro_batch_order(spans, [5, 6, 9]) == [2, 0, 1]
