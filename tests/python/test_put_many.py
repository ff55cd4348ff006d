"""PutMany: many entries a call, as bulk writers (kiln import, a farm's sync)
store them, each stored or refused on its own, through a real kilnd."""

import grpc
import pytest

from kiln.service import api as _api

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes


def put_request(key, data, name="k.cubin"):
    return _api.PutRequest(namespace="triton", key=key, blobs=[_api.blob(name, data)], serve_as_files=False)


def test_each_entry_is_stored_or_refused_on_its_own_and_the_stored_ones_are_served(kilnd):
    bad_digest = put_request("bulk-damaged", b"bytes in transit")
    bad_digest.blobs[0].sha256 = b"\x01" * 32
    entries = [put_request(f"bulk-{i}", bytes([i]) * (1000 + i)) for i in range(40)]
    entries[3] = _api.PutRequest(namespace="triton", key="bulk-empty")  # no blobs
    entries[20] = bad_digest
    response = kilnd.stub.PutMany(_api.PutManyRequest(entries=entries), timeout=60)

    assert len(response.results) == len(entries)
    codes = [result.code for result in response.results]
    assert codes[3] == grpc.StatusCode.INVALID_ARGUMENT.value[0], response.results[3]
    assert "no blobs" in response.results[3].message
    assert codes[20] == grpc.StatusCode.INVALID_ARGUMENT.value[0], response.results[20]
    assert "SHA-256" in response.results[20].message
    assert [i for i, code in enumerate(codes) if code != 0] == [3, 20]
    for i, entry in enumerate(entries):
        found = kilnd.stub.Lookup(_api.LookupRequest(namespace="triton", key=entry.key), timeout=30)
        assert found.found == (i not in (3, 20)), entry.key
        if found.found:
            assert [blob.data for blob in found.entry.blobs] == [bytes([i]) * (1000 + i)]


def test_a_call_over_ten_thousand_entries_is_refused_whole_naming_the_limit(kilnd):
    entries = [put_request(f"too-many-{i}", b"x") for i in range(10001)]
    with pytest.raises(grpc.RpcError) as error:
        kilnd.stub.PutMany(_api.PutManyRequest(entries=entries), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 10,000 entries a call" in error.value.details()
    found = kilnd.stub.Lookup(_api.LookupRequest(namespace="triton", key="too-many-0"), timeout=30)
    assert not found.found
