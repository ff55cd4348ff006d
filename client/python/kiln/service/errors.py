class KilnUnavailable(RuntimeError):
    """kilnd cannot be reached and KILN_STRICT forbids compiling without it."""


class StatusCode:
    """A gRPC status (grpc.StatusCode's names and numbers), without grpc."""

    def __init__(self, value, name):
        self.value, self.name = value, name

    def __repr__(self):
        return f"StatusCode.{self.name}"


_CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
               "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
               "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
STATUS_CODES = tuple(StatusCode(value, name) for value, name in enumerate(_CODE_NAMES))
for _code in STATUS_CODES:
    setattr(StatusCode, _code.name, _code)


def status_code(value):
    """The StatusCode numbered `value`; UNKNOWN for a number gRPC does not define."""
    return STATUS_CODES[value] if 0 <= value < len(STATUS_CODES) else StatusCode.UNKNOWN


class RpcError(Exception):
    """A call to kilnd that ended without its answer: kilnd's status, or what
    failed on the way (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED). Raised for
    calls over either transport (kiln.service.local_grpc, or grpcio's for TLS
    and fleets), with grpc.RpcError's code() and details()."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details
