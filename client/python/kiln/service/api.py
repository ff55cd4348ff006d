"""kilnd's API (proto/kiln/v1/kiln.proto) without generated code.

The package ships the API's compiled descriptor (kiln_v1.desc, made by
`protoc --descriptor_set_out`), and kiln.service.wire builds the message
classes from it at import: no protobuf runtime, whose version other packages
of the client's environment (ComfyUI's nodes, torch) may pin, and whose import
cost more than the rest of the client under Wine.
"""

import hashlib
import os

from kiln.service import wire

with open(os.path.join(os.path.dirname(__file__), "kiln_v1.desc"), "rb") as _descriptor_set:
    try:
        _MESSAGES, _ENUMS = wire.message_classes(_descriptor_set.read())
    except wire.DecodeError as _error:
        raise ImportError(f"kiln_v1.desc is damaged ({_error}); reinstall the kiln package") from None


def _message(name):
    return _MESSAGES[f"kiln.v1.{name}"]


def _enum_values(name):
    return _ENUMS[f"kiln.v1.{name}"]


Blob = _message("Blob")
CacheEntry = _message("CacheEntry")
LookupRequest = _message("LookupRequest")
LookupResponse = _message("LookupResponse")
PutRequest = _message("PutRequest")
PutResponse = _message("PutResponse")
PutManyRequest = _message("PutManyRequest")
PutManyResponse = _message("PutManyResponse")
RecordHitsRequest = _message("RecordHitsRequest")
RecordHitsResponse = _message("RecordHitsResponse")
Target = _message("Target")
CompileRequest = _message("CompileRequest")
CompileResponse = _message("CompileResponse")
CompileError = _message("CompileError")
PythonAbi = _message("PythonAbi")
LauncherOrigin = _message("LauncherOrigin")
BuildLauncherRequest = _message("BuildLauncherRequest")
BuildLauncherResponse = _message("BuildLauncherResponse")
GetStatsRequest = _message("GetStatsRequest")
GetStatsResponse = _message("GetStatsResponse")
ListToolchainsRequest = _message("ListToolchainsRequest")
ListToolchainsResponse = _message("ListToolchainsResponse")
EvictRequest = _message("EvictRequest")
EvictResponse = _message("EvictResponse")
VerifyRequest = _message("VerifyRequest")
VerifyResponse = _message("VerifyResponse")
KeyComponents = _message("KeyComponents")
ListMissesRequest = _message("ListMissesRequest")
ListMissesResponse = _message("ListMissesResponse")
ListEntriesRequest = _message("ListEntriesRequest")
ListEntriesResponse = _message("ListEntriesResponse")
BundleEntry = _message("BundleEntry")
PrewarmRequest = _message("PrewarmRequest")
PrewarmResponse = _message("PrewarmResponse")
CompileInductorKernelRequest = _message("CompileInductorKernelRequest")
CompileInductorKernelResponse = _message("CompileInductorKernelResponse")

STAGE = _enum_values("Stage")


def blob(name, data, digest=None):
    """A Blob carrying `data`, with its SHA-256 (computed unless given) and size."""
    return Blob(name=name, data=data, sha256=digest or hashlib.sha256(data).digest(), size=len(data))

PRIORITY = _enum_values("Priority")

_METHODS = {
    "Lookup": (LookupRequest, LookupResponse),
    "Put": (PutRequest, PutResponse),
    "PutMany": (PutManyRequest, PutManyResponse),
    "RecordHits": (RecordHitsRequest, RecordHitsResponse),
    "Compile": (CompileRequest, CompileResponse),
    "BuildLauncher": (BuildLauncherRequest, BuildLauncherResponse),
    "GetStats": (GetStatsRequest, GetStatsResponse),
    "ListToolchains": (ListToolchainsRequest, ListToolchainsResponse),
    "Evict": (EvictRequest, EvictResponse),
    "Verify": (VerifyRequest, VerifyResponse),
    "ListEntries": (ListEntriesRequest, ListEntriesResponse),
    "ListMisses": (ListMissesRequest, ListMissesResponse),
    "Prewarm": (PrewarmRequest, PrewarmResponse),
    "CompileInductorKernel": (CompileInductorKernelRequest, CompileInductorKernelResponse),
}
# Methods that answer with a stream.
_STREAMING_METHODS = {
    "LookupOrClaim": (LookupRequest, LookupResponse),
}

# Every call ends by its deadline, the caller's or else its method's here.
# kilnd answers the quick ones in milliseconds: their deadline bounds a kilnd
# whose transport answers and whose handlers do not (a deadlock). Those that
# compile, or wait on another process's compile, may take minutes: they end at
# kilnd's own compile limit (compile_timeout_seconds, 10 min) and a margin,
# and a kilnd that stops answering ends them long before, by liveness (PINGs
# on this machine's connection, gRPC keepalive on a farm's). A claim's
# LookupOrClaim has liveness only: kilnd holds the claim for as long as the
# call lasts, and its holder may compile for longer than any deadline (an
# inductor graph); its lookup's wait ends at kilnd's own compile limit.
QUICK_DEADLINE = 10.0
_WRITE_DEADLINE = 60.0
_COMPILE_DEADLINE = 900.0
_DEADLINES = {
    "Put": _WRITE_DEADLINE, "PutMany": _WRITE_DEADLINE, "ListEntries": _WRITE_DEADLINE,
    "BuildLauncher": 300.0, "Evict": 300.0,
    "Compile": _COMPILE_DEADLINE, "CompileInductorKernel": _COMPILE_DEADLINE, "Prewarm": _COMPILE_DEADLINE,
    "LookupOrClaim": None, "Verify": _COMPILE_DEADLINE,
}


class _WithDeadline:
    """A method of a channel whose calls get `seconds` as their deadline
    (None: none, liveness only) unless the caller gives one."""

    __slots__ = ("_method", "_seconds")

    def __init__(self, method, seconds):
        self._method, self._seconds = method, seconds

    def __call__(self, request, timeout=None, metadata=None):
        return self._method(request, timeout=self._seconds if timeout is None else timeout, metadata=metadata)

    def future(self, request, timeout=None, metadata=None):
        return self._method.future(request, timeout=self._seconds if timeout is None else timeout,
                                   metadata=metadata)


class KilnStub:
    """kiln.v1.Kiln's methods on a channel (local_grpc's, or a grpc channel),
    e.g. stub.Lookup(request, timeout=5)."""

    def __init__(self, channel):
        for methods, make in ((_METHODS, channel.unary_unary), (_STREAMING_METHODS, channel.unary_stream)):
            for method, (request, response) in methods.items():
                setattr(self, method, _WithDeadline(
                    make(f"/kiln.v1.Kiln/{method}", request_serializer=request.SerializeToString,
                         response_deserializer=response.FromString),
                    _DEADLINES.get(method, QUICK_DEADLINE)))

    def start_call(self, method, request):
        """Starts a unary call without waiting for it: a future of its answer (result(), cancel())."""
        return getattr(self, method).future(request)
