"""kilnd's API (proto/kiln/v1/kiln.proto) without generated code.

The package ships the API's compiled descriptor (kiln_v1.desc, made by
`protoc --descriptor_set_out`) and builds the message classes from it at
import, in a private descriptor pool. Generated _pb2 modules would pin the
protobuf runtime to the generator's version; this works with any protobuf from
3.20 on, whatever else the client's environment (ComfyUI, torch) has installed.
"""

import hashlib
import os

from google.protobuf import descriptor_pool, message_factory


def _serialized_files(descriptor_set):
    """The FileDescriptorProtos of a serialized FileDescriptorSet, whose only
    field is `repeated FileDescriptorProto file = 1`: split by hand, because
    importing descriptor_pb2 to parse it costs more than the rest of this
    module, on the first cache miss of every process."""
    position = 0
    while position < len(descriptor_set):
        if descriptor_set[position] != 0x0A:  # field 1, length-delimited
            raise ValueError("kiln_v1.desc is not a FileDescriptorSet; reinstall the kiln package")
        position += 1
        size = shift = 0
        while True:
            byte = descriptor_set[position]
            position += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        yield descriptor_set[position:position + size]
        position += size


_POOL = descriptor_pool.DescriptorPool()
with open(os.path.join(os.path.dirname(__file__), "kiln_v1.desc"), "rb") as _descriptor_set:
    for _file in _serialized_files(_descriptor_set.read()):
        _POOL.AddSerializedFile(_file)


def _message(name):
    descriptor = _POOL.FindMessageTypeByName(f"kiln.v1.{name}")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(_POOL).GetPrototype(descriptor)


def _enum_values(name):
    return {value.name: value.number for value in _POOL.FindEnumTypeByName(f"kiln.v1.{name}").values}


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
    """kiln.v1.Kiln's methods on a grpc channel, e.g. stub.Lookup(request, timeout=5)."""

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
        """Starts a unary call without waiting for it: a grpc.Future of its answer."""
        return getattr(self, method).future(request)
