"""Launcher modules built by kilnd with the machine's real C compiler."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from triton.backends.nvidia import driver as nvidia_driver

from kiln.service import api as kiln_pb2

CUDA_STUBS = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64" / "stubs",
              Path("/usr/local/cuda/targets/x86_64-linux/lib/stubs")]


@pytest.fixture(scope="module")
def libcuda_dir(tmp_path_factory):
    """A directory with libcuda.so.1. No GPU driver is installed here, so the
    CUDA toolkit's link stub stands in for it: linking and importing are what
    is tested, not launching."""
    stub = next((d / "libcuda.so" for d in CUDA_STUBS if (d / "libcuda.so").exists()), None)
    if stub is None:
        pytest.skip("no CUDA toolkit stub libcuda.so on this machine")
    directory = tmp_path_factory.mktemp("libcuda")
    (directory / "libcuda.so.1").symlink_to(stub)
    return directory


def launcher_request(source, libcuda_dir, name="__triton_launcher"):
    return kiln_pb2.BuildLauncherRequest(
        module_name=name,
        c_source=source,
        python_abi=kiln_pb2.PythonAbi(
            version="%d.%d" % sys.version_info[:2], abiflags=getattr(sys, "abiflags", ""),
            ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"), platform=sysconfig.get_platform(),
            include_dir=sysconfig.get_paths()["include"]),
        include_dirs=nvidia_driver.include_dirs,
        library_dirs=[str(libcuda_dir)],
        libraries=nvidia_driver.libraries,
    )


def add_kernel_launcher_source():
    signature = {0: "*fp32", 1: "*fp32", 2: "*fp32", 3: "i32", 4: "constexpr"}
    return nvidia_driver.make_launcher({(4,): 1024}, signature, None)


def _imports_with_launch(module, libcuda_dir):
    """Imports the module with importlib in a fresh interpreter, as Triton does."""
    probe = ("import importlib.util, sys\n"
             "spec = importlib.util.spec_from_file_location('__triton_launcher', sys.argv[1])\n"
             "mod = importlib.util.module_from_spec(spec)\n"
             "spec.loader.exec_module(mod)\n"
             "print(callable(mod.launch))\n")
    result = subprocess.run([sys.executable, "-c", probe, str(module)], capture_output=True, text=True,
                            env=dict(os.environ, LD_LIBRARY_PATH=str(libcuda_dir)))
    assert result.stdout.strip() == "True", result.stderr
    return True


def test_launcher_built_by_kilnd_imports_and_exposes_launch(kilnd, libcuda_dir, tmp_path):
    response = kilnd.stub.BuildLauncher(launcher_request(add_kernel_launcher_source(), libcuda_dir))
    assert response.WhichOneof("result") == "module", response.error
    module = tmp_path / response.module.name
    module.write_bytes(response.module.data)
    assert _imports_with_launch(module, libcuda_dir)
    again = kilnd.stub.BuildLauncher(launcher_request(add_kernel_launcher_source(), libcuda_dir))
    assert again.cache_hit
    assert again.module.data == response.module.data


def test_a_changed_environment_never_reuses_a_module(kilnd, libcuda_dir):
    request = launcher_request(add_kernel_launcher_source(), libcuda_dir)
    kilnd.stub.BuildLauncher(request)
    request.python_abi.ext_suffix = ".cpython-399-x86_64-linux-gnu.so"
    assert not kilnd.stub.BuildLauncher(request).cache_hit


def test_c_that_does_not_compile_is_a_compilation_error_with_the_log(kilnd, libcuda_dir):
    response = kilnd.stub.BuildLauncher(launcher_request("this is not C;", libcuda_dir, "broken"))
    assert response.error.kind == kiln_pb2.CompileError.KIND_COMPILATION_ERROR
    assert "error" in response.error.log


@pytest.mark.parametrize("compiler", ["gcc", "tcc"])
def test_each_discovered_compiler_builds_an_importable_launcher(fresh_kilnd, libcuda_dir, tmp_path, compiler):
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    server = fresh_kilnd(f"--launcher-cc={compiler}")
    response = server.stub.BuildLauncher(launcher_request(add_kernel_launcher_source(), libcuda_dir))
    assert response.WhichOneof("result") == "module", response.error
    module = tmp_path / response.module.name
    module.write_bytes(response.module.data)
    assert _imports_with_launch(module, libcuda_dir)
