#include "oci_manifest.h"

#include <cmath>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "json_object.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"

namespace kiln {
namespace {

absl::StatusOr<uint64_t> WholeSize(const google::protobuf::Struct& descriptor, absl::string_view reference,
                                   absl::string_view what) {
  const auto size_field = descriptor.fields().find("size");
  // JSON numbers are doubles: a size is a whole number no larger than 2^53
  // (a negative or NaN one cast to uint64_t would be undefined behaviour).
  const double size_value = size_field == descriptor.fields().end() ? -1 : size_field->second.number_value();
  if (size_field == descriptor.fields().end() ||
      size_field->second.kind_case() != google::protobuf::Value::kNumberValue || !std::isfinite(size_value) ||
      size_value < 0 || size_value > 9007199254740992.0 || size_value != std::floor(size_value)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the manifest gives %s no valid size; nothing was fetched (was it pushed by `kiln push`?)",
        reference, what));
  }
  return static_cast<uint64_t>(size_value);
}

// An index's members, as `ChooseIndexMembers` weighs them.
struct IndexReading {
  IndexChoice choice;
  bool for_another_triton = false;     // a member of a target asked for, of no Triton asked for
  std::vector<std::string> described;  // each member, for an error: "cuda:89 (Triton 3.6.0)"
};

IndexReading ReadIndex(const google::protobuf::Value& members, const std::vector<std::string>& targets,
                       const std::vector<std::string>& tritons) {
  IndexReading reading;
  for (const google::protobuf::Value& member : members.list_value().values()) {
    const google::protobuf::Struct& descriptor = member.struct_value();
    const auto annotations = descriptor.fields().find("annotations");
    if (annotations == descriptor.fields().end()) continue;
    const google::protobuf::Struct& annotated = annotations->second.struct_value();
    const std::string target = StringField(annotated, std::string(kTargetAnnotation));
    if (target.empty() || StringField(descriptor, "mediaType") != kManifestMediaType) continue;
    const std::vector<std::string> member_tritons =
        absl::StrSplit(StringField(annotated, std::string(kTritonAnnotation)), ',', absl::SkipEmpty());
    reading.choice.targets.push_back(target);
    reading.described.push_back(member_tritons.empty() ? target
                                                       : absl::StrFormat("%s (Triton %s)", target,
                                                                         absl::StrJoin(member_tritons, ", ")));
    if (!absl::c_linear_search(targets, target)) continue;
    if (!member_tritons.empty() && !tritons.empty() &&
        absl::c_none_of(member_tritons, [&](const std::string& triton) { return absl::c_linear_search(tritons, triton); })) {
      reading.for_another_triton = true;
      continue;
    }
    reading.choice.chosen.push_back({target, StringField(descriptor, "digest")});
  }
  return reading;
}

}  // namespace

bool PlainJsonText(absl::string_view text) {
  return absl::c_all_of(text, [](char c) { return absl::ascii_isalnum(c) || c == ':' || c == '.' || c == '_' || c == '-'; });
}

absl::StatusOr<BundleLayer> ParseBundleManifest(absl::string_view text, absl::string_view reference) {
  ASSIGN_OR_RETURN(google::protobuf::Struct manifest, ParseJsonObject(text, "the manifest"));
  const auto& fields = manifest.fields();
  const auto config = fields.find("config");
  const auto layers = fields.find("layers");
  if (config == fields.end() ||
      StringField(config->second.struct_value(), "mediaType") != kBundleConfigMediaType ||
      layers == fields.end() || layers->second.list_value().values_size() != 1 ||
      StringField(layers->second.list_value().values(0).struct_value(), "mediaType") != kBundleMediaType) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not a Kiln bundle (its manifest has no single layer of %s); push one with "
        "`kiln push`",
        reference, kBundleMediaType));
  }
  const google::protobuf::Struct& layer = layers->second.list_value().values(0).struct_value();
  BundleLayer found;
  found.digest = StringField(layer, "digest");
  ASSIGN_OR_RETURN(found.size, WholeSize(layer, reference, "its layer"));
  return found;
}

absl::StatusOr<std::optional<IndexChoice>> ChooseIndexMembers(absl::string_view text,
                                                               absl::string_view reference,
                                                               const std::vector<std::string>& targets,
                                                               const std::vector<std::string>& tritons) {
  ASSIGN_OR_RETURN(google::protobuf::Struct parsed, ParseJsonObject(text, "the manifest"));
  const auto members = parsed.fields().find("manifests");
  if (StringField(parsed, "mediaType") != kIndexMediaType && members == parsed.fields().end()) return std::nullopt;
  IndexReading reading;
  if (members != parsed.fields().end()) reading = ReadIndex(members->second, targets, tritons);
  if (reading.choice.targets.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is an index with no Kiln bundle for any GPU target (annotation %s); push one with "
        "`kiln push --target`",
        reference, kTargetAnnotation));
  }
  if (reading.choice.chosen.empty() && reading.for_another_triton) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds kernels for %s, none of a Triton this kilnd has a toolchain of (%s); push them from a "
        "recording made with that Triton, or register a toolchain of the index's Triton (kilnd --toolchain)",
        reference, absl::StrJoin(reading.described, ", "), absl::StrJoin(tritons, ", ")));
  }
  if (reading.choice.chosen.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds kernels for %s, none for %s; push it for that target too (kiln push --target), "
        "or name the targets to take (kiln pull --target, or kilnd's gpu_targets)",
        reference, absl::StrJoin(reading.choice.targets, ", "),
        targets.empty() ? "this machine's GPUs (none found)" : absl::StrJoin(targets, ", ")));
  }
  // Checked before any is fetched: a bad digest keeps nothing of the others either.
  for (const IndexMember& member : reading.choice.chosen) {
    if (!absl::StartsWith(member.digest, "sha256:") || member.digest.size() != 71 || !PlainJsonText(member.digest)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the index names no valid digest for %s", reference, member.target));
    }
  }
  return std::move(reading.choice);
}

}  // namespace kiln
