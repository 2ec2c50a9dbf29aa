"""The contiguous baseline: one region per request, reserved up front in a linear address space.

Each request reserves prompt + max output tokens at admission, placed first-fit (or prompt + a
guess, growing in place or moving when it outgrows it: `lab/memory/contiguous_kv.py`). What it
does not use is internal fragmentation; free space split into holes too small for the next
request is external fragmentation. Units are token slots (multiply by bytes per token for
bytes), the same units as the paged pool's slots, so both can be compared on one workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.memory.block_pool import KVCacheError
from lab.memory.events import EventLog


class NoContiguousRegion(KVCacheError):
    def __init__(self, needed: int, largest_hole: int, total_free: int) -> None:
        super().__init__(f"no contiguous region of {needed} slots: largest hole {largest_hole}, "
                         f"{total_free} free in all")
        self.needed, self.largest_hole, self.total_free = needed, largest_hole, total_free


@dataclass
class Region:
    req_id: int
    start: int
    reserved: int
    used: int


@dataclass(frozen=True)
class ContiguousUsage:
    capacity: int
    reserved: int
    used: int
    internal: int  # reserved but unused
    free: int
    largest_hole: int
    external: int  # free slots in holes smaller than the request that must fit next
    holes: tuple[tuple[int, int], ...]  # (start, size) of each free run


@dataclass(frozen=True)
class ContiguousPicture:
    """The contiguous address space at one moment: its regions in address order, and usage."""

    regions: tuple[Region, ...]  # (req_id, start, reserved, used): used = tokens held now
    usage: ContiguousUsage
    next_request: int  # slots the request waiting to be placed needs (0: nobody waits)


class ContiguousAllocator:
    def __init__(self, capacity: int, events: EventLog | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 slot, got {capacity}")
        self.capacity = capacity
        self.events = events if events is not None else EventLog()
        self.regions: dict[int, Region] = {}

    def holes(self) -> list[tuple[int, int]]:
        holes, cursor = [], 0
        for r in sorted(self.regions.values(), key=lambda r: r.start):
            if r.start > cursor:
                holes.append((cursor, r.start - cursor))
            cursor = r.start + r.reserved
        if cursor < self.capacity:
            holes.append((cursor, self.capacity - cursor))
        return holes

    def first_fit(self, size: int) -> int | None:
        """The start of the first hole that holds `size` slots (None: no hole does)."""
        return next((s for s, hole in self.holes() if hole >= size), None)

    def can_reserve(self, size: int) -> bool:
        return self.first_fit(size) is not None

    def _place(self, size: int) -> int:
        """First fit for `size` slots, or NoContiguousRegion saying what is free."""
        start = self.first_fit(size)
        if start is None:
            holes = self.holes()
            largest = max((hole for _, hole in holes), default=0)
            raise NoContiguousRegion(size, largest, sum(h for _, h in holes))
        return start

    def reserve(self, req_id: int, size: int, used: int) -> Region:
        """Reserve `size` contiguous slots (first fit) for a request already using `used`."""
        if req_id in self.regions:
            raise KVCacheError(f"request {req_id} already holds a region")
        if not 0 < used <= size:
            raise ValueError(f"used ({used}) must be in 1..reserved ({size})")
        start = self._place(size)
        region = self.regions[req_id] = Region(req_id, start, size, used)
        self.events.emit("allocate", req_id, None, start=start, reserved=size)
        return region

    def room_after(self, req_id: int) -> int:
        """Free slots right after the request's region: up to the next region, or the end."""
        end = self.regions[req_id].start + self.regions[req_id].reserved
        return min((r.start for r in self.regions.values() if r.start >= end),
                   default=self.capacity) - end

    def extend(self, req_id: int, size: int) -> Region:
        """Grow a region in place to `size` slots: the slots right after it must be free."""
        region = self.regions[req_id]
        more = size - region.reserved
        if not 0 < more <= self.room_after(req_id):
            raise KVCacheError(f"request {req_id}: cannot extend {region.reserved} slots at "
                               f"{region.start} to {size} in place")
        self.events.emit("allocate", req_id, None, start=region.start + region.reserved,
                         reserved=more, extends=region.start)
        region.reserved = size
        return region

    def move(self, req_id: int, size: int) -> tuple[Region, Region]:
        """Reserve `size` slots elsewhere (first fit, the old region still held, as a copy
        needs its source) and give the old region up: a realloc's bookkeeping. The caller
        copies the bytes. Returns (old region, new region)."""
        old = self.regions[req_id]
        if size < old.used:
            raise ValueError(f"request {req_id} holds {old.used} tokens, more than {size}")
        start = self._place(size)
        new = self.regions[req_id] = Region(req_id, start, size, old.used)
        self.events.emit("allocate", req_id, None, start=start, reserved=size,
                         moved_from=old.start)
        self.events.emit("free", req_id, None, start=old.start, reserved=old.reserved)
        return old, new

    def grow(self, req_id: int, n: int = 1) -> None:
        region = self.regions[req_id]
        if region.used + n > region.reserved:
            raise KVCacheError(f"request {req_id} outgrew its reservation of {region.reserved}")
        region.used += n

    def release(self, req_id: int) -> None:
        region = self.regions.pop(req_id)
        self.events.emit("free", req_id, None, start=region.start, reserved=region.reserved)

    def picture(self, held: dict[int, int] | None = None,
                next_request: int = 0) -> ContiguousPicture:
        """The regions in address order and the usage now. `held` (request id -> tokens held)
        overrides each region's `used`: a server that tracks lengths itself need not call grow."""
        held = held or {}
        regions = tuple(Region(r.req_id, r.start, r.reserved, held.get(r.req_id, r.used))
                        for r in sorted(self.regions.values(), key=lambda r: r.start))
        return ContiguousPicture(regions, self._usage(regions, next_request or None),
                                 next_request)

    def usage(self, next_request: int | None = None) -> ContiguousUsage:
        """Fragmentation now. External counts holes smaller than `next_request` slots (by
        default the smallest reservation in place, a stand-in for a typical request)."""
        return self._usage(tuple(self.regions.values()), next_request)

    def _usage(self, regions: tuple[Region, ...], next_request: int | None) -> ContiguousUsage:
        holes = self.holes()
        reserved = sum(r.reserved for r in regions)
        used = sum(r.used for r in regions)
        if next_request is None:
            next_request = min((r.reserved for r in regions), default=1)
        return ContiguousUsage(
            self.capacity, reserved, used, reserved - used, self.capacity - reserved,
            max((h for _, h in holes), default=0),
            sum(h for _, h in holes if h < next_request), tuple(holes))
