#include "json_object.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {

absl::StatusOr<google::protobuf::Struct> ParseJsonObject(absl::string_view text, absl::string_view what) {
  google::protobuf::Struct parsed;
  if (!google::protobuf::util::JsonStringToMessage(std::string(text), &parsed).ok()) {
    return absl::DataLossError(absl::StrCat(what, " is not a JSON object"));
  }
  return parsed;
}

const google::protobuf::Value* FieldOf(const google::protobuf::Struct& object, const std::string& name) {
  auto found = object.fields().find(name);
  return found == object.fields().end() ? nullptr : &found->second;
}

std::string StringField(const google::protobuf::Struct& object, const std::string& name) {
  const google::protobuf::Value* value = FieldOf(object, name);
  return value != nullptr && value->kind_case() == google::protobuf::Value::kStringValue ? value->string_value()
                                                                                        : "";
}

}  // namespace kiln
