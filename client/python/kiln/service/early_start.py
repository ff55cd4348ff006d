"""Starts the user's kilnd while the program is still starting, so that its
first compile finds kilnd, and a worker of this Python's Triton, ready rather
than paying their start (a second and more under Wine). It begins when
Triton's JIT loads under Kiln (a process about to define kernels), on a thread
of its own, and only where the user's own kilnd does not answer. Where kilnd
runs it takes a socket connect and imports nothing more: a process whose kernels
all come from its local index pays nothing more. Should it fail, the first
compile's connect tries again and says why. KILN_EARLY_START=0 turns it off."""

import _socket  # not socket: its module and the two it imports cost about 15 ms under Wine
import logging
import os
import threading

from kiln.service import paths as _paths

log = logging.getLogger("kiln")

_ANSWER_TIMEOUT = 0.2
_begun = False
_begun_lock = threading.Lock()
_starting = False  # the user's kilnd did not answer, and this process is starting it (or waits for another's start)


def install(_module=None):
    """The installer _after_import runs as triton.runtime.jit loads."""
    begin()


def begin():
    """Starts the thread, once per process."""
    global _begun
    if os.environ.get("KILN_EARLY_START", "1") == "0":
        return
    with _begun_lock:
        if _begun:
            return
        _begun = True
    threading.Thread(target=_start_unless_kilnd_answers, name="kiln-early-start", daemon=True).start()


def starting():
    """Whether this process found the user's own kilnd down and is starting it
    now: a kilnd of this account, which serves it files, is on its way."""
    return _starting


def answers(endpoint):
    """Whether something accepts connections at the endpoint: a socket
    connect, which a listening kilnd accepts at once."""
    target = endpoint.target
    if not target:
        return False
    try:
        if target.startswith("unix:"):
            family, address = _socket.AF_UNIX, target[len("unix:"):]
        else:
            host, _, port = target.rpartition(":")
            # The host as bytes: a str is encoded by the idna codec, whose
            # import (with stringprep and unicodedata) costs about 20 ms under Wine.
            family, _, _, _, address = _socket.getaddrinfo(host.strip("[]").encode("ascii"), int(port), 0,
                                                           _socket.SOCK_STREAM)[0]
        probe = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            probe.settimeout(_ANSWER_TIMEOUT)
            probe.connect(address)
        finally:
            probe.close()
    except (OSError, ValueError):  # UnicodeError is a ValueError
        return False
    return True


def _import_the_client_of_kilnd():
    """Kilnd's client (its transport and API), which the first compile will
    need (kilnd was not running: this process is likely the first to compile
    today). Imported while kilnd starts and the program hashes Triton's files
    for its cache key, which lets go of the GIL."""
    from kiln.service import connection  # noqa: F401


def _start_unless_kilnd_answers():
    global _starting
    try:
        endpoint = _paths.default_endpoint()
        if not endpoint.is_user_default or answers(endpoint):
            return  # KILN_ENDPOINT or the machine's service (not the client's to start), or up already
        _starting = True
        from kiln.service import autostart as _autostart  # only now: kilnd is not up

        # The endpoint is read afresh each time: on Windows a new kilnd writes a new port.
        _autostart.start_user_kilnd(lambda: answers(_paths.default_endpoint()), _import_the_client_of_kilnd)
    except Exception as error:  # noqa: BLE001  (the first compile's connect tries again, and says why)
        log.debug("kilnd not started early: %s", error)
    finally:
        _starting = False
