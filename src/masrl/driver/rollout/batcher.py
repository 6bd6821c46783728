"""Batcher: merges calls that arrive concurrently into one engine batch.

Callers ``await batcher.submit(item)``. A background task takes the first waiting item, then
keeps collecting until the batch holds ``max_batch_size`` items or ``max_wait_ms`` has passed,
and runs ``run_batch(items)`` in a worker thread, so the event loop keeps serving workflows
while the model computes. While one batch runs, new items queue up and form the next batch.
With ``concurrent`` > 1 up to that many batches run at once (for an engine whose calls join a
running decode, engines/paged/: a call then waits for no other batch). ``run_batch`` returns one
result per item, in order (an exception instance in an item's place
fails that item alone); each caller gets its own result (or the batch's exception). A caller
that gave up (timeout, cancellation) is skipped. With ``streams``, ``run_batch(items, deliver)`` may
call ``deliver(i, result)`` from its thread as item ``i`` finishes: that caller goes on at once
instead of waiting for the batch's longest call (an episode's next turn starts while the batch runs).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from masrl.driver.rollout.shared_lock import SharedLock


@dataclass
class BatcherStats:
    batches: int = 0
    items: int = 0
    largest: int = 0
    busy_s: float = 0.0
    sizes: list[int] = field(default_factory=list)

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class Batcher:
    def __init__(
        self,
        run_batch: Callable[[list[Any]], Sequence[Any]],
        *,
        max_batch_size: int = 32,
        max_wait_ms: float = 10.0,
        compute_lock: threading.Lock | SharedLock | None = None,
        name: str = "batcher",
        on_orphan: Callable[[Any], None] | None = None,
        concurrent: int = 1,
        streams: bool = False,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if concurrent < 1:
            raise ValueError("concurrent must be at least 1")
        self.concurrent = concurrent  # batches handed to run_batch at once (an engine whose calls join a running one)
        self.streams = streams  # run_batch takes deliver(i, result) and tells each item as it finishes
        # batches that run at once wait in threads of their own (a joining engine's caller blocks until its
        # calls end), not in the event loop's shared pool, which tools and other hosts need
        self._pool: ThreadPoolExecutor | None = None
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.compute_lock = compute_lock  # shared by batchers whose models compete for the same cores
        self.on_orphan = on_orphan  # told of an item whose caller gave up while its batch ran (it was computed)
        self.name = name
        self.stats = BatcherStats()
        self._queue: asyncio.Queue | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure_running(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._idle = asyncio.Event()  # of this loop
            self._idle.set()
            self._task = loop.create_task(self._serve(), name=f"{self.name}-serve")
        assert self._queue is not None
        return self._queue

    async def submit(self, item: Any) -> Any:
        queue = self._ensure_running()
        fut = asyncio.get_running_loop().create_future()
        await queue.put((item, fut))
        return await fut

    async def _collect(self, queue: asyncio.Queue) -> list[tuple[Any, asyncio.Future]]:
        batch = [await queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            try:
                batch.append(queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return [(item, fut) for item, fut in batch if not fut.done()]

    def _run_locked(self, items: list[Any], deliver=None) -> Sequence[Any]:
        args = (items, deliver) if self.streams else (items,)
        if self.compute_lock is None:
            return self.run_batch(*args)
        # a SharedLock (a paged host): batches share it, an update holds it alone
        with self.compute_lock.shared() if hasattr(self.compute_lock, "shared") else self.compute_lock:
            return self.run_batch(*args)

    async def _serve(self) -> None:
        queue = self._queue
        assert queue is not None
        slots = asyncio.Semaphore(self.concurrent)
        running: set[asyncio.Task] = set()
        while True:
            batch = await self._collect(queue)
            if not batch:
                continue
            await slots.acquire()
            self._idle.clear()
            task = asyncio.get_running_loop().create_task(self._run(batch))
            running.add(task)

            def done(t, slots=slots):
                running.discard(t)
                slots.release()
                if not running:
                    self._idle.set()  # drain() waiters wake after the batch's results were delivered

            task.add_done_callback(done)
            if self.concurrent == 1:
                await asyncio.shield(task)  # one batch at a time: collect the next while none runs

    async def _run(self, batch: list) -> None:
        items = [item for item, _ in batch]
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        told: set[int] = set()  # items delivered before the batch ended (streams)

        def tell(i: int, res: Any) -> None:  # in the loop: one item's result, while its batch runs on
            if i not in told:
                told.add(i)
                self._deliver_one(batch[i], res)

        def deliver(i: int, res: Any) -> None:  # from run_batch's thread
            try:
                loop.call_soon_threadsafe(tell, i, res)
            except RuntimeError:  # the loop is closed (the run ended): nobody waits for it
                pass

        try:
            if self.concurrent > 1 and self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrent, thread_name_prefix=self.name)
            results = await loop.run_in_executor(self._pool, self._run_locked, items, deliver)
            if len(results) != len(items):
                raise RuntimeError(f"{self.name}: run_batch returned {len(results)} results for {len(items)} items")
        except Exception as exc:  # the engine failed: every caller of this batch gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        finally:
            self.stats.busy_s += time.monotonic() - t0
        rest = [i for i in range(len(batch)) if i not in told]
        told.update(rest)
        self._deliver([batch[i] for i in rest], [results[i] for i in rest], len(batch))

    def _deliver(self, batch: list, results: Sequence[Any], size: int) -> None:
        self.stats.batches += 1
        self.stats.items += size
        self.stats.largest = max(self.stats.largest, size)
        self.stats.sizes.append(size)
        for pair, res in zip(batch, results):
            self._deliver_one(pair, res)

    def _deliver_one(self, pair: tuple[Any, asyncio.Future], res: Any) -> None:
        item, fut = pair
        if not fut.done():  # an exception in place of one result fails that caller alone
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)
        elif self.on_orphan is not None and not isinstance(res, BaseException):
            self.on_orphan(item)

    async def drain(self) -> None:
        """Wait until no batch is running (results, and orphans, delivered)."""
        if self._task is not None and not self._task.done() and self._loop is asyncio.get_running_loop():
            await self._idle.wait()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
