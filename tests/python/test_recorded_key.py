"""triton_key() with libtriton's SHA-256 taken from the wheel's RECORD
(kiln/triton/recorded_key.py): when the record is trusted and when the library
is hashed after all.

The installs here are made by the test: a site-packages with a small library,
its RECORD, and a key function composed as stock's is (its own source, then
the library in 1 MB chunks). The real Triton's key, for each version of the
matrix, is tested against stock's in test_triton_memos.py."""

import base64
import hashlib
import importlib.util
import itertools
import os
import sysconfig
import time

from kiln.triton import recorded_key

KEY_MODULE = '''
import hashlib, os, sysconfig

def triton_key():
    triton_path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(__file__, "rb") as f:
        contents = [hashlib.{own}(f.read()).hexdigest()]
    library = hashlib.{library}()
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    with open(os.path.join(triton_path, "_C", f"libtriton.{{ext}}"), "rb") as f:
        while True:
            chunk = f.read(1024 ** 2)
            if not chunk:
                break
            library.update(chunk)
    contents.append(library.hexdigest())
    return "9.9.9" + "-".join(contents)
'''

_loaded = itertools.count()


def _record_line(relative, content):
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(content)}\n"


class Install:
    """site-packages/triton (runtime/cache.py, _C/libtriton.<ext>) and triton-9.9.9.dist-info/RECORD."""

    def __init__(self, root, library=None, key_module=KEY_MODULE.format(own="sha256", library="sha256")):
        self.site = root / "site-packages"
        self.library = self.site / "triton" / "_C" / f"libtriton.{sysconfig.get_config_var('EXT_SUFFIX').split('.')[-1]}"
        self.library.parent.mkdir(parents=True)
        self.library.write_bytes(os.urandom(3 << 20) if library is None else library)
        self.module_file = self.site / "triton" / "runtime" / "cache.py"
        self.module_file.parent.mkdir()
        self.module_file.write_text(key_module)
        self.record = self.write_record("triton-9.9.9.dist-info", self.library.read_bytes())

    def write_record(self, dist_info, library_content, lines=None):
        record = self.site / dist_info / "RECORD"
        record.parent.mkdir(exist_ok=True)
        record.write_text("triton/runtime/cache.py,,\n" + (
            lines if lines is not None else _record_line("triton/_C/" + self.library.name, library_content)))
        return record

    def triton_key(self):
        spec = importlib.util.spec_from_file_location(f"kiln_test_key_{next(_loaded)}", self.module_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.triton_key


def test_the_key_is_the_hashed_one_with_the_library_digest_from_the_record(tmp_path):
    install = Install(tmp_path)
    triton_key = install.triton_key()
    assert recorded_key.key_without_hashing_libtriton(triton_key) == triton_key()


def test_the_record_is_trusted_not_the_librarys_bytes_while_the_library_is_as_installed(tmp_path):
    # A record whose digest is not the library's, written after it: the key
    # carries the record's digest, which only a library never read gives.
    install = Install(tmp_path)
    claimed = os.urandom(len(install.library.read_bytes()))
    install.write_record("triton-9.9.9.dist-info", claimed)
    key = recorded_key.key_without_hashing_libtriton(install.triton_key())
    assert key.endswith("-" + hashlib.sha256(claimed).hexdigest())


def test_a_library_changed_after_its_record_was_written_is_hashed(tmp_path):
    install = Install(tmp_path)
    triton_key = install.triton_key()
    time.sleep(0.02)  # a later time than the record's, on any file system's clock
    install.library.write_bytes(os.urandom(3 << 20))  # an in-place rebuild, the same size
    assert recorded_key.key_without_hashing_libtriton(triton_key) is None

    # Its modification time set back as `cp -p` or `touch -r` would: on POSIX
    # the change time, which no user can set back, still tells.
    if os.name == "posix":
        written = install.record.stat().st_mtime_ns
        os.utime(install.library, ns=(written - 10**9, written - 10**9))
        assert recorded_key.key_without_hashing_libtriton(triton_key) is None


def test_a_record_that_does_not_fit_the_library_is_not_used(tmp_path):
    install = Install(tmp_path)
    triton_key = install.triton_key()
    content = install.library.read_bytes()

    install.write_record("triton-9.9.9.dist-info", content + b"-")  # another size
    assert recorded_key.recorded_sha256(install.library) is None

    install.write_record("triton-9.9.9.dist-info", content, lines="")  # an editable install lists no library
    assert recorded_key.recorded_sha256(install.library) is None

    install.write_record("triton-9.9.9.dist-info", content, lines=f"triton/_C/{install.library.name},,{len(content)}\n")
    assert recorded_key.recorded_sha256(install.library) is None  # a record without digests

    install.write_record("triton-9.9.9.dist-info", content)
    assert recorded_key.key_without_hashing_libtriton(triton_key) == triton_key()


def test_two_records_of_the_library_must_agree(tmp_path):
    install = Install(tmp_path)
    content = install.library.read_bytes()
    install.write_record("triton_windows-9.9.9.dist-info", content)
    assert recorded_key.recorded_sha256(install.library) == hashlib.sha256(content).hexdigest()

    install.write_record("pytorch_triton-9.9.9.dist-info", os.urandom(len(content)))
    assert recorded_key.recorded_sha256(install.library) is None


def test_a_triton_that_digests_the_library_otherwise_hashes_it(tmp_path):
    # The library's bytes go to a digest the record cannot stand for: the
    # marker that stands in for them must never reach a key.
    install = Install(tmp_path, key_module=KEY_MODULE.format(own="sha256", library="sha1"))
    assert recorded_key.key_without_hashing_libtriton(install.triton_key()) is None
