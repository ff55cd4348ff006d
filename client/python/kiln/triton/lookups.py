"""A kernel's entry asked of kilnd, and the files of a hit: kilnd's served
files, or files written here from the bytes it sent."""

import logging

from kiln.local import files as _files
from kiln.local import index as _index
from kiln.service import api as _api
from kiln.service import connection as _service
from kiln.triton import keys as _keys

log = logging.getLogger("kiln")


def hit_files(namespace, key, entry):
    """{name: path} of a hit: kilnd's served files (which kilnd indexes itself),
    or files written here from the bytes it sent (indexed here)."""
    files = {blob.name: _files.path_of(blob) for blob in entry.blobs}
    if not all(blob.path for blob in entry.blobs):
        _index.record(namespace, key, files)
    return files


def lookup(namespace, key):
    """A unary Lookup, asking for kilnd's served files where this process may read them."""
    response = _service.connect().stub.Lookup(_api.LookupRequest(namespace=namespace, key=key,
                                                                  as_files=_files.wanted_as_served_files()))
    if response.found and not _files.readable_served(response.entry):
        response = _service.connect().stub.Lookup(_api.LookupRequest(namespace=namespace, key=key))
    return response


def path_in_kilnd(kernel_key, file_name):
    """The path of `file_name` of the kernel Triton keys `kernel_key`, as kilnd
    has it now (its served file, or one written here); None when kilnd has no
    such file or cannot be reached."""
    hex_key = _keys.hex_key(kernel_key)
    try:
        response = lookup("triton", hex_key)
    except (_service.RpcError, _service.KilnUnavailable) as error:
        log.debug("%s of %s not asked of kilnd again: %s", file_name, hex_key, error)
        return None
    if not response.found:
        return None
    return hit_files("triton", hex_key, response.entry).get(file_name)
