#ifndef KILN_COMMON_WINDOWS_TEXT_H_
#define KILN_COMMON_WINDOWS_TEXT_H_

// Windows only: UTF-8 <-> UTF-16 at the Win32 boundary, and error texts.
// Kiln keeps UTF-8 everywhere else; paths cross as std::filesystem::path,
// which is UTF-16 on Windows.

#include <filesystem>
#include <string>
#include <string_view>

namespace kiln {

std::wstring Widen(std::string_view utf8);
std::string Narrow(std::wstring_view utf16);
// A path as UTF-8 for messages (path::string() uses the ANSI code page).
std::string PathText(const std::filesystem::path& path);
// FormatMessage's text for a Win32 error code, with the code: "Access is denied. (5)".
std::string ErrorText(unsigned long error);
std::string LastErrorText();

}  // namespace kiln

#endif  // KILN_COMMON_WINDOWS_TEXT_H_
