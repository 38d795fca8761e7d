"""A listener's end, bounded: it stops accepting, lets its associations go on for at
most a grace period, aborts the rest, and exits, whatever a peer or a stuck thread does.

Seen after a CI run: a listener process whose ``serve`` was gone kept running and
ignored SIGTERM (SIGKILL was needed). Its SIGTERM handler only set an event; then
pynetdicom's DUL threads, which are not daemon threads, kept the interpreter alive
while an association sat in the middle of a data set (until the 60 s network timeout,
or for ever with a peer that trickles bytes), and nothing ended the process when its
parent died before ``PR_SET_PDEATHSIG`` was armed. Hence:

- :func:`end_associations`: after the grace period each association still open gets an
  A-ABORT (PS3.8 §7.3.1, A-ABORT service; §9.3.8 PDU) and its connection closed. A data
  set half received is dropped with it (``scp._on_abort``: nothing left in the spool,
  nothing indexed); a C-STORE whose handler is running finishes its store (durable and
  indexed, or not at all) before the archive closes, though its C-STORE-RSP may not get
  out: the SCU then sends it again, and the duplicate policy applies;
- :func:`stop_on_signals_and_parent`: ``serve`` hands each listener the read end of a pipe whose write
  end only ``serve`` holds: when ``serve`` ends in any way (SIGKILL included, even before
  the listener started) the read returns end-of-file. ``PR_SET_PDEATHSIG`` alone can miss
  a parent gone before ``prctl`` ran, and fires when the forking *thread* ends;
- :func:`exit_after`: a watchdog that ends the process (``os._exit``) if the orderly end
  has not finished in time. That is no weaker than the SIGKILL the listener is built to
  survive (tests/dimse/test_crash.py): Success is only sent after the durable commit.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("dicomweb_server.dimse")

#: seconds an aborted association's DUL gets to send the A-ABORT before its socket is shut
ABORT_SEND_WAIT = 1.0
#: seconds, after the grace period, for the aborts, the handlers running and the archive's close
CLOSE_WAIT = 5.0


def end_associations(server, grace: float) -> None:
    """Wait up to ``grace`` seconds for ``server``'s associations to end (released by their
    peer), then abort the rest and join them for at most :data:`CLOSE_WAIT` seconds."""
    deadline = time.monotonic() + max(0.0, grace)
    for assoc in server.active_associations:
        assoc.join(max(0.0, deadline - time.monotonic()))
    left = [a for a in server.active_associations if a.is_alive()]
    if not left:
        return
    log.warning("DIMSE listener stopping: aborting %d association(s) still open after %.0f s", len(left), grace)
    for assoc in left:
        try:
            assoc.abort(block=False)  # A-ABORT queued for its DUL thread; EVT_ABORTED drops a partial data set
        except Exception:  # e.g. not yet associated (Sta2): the socket shutdown below ends it
            log.debug("abort failed", exc_info=True)
    until = time.monotonic() + ABORT_SEND_WAIT
    while time.monotonic() < until and any(a.dul.state_machine.current_state not in ("Sta1", "Sta13") for a in left):
        time.sleep(0.01)  # the DUL threads send their A-ABORT (shutdown only; not a receive path)
    for assoc in left:
        sock = getattr(assoc.dul.socket, "socket", None)
        if sock is not None:
            try:  # a peer that keeps sending would hold the DUL in Sta13 (PS3.8 §9.2, AA-6)
                sock.shutdown(2)  # SHUT_RDWR: wakes the DUL thread's select with end-of-file
            except OSError:
                pass
    until = time.monotonic() + CLOSE_WAIT
    for assoc in left:
        closer = threading.Thread(target=assoc.kill, daemon=True)  # joins its DUL thread
        closer.start()
        closer.join(max(0.0, until - time.monotonic()))
        assoc.join(max(0.0, until - time.monotonic()))  # a handler still storing finishes


def stop_on_signals_and_parent(stop: threading.Event, signals, parent_fd: int | None = None) -> threading.Thread:
    """Set ``stop`` on one of ``signals``, or when the pipe ``parent_fd`` reaches end-of-file
    (its writer, ``serve``, is gone).

    The signal handler only writes a byte to a pipe (async-signal-safe); a thread waiting
    on that pipe and on ``parent_fd`` sets ``stop``. A handler calling ``Event.set`` itself
    deadlocked a listener: when ``serve`` died, the parent pipe's end-of-file set ``stop``
    and PR_SET_PDEATHSIG's SIGTERM arrived while the main thread was re-acquiring the
    event's (non-reentrant) lock in ``Event.wait``; the handler, run in the main thread,
    then waited for that lock for ever, before the watchdog (:func:`exit_after`) was armed.
    """
    import select
    import signal

    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def on_signal(*_) -> None:
        try:
            os.write(wake_w, b"\0")
        except OSError:  # the pipe is full: a wake-up is pending already
            pass

    for sig in signals:
        signal.signal(sig, on_signal)

    def watch() -> None:
        watched = [wake_r] + ([parent_fd] if parent_fd is not None else [])
        while True:
            try:
                ready, _, _ = select.select(watched, [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                break
            try:
                if not os.read(parent_fd, 4096):  # type: ignore[arg-type]
                    # serve stopping in order sends SIGTERM, then closes the pipe: information;
                    # the pipe closed without the signal is serve gone (killed): a warning
                    orderly = select.select([wake_r], [], [], 1.0)[0]
                    log.log(logging.DEBUG if orderly else logging.WARNING,
                            "DIMSE listener: serve (its parent) is gone; stopping")
                    break
            except OSError:
                break
        stop.set()

    t = threading.Thread(target=watch, name="dimse-stop-watch", daemon=True)
    t.start()
    return t


def exit_after(seconds: float, code: int = 1) -> threading.Timer:
    """End the process in ``seconds`` unless it has ended by then (a daemon timer: it keeps
    running while the interpreter waits for non-daemon threads at exit)."""

    def hard_exit() -> None:
        log.error("DIMSE listener did not stop within %.0f s: exiting now", seconds)
        logging.shutdown()
        os._exit(code)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()
    return timer
