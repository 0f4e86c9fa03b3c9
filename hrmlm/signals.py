"""How a script stops: on bad input a UserError, raised where it is found, is one line '<prog>: error: <what>' and
exit status 2 at its entry point; on SIGINT, SIGTERM or SIGHUP one line and 128 + n. The standard library only:
guard() first thing (a signal raised through torch's import can abort), then main(); train.py: a flag."""

import os
import signal
import sys

IO_ERROR, BAD_INPUT, DIVERGED, SIGNALLED = 1, 2, 3, 128   # exit statuses: a write failed, bad input, non-finite, 128+n
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
received = []   # the stop signals this process got, in order


class UserError(ValueError):
    """A problem with the user's input (or the machine's: a full disk): str() is the line, status the exit status."""
    def __init__(self, line, status=BAD_INPUT):
        super().__init__(line)
        self.status = status


def install(handler):   # for each stop signal; nohup's ignored SIGHUP stays ignored
    for s in STOP_SIGNALS:
        signal.signal(s, handler) if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN else None


def leave(prog, note="", speak=True):   # the line, and out at once (os._exit: nothing on the way can raise or block)
    install(signal.SIG_IGN)   # one line: a signal now cannot start another
    n = received[0] if received else signal.SIGINT   # a KeyboardInterrupt without a signal: a Ctrl-C all the same
    then = f" (then by {signal.Signals(received[1]).name})" if len(received) > 1 else ""
    sys.stdout.flush()   # stderr is line-buffered: its line is out before the exit
    print(f"{prog}: error: interrupted by {signal.Signals(n).name}{then}{note}", file=sys.stderr) if speak else None
    os._exit(SIGNALLED + n)


def guard(prog, note="", speak=True, first=None):
    """A signal: the line, out at once (an import too). With `first` (train.py's loop) the first is only said and kept."""
    def on_signal(n, frame):
        received.append(n)
        leave(prog, note, speak) if first is None or len(received) > 1 else None
        print(f"{prog}: {signal.Signals(n).name}: {first}", file=sys.stderr, flush=True) if speak else None
    install(on_signal)


def main(fn, prog=None, note=""):
    """fn(), a script's work: a signal raises KeyboardInterrupt (`finally` cleans up), then the line; a UserError its."""
    prog = prog or os.path.basename(sys.argv[0])

    def on_signal(n, frame):
        received.append(n)
        if received[1:]:   # a repeat waits while an exception is handled (a `finally` cleaning up); with none, a
            return None if sys.exc_info()[0] else leave(prog, note)   # library swallowed the first: out at once
        raise KeyboardInterrupt
    install(on_signal)
    try:
        try:
            fn()
        finally:
            install(signal.SIG_IGN)   # done or stopped: a signal now changes nothing
    except KeyboardInterrupt:   # also one that lands as fn returns or raises, before SIG_IGN
        leave(prog, note)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.status)
