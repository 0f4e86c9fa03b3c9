"""
The signals that stop a script, and how a script with nothing to save stops on them. Imports only the standard
library, so a script installs it before torch's import (seconds) and the runners' --tables need no torch.

train.py (parallel.StopSignals) and prepare.py (its Interrupts) answer the same STOP_SIGNALS in their own way:
a save at the end of the iteration; the old dataset kept. docs/TRAINING.md, "What happens on a crash".
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
# Ctrl-C; kill or a scheduler; a closed terminal or a dropped ssh session
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_on_signals(prog=None):
    """Ctrl-C, SIGTERM or SIGHUP, at any moment, ends the script with one line, '<prog>: error: interrupted by
    SIGTERM', and exit status 128 + n, never a traceback. The signal raises KeyboardInterrupt in the main thread,
    so `with` and `finally` blocks clean up as it passes (subprocess.run kills its child); one that reaches the
    top is that line. Returns the list of signals received (a script may check it where Python could drop the
    exception, in a finaliser)."""
    got = []

    def on_signal(signum, frame):
        got.append(signum)
        if len(got) == 1:   # what a library warns of as the interrupt unwinds it (numpy's import cut in two
            warnings.simplefilter("ignore")   # and retried by torch's) is noise beside the one line
            threading.Thread(target=insist, daemon=True).start()
        raise KeyboardInterrupt

    def insist():   # a library may swallow the KeyboardInterrupt (torch's import, a finaliser): raise it again
        for _ in range(20):
            time.sleep(0.5)
            if not got:   # the script said it itself (sample.py)
                return
            _thread.interrupt_main(got[0])
        stop()   # 10 s on and still running: leave

    def stop():
        n = got[0] if got else signal.SIGINT
        try:
            sys.stdout.flush()   # what was printed stays printed
        except OSError:
            pass
        sys.stderr.write(f"{prog or os.path.basename(sys.argv[0])}: error: interrupted by {signal.Signals(n).name}\n")
        sys.stderr.flush()
        os._exit(SIGNALLED + n)   # past the interpreter's exit: an uncaught exception's status is 1

    def on_uncaught(kind, value, tb):   # after a signal, whatever ends the script is the signal's doing: a library
        if not got and not issubclass(kind, KeyboardInterrupt):   # may turn the KeyboardInterrupt into another
            return sys.__excepthook__(kind, value, tb)            # error (matplotlib's import: a ValueError)
        stop()

    def on_exit():   # a KeyboardInterrupt Python dropped (raised in a finaliser or an import lock's callback):
        if got:      # the script ran on, but the signal is never lost
            stop()

    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)
    sys.excepthook = on_uncaught
    atexit.register(on_exit)
    return got
