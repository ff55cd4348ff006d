#include "kiln/cuda_module.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

// The few Driver API types and constants used here, as cuda.h defines them,
// so building needs no CUDA toolkit.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
constexpr CUresult kSuccess = 0;
constexpr int kFuncAttributeSharedSizeBytes = 1;              // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr int kFuncAttributeMaxDynamicSharedSizeBytes = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDeviceAttributeMaxSharedPerBlockOptin = 97;    // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kDefaultSharedLimit = 48 * 1024;

}  // namespace

struct CudaDriver::Api {
  std::unique_ptr<platform::DynamicLibrary> library;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(DevicePointer*, size_t);
  CUresult (*cuMemFree)(DevicePointer);
  CUresult (*cuMemcpyHtoD)(DevicePointer, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, DevicePointer, size_t);
  CUresult (*cuGetErrorString)(CUresult, const char**);

  absl::Status Check(CUresult result, absl::string_view what) const {
    if (result == kSuccess) return absl::OkStatus();
    const char* text = nullptr;
    if (cuGetErrorString == nullptr || cuGetErrorString(result, &text) != kSuccess) text = nullptr;
    return absl::FailedPreconditionError(
        absl::StrFormat("%s failed: CUDA error %d (%s)", what, result, text ? text : "unknown"));
  }
};

namespace {

// Resolves every entry point or names the one missing (a driver too old).
absl::Status Resolve(CudaDriver::Api& api) {
  struct Entry {
    const char* name;
    void** slot;
  };
  const Entry entries[] = {
      {"cuInit", reinterpret_cast<void**>(&api.cuInit)},
      {"cuDeviceGet", reinterpret_cast<void**>(&api.cuDeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<void**>(&api.cuDeviceGetAttribute)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&api.cuDevicePrimaryCtxRetain)},
      {"cuCtxSetCurrent", reinterpret_cast<void**>(&api.cuCtxSetCurrent)},
      {"cuCtxSynchronize", reinterpret_cast<void**>(&api.cuCtxSynchronize)},
      {"cuModuleLoadData", reinterpret_cast<void**>(&api.cuModuleLoadData)},
      {"cuModuleUnload", reinterpret_cast<void**>(&api.cuModuleUnload)},
      {"cuModuleGetFunction", reinterpret_cast<void**>(&api.cuModuleGetFunction)},
      {"cuFuncGetAttribute", reinterpret_cast<void**>(&api.cuFuncGetAttribute)},
      {"cuFuncSetAttribute", reinterpret_cast<void**>(&api.cuFuncSetAttribute)},
      {"cuLaunchKernel", reinterpret_cast<void**>(&api.cuLaunchKernel)},
      {"cuMemAlloc_v2", reinterpret_cast<void**>(&api.cuMemAlloc)},
      {"cuMemFree_v2", reinterpret_cast<void**>(&api.cuMemFree)},
      {"cuMemcpyHtoD_v2", reinterpret_cast<void**>(&api.cuMemcpyHtoD)},
      {"cuMemcpyDtoH_v2", reinterpret_cast<void**>(&api.cuMemcpyDtoH)},
      {"cuGetErrorString", reinterpret_cast<void**>(&api.cuGetErrorString)},
  };
  for (const Entry& entry : entries) {
    *entry.slot = api.library->Symbol(entry.name);
    if (*entry.slot == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the CUDA driver lacks ", entry.name, "; update the NVIDIA driver"));
    }
  }
  return absl::OkStatus();
}

int64_t IntField(const google::protobuf::Struct& json, const std::string& name, int64_t fallback) {
  const auto field = json.fields().find(name);
  if (field == json.fields().end() || !field->second.has_number_value()) return fallback;
  return static_cast<int64_t>(field->second.number_value());
}

}  // namespace

KernelArg::KernelArg(const void* value, size_t size) { std::memcpy(bytes_, value, size); }

absl::StatusOr<std::shared_ptr<CudaDriver>> CudaDriver::Load(int device) {
  std::shared_ptr<CudaDriver> driver(new CudaDriver());
  driver->api_ = std::make_unique<Api>();
  Api& api = *driver->api_;
  absl::StatusOr<std::unique_ptr<platform::DynamicLibrary>> library =
      platform::LoadDynamicLibrary({"libcuda.so.1", "nvcuda.dll"});
  if (!library.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA driver on this machine (", library.status().message(),
        "); install the NVIDIA driver to run kernels"));
  }
  api.library = *std::move(library);
  if (absl::Status status = Resolve(api); !status.ok()) return status;
  CUdevice handle = 0;
  CUcontext context = nullptr;
  if (absl::Status status = api.Check(api.cuInit(0), "cuInit (is a GPU present?)"); !status.ok()) {
    return status;
  }
  if (absl::Status status = api.Check(api.cuDeviceGet(&handle, device), "cuDeviceGet");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = api.Check(api.cuDevicePrimaryCtxRetain(&context, handle),
                                      "cuDevicePrimaryCtxRetain");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = api.Check(api.cuCtxSetCurrent(context), "cuCtxSetCurrent");
      !status.ok()) {
    return status;
  }
  api.cuDeviceGetAttribute(&driver->max_shared_optin_, kDeviceAttributeMaxSharedPerBlockOptin,
                           handle);
  return driver;
}

CudaDriver::~CudaDriver() = default;

absl::StatusOr<DevicePointer> CudaDriver::Allocate(size_t bytes) {
  DevicePointer pointer = 0;
  if (absl::Status status = api_->Check(api_->cuMemAlloc(&pointer, bytes), "cuMemAlloc");
      !status.ok()) {
    return status;
  }
  return pointer;
}

