/* A Windows process that holds files open the way a virus scanner, a backup
 * agent or a loaded DLL does: read access, sharing read only (no
 * FILE_SHARE_DELETE), so no other process may delete, rename over or write
 * them. Prints "held" once every file is open and keeps them until its stdin
 * closes.
 *
 *   hold_open.exe FILE...
 */
#include <stdio.h>
#include <windows.h>

int wmain(int argc, wchar_t** argv) {
  for (int i = 1; i < argc; ++i) {
    HANDLE file = CreateFileW(argv[i], GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING,
                              FILE_ATTRIBUTE_NORMAL, NULL);
    if (file == INVALID_HANDLE_VALUE) {
      fwprintf(stderr, L"hold_open: cannot open %ls: error %lu\n", argv[i], GetLastError());
      return 1;
    }
  }
  printf("held\n");
  fflush(stdout);
  char buffer[64];
  DWORD read = 0;
  while (ReadFile(GetStdHandle(STD_INPUT_HANDLE), buffer, sizeof buffer, &read, NULL) && read > 0) {
  }
  return 0;
}
