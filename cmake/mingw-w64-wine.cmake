# Cross-compiles Kiln's Windows code on Linux with mingw-w64 (Debian's
# g++-mingw-w64-x86-64-posix: the posix thread model, for std::thread), and
# runs what it builds under Wine: ctest in such a build runs the Windows tests.
# Used with -DKILN_WINDOWS_PLATFORM_ONLY=ON (scripts/windows-tests), since
# gRPC has no mingw-w64 build to link.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(KILN_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${KILN_MINGW_TRIPLE}-gcc-posix)
set(CMAKE_CXX_COMPILER ${KILN_MINGW_TRIPLE}-g++-posix)
set(CMAKE_RC_COMPILER ${KILN_MINGW_TRIPLE}-windres)
# Libraries scripts/build-windows-deps cross-built, then mingw-w64's own.
set(CMAKE_FIND_ROOT_PATH ${KILN_WINDOWS_DEPS_PREFIX} /usr/${KILN_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Static C++ and thread runtimes: the executables then run under Wine (or on a
# Windows machine) without MinGW's DLLs beside them.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
find_program(KILN_WINE NAMES wine wine64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${KILN_WINE})
