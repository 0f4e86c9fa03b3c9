"""
How every script stops on Ctrl-C (SIGINT), SIGTERM (kill, a scheduler) and SIGHUP (a closed terminal): one line,
'<script>: error: interrupted by SIGTERM...', exit status 128 + n as a shell reports it, never a traceback, and
nothing half-written left. Imports only the standard library, so a script installs it before torch's import.

  exit_at_once      while a script imports and sets up (nothing to clean): the line, and out at once
  exit_on_signals   during the work: a KeyboardInterrupt in the main thread, so `with` and `finally` clean up as it
                    passes; a second signal, or GRACE_S seconds without stopping, ends it at once after cleanup()
train.py's loop adds one thing, a save at the end of the iteration (parallel.StopSignals: the signal is only noted
there, and answered by the loop). docs/TRAINING.md, "What happens on a crash".
"""

import _thread
import atexit
import os
import signal
import sys
import threading
import time
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
    """The signals a script got (falsy until one comes); stop() ends the script with its line."""


def exit_on_signals(prog=None, cleanup=None, describe=None, insist=True, leave=True):
    """The first signal raises KeyboardInterrupt in the main thread; one that reaches the top is the line,
    '<prog>: error: interrupted by SIGTERM<describe()>'. A library may swallow it (torch's import, a finaliser):
    insist=True raises it again every half second; a script whose cleanup must not be cut short (prepare.py's
    staging folder) passes insist=False and calls check() between chunks of its work. A second signal, or GRACE_S
    seconds without the script stopping, ends the process at once, after cleanup(). Returns the Signals list (a
    script that says the line itself clears it). leave=False (prepare.main called by a test, not run): stop()
    raises SystemExit carrying the line, and nothing ends the process."""
    got, done, one_line = Signals(), threading.Event(), threading.Lock()
    RECEIVED[:] = [got]
    prog = prog or os.path.basename(sys.argv[0])

    def stop(how=""):
        done.set()   # from here on a signal changes nothing
        n = got[0] if got else signal.SIGINT   # a KeyboardInterrupt without a signal is a Ctrl-C all the same
        line = f"{prog}: error: interrupted by {signal.Signals(n).name}{how}{describe() if describe else ''}"
        if not leave:
            raise SystemExit(line)
        one_line.acquire()   # the watcher's end and the main thread at once: the second waits for the exit
        try:
            sys.stdout.flush()   # what was printed stays printed
        except OSError:
            pass
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        os._exit(SIGNALLED + n)   # past the interpreter's exit, which waits for threads still working

    def end(how):   # whatever the main thread is stuck in: clean up and leave now
        if not leave or done.is_set():
            return
        try:
            cleanup and cleanup()
        except OSError:
            pass
        sys.stderr.write("\n")   # a progress bar may stand half-drawn on the last line
        stop(f" ({how})")

    def on_signal(signum, frame):
        if done.is_set():   # stopping already
            return
        got.append(signum)
        if len(got) > 1:
            end(f"then by {signal.Signals(signum).name}")   # the user insists
            raise KeyboardInterrupt
        warnings.simplefilter("ignore")   # what a library warns of as the interrupt unwinds it (numpy's import cut
        if insist:                        # in two, retried by torch's) is noise beside the line
            signal.signal(REPEAT, on_repeat)
        threading.Thread(target=watch, daemon=True).start()
        raise KeyboardInterrupt

    def on_repeat(signum, frame):   # watch's repeat of the first, on a signal of its own: never taken for a second
        if got and not done.is_set():
            raise KeyboardInterrupt

    def watch():
        deadline = time.monotonic() + GRACE_S
        while not done.wait(0.5):
            if not got:   # the script said it itself (sample.py)
                return
            if time.monotonic() > deadline:
                return end(f"{GRACE_S} s after it, still not stopped")
            if insist:
                _thread.interrupt_main(REPEAT)

    def on_uncaught(kind, value, tb):   # after a signal, whatever ends the script is the signal's doing: a library
        if not got and not issubclass(kind, KeyboardInterrupt):   # may turn the KeyboardInterrupt into another
            return sys.__excepthook__(kind, value, tb)            # error (matplotlib's import: a ValueError)
        stop()

    def on_unraisable(what, previous=sys.unraisablehook):   # our KeyboardInterrupt dropped in a finaliser: no
        if not (got and isinstance(what.exc_value, KeyboardInterrupt)):   # "Exception ignored" traceback (the
            previous(what)                                                  # script checks, or watch insists)

    def on_exit():   # a KeyboardInterrupt Python dropped, and the script ran on: the signal is never lost
        if got and leave:
            stop()

    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)
    sys.unraisablehook = on_unraisable
    if leave:
        sys.excepthook = on_uncaught
        atexit.register(on_exit)
    got.stop = stop
    got.done = done
    return got


def check():
    """Between two chunks of work (exit_on_signals with insist=False): KeyboardInterrupt if a signal came."""
    if RECEIVED and RECEIVED[0]:
        raise KeyboardInterrupt
