"""A child for tests of the pause: it arms POSIX timers that send it SIGCONT within a millisecond of a SIGSTOP (what
lifts the stop) and burns CPU in a thread of its own and in its main thread, until killed. With $SPIN_IDLE set it is
its honest twin: no timer, the same thread asleep. $SPIN_READY names a file it writes once armed."""

import ctypes
import ctypes.util
import os
import signal
import threading
import time

CLOCK_MONOTONIC, SIGEV_SIGNAL = 1, 0


class _SigEvent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_byte * 48)]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


_rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)


def arm_sigcont_timers(period_ns: int = 1_000_000) -> None:
    """Two timers (timer_create(CLOCK_MONOTONIC, SIGEV_SIGNAL SIGCONT)) due half a period and a period ahead, then
    every period, set again every fifth of a period by a thread: while the process runs they never fire, so no SIGCONT
    of theirs is pending when a SIGSTOP comes (a recent kernel drops a timer whose signal the stop flushed); once it is
    stopped they fire. SIGCONT gets a handler: recent kernels park a timer whose signal is ignored (SIGCONT's
    default)."""
    signal.signal(signal.SIGCONT, lambda *_: None)
    timers = []
    for k in range(2):
        timer = ctypes.c_void_p()
        event = _SigEvent(signo=signal.SIGCONT, notify=SIGEV_SIGNAL)
        if _rt.timer_create(CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create")
        timers.append((timer, _ITimerSpec(_TimeSpec(0, period_ns), _TimeSpec(0, period_ns // 2 * (k + 1)))))

    def rearm() -> None:
        while True:
            for timer, spec in timers:
                if _rt.timer_settime(timer, 0, ctypes.byref(spec), None) != 0:
                    raise OSError(ctypes.get_errno(), "timer_settime")
            time.sleep(period_ns / 5e9)

    threading.Thread(target=rearm, daemon=True).start()


def _spin() -> None:
    """Burn the CPU outside the GIL (a ctypes call releases it), so that the timers' thread runs on time."""
    buf = ctypes.create_string_buffer(1 << 20)
    while True:
        ctypes.memset(buf, 0, len(buf))


def _idle() -> None:
    while True:
        time.sleep(0.5)


if __name__ == "__main__":
    if not os.environ.get("SPIN_IDLE"):
        arm_sigcont_timers()
    threading.Thread(target=_idle if os.environ.get("SPIN_IDLE") else _spin, daemon=True).start()
    if os.environ.get("SPIN_READY"):
        with open(os.environ["SPIN_READY"], "w") as f:
            f.write(str(os.getpid()))
    (_idle if os.environ.get("SPIN_IDLE") else _spin)()
