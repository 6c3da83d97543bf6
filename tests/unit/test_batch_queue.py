"""BatchQueue: what a take returns, and when a batch lingers for company."""

from __future__ import annotations

from collections.abc import Callable

from pathways_worker.batch_queue import BatchQueue


def recording(answer: bool, asked: list[bool]) -> Callable[[], bool]:
    def more_coming() -> bool:
        asked.append(answer)
        return answer

    return more_coming


def test_an_urgent_item_goes_without_lingering() -> None:
    queue: BatchQueue[int] = BatchQueue()
    asked: list[bool] = []
    queue.put(1)
    queue.put(2, urgent=True)
    items, nudged = queue.take(0.0, linger_s=60.0, more_coming=recording(True, asked))
    assert items == [1, 2] and not nudged
    assert asked == []


def test_a_batch_without_urgent_items_asks_whether_to_linger() -> None:
    queue: BatchQueue[int] = BatchQueue()
    asked: list[bool] = []
    queue.put(1, urgent=True)
    queue.take(0.0)
    queue.put(2)
    items, _ = queue.take(0.0, linger_s=60.0, more_coming=recording(False, asked))
    assert items == [2]
    assert asked == [False]
