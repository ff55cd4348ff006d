// Lists the kernels embedded at build time; with a GPU, launches the sm90 one.
// usage: embedded_kernels [WRITE_SM90_CUBIN_TO]

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kiln/cuda_module.h"
#include "kiln_kernels_embedded_kernels.h"

int main(int argc, char** argv) {
  struct Embedded {
    const char* target;
    const unsigned char* cubin;
    size_t size;
    const char* json;
  };
  const Embedded kernels[] = {
      {"cuda:80", kiln_add_cuda_80_cubin, kiln_add_cuda_80_cubin_size, kiln_add_cuda_80_json},
      {"cuda:90", kiln_add_cuda_90_cubin, kiln_add_cuda_90_cubin_size, kiln_add_cuda_90_json},
  };
  for (const Embedded& kernel : kernels) {
    absl::StatusOr<kiln::KernelMetadata> metadata = kiln::ParseKernelMetadata(kernel.json);
    std::cout << kernel.target << ": " << (metadata.ok() ? metadata->name : "?") << ", "
              << kernel.size << " bytes of cubin\n";
  }
  if (argc > 1) {
    std::ofstream(argv[1], std::ios::binary)
        .write(reinterpret_cast<const char*>(kiln_add_cuda_90_cubin),
               static_cast<std::streamsize>(kiln_add_cuda_90_cubin_size));
  }
  absl::StatusOr<std::shared_ptr<kiln::CudaDriver>> cuda = kiln::CudaDriver::Load();
  if (!cuda.ok()) {
    std::cout << "not launching: " << cuda.status().message() << "\n";
    return 0;
  }
  const std::string cubin(reinterpret_cast<const char*>(kiln_add_cuda_90_cubin),
                          kiln_add_cuda_90_cubin_size);
  absl::StatusOr<std::unique_ptr<kiln::CudaModule>> module =
      kiln::CudaModule::Load(*cuda, cubin, kiln_add_cuda_90_json);
  std::cout << (module.ok() ? "loaded the sm90 kernel" : std::string(module.status().message()))
            << "\n";
  return module.ok() ? 0 : 1;
}
