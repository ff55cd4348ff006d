#pragma once

// What a registry, a token service or docker's files send as JSON objects,
// read through protobuf's JSON parser into a Struct, and the fields the
// registry code reads from one.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace kiln {

// `text` as a JSON object; DATA_LOSS naming `what` when it is not one.
absl::StatusOr<google::protobuf::Struct> ParseJsonObject(absl::string_view text, absl::string_view what);

// The field `name` of `object`, or null when it has none.
const google::protobuf::Value* FieldOf(const google::protobuf::Struct& object, const std::string& name);

// The string field `name` of `object`; empty when it has none or it is not a string.
std::string StringField(const google::protobuf::Struct& object, const std::string& name);

}  // namespace kiln
