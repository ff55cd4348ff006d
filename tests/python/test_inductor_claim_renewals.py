"""The renewal of inductor graph claims (kiln/inductor/claims.py), alone: no
kilnd, a renew function of the test's own that answers as kilnd would."""

import logging
import threading
import time

from kiln.inductor import claims

LAPSE = "ended in kilnd while compiling"


class FakeCall:
    """An open LookupOrClaim call: only its cancel() is used."""

    def __init__(self):
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class Renewal:
    """A renew() that waits, once entered, until the test lets it answer None:
    the claim is gone in kilnd."""

    def __init__(self):
        self.entered = threading.Event()
        self.answer = threading.Event()
        self.answered = threading.Event()

    def __call__(self):
        self.entered.set()
        assert self.answer.wait(10)
        self.answered.set()
        return None


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _held_with_a_renewal_in_flight(key):
    """In a compile's scope: key claimed, and its first renewal asked."""
    renewal = Renewal()
    call = FakeCall()
    claims.hold(key, call, lapses_in=0.03, renew=renewal)  # renewed 10 ms from now
    assert renewal.entered.wait(10)
    return call, renewal


def _logged_while(action):
    logger = logging.getLogger("kiln")
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    try:
        with claims.claim_scope(claims.GRAPHS):
            action(records.messages)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    return records.messages


def test_a_renewal_answered_after_the_process_stored_the_key_is_no_lapse():
    def store_while_a_renewal_is_in_flight(messages):
        call, renewal = _held_with_a_renewal_in_flight("stored-key")
        claims.storing("stored-key")  # the put is on its way; kilnd ends the claim at the store
        renewal.answer.set()
        assert renewal.answered.wait(10)
        # Time for the renewer to take the answer (microseconds) before the
        # put's release: what a loaded machine's scheduling can give it.
        time.sleep(0.2)
        claims.release("stored-key")
        assert call.cancelled

    messages = _logged_while(store_while_a_renewal_is_in_flight)
    assert not [m for m in messages if LAPSE in m], messages


def test_a_claim_that_ends_in_kilnd_while_the_process_compiles_is_still_a_lapse():
    def lapse(messages):
        _, renewal = _held_with_a_renewal_in_flight("lapsed-key")
        renewal.answer.set()
        deadline = time.monotonic() + 10
        while not [m for m in messages if LAPSE in m] and time.monotonic() < deadline:
            time.sleep(0.01)
        claims.release("lapsed-key")

    messages = _logged_while(lapse)
    assert [m for m in messages if LAPSE in m and "lapsed-key" in m], messages
