"""reach.envelope.new_id: unique, time-ordered ids, random bits read in chunks - and a
forked child never repeats its parent's bits (both would otherwise hand out the same
rest of one buffer)."""

from __future__ import annotations

import os
import threading

from reach.envelope import new_id, new_ids


def test_ids_are_unique_and_sort_by_time() -> None:
    ids = [new_id() for _ in range(20_000)]  # several buffers' worth
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert [i[:12] for i in ids] == sorted(i[:12] for i in ids)


def test_a_batch_of_ids_is_unique_and_apart_from_single_ones() -> None:
    batch = new_ids(3_000)  # more bits than one buffer holds
    ids = batch + new_ids(1) + [new_id() for _ in range(2_000)] + new_ids(0)
    assert len(set(ids)) == len(ids) == 5_001
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:12] for i in batch}) == 1  # one clock read for the batch
    assert [i[:12] for i in ids] == sorted(i[:12] for i in ids)


def test_threads_get_distinct_ids() -> None:
    got: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out += [new_id() for _ in range(5_000)]

    threads = [threading.Thread(target=make, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for out in got for i in out]
    assert len(set(flat)) == len(flat)


def test_a_forked_child_does_not_repeat_the_parents_bits() -> None:
    new_id()  # the parent's buffer holds unread bits at the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids, then out
        try:
            os.write(w, "\n".join(new_id()[12:] for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    parent = {new_id()[12:] for _ in range(50)}
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    child = set(b"".join(chunks).decode().split("\n"))
    assert len(child) == 50 and not parent & child
