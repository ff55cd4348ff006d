"""Who may change the machine service's files on Windows, through advapi32
(ctypes, so that an embedded Python needs nothing more). The service runs
kilnd.exe, the worker and the configured toolchain as its own account, and
builds launchers with the headers beside kilnd.exe: whoever could change those
files, or kilnd.conf, could run code as that account. So they belong to
Administrators, who alone may change them; everyone else may read them."""

import ctypes
from ctypes import wintypes

# SYSTEM and Administrators: full control; Users: read and execute. Protected
# (P): nothing inherited from the parent folder, which users may be able to write.
_ADMIN_ONLY = "O:BAD:P(A;{flags};FA;;;SY)(A;{flags};FA;;;BA)(A;{flags};0x1200a9;;;BU)"
_INHERITED_BY_CHILDREN = "OICI"
# Owners that may be trusted with a folder the service reads its configuration
# from: SYSTEM, Administrators, LocalService, NetworkService.
_TRUSTED_OWNERS = {"S-1-5-18", "S-1-5-32-544", "S-1-5-19", "S-1-5-20"}

_SE_FILE_OBJECT = 1
_OWNER_SECURITY_INFORMATION = 0x1
_DACL_SECURITY_INFORMATION = 0x4
_PROTECTED_DACL_SECURITY_INFORMATION = 0x80000000
_SDDL_REVISION_1 = 1
_TOKEN_QUERY = 0x8
_TOKEN_USER = 1


def _advapi32():
    return ctypes.WinDLL("advapi32", use_last_error=True)


def _check(result, what):
    if result != 0:
        raise OSError(result, f"{what}: {ctypes.FormatError(result)}")


def restrict_to_administrators(path, folder):
    """Makes Administrators the owner of `path` and the only ones, with
    SYSTEM, who may change it; for a folder, what is in it and what is made
    in it later too."""
    advapi32 = _advapi32()
    descriptor = ctypes.c_void_p()
    sddl = _ADMIN_ONLY.format(flags=_INHERITED_BY_CHILDREN if folder else "")
    if not advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW(sddl, _SDDL_REVISION_1,
                                                                          ctypes.byref(descriptor), None):
        raise ctypes.WinError(ctypes.get_last_error())
    try:
        owner, dacl = ctypes.c_void_p(), ctypes.c_void_p()
        present, defaulted = wintypes.BOOL(), wintypes.BOOL()
        advapi32.GetSecurityDescriptorOwner(descriptor, ctypes.byref(owner), ctypes.byref(defaulted))
        advapi32.GetSecurityDescriptorDacl(descriptor, ctypes.byref(present), ctypes.byref(dacl),
                                           ctypes.byref(defaulted))
        # SetNamedSecurityInfoW also hands the inheritable entries down to
        # what the folder holds already.
        _check(advapi32.SetNamedSecurityInfoW(
            str(path), _SE_FILE_OBJECT,
            _OWNER_SECURITY_INFORMATION | _DACL_SECURITY_INFORMATION | _PROTECTED_DACL_SECURITY_INFORMATION,
            owner, None, dacl, None), f"cannot restrict {path} to Administrators")
    finally:
        ctypes.windll.kernel32.LocalFree(descriptor)


def _sid_text(sid):
    text = ctypes.c_wchar_p()
    if not _advapi32().ConvertSidToStringSidW(sid, ctypes.byref(text)):
        raise ctypes.WinError(ctypes.get_last_error())
    try:
        return text.value
    finally:
        ctypes.windll.kernel32.LocalFree(text)


def owner_of(path):
    """The SID of `path`'s owner, as text (S-1-5-32-544)."""
    owner, descriptor = ctypes.c_void_p(), ctypes.c_void_p()
    _check(_advapi32().GetNamedSecurityInfoW(str(path), _SE_FILE_OBJECT, _OWNER_SECURITY_INFORMATION,
                                             ctypes.byref(owner), None, None, None, ctypes.byref(descriptor)),
           f"cannot read who owns {path}")
    try:
        return _sid_text(owner)
    finally:
        ctypes.windll.kernel32.LocalFree(descriptor)


def current_user_sid():
    kernel32, advapi32 = ctypes.WinDLL("kernel32", use_last_error=True), _advapi32()
    kernel32.GetCurrentProcess.restype = wintypes.HANDLE
    token = wintypes.HANDLE()
    this_process = wintypes.HANDLE(kernel32.GetCurrentProcess())
    if not advapi32.OpenProcessToken(this_process, _TOKEN_QUERY, ctypes.byref(token)):
        raise ctypes.WinError(ctypes.get_last_error())
    try:
        needed = wintypes.DWORD()
        advapi32.GetTokenInformation(token, _TOKEN_USER, None, 0, ctypes.byref(needed))
        buffer = ctypes.create_string_buffer(needed.value)
        if not advapi32.GetTokenInformation(token, _TOKEN_USER, buffer, needed, ctypes.byref(needed)):
            raise ctypes.WinError(ctypes.get_last_error())
        # TOKEN_USER begins with the SID's address.
        return _sid_text(ctypes.c_void_p.from_buffer(buffer).value)
    finally:
        kernel32.CloseHandle(token)


def untrusted_owner(path):
    """The owner of `path` when it is neither the system, Administrators, a
    service account, nor the caller: users may create folders in
    %ProgramData%, and whoever made %ProgramData%\\kiln could swap the
    configuration the service reads. None when the owner is trusted."""
    owner = owner_of(path)
    return None if owner in _TRUSTED_OWNERS or owner == current_user_sid() else owner
