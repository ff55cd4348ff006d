#ifndef KILN_COMMON_WINDOWS_API_H_
#define KILN_COMMON_WINDOWS_API_H_

// Windows only: the Win32 headers, included one way everywhere. NOMINMAX keeps
// windows.h's min/max macros away from std::min/std::max; the socket,
// security and shell headers must come in this order.

#ifndef NOMINMAX
#define NOMINMAX
#endif
// winsock2.h must precede windows.h, which would pull in the old winsock.h.
#include <winsock2.h>
#include <windows.h>
// After windows.h:
#include <afunix.h>
#include <aclapi.h>
#include <sddl.h>
#include <shlobj.h>

#endif  // KILN_COMMON_WINDOWS_API_H_
