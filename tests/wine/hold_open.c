/* A Windows process that holds files open the way a virus scanner, a backup
 * agent or a loaded DLL does: read access, sharing read only (no
 * FILE_SHARE_DELETE), so no other process may delete, rename over or write
 * them. Prints "held" once every file is open and keeps them until its stdin
 * closes. An argument @LIST names a UTF-8 file of paths, one per line (more
 * of them than a command line holds).
 *
 *   hold_open.exe FILE... [@LIST]...
 */
#include <stdio.h>
#include <string.h>
#include <windows.h>

static int hold(const wchar_t* path) {
  HANDLE file = CreateFileW(path, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING,
                            FILE_ATTRIBUTE_NORMAL, NULL);
  if (file == INVALID_HANDLE_VALUE) {
    fwprintf(stderr, L"hold_open: cannot open %ls: error %lu\n", path, GetLastError());
    return 0;
  }
  return 1;
}

static int hold_listed(const wchar_t* list) {
  FILE* opened = _wfopen(list, L"rb");
  if (opened == NULL) {
    fwprintf(stderr, L"hold_open: cannot read %ls\n", list);
    return 0;
  }
  char line[32768];
  wchar_t path[32768];
  while (fgets(line, sizeof line, opened) != NULL) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') continue;
    if (MultiByteToWideChar(CP_UTF8, 0, line, -1, path, 32768) == 0 || !hold(path)) {
      fclose(opened);
      return 0;
    }
  }
  fclose(opened);
  return 1;
}

int wmain(int argc, wchar_t** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!(argv[i][0] == L'@' ? hold_listed(argv[i] + 1) : hold(argv[i]))) return 1;
  }
  printf("held\n");
  fflush(stdout);
  char buffer[64];
  DWORD read = 0;
  while (ReadFile(GetStdHandle(STD_INPUT_HANDLE), buffer, sizeof buffer, &read, NULL) && read > 0) {
  }
  return 0;
}