absl::Status CudaDriver::Free(DevicePointer pointer) {
  return api_->Check(api_->cuMemFree(pointer), "cuMemFree");
}

absl::Status CudaDriver::CopyToDevice(DevicePointer destination, const void* source, size_t bytes) {
  return api_->Check(api_->cuMemcpyHtoD(destination, source, bytes), "cuMemcpyHtoD");
}

absl::Status CudaDriver::CopyToHost(void* destination, DevicePointer source, size_t bytes) {
  return api_->Check(api_->cuMemcpyDtoH(destination, source, bytes), "cuMemcpyDtoH");
}

absl::Status CudaDriver::Synchronize() {
  return api_->Check(api_->cuCtxSynchronize(), "cuCtxSynchronize");
}

absl::StatusOr<KernelMetadata> ParseKernelMetadata(absl::string_view json) {
  google::protobuf::Struct parsed;
  google::protobuf::util::JsonParseOptions options;
  if (!google::protobuf::util::JsonStringToMessage(std::string(json), &parsed, options).ok()) {
    return absl::InvalidArgumentError("kernel metadata is not JSON; pass Triton's <kernel>.json");
  }
  KernelMetadata metadata;
  const auto name = parsed.fields().find("name");
  if (name == parsed.fields().end() || !name->second.has_string_value()) {
    return absl::InvalidArgumentError("kernel metadata has no kernel name");
  }
  metadata.name = name->second.string_value();
  metadata.num_warps = static_cast<int>(IntField(parsed, "num_warps", 4));
  metadata.num_ctas = static_cast<int>(IntField(parsed, "num_ctas", 1));
  metadata.shared = static_cast<int>(IntField(parsed, "shared", 0));
  metadata.global_scratch_size = IntField(parsed, "global_scratch_size", 0);
  metadata.profile_scratch_size = IntField(parsed, "profile_scratch_size", 0);
  return metadata;
}

absl::StatusOr<std::unique_ptr<CudaModule>> CudaModule::Load(std::shared_ptr<CudaDriver> driver,
                                                             const std::string& cubin,
                                                             absl::string_view metadata_json) {
  absl::StatusOr<KernelMetadata> metadata = ParseKernelMetadata(metadata_json);
  if (!metadata.ok()) return metadata.status();
  std::unique_ptr<CudaModule> module(new CudaModule());
  module->driver_ = std::move(driver);
  module->metadata_ = *std::move(metadata);
  const CudaDriver::Api& api = module->driver_->api();
  if (absl::Status status = api.Check(api.cuModuleLoadData(&module->module_, cubin.data()),
                                      "cuModuleLoadData");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = api.Check(
          api.cuModuleGetFunction(&module->function_, module->module_,
                                  module->metadata_.name.c_str()),
          absl::StrCat("cuModuleGetFunction(", module->metadata_.name, ")"));
      !status.ok()) {
    return status;
  }
  const int shared = module->metadata_.shared;
  if (shared > kDefaultSharedLimit) {
    const int limit = module->driver_->max_shared_optin();
    if (shared > limit) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s needs %d bytes of shared memory; this device allows %d", module->metadata_.name,
          shared, limit));
    }
    int static_shared = 0;
    api.cuFuncGetAttribute(&static_shared, kFuncAttributeSharedSizeBytes, module->function_);
    if (absl::Status status =
            api.Check(api.cuFuncSetAttribute(module->function_,
                                             kFuncAttributeMaxDynamicSharedSizeBytes,
                                             limit - static_shared),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
        !status.ok()) {
      return status;
    }
  }
  return module;
}

CudaModule::~CudaModule() {
  if (module_ != nullptr) driver_->api().cuModuleUnload(module_);
}

absl::Status CudaModule::Launch(Grid grid, std::vector<KernelArg> args) {
  if (metadata_.num_ctas != 1) {
    return absl::UnimplementedError(
        "kernels with num_ctas > 1 (thread-block clusters) cannot be launched by this loader yet");
  }
  const uint64_t programs = uint64_t{grid.x} * grid.y * grid.z;
  // Triton 3.5+ kernels take two trailing pointers: global and profile scratch.
  std::vector<DevicePointer> scratch;
  for (int64_t per_program : {metadata_.global_scratch_size, metadata_.profile_scratch_size}) {
    DevicePointer pointer = 0;
    if (per_program > 0) {
      absl::StatusOr<DevicePointer> allocated =
          driver_->Allocate(static_cast<size_t>(per_program) * programs);
      if (!allocated.ok()) return allocated.status();
      pointer = *allocated;
    }
    scratch.push_back(pointer);
  }
  std::vector<void*> params;
  for (KernelArg& arg : args) params.push_back(arg.data());
  for (DevicePointer& pointer : scratch) params.push_back(&pointer);
  const CudaDriver::Api& api = driver_->api();
  absl::Status status = api.Check(
      api.cuLaunchKernel(function_, grid.x, grid.y, grid.z,
                         static_cast<unsigned>(32 * metadata_.num_warps), 1, 1,
                         static_cast<unsigned>(metadata_.shared), nullptr, params.data(), nullptr),
      absl::StrCat("launching ", metadata_.name));
  if (status.ok()) status = driver_->Synchronize();
  for (DevicePointer pointer : scratch) {
    if (pointer != 0) driver_->Free(pointer).IgnoreError();
  }
  return status;
}

}  // namespace kiln
