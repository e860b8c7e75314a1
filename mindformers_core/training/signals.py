"""Ctrl-C and SIGTERM for the trainer's command line, whatever MindSpore does with SIGINT.

MindSpore 2.10 swaps in a SIGINT handler of its own (``SignalGuard``, ccsrc/utils/signal_util.cc): around
every graph launch (``GraphScheduler::Run``, so every jit step) and for the whole life of the PyNative
op-queue threads (``AsyncQueue::WorkerLoop``, ``OpExecutor::WorkerLoop``). That handler logs "receive
KeyboardInterrupt signal" and sends the process SIGTERM, so Ctrl-C would end a run by SIGTERM (exit -15)
instead of the trainer's exit 130 and its message. ``sigaction`` is process-wide, so re-installing
Python's handler cannot win against a guard that is constructed at every graph launch.

So the program entry points (``run_mindformer.py``, ``python -m mindformers_core.run``) block SIGINT and
SIGTERM in the main thread before MindSpore is imported (every thread MindSpore starts inherits the
mask, so no handler of anyone runs for them), and ``SignalRelay`` waits for them on a thread of its own
with ``sigtimedwait``, which also gives the sender (``si_pid``):

* SIGINT (any sender), or a SIGTERM that this process sent itself (MindSpore's converted Ctrl-C, possible
  only where some thread did not inherit the mask): the main thread gets ``KeyboardInterrupt``, as
  Python's own SIGINT handling would give it (exit 130 and the message in ``cli.main``).
* SIGTERM from another process: one line on stderr naming the sender, then the process ends by SIGTERM
  as before (exit -15): msrun and the supervisor end workers with SIGKILL and count any non-zero end as
  the rank's fault, so nothing they expect changes.

Called as a library (``run_mindformer.main([...])`` inside another program, e.g. pytest) nothing is
blocked and the relay is not started: Python's SIGINT handling stays (the trainer re-installs it
after setup, which covers the PyNative queue threads' guard, not a jit graph launch).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import _thread
from typing import Optional

RELAYED = (signal.SIGINT, signal.SIGTERM)


def block_in_this_thread() -> None:
    """Block SIGINT and SIGTERM in the calling thread (and every thread it starts afterwards)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)


def blocked_here() -> bool:
    """True when SIGINT is blocked in the calling thread (an entry point called ``block_in_this_thread``)."""
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _sender(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"process {pid}" + (f" ({cmd[:120]})" if cmd else "")


class SignalRelay:
    """The thread that takes SIGINT/SIGTERM for a process that blocks them (see the module docstring)."""

    def __init__(self, prog: str, poll_s: float = 0.2):
        self.prog, self.poll_s = prog, poll_s
        self.received = []              # (signal number, sender pid), in order
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "SignalRelay":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalRelay.start() must run on the main thread (it owns the signal handlers)")
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.signal(signal.SIGINT, signal.default_int_handler)   # interrupt_main needs a Python handler
        block_in_this_thread()
        self._thread = threading.Thread(target=self._run, name="mfc-signal-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self, unblock: bool = True) -> None:
        """End the relay thread; with ``unblock``, the main thread takes the signals again (signals that
        arrived meanwhile are delivered then, to Python's handlers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)

    def _run(self) -> None:
        while not self._stop.is_set():
            info = signal.sigtimedwait(RELAYED, self.poll_s)
            if info is None:
                continue
            self.received.append((info.si_signo, info.si_pid))
            if info.si_signo == signal.SIGINT:
                _thread.interrupt_main(signal.SIGINT)
            elif info.si_pid == os.getpid():
                print(f"{self.prog}: SIGTERM from this process itself: MindSpore's runtime turns Ctrl-C into "
                      "SIGTERM; treated as Ctrl-C", file=sys.stderr, flush=True)
                _thread.interrupt_main(signal.SIGINT)
            else:
                print(f"{self.prog}: terminated by SIGTERM from {_sender(info.si_pid)}; checkpoints already "
                      "published are complete", file=sys.stderr, flush=True)
                self._die_by_sigterm()
                return

    @staticmethod
    def _die_by_sigterm() -> None:
        """End the process by SIGTERM, as if no one had blocked it (the default action; exit -15)."""
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)   # raises off the main thread; then it is the default
        except ValueError:
            pass
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            os._exit(128 + signal.SIGTERM)                 # someone's Python handler: do not run it off-thread
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)                     # not reached with the default action
