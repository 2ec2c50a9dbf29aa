"""The contiguous baseline: first-fit reservations, internal and external fragmentation."""

import pytest

from lab.memory.contiguous import ContiguousAllocator, NoContiguousRegion


def test_first_fit_and_fragmentation_in_slots():
    c = ContiguousAllocator(100)
    a = c.reserve(0, size=30, used=10)
    b = c.reserve(1, size=30, used=5)
    c.reserve(2, size=30, used=30)
    assert (a.start, b.start) == (0, 30)
    c.release(1)  # a 30-slot hole at 30, plus 10 free at the end
    u = c.usage(next_request=35)
    assert u.holes == ((30, 30), (90, 10))
    assert u.internal == 20 and u.free == 40 and u.largest_hole == 30
    assert u.external == 40  # neither hole can take a 35-slot request
    with pytest.raises(NoContiguousRegion) as err:
        c.reserve(3, size=35, used=1)
    assert err.value.total_free == 40 and err.value.largest_hole == 30
    d = c.reserve(4, size=25, used=1)  # first fit: the hole at 30
    assert d.start == 30


def test_grow_within_reservation_only():
    c = ContiguousAllocator(10)
    c.reserve(0, size=4, used=3)
    c.grow(0)
    with pytest.raises(Exception, match="outgrew"):
        c.grow(0)
    assert c.usage().internal == 0


def test_failed_reservation_changes_nothing():
    c = ContiguousAllocator(10)
    c.reserve(0, size=8, used=1)
    before = c.holes()
    with pytest.raises(NoContiguousRegion):
        c.reserve(1, size=3, used=1)
    assert c.holes() == before and list(c.regions) == [0]
