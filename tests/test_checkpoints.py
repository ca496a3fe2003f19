"""The checkpoint store (backends/llamacpp/checkpoints.py) counts the memory its checkpoints keep alive: views into one
payload read back from disk count that payload once, and it is freed (uncounted) when the last view goes."""
from __future__ import annotations

import ctypes

from evenflow.backends.llamacpp.checkpoints import Checkpoints, kept, state_pointer


def test_views_into_one_payload_count_it_once_and_until_the_last_goes():
    payload = bytes(range(256)) * 4
    view = memoryview(payload)
    cp = Checkpoints()
    for block in range(3):
        cp.put(block, view[block * 100:(block + 1) * 100], budget=1 << 20)
    assert cp.bytes == len(payload)
    cp.put(7, b"own" * 10, budget=1 << 20)
    assert cp.bytes == len(payload) + 30
    cp.forget(0)
    cp.forget(1)
    assert cp.bytes == len(payload) + 30  # one view still holds all of it
    cp.put(2, b"z" * 5, budget=1 << 20)  # replaced: the last view went
    assert cp.bytes == 35
    cp.clear()
    assert cp.bytes == 0 and 2 not in cp


def test_the_budget_evicts_views_until_their_payload_is_gone():
    payload = bytearray(1000)
    view = memoryview(payload)
    cp = Checkpoints()
    for block in range(4):
        cp.put(block, view[block * 10:(block + 1) * 10], budget=1500)
    assert cp.bytes == 1000 and all(b in cp for b in range(4))
    assert cp.put(9, b"q" * 600, budget=1500) == 4  # over budget: every view goes before the payload is freed
    assert cp.bytes == 600 and [b for b in range(10) if b in cp] == [9]


def test_state_pointer_reads_a_view_in_place():
    data = b"0123456789"
    view = memoryview(data)[3:7]
    assert ctypes.string_at(state_pointer(view), len(view)) == b"3456"
    assert ctypes.string_at(state_pointer(bytearray(b"ab")), 2) == b"ab"


def test_restored_checkpoints_stay_views_only_where_they_are_most_of_their_payload():
    payload = bytes(100)
    view = memoryview(payload)
    most = [(0, view[10:40]), (1, view[40:90])]
    assert kept(most, payload) is most
    few = [(0, view[10:20]), (3, view[90:100])]  # the other 80 bytes (an attention state) would stay alive for them
    out = kept(few, payload)
    assert [(i, type(d), bytes(d)) for i, d in out] == [(0, bytes, bytes(10)), (3, bytes, bytes(10))]
