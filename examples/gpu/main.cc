// Compiles a vector-add and a matmul TTIR through kilnd, loads them with the
// CUDA driver loader, launches them and checks the results against the CPU.
//
// usage: kiln_gpu_example TARGET ADD.ttir MATMUL.ttir     (e.g. cuda:90)
// The TTIR files are add_kernel(x, y, out, n; BLOCK=1024) and
// matmul_kernel(a, b, c, M, N, K, strides...; 32x32x32 blocks), fp32, as
// Triton's frontend emits them (tests/gpu/make_ttir.py writes them).

#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/client.h"
#include "kiln/cuda_module.h"

namespace {

absl::StatusOr<std::unique_ptr<kiln::CudaModule>> CompileAndLoad(
    kiln::Client& client, std::shared_ptr<kiln::CudaDriver> cuda, const kiln::v1::Target& target,
    const char* path, const std::string& options_json) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  kiln::CompileInput input;
  input.ir.assign(std::istreambuf_iterator<char>(in), {});
  input.target = target;
  input.options_json = options_json;
  absl::StatusOr<kiln::CompiledKernel> kernel = client.Compile(input);
  if (!kernel.ok()) return kernel.status();
  std::cout << "compiled " << kernel->name << " for " << target.backend() << ":" << target.arch()
            << (kernel->cache_hit ? " (cache hit)" : "") << ", cubin " << kernel->cubin().size()
            << " bytes\n";
  return kiln::CudaModule::Load(std::move(cuda), kernel->cubin(), kernel->metadata_json());
}

// Uploads host data; returns the device pointer.
kiln::DevicePointer Upload(kiln::CudaDriver& cuda, const std::vector<float>& host) {
  kiln::DevicePointer device = *cuda.Allocate(host.size() * sizeof(float));
  cuda.CopyToDevice(device, host.data(), host.size() * sizeof(float)).IgnoreError();
  return device;
}

std::vector<float> Download(kiln::CudaDriver& cuda, kiln::DevicePointer device, size_t count) {
  std::vector<float> host(count);
  cuda.CopyToHost(host.data(), device, count * sizeof(float)).IgnoreError();
  return host;
}

bool CheckAdd(kiln::CudaDriver& cuda, kiln::CudaModule& add) {
  const int n = 100000;
  std::mt19937 random(1);
  std::uniform_real_distribution<float> values(-1, 1);
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = values(random), y[i] = values(random);
  kiln::DevicePointer dx = Upload(cuda, x), dy = Upload(cuda, y), dout = *cuda.Allocate(n * 4);
  absl::Status launched = add.Launch({(n + 1023) / 1024, 1, 1},
                                     {kiln::KernelArg::Pointer(dx), kiln::KernelArg::Pointer(dy),
                                      kiln::KernelArg::Pointer(dout), kiln::KernelArg::Int32(n)});
  if (!launched.ok()) {
    std::cerr << launched << "\n";
    return false;
  }
  const std::vector<float> out = Download(cuda, dout, n);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += out[i] != x[i] + y[i];
  std::cout << "vector add, " << n << " elements: " << wrong << " differ from the CPU\n";
  return wrong == 0;
}

bool CheckMatmul(kiln::CudaDriver& cuda, kiln::CudaModule& matmul) {
  const int m = 256, n = 192, k = 128;
  std::mt19937 random(2);
  std::uniform_real_distribution<float> values(-1, 1);
  std::vector<float> a(m * k), b(k * n);
  for (float& value : a) value = values(random);
  for (float& value : b) value = values(random);
  kiln::DevicePointer da = Upload(cuda, a), db = Upload(cuda, b), dc = *cuda.Allocate(m * n * 4);
  using Arg = kiln::KernelArg;
  absl::Status launched = matmul.Launch(
      {(m + 31) / 32, (n + 31) / 32, 1},
      {Arg::Pointer(da), Arg::Pointer(db), Arg::Pointer(dc), Arg::Int32(m), Arg::Int32(n),
       Arg::Int32(k), Arg::Int32(k), Arg::Int32(1), Arg::Int32(n), Arg::Int32(1), Arg::Int32(n),
       Arg::Int32(1)});
  if (!launched.ok()) {
    std::cerr << launched << "\n";
    return false;
  }
  const std::vector<float> c = Download(cuda, dc, m * n);
  double worst = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double expected = 0;
      for (int p = 0; p < k; ++p) expected += double{a[i * k + p]} * b[p * n + j];
      worst = std::max(worst, std::abs(expected - c[i * n + j]));
    }
  }
  // tl.dot on fp32 uses TF32 by default: about 3 significant digits.
  std::cout << "matmul " << m << "x" << k << " @ " << k << "x" << n
            << ": max |GPU - CPU| = " << worst << "\n";
  return worst < 0.05;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: kiln_gpu_example TARGET ADD.ttir MATMUL.ttir\n";
    return 2;
  }
  absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(argv[1]);
  if (!target.ok()) {
    std::cerr << target.status() << "\n";
    return 2;
  }
  absl::StatusOr<std::shared_ptr<kiln::CudaDriver>> cuda = kiln::CudaDriver::Load();
  if (!cuda.ok()) {
    std::cerr << cuda.status() << "\n";
    return 1;
  }
  kiln::Client client({});
  auto add = CompileAndLoad(client, *cuda, *target, argv[2], "{\"num_warps\": 4}");
  auto matmul = CompileAndLoad(client, *cuda, *target, argv[3], "{\"num_warps\": 4, \"num_stages\": 1}");
  if (!add.ok() || !matmul.ok()) {
    std::cerr << (add.ok() ? matmul.status() : add.status()) << "\n";
    return 1;
  }
  const bool add_ok = CheckAdd(**cuda, **add);
  const bool matmul_ok = CheckMatmul(**cuda, **matmul);
  std::cout << (add_ok && matmul_ok ? "PASS" : "FAIL") << "\n";
  return add_ok && matmul_ok ? 0 : 1;
}
