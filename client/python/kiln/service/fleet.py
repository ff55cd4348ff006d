"""Several kilnds behind one KILN_ENDPOINT: which kilnd each call goes to.

Every call about one cache key goes to the same kilnd, the one that key ranks
first (rendezvous hashing over the kilnds' addresses), so the lookup, the claim
and the compile of one kernel, from every client of the fleet, meet on one
kilnd: its claim makes the others wait instead of running Triton's frontend
too, and its cache has the entry the next lookup asks for. Different keys
spread over the fleet. Round robin per call would scatter them: a client's
claim on one kilnd and its compile on another leave the claim's waiters with
nothing, and each runs the frontend itself.

A kilnd that cannot be reached is passed over for a while, and a call that
finds its kilnd gone (UNAVAILABLE before any answer) is made again on the
key's next kilnd."""

import hashlib
import random
import time

from kiln.service.errors import RpcError, StatusCode
from kiln.service.grpc_runtime import grpc

# How long a kilnd that failed a call is passed over before it is tried again.
_PASS_OVER_SECONDS = 5.0
_STREAMING = frozenset({"LookupOrClaim"})


def affinity_key(request):
    """What a request is about: its cache key, or the launcher source it builds;
    empty for calls about nothing in particular (stats, hits, toolchains)."""
    for field in ("key", "cache_key", "c_source"):
        value = getattr(request, field, "")
        if value:
            return value
    return ""


def _unavailable(error):
    return isinstance(error, RpcError) and error.code() is StatusCode.UNAVAILABLE


class Member:
    """One kilnd of the fleet: its address, channel and stub, and whether it answers."""

    def __init__(self, address, channel, stub):
        self.address = address
        self.channel = channel
        self.stub = stub
        self.passed_over_until = 0.0
        self.state = None
        channel.subscribe(self._on_state, try_to_connect=True)

    def _on_state(self, state):
        self.state = state

    def usable(self, now):
        return now >= self.passed_over_until and self.state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE

    def failed(self):
        self.passed_over_until = time.monotonic() + _PASS_OVER_SECONDS


class FleetStub:
    """A KilnStub over several kilnds, routing each call by its request's key."""

    def __init__(self, members):
        self._members = members
        # Calls about nothing in particular start from a kilnd of this process's
        # own choosing, so many processes spread them.
        self._any = random.Random().sample(members, len(members))

    def ranked(self, key):
        """The kilnds in the order `key` tries them: usable ones first."""
        if key:
            digest = key.encode() if isinstance(key, str) else key
            order = sorted(self._members, reverse=True,
                           key=lambda m: hashlib.sha256(m.address.encode() + b"\0" + digest).digest())
        else:
            order = list(self._any)
        now = time.monotonic()
        # Asked once per member: a channel state changing between two asks would
        # have dropped the member from the order, or listed it twice.
        usable = {id(m): m.usable(now) for m in order}
        return sorted(order, key=lambda m: not usable[id(m)])  # stable: the key's order within each

    def start_call(self, method, request):
        """Starts a unary call on the request's first usable kilnd, without
        waiting for it and without moving on to another if that one is gone."""
        return self.ranked(affinity_key(request))[0].stub.start_call(method, request)

    def __getattr__(self, method):
        def call(request, *args, **kwargs):
            order = self.ranked(affinity_key(request))
            for index, member in enumerate(order):
                last = index == len(order) - 1
                try:
                    if method in _STREAMING:
                        return _FirstAnswer(getattr(member.stub, method)(request, *args, **kwargs))
                    return getattr(member.stub, method)(request, *args, **kwargs)
                except RpcError as error:
                    if not _unavailable(error) or last:
                        raise
                    member.failed()
        return call


class _FirstAnswer:
    """A streaming call whose first answer has been awaited, so that a kilnd
    gone before answering fails it at once (and FleetStub tries the next);
    then it reads like the call it wraps."""

    def __init__(self, call):
        self._call = call
        self._first = next(call, _FirstAnswer)  # raises the RpcError of a kilnd that is gone

    def __iter__(self):
        return self

    def __next__(self):
        if self._first is not None:
            first, self._first = self._first, None
            if first is _FirstAnswer:
                raise StopIteration
            return first
        return next(self._call)

    def __getattr__(self, name):
        return getattr(self._call, name)
