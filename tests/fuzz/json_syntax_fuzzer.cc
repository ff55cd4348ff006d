// Feeds IsJsonObject (common/json_syntax.h) any text and holds it to
// protobuf's JSON parser (into a google.protobuf.Struct) as the oracle; traps
// on a disagreement:
//  - text IsJsonObject accepts, in valid UTF-8, protobuf accepts too, but
//    where protobuf is stricter than RFC 8259 (a duplicate key, a number
//    beyond a double's range, an escaped lone surrogate: RFC 8259 allows
//    each, and Triton's json.dumps writes the last two) or nests deeper
//    than a Struct can hold (each level is two or three messages deep in
//    its binary form, whose limit is 100);
//  - text protobuf accepts as an object, IsJsonObject accepts, but where it
//    uses one of protobuf's extensions of JSON (StrictnessOf lists them);
//  - whatever protobuf accepts, IsJsonObject accepts as protobuf prints it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/json_syntax.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace {

// Nesting that a Struct holds whatever mix of objects and arrays it is
// (found by trying: 33 levels of objects parse, 50 do not).
constexpr int kStructSafeDepth = 32;

// Strict UTF-8 (RFC 3629): no overlong forms, surrogates or code points past U+10FFFF.
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t at) { return static_cast<uint8_t>(text[at]); };
    const uint8_t lead = byte(i);
    size_t length = 0;
    uint32_t point = 0;
    if (lead < 0x80) length = 1, point = lead;
    else if ((lead & 0xe0) == 0xc0) length = 2, point = lead & 0x1f;
    else if ((lead & 0xf0) == 0xe0) length = 3, point = lead & 0x0f;
    else if ((lead & 0xf8) == 0xf0) length = 4, point = lead & 0x07;
    else return false;
    if (i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((byte(i + k) & 0xc0) != 0x80) return false;
      point = point << 6 | (byte(i + k) & 0x3f);
    }
    constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (point < kSmallest[length] || point > 0x10ffff || (point >= 0xd800 && point <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

// What a lexical pass over `text` tells: how deep it nests, and whether it
// uses an extension of JSON that protobuf 3's parser takes (single quotes,
// bare words as keys, a trailing comma, numbers such as "1." or "09", raw
// control characters or unknown escapes in strings, \v or \f as
// whitespace), where IsJsonObject rightly refuses what protobuf takes.
struct Strictness {
  int depth = 0;
  bool lenient = false;
};

// RFC 8259's number, written apart from IsJsonObject's.
bool IsJsonNumber(const std::string& token) {
  static const std::regex kNumber("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
  return std::regex_match(token, kNumber);
}

// The length of the token at `text[at]` of the characters in `of`.
size_t Span(absl::string_view text, size_t at, absl::string_view of) {
  size_t end = at;
  while (end < text.size() && absl::StrContains(of, text[end])) ++end;
  return end - at;
}

Strictness StrictnessOf(absl::string_view text) {
  Strictness found;
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (static_cast<uint8_t>(text[i]) < 0x20) found.lenient = true;
        if (text[i] != '\\') continue;
        ++i;
        if (i < text.size() && !absl::StrContains("\"\\/bfnrtu", text[i])) found.lenient = true;
      }
    } else if (c == '-' || absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      const size_t length = Span(text, i, "+-.0123456789eE");
      found.lenient = found.lenient || !IsJsonNumber(std::string(text.substr(i, length)));
      i += length - 1;
    } else if (absl::ascii_isalpha(static_cast<unsigned char>(c))) {
      const absl::string_view word = text.substr(i, Span(text, i, "abcdefghijklmnopqrstuvwxyz"));
      found.lenient = found.lenient || (word != "true" && word != "false" && word != "null");
      i += std::max<size_t>(word.size(), 1) - 1;
    } else if (c == '{' || c == '[') {
      found.depth = std::max(found.depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',') {
      const size_t after = i + 1 + Span(text, i + 1, " \t\n\r");
      if (after < text.size() && (text[after] == '}' || text[after] == ']')) found.lenient = true;
    } else if (c == ':') {
      size_t before = i;
      while (before > 0 && absl::StrContains(" \t\n\r", text[before - 1])) --before;
      if (before == 0 || text[before - 1] != '"') found.lenient = true;  // a key that is no string
    } else if (!absl::StrContains(" \t\n\r", c)) {
      found.lenient = true;
    }
  }
  return found;
}

bool ProtobufParses(const std::string& text, google::protobuf::Struct& parsed, std::string& error) {
  const auto status = google::protobuf::util::JsonStringToMessage(text, &parsed);
  error = std::string(status.message());
  return status.ok();
}

// protobuf refusing, for a reason that RFC 8259 does not give.
bool ProtobufStricterThanJson(absl::string_view error, const Strictness& strictness) {
  // Surrogates: "Missing low surrogate", "Invalid low surrogate" (a high one
  // followed by another \u escape), "Invalid unicode code point" (a lone low one).
  for (absl::string_view quirk : {"Repeated map key", "Number exceeds the range of double", "surrogate",
                                  "Invalid unicode code point"}) {
    if (absl::StrContains(error, quirk)) return true;
  }
  return strictness.depth > kStructSafeDepth;
}

[[noreturn]] void Disagree(const char* what, const std::string& error) {
  std::fprintf(stderr, "json_syntax_fuzzer: %s (protobuf: %s)\n", what, error.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool ours = kiln::IsJsonObject(text);
  const Strictness strictness = StrictnessOf(text);
  google::protobuf::Struct parsed;
  std::string error;
  const bool theirs = ProtobufParses(text, parsed, error);
  if (ours && !theirs && IsValidUtf8(text) && !ProtobufStricterThanJson(error, strictness)) {
    Disagree("IsJsonObject accepts JSON that protobuf refuses", error);
  }
  if (theirs && !ours && !strictness.lenient && strictness.depth <= kiln::kMaxJsonDepth) {
    Disagree("protobuf accepts a strict JSON object that IsJsonObject refuses", error);
  }
  if (theirs) {
    std::string printed;
    if (!google::protobuf::util::MessageToJsonString(parsed, &printed).ok()) return 0;
    if (!kiln::IsJsonObject(printed)) Disagree("IsJsonObject refuses protobuf's own JSON", printed);
  }
  return 0;
}
