"""
How every script stops on Ctrl-C (SIGINT), SIGTERM (kill, a scheduler) and SIGHUP (a closed terminal): one line,
'<script>: error: interrupted by SIGTERM...', exit status 128 + n as a shell reports it, never a traceback, and
nothing half-written left. Standard library only, so a script installs it before torch's import: exit_at_once
while it imports and sets up, exit_on_signals during the work (docs/TRAINING.md, "What happens on a crash").
"""

import _thread
import atexit
import contextlib
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings

SIGNALLED = 128   # a script stopped by signal n exits with 128 + n, as a shell reports it
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 10      # after a signal, how long the orderly stop may take before the process ends itself
REPEAT = signal.SIGUSR2   # after a stop signal, exit_on_signals raises it again through this one (insist)
RECEIVED = []     # the signals the running script got (exit_on_signals): check() reads them


def exit_at_once(prog, note, speak=True):
    """Until the work starts: a signal prints '<prog>: error: interrupted by SIG...<note>' (speak: torchrun's rank 0
    only) and leaves at once (os._exit: an exception raised inside an import or a finaliser prints a traceback)."""
    def on_signal(signum, frame):
        if speak:
            print(f"{prog}: error: interrupted by {signal.Signals(signum).name}{note}", file=sys.stderr, flush=True)
        os._exit(SIGNALLED + signum)
    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)


class Signals(list):
    """The signals a script got (falsy until one comes); stop() ends the script; clear(): it said so itself."""

    def clear(self):
        super().clear()
        self.done.set()


def exit_on_signals(prog=None, cleanup=None, describe=None, insist=True, leave=True, defer=None, speak=True):
    """The first signal raises KeyboardInterrupt in the main thread, so `with` and `finally` clean up; at the top it
    is the line '<prog>: error: interrupted by SIGTERM<describe()>'. Inside an import (torch's pybind11 code may abort
    on it) cleanup() and the line come at once instead. A library may swallow it: insist raises it again every half
    second, or (insist=False: prepare.py's staging folder) the script calls check() between chunks. defer
    (train.py's loop): the first is only noted and `defer` printed. A second signal, or GRACE_S s without stopping
    (not with defer), ends the process after cleanup(), even inside a long C call where no handler runs: a thread
    reads the wakeup fd. speak=False (torchrun's ranks but 0): no line. leave=False (prepare.main called by a
    test): stop() raises SystemExit carrying the line. Returns the Signals list."""
    got, done, one_line = Signals(), threading.Event(), threading.Lock()
    got.done, RECEIVED[:] = done, [got]
    prog = prog or os.path.basename(sys.argv[0])

    def stop(how=""):
        done.set()   # from here on a signal changes nothing
        n = got[0] if got else signal.SIGINT   # a KeyboardInterrupt without a signal is a Ctrl-C all the same
        line = f"{prog}: error: interrupted by {signal.Signals(n).name}{how}{describe() if describe else ''}"
        if not leave:
            raise SystemExit(line)
        one_line.acquire()   # the watcher's end and the main thread at once: the second waits for the exit
        with contextlib.suppress(OSError, ValueError):   # a closed pipe or terminal (SIGHUP's): leave all the same
            sys.stdout.flush()   # what was printed stays printed
            if speak:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
        os._exit(SIGNALLED + n)   # past the interpreter's exit, which waits for threads still working

    def end(first, how=""):   # whatever the main thread is stuck in (a long C call: its handler never ran): leave now
        if done.is_set():
            return
        if not got:
            got.append(first)
        with contextlib.suppress(OSError):
            cleanup and cleanup()
        stop(f" ({how})" if how else "")

    def importing(frame):   # a KeyboardInterrupt raised through torch's import (pybind11) can abort the process
        stack = traceback.walk_stack(frame)
        return leave and any(f.f_code.co_filename.startswith("<frozen importlib") for f, _ in stack)

    def on_signal(signum, frame):
        if done.is_set() or got:   # stopping already, or a second one (the watcher ends the process)
            return
        got.append(signum)
        if defer:
            return
        if importing(frame):   # SIGABRT and no line: leave now instead (an import writes nothing)
            end(signum)
        warnings.simplefilter("ignore")   # what a library warns of as the interrupt unwinds it (numpy's import cut
        if insist:                        # in two, retried by torch's) is noise beside the line
            signal.signal(REPEAT, on_repeat)
        raise KeyboardInterrupt

    def on_repeat(signum, frame):   # watch's repeat of the first, on a signal of its own: never taken for a second
        if got and not done.is_set():
            if importing(frame):
                end(got[0])
            raise KeyboardInterrupt

    def watch(r):
        first, deadline = None, None
        while True:   # asleep until a signal; then, where a deadline or repeats are due, awake each half second
            waiting = first is not None and not defer and not done.is_set()
            ready = select.select([r], [], [], 0.5 if waiting else None)[0]
            for signum in os.read(r, 64) if ready else b"":
                if signum not in STOP_SIGNALS or done.is_set():
                    continue
                if first is not None:
                    end(first, f"then by {signal.Signals(signum).name}")   # the user insists
                    continue
                first, deadline = signum, time.monotonic() + GRACE_S
                if defer and speak:
                    with contextlib.suppress(OSError, ValueError):   # a closed terminal: the watcher stays for a second
                        sys.stderr.write(f"{prog}: {signal.Signals(signum).name}: {defer}\n")
            if first is None or defer or done.is_set():
                continue
            if time.monotonic() > deadline:
                end(first, f"{GRACE_S} s after it, still not stopped")
            elif insist and got:
                _thread.interrupt_main(REPEAT)

    def on_uncaught(kind, value, tb):   # after a signal, whatever ends the script is the signal's doing: a library
        if not got and not issubclass(kind, KeyboardInterrupt):   # may turn the KeyboardInterrupt into another
            return sys.__excepthook__(kind, value, tb)            # error (matplotlib's import: a ValueError)
        done.set()   # no repeat lands in here
        stop()

    def on_unraisable(what, previous=sys.unraisablehook):   # our KeyboardInterrupt dropped in a finaliser: no
        if not (got and isinstance(what.exc_value, KeyboardInterrupt)):   # "Exception ignored" traceback (the
            previous(what)                                                  # script checks, or watch insists)

    if leave:   # the fd before the handlers: no signal is handled without its byte
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=watch, args=(r,), daemon=True).start()
    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)
    sys.unraisablehook = on_unraisable
    if leave and not defer:   # train.py's loop ends itself, with its own line
        sys.excepthook = on_uncaught
        atexit.register(lambda: got and stop())   # a KeyboardInterrupt Python dropped: the signal is never lost
    got.stop = stop
    return got


def check():
    """Between two chunks of work (exit_on_signals with insist=False): KeyboardInterrupt if a signal came."""
    if RECEIVED and RECEIVED[0]:
        raise KeyboardInterrupt
