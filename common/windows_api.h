#ifndef KILN_COMMON_WINDOWS_API_H_
#define KILN_COMMON_WINDOWS_API_H_

// Windows only: the Win32 headers, included one way everywhere. NOMINMAX keeps
// windows.h's min/max macros away from std::min/std::max; the security and
// shell headers must come after windows.h.

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// After windows.h:
#include <aclapi.h>
#include <sddl.h>
#include <shlobj.h>

#endif  // KILN_COMMON_WINDOWS_API_H_
