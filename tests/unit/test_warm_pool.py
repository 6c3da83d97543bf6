"""The plan of which shared-memory files to keep warm (pathways_worker.warm_pool)."""

from __future__ import annotations

from pathways_worker.warm_pool import MIN_WARM_BYTES, SPARES_PER_SIZE, WarmPlan, keep_spare

MIB = 1 << 20


def make_all(plan: WarmPlan) -> list[int]:
    made: list[int] = []
    for _ in range(100):
        size = plan.next_to_make()
        if size is None:
            return made
        plan.made(size)
        made.append(size)
    raise AssertionError("the plan never stopped asking for files")


def test_a_size_asked_for_is_warmed_to_depth_and_then_handed_out() -> None:
    plan = WarmPlan(limit_bytes=256 * MIB, depth=2)
    assert plan.take(64 * MIB) is False
    assert make_all(plan) == [64 * MIB, 64 * MIB]
    assert plan.take(64 * MIB) is True
    assert plan.take(64 * MIB) is True
    assert plan.take(64 * MIB) is False
    assert make_all(plan) == [64 * MIB, 64 * MIB]


def test_small_files_are_never_kept_warm() -> None:
    plan = WarmPlan(limit_bytes=256 * MIB)
    assert plan.take(MIN_WARM_BYTES - 1) is False
    assert plan.next_to_make() is None


def test_warm_bytes_stay_within_the_limit() -> None:
    plan = WarmPlan(limit_bytes=100 * MIB, depth=2)
    plan.take(64 * MIB)
    plan.take(16 * MIB)
    made = make_all(plan)
    assert sum(made) <= 100 * MIB
    assert plan.held == sum(made)
    assert 16 * MIB in made


def test_a_file_that_could_not_be_made_is_not_counted_warm() -> None:
    plan = WarmPlan(limit_bytes=256 * MIB, depth=1)
    plan.take(MIB)
    size = plan.next_to_make()
    assert size == MIB
    plan.made(size, ok=False)
    assert plan.held == 0
    assert plan.take(MIB) is False


def test_sizes_no_longer_asked_for_are_discarded() -> None:
    plan = WarmPlan(limit_bytes=1024 * MIB, depth=1, sizes=2)
    plan.take(MIB)
    make_all(plan)
    plan.take(2 * MIB)
    plan.take(4 * MIB)
    assert plan.unwanted() == [MIB]
    assert plan.unwanted() == []
    assert sorted(make_all(plan)) == [2 * MIB, 4 * MIB]


def test_a_file_done_with_is_kept_as_a_spare_until_there_are_enough_of_its_size() -> None:
    limit = 1024 * MIB
    assert keep_spare(64 * MIB, 0, 0, limit) is True
    assert keep_spare(64 * MIB, SPARES_PER_SIZE - 1, 64 * MIB, limit) is True
    assert keep_spare(64 * MIB, SPARES_PER_SIZE, 128 * MIB, limit) is False
    assert keep_spare(MIN_WARM_BYTES - 1, 0, 0, limit) is False


def test_the_inputs_of_a_batch_of_calls_that_come_free_at_once_are_all_kept_as_spares() -> None:
    batch_input = 512 << 10
    kept = 0
    for _ in range(32):
        kept += keep_spare(batch_input, kept, kept * batch_input, 256 * MIB)
    assert kept == 32
    assert keep_spare(batch_input, kept, kept * batch_input, 256 * MIB) is False


def test_spares_of_all_sizes_stay_within_the_limit() -> None:
    assert keep_spare(64 * MIB, 0, 200 * MIB, 256 * MIB) is False
    assert keep_spare(32 * MIB, 0, 200 * MIB, 256 * MIB) is True


def test_a_writer_that_found_a_spare_spends_no_warm_file() -> None:
    plan = WarmPlan(limit_bytes=256 * MIB, depth=1)
    plan.take(64 * MIB)
    assert make_all(plan) == [64 * MIB]
    assert plan.take(64 * MIB, spare=True) is False
    assert make_all(plan) == []
    assert plan.take(64 * MIB) is True
