#ifndef KILN_CLIENT_CUDA_MODULE_H_
#define KILN_CLIENT_CUDA_MODULE_H_

// Loading and launching Kiln's cubins through the CUDA Driver API, loaded at
// run time (libcuda.so.1 / nvcuda.dll): programs link no CUDA library and run,
// with a clear error, where no driver is installed.
//
//   auto cuda = kiln::CudaDriver::Load();               // device 0
//   auto kernel = kiln::CudaModule::Load(*cuda, kernel.cubin(), kernel.metadata_json());
//   kernel->Launch({blocks, 1, 1}, {kiln::KernelArg::Pointer(x), kiln::KernelArg::Int32(n)});

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

using DevicePointer = uint64_t;  // CUdeviceptr

class CudaDriver {
 public:
  // Loads the driver, initializes it and makes `device`'s primary context
  // current. FAILED_PRECONDITION when no driver or device is present.
  static absl::StatusOr<std::shared_ptr<CudaDriver>> Load(int device = 0);
  ~CudaDriver();

  absl::StatusOr<DevicePointer> Allocate(size_t bytes);
  absl::Status Free(DevicePointer pointer);
  absl::Status CopyToDevice(DevicePointer destination, const void* source, size_t bytes);
  absl::Status CopyToHost(void* destination, DevicePointer source, size_t bytes);
  absl::Status Synchronize();

  struct Api;  // the driver's entry points
  const Api& api() const { return *api_; }
  int max_shared_optin() const { return max_shared_optin_; }

 private:
  CudaDriver() = default;
  std::unique_ptr<Api> api_;
  int max_shared_optin_ = 0;
};

// One kernel argument, passed by value as the kernel's signature declares it.
class KernelArg {
 public:
  static KernelArg Pointer(DevicePointer value) { return KernelArg(&value, sizeof(value)); }
  static KernelArg Int32(int32_t value) { return KernelArg(&value, sizeof(value)); }
  static KernelArg Int64(int64_t value) { return KernelArg(&value, sizeof(value)); }
  static KernelArg Float32(float value) { return KernelArg(&value, sizeof(value)); }
  static KernelArg Float64(double value) { return KernelArg(&value, sizeof(value)); }
  void* data() { return bytes_; }

 private:
  KernelArg(const void* value, size_t size);
  alignas(8) unsigned char bytes_[8] = {};
};

// What launching needs from Triton's metadata JSON ("<kernel>.json").
struct KernelMetadata {
  std::string name;
  int num_warps = 4;
  int num_ctas = 1;
  int shared = 0;  // dynamic shared memory, bytes
  int64_t global_scratch_size = 0;  // per program
  int64_t profile_scratch_size = 0;
};
absl::StatusOr<KernelMetadata> ParseKernelMetadata(absl::string_view json);

class CudaModule {
 public:
  // Loads a cubin with cuModuleLoadData and finds its kernel. Raises the
  // function's dynamic shared-memory limit when it needs more than 48 KB, as
  // Triton's driver does. RESOURCE_EXHAUSTED when the device has too little.
  static absl::StatusOr<std::unique_ptr<CudaModule>> Load(std::shared_ptr<CudaDriver> driver,
                                                          const std::string& cubin,
                                                          absl::string_view metadata_json);
  ~CudaModule();

  struct Grid {
    unsigned x = 1, y = 1, z = 1;
  };
  // Launches with Triton's calling convention: the kernel's non-constexpr
  // arguments in signature order, then the global-scratch and profile-scratch
  // pointers Triton 3.5+ kernels take (allocated here when the metadata asks);
  // 32 * num_warps threads per program and the metadata's shared memory.
  // Returns when the kernel has finished (its scratch memory is then freed).
  absl::Status Launch(Grid grid, std::vector<KernelArg> args);

  const KernelMetadata& metadata() const { return metadata_; }

 private:
  CudaModule() = default;
  std::shared_ptr<CudaDriver> driver_;
  KernelMetadata metadata_;
  void* module_ = nullptr;    // CUmodule
  void* function_ = nullptr;  // CUfunction
};

}  // namespace kiln

#endif  // KILN_CLIENT_CUDA_MODULE_H_
