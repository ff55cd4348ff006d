"""Makes a platform wheel of kiln-triton from its pure-Python wheel: the same
package plus kilnd, kiln and the worker under kiln/bin/ (where the client looks
for the kilnd of its wheel), tagged for one platform. scripts/build-wheels
runs it; on Linux auditwheel then brings the shared libraries in.

    platform_wheel.py PURE_WHEEL PLATFORM OUTDIR NAME=PATH...

NAME=PATH adds the file (or a folder, recursively) at kiln/bin/NAME;
executables keep their mode. Prints the wheel's path."""

import base64
import hashlib
import os
import sys
import zipfile
from pathlib import Path


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _files_of(name, path):
    path = Path(path)
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file():
                yield f"{name}/{child.relative_to(path).as_posix()}", child
    else:
        yield name, path


def main(pure_wheel, platform, outdir, *extras):
    pure = zipfile.ZipFile(pure_wheel)
    dist_info = next(name.split("/")[0] for name in pure.namelist() if name.endswith(".dist-info/WHEEL"))
    distribution, version = dist_info[:-len(".dist-info")].rsplit("-", 1)
    out = Path(outdir) / f"{distribution}-{version}-py3-none-{platform}.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        def add(name, data, mode=0o644):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
            records.append(_record_line(name, data))

        for item in pure.infolist():
            if item.filename in (f"{dist_info}/RECORD", f"{dist_info}/WHEEL"):
                continue
            add(item.filename, pure.read(item))
        for extra in extras:
            name, _, path = extra.partition("=")
            for member, source in _files_of(f"kiln/bin/{name}", path):
                add(member, source.read_bytes(), 0o755 if os.access(source, os.X_OK) else 0o644)
        add(f"{dist_info}/WHEEL", (
            "Wheel-Version: 1.0\nGenerator: kiln platform_wheel.py\nRoot-Is-Purelib: false\n"
            f"Tag: py3-none-{platform}\n").encode())
        record = "\n".join(records + [f"{dist_info}/RECORD,,"]) + "\n"
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        wheel.writestr(info, record, zipfile.ZIP_DEFLATED)
    print(out)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
