#ifndef KILN_COMMON_GPU_TARGETS_H_
#define KILN_COMMON_GPU_TARGETS_H_

// The GPU targets of this machine ("cuda:89"), as Triton names them: what a
// pull of a bundle index takes (bundle_subscription.h, `kiln pull`).

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kiln {

// Asks the NVIDIA driver's nvidia-smi (on PATH on Linux and Windows wherever
// the driver is installed) for each GPU's compute capability; none where it
// is missing or fails. Distinct, in the order of the GPUs. Takes up to 10 s.
std::vector<std::string> DetectGpuTargets();

// nvidia-smi's "--query-gpu=compute_cap --format=csv,noheader" output
// ("8.9\n9.0\n") as targets ("cuda:89", "cuda:90"); lines that are not a
// capability are skipped.
std::vector<std::string> ParseComputeCapabilities(absl::string_view output);

}  // namespace kiln

#endif  // KILN_COMMON_GPU_TARGETS_H_
