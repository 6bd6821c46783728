"""SharedLock: engine batches share it, an update holds it alone.

A paged host's batches run at once (their calls join one running decode), so they cannot take a
plain lock in turn; but an update that writes the weights its engine reads must still wait for the
running batches and keep new ones out until it is done. ``with lock.shared():`` is a batch;
``with lock:`` is the update. A waiting update goes first: batches that arrive after it wait, so a
stream of batches cannot starve it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager


class SharedLock:
    def __init__(self):
        self._cv = threading.Condition()
        self._sharers = 0
        self._owned = False
        self._waiting = 0  # updates waiting for the sharers to leave

    @contextmanager
    def shared(self):
        with self._cv:
            while self._owned or self._waiting:
                self._cv.wait()
            self._sharers += 1
        try:
            yield
        finally:
            with self._cv:
                self._sharers -= 1
                self._cv.notify_all()

    def acquire(self) -> None:
        with self._cv:
            self._waiting += 1
            try:
                while self._owned or self._sharers:
                    self._cv.wait()
            finally:
                self._waiting -= 1
            self._owned = True

    def release(self) -> None:
        with self._cv:
            self._owned = False
            self._cv.notify_all()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
