"""Where log lines are written: those logged on the process's event loop leave together at the end of the loop's
turn, any other at once, and none is lost or reordered within its thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from worker.logs import LineWriter


class CountingStream:
    """A stream that records each write (a system call each, on a real file)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_lines_of_one_turn_of_the_loop_leave_in_one_write(loop: asyncio.AbstractEventLoop) -> None:
    """Three lines logged in one callback are written once that callback is over, in one write."""
    writer, stream = LineWriter(), CountingStream()
    writer.stream = stream
    writer.hold_for(loop, threading.get_ident())
    seen_during: list[list[str]] = []

    def turn() -> None:
        for n in range(3):
            writer.msg(f"line {n}")
        seen_during.append(list(stream.writes))
        loop.call_soon(loop.stop)  # after the turn's own lines

    loop.call_soon(turn)
    loop.run_forever()
    assert seen_during == [[]]
    assert stream.writes == ["line 0\nline 1\nline 2\n"]


def test_a_line_of_another_thread_is_written_at_once_after_what_the_loop_holds(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Another thread's line does not wait for the loop, and does not overtake the lines held before it."""
    writer, stream = LineWriter(), CountingStream()
    writer.stream = stream
    writer.hold_for(loop, threading.get_ident())
    writer.msg("held")
    other = threading.Thread(target=writer.msg, args=("from a thread",))
    other.start()
    other.join()
    assert stream.writes == ["held\nfrom a thread\n"]


def test_lines_held_when_the_loop_stops_holding_are_written(loop: asyncio.AbstractEventLoop) -> None:
    """A loop that stops (its turn's flush never ran) leaves nothing unwritten once it is let go."""
    writer, stream = LineWriter(), CountingStream()
    writer.stream = stream
    writer.hold_for(loop, threading.get_ident())
    writer.msg("last words")
    assert stream.writes == []
    writer.hold_for(None, None)
    assert stream.writes == ["last words\n"]
    writer.msg("after")
    assert stream.writes[-1] == "after\n"


def test_a_forked_child_holds_nothing_of_its_parent_s(loop: asyncio.AbstractEventLoop) -> None:
    """After a fork the child writes every line at once until a loop of its own holds them, and leaves the
    lines its parent held to the parent."""
    writer, stream = LineWriter(), CountingStream()
    writer.stream = stream
    writer.hold_for(loop, threading.get_ident())
    writer.msg("the parent's")
    writer.forked()
    writer.msg("the child's")
    assert stream.writes == ["the child's\n"]
