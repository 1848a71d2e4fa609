"""A handler's traceback, bounded for a task event: what an operator reads in the API, the CLI and
the console when a task retries or fails.

The end of a traceback is where the error is, so a long one keeps its last frames and its last
bytes, and says what it cut. Pure formatting: no I/O, no logging.
"""

from __future__ import annotations

import traceback
from types import TracebackType

# documented in the README (Handlers) and the API's task schema
MAX_FRAMES = 30
MAX_BYTES = 8 * 1024


def bounded_traceback(exc: BaseException, skip_file: str | None = None) -> str | None:
    """`exc`'s traceback as text, at most MAX_FRAMES frames per exception and MAX_BYTES bytes
    of UTF-8, the last ones kept; None when it has no traceback. Leading frames in `skip_file`
    (the worker's own call of the handler) are left out: they are the same for every task."""
    tb = exc.__traceback__
    while tb is not None and skip_file is not None and tb.tb_frame.f_code.co_filename == skip_file:
        tb = tb.tb_next
    if tb is None:
        return None
    frames = _count(tb)
    lines = traceback.format_exception(type(exc), exc, tb, limit=-MAX_FRAMES)
    text = "".join(lines)
    if frames > MAX_FRAMES:
        # after the "Traceback (most recent call last):" line of the outermost exception
        at = text.rfind("Traceback (most recent call last):\n")
        cut = f"  [... {frames - MAX_FRAMES} earlier frames cut ...]\n"
        if at >= 0:
            at += len("Traceback (most recent call last):\n")
            text = text[:at] + cut + text[at:]
    # text columns and jsonb refuse NUL
    text = text.replace("\x00", "\\0")
    data = text.encode("utf-8")
    if len(data) <= MAX_BYTES:
        return text
    marker = "[... {} earlier bytes cut ...]\n"
    room = MAX_BYTES - len(marker.format(len(data)).encode())
    tail = data[len(data) - room:]
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1:]  # start at a whole line
    tail_text = tail.decode("utf-8", errors="ignore")
    return marker.format(len(data) - len(tail)) + tail_text


def _count(tb: TracebackType | None) -> int:
    n = 0
    while tb is not None:
        n += 1
        tb = tb.tb_next
    return n
