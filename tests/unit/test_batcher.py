import asyncio
import threading
import time

import pytest

from masrl.driver.rollout.batcher import Batcher


def test_concurrent_requests_merge_into_one_batch_and_each_caller_gets_its_own_result():
    seen: list[list[int]] = []

    def run(items):
        seen.append(list(items))
        time.sleep(0.05)
        return [x * 10 for x in items]

    async def main():
        b = Batcher(run, max_batch_size=64, max_wait_ms=50)
        results = await asyncio.gather(*(b.submit(i) for i in range(20)))
        await b.aclose()
        return results, b

    results, b = asyncio.run(main())
    assert results == [i * 10 for i in range(20)]
    assert len(seen) == 1 and sorted(seen[0]) == list(range(20))
    assert b.stats.largest == 20


def test_max_batch_size_splits_and_queue_forms_next_batch():
    seen = []

    def run(items):
        seen.append(len(items))
        time.sleep(0.02)
        return items

    async def main():
        b = Batcher(run, max_batch_size=8, max_wait_ms=20)
        out = await asyncio.gather(*(b.submit(i) for i in range(20)))
        await b.aclose()
        return out

    assert asyncio.run(main()) == list(range(20))
    assert max(seen) <= 8 and sum(seen) == 20 and len(seen) >= 3


def test_event_loop_stays_free_while_a_batch_runs():
    """The batch blocks until the event loop has ticked 5 times: it ends only if the loop kept running
    beside it (no wall-clock margin: a busy machine is only slower)."""
    import threading

    ticked = threading.Event()
    running = threading.Event()

    def run(items):
        running.set()
        assert ticked.wait(timeout=60), "the event loop stopped while the batch ran"
        return items

    async def ticker():
        while not running.is_set():
            await asyncio.sleep(0.005)
        for _ in range(5):
            await asyncio.sleep(0.001)
        ticked.set()

    async def main():
        b = Batcher(run, max_batch_size=4, max_wait_ms=1)
        got = await asyncio.gather(b.submit(1), ticker())
        await b.aclose()
        return got

    assert asyncio.run(main())[0] == 1


def test_failure_reaches_every_caller_of_the_batch_and_batcher_survives():
    calls = {"n": 0}

    def run(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("engine exploded")
        return items

    async def main():
        b = Batcher(run, max_batch_size=8, max_wait_ms=20)
        first = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
        second = await b.submit(3)
        await b.aclose()
        return first, second

    first, second = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "exploded" in str(e) for e in first)
    assert second == 3


def test_cancelled_caller_is_skipped():
    def run(items):
        time.sleep(0.1)
        return items

    async def main():
        b = Batcher(run, max_batch_size=8, max_wait_ms=5)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.submit("slow"), 0.01)
        out = await b.submit("next")
        await b.aclose()
        return out

    assert asyncio.run(main()) == "next"


def test_compute_lock_serialises_batchers():
    lock = threading.Lock()
    active, peak = [0], [0]

    def run(items):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        active[0] -= 1
        return items

    async def main():
        a = Batcher(run, max_batch_size=2, max_wait_ms=1, compute_lock=lock)
        b = Batcher(run, max_batch_size=2, max_wait_ms=1, compute_lock=lock)
        await asyncio.gather(*(x.submit(i) for i in range(4) for x in (a, b)))
        await a.aclose()
        await b.aclose()

    asyncio.run(main())
    assert peak[0] == 1


def test_concurrent_batches_run_at_once_and_a_short_one_returns_first():
    """concurrent=2: a second batch starts while the first still runs (the paged engine joins its calls
    into the running decode), and its callers return without waiting for the first."""
    release_long = threading.Event()
    running = []

    def run(items):
        running.append(list(items))
        if "long" in items:
            assert release_long.wait(10)
        return [f"{x}!" for x in items]

    async def main(concurrent):
        b = Batcher(run, max_batch_size=8, max_wait_ms=5, concurrent=concurrent)
        long = asyncio.ensure_future(b.submit("long"))
        await asyncio.sleep(0.05)
        short = asyncio.ensure_future(b.submit("short"))
        done, _ = await asyncio.wait([short], timeout=1.0)
        short_first = bool(done)
        release_long.set()
        out = await asyncio.gather(long, short)
        await b.drain()
        await b.aclose()
        release_long.clear()
        return out, short_first

    out, short_first = asyncio.run(main(2))
    assert out == ["long!", "short!"] and short_first
    running.clear()
    out, short_first = asyncio.run(main(1))  # one at a time: the short call waits for the long batch
    assert out == ["long!", "short!"] and not short_first
    with pytest.raises(ValueError, match="concurrent"):
        Batcher(run, concurrent=0)


def test_a_shared_lock_lets_batches_overlap_and_an_update_waits_for_them_alone():
    """A paged host's batcher (SharedLock, concurrent=2): two batches hold the lock at once; an update
    (the lock held alone) waits until both are done, and a batch that arrives while it waits runs
    after it, never during it."""
    from masrl.driver.rollout.shared_lock import SharedLock

    lock = SharedLock()
    events: list[str] = []
    gate = threading.Event()

    def run(items):
        events.append(f"start {items[0]}")
        if items[0] in ("a", "b"):
            assert gate.wait(10)
        events.append(f"end {items[0]}")
        return items

    def update():
        with lock:
            events.append("update")

    async def main():
        b = Batcher(run, max_batch_size=1, max_wait_ms=1, compute_lock=lock, concurrent=2)
        first = [asyncio.ensure_future(b.submit(x)) for x in ("a", "b")]
        while events.count("start a") + events.count("start b") < 2:
            await asyncio.sleep(0.01)
        upd = threading.Thread(target=update)
        upd.start()
        while not lock._waiting:
            await asyncio.sleep(0.01)
        late = asyncio.ensure_future(b.submit("c"))  # arrives while the update waits
        await asyncio.sleep(0.1)
        assert "start c" not in events and "update" not in events
        gate.set()
        await asyncio.gather(*first, late)
        upd.join(5)
        await b.aclose()

    asyncio.run(main())
    assert events.index("update") > max(events.index("end a"), events.index("end b"))
    assert events.index("start c") > events.index("update")


def test_a_streaming_batch_hands_each_result_back_as_it_is_ready():
    """``streams``: ``run_batch(items, deliver)`` tells item 0's caller while the batch still runs (the
    batch waits until that caller has its result); the other items come back when it ends, once each."""
    resumed = threading.Event()

    def run(items, deliver):
        deliver(0, items[0] * 10)
        got_it = resumed.wait(timeout=10)  # the first caller goes on while this batch is still running
        return [x * 10 if got_it else -1 for x in items]

    async def main():
        b = Batcher(run, max_batch_size=8, max_wait_ms=20, streams=True, concurrent=2)

        async def first():
            out = await b.submit(1)
            resumed.set()
            return out

        out = await asyncio.gather(first(), b.submit(2), b.submit(3))
        await b.aclose()
        return out, b

    out, b = asyncio.run(main())
    assert out == [10, 20, 30] and b.stats.items == 3 and b.stats.batches == 1
