"""A handler's traceback as task events keep it: the last frames and bytes, with a line saying
what was cut."""

from __future__ import annotations

from skiplock.worker import tracebacks
from skiplock.worker.tracebacks import MAX_BYTES, MAX_FRAMES, bounded_traceback


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def _descend(depth: int):
    if depth == 0:
        raise KeyError("b")
    return _descend(depth - 1)


def _frames(text: str) -> int:
    """Frames shown, counting those Python folds into "[Previous line repeated N more times]"."""
    shown = sum(1 for line in text.splitlines() if line.startswith('  File "'))
    folded = sum(int(line.split()[3]) for line in text.splitlines()
                 if line.startswith("  [Previous line repeated "))
    return shown + folded


def test_a_short_traceback_is_kept_whole():
    text = bounded_traceback(_raised(lambda: _descend(3)))
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("KeyError: 'b'\n")
    assert _frames(text) == 6  # _raised's call, the lambda and 4 of _descend
    assert "cut" not in text


def test_a_deep_traceback_keeps_its_last_frames():
    text = bounded_traceback(_raised(lambda: _descend(100)))
    assert _frames(text) == MAX_FRAMES
    # _raised, the lambda and 101 _descend frames: the first 103 - MAX_FRAMES are cut
    assert f"[... {103 - MAX_FRAMES} earlier frames cut ...]" in text
    assert text.endswith("KeyError: 'b'\n")


def test_a_long_traceback_keeps_its_last_bytes_from_a_whole_line():
    exc = _raised(lambda: (_ for _ in ()).throw(ValueError("x" * 3000 + "\n" + "é" * 6000)))
    text = bounded_traceback(exc)
    assert len(text.encode()) <= MAX_BYTES
    assert text.startswith("[... ") and " earlier bytes cut ...]\n" in text
    assert text.endswith("é" * 100 + "\n")


def test_frames_of_the_calling_file_are_skipped_and_nul_is_escaped():
    text = bounded_traceback(_raised(lambda: _descend(0)), skip_file=__file__)
    assert text is None  # every frame is this file's
    exc = _raised(lambda: (_ for _ in ()).throw(RuntimeError("a\x00b")))
    assert "RuntimeError: a\\0b" in bounded_traceback(exc)
    assert bounded_traceback(RuntimeError("never raised")) is None
    assert tracebacks.MAX_BYTES == 8 * 1024
