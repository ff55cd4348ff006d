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


class KilnStub:
    """kiln.v1.Kiln's methods on a channel (local_grpc's, or a grpc channel),
    e.g. stub.Lookup(request, timeout=5)."""

    def __init__(self, channel):
        for method, (request, response) in _METHODS.items():
            setattr(self, method, channel.unary_unary(f"/kiln.v1.Kiln/{method}",
                                                      request_serializer=request.SerializeToString,
                                                      response_deserializer=response.FromString))
        for method, (request, response) in _STREAMING_METHODS.items():
            setattr(self, method, channel.unary_stream(f"/kiln.v1.Kiln/{method}",
                                                       request_serializer=request.SerializeToString,
                                                       response_deserializer=response.FromString))

    def start_call(self, method, request):
        """Starts a unary call without waiting for it: a future of its answer (result(), cancel())."""
        return getattr(self, method).future(request)
