<#
.SYNOPSIS
Installs Kiln on Windows: kilnd (as a service, or per user), its configuration,
Python headers for embedded Pythons, and the kiln-triton client.

.DESCRIPTION
Machine install (the default, needs an elevated PowerShell):
  - copies kilnd.exe, kiln.exe, kiln_worker.py and the DLLs beside them to -InstallDir;
  - adds `toolchain = <-Python>` and `allowed_user = <you>` to %ProgramData%\kiln\kilnd.conf,
    keeping every line already there;
  - if that Python has no include\Python.h or libs\python3XY.lib (an embedded Python such
    as ComfyUI's ships neither), puts a copy under %ProgramData%\kiln\python\<x.y>, from
    the matching python.org NuGet package;
  - registers and starts the kilnd service (`kilnd install`, `kilnd start`);
  - installs the kiln-triton client into that Python and runs `python -m kiln status`.

-PerUser does the same without a service or administrator rights: files go under
%LOCALAPPDATA%, the config gets no allowed_user (that kilnd serves only you), and the
client starts kilnd itself when it first needs it (KILN_KILND).

Re-running the script upgrades in place; the cache is kept.

.PARAMETER Python
The python.exe whose Triton kilnd compiles with, e.g.
C:\ComfyUI_windows_portable\python_embeded\python.exe. Required unless -Uninstall.

.PARAMETER KilnDir
The folder holding kilnd.exe and kiln_worker.py. Default: this script's folder, as in
the release zip.

.PARAMETER InstallDir
Where the binaries go. Default: $env:ProgramFiles\Kiln, or
$env:LOCALAPPDATA\Programs\Kiln with -PerUser.

.PARAMETER Account
The account the service runs as (kilnd install --user). Default: NT AUTHORITY\LocalService,
which needs no password and can read nothing of yours it is not given.

.PARAMETER PerUser
No service: install for the current user only, without administrator rights.

.PARAMETER Uninstall
Stop and remove the service (or the per-user kilnd), delete -InstallDir, and uninstall
kiln-triton from -Python when given. The cache and configuration stay unless -RemoveCache.

.PARAMETER RemoveCache
With -Uninstall: also delete %ProgramData%\kiln (or %LOCALAPPDATA%\kiln with -PerUser):
configuration, cache, logs and the Python headers.

.PARAMETER ClientWheel
A kiln_triton-*.whl to install. Default: the newest one beside this script (or in
-KilnDir); without one the installer stops before changing the Python.

.EXAMPLE
.\install-kiln.ps1 -Python C:\ComfyUI_windows_portable\python_embeded\python.exe
Machine install, from an elevated PowerShell in the unzipped release folder.

.EXAMPLE
.\install-kiln.ps1 -PerUser -Python C:\ComfyUI_windows_portable\python_embeded\python.exe
Per-user install; no administrator rights needed.

.EXAMPLE
.\install-kiln.ps1 -Uninstall -Python C:\ComfyUI_windows_portable\python_embeded\python.exe
Removes the service, the binaries and the client; keeps the cache.
#>
[CmdletBinding()]
param(
    [string]$Python,
    [string]$KilnDir = $PSScriptRoot,
    [string]$InstallDir = "$env:ProgramFiles\Kiln",
    [string]$Account = 'NT AUTHORITY\LocalService',
    [switch]$PerUser,
    [switch]$Uninstall,
    [switch]$RemoveCache,
    [string]$ClientWheel
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
# PowerShell 5.1 redraws Invoke-WebRequest's progress bar so often that downloads
# run many times slower.
$ProgressPreference = 'SilentlyContinue'

# Relative paths are made absolute against PowerShell's location: .NET calls resolve
# them against the process's directory, which is often another one.
function Get-FullPath([string]$Path) {
    return $ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath($Path)
}
if ($KilnDir) { $KilnDir = Get-FullPath $KilnDir }
if ($Python) { $Python = Get-FullPath $Python }
if ($ClientWheel) { $ClientWheel = Get-FullPath $ClientWheel }

$ServiceName = 'kilnd'
if ($PerUser) {
    if (-not $PSBoundParameters.ContainsKey('InstallDir')) {
        $InstallDir = Join-Path $env:LOCALAPPDATA 'Programs\Kiln'
    }
    $KilnHome = Join-Path $env:LOCALAPPDATA 'kiln'
} else {
    $KilnHome = Join-Path $env:ProgramData 'kiln'
}
$InstallDir = Get-FullPath $InstallDir
$ConfigPath = Join-Path $KilnHome 'kilnd.conf'
# kilnd looks for an embedded Python's headers in <this>\<x.y>\{include,libs}.
$PythonFilesDir = Join-Path $KilnHome 'python'
$InstalledKilnd = Join-Path $InstallDir 'kilnd.exe'

# Well-known SIDs, so that nothing depends on the language of account names.
$SidSystem = 'S-1-5-18'
$SidAdministrators = 'S-1-5-32-544'
$SidUsers = 'S-1-5-32-545'

function Write-Step([string]$Message) {
    Write-Host "==> $Message" -ForegroundColor Cyan
}

# PowerShell does not stop when a program fails, so every program runs through
# here. Its output goes to the console, never into a caller's return value.
function Invoke-Native {
    param(
        [Parameter(Mandatory = $true, Position = 0)][string]$FilePath,
        [Parameter(Position = 1)][string[]]$ArgumentList = @()
    )
    & $FilePath @ArgumentList | Out-Host
    if ($LASTEXITCODE -ne 0) {
        throw "'$FilePath $($ArgumentList -join ' ')' failed with exit code $LASTEXITCODE"
    }
}

function Test-Administrator {
    $identity = [Security.Principal.WindowsIdentity]::GetCurrent()
    $principal = New-Object Security.Principal.WindowsPrincipal($identity)
    return $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)
}

function Assert-Administrator {
    if (-not (Test-Administrator)) {
        throw ('Installing the kilnd service needs administrator rights. Re-run this script ' +
            'from an elevated PowerShell (right-click PowerShell, Run as administrator), or ' +
            'add -PerUser to install for yourself only, without a service.')
    }
}

function Test-SamePath([string]$A, [string]$B) {
    try {
        return [IO.Path]::GetFullPath($A).TrimEnd('\') -eq [IO.Path]::GetFullPath($B).TrimEnd('\')
    } catch {
        return $A -eq $B
    }
}

# The Python's Triton version, its version ("3.12" and "3.12.7"), base prefix and
# platform. The answer comes back in a UTF-8 file, not on stdout, so that
# non-ASCII paths survive PowerShell 5.1's console code page.
function Get-PythonInfo([string]$Path) {
    if (-not (Test-Path -LiteralPath $Path -PathType Leaf)) {
        throw ("No python.exe at '$Path'. Pass the full path of the Python that runs Triton, " +
            'e.g. -Python C:\ComfyUI_windows_portable\python_embeded\python.exe')
    }
    $Path = (Resolve-Path -LiteralPath $Path).ProviderPath
    # Only single quotes inside: PowerShell 5.1 mangles double quotes in arguments.
    $probe = @'
import sys, sysconfig, triton; v = sys.version_info; pre = {'alpha': 'a', 'beta': 'b', 'candidate': 'rc'}.get(v.releaselevel); open(sys.argv[1], 'w', encoding='utf-8').write('\n'.join([triton.__version__, '%d.%d' % v[:2], '%d.%d.%d' % v[:3] + ('-%s%d' % (pre, v.serial) if pre else ''), sys.base_prefix, sysconfig.get_platform()]))
'@
    $answer = Join-Path ([IO.Path]::GetTempPath()) ('kiln-probe-' + [guid]::NewGuid() + '.txt')
    try {
        & $Path -c $probe $answer | Out-Host
        $code = $LASTEXITCODE
        if ($code -ne 0 -or -not (Test-Path -LiteralPath $answer)) {
            throw ("'$Path' cannot import triton (exit code $code; its error is above). Kiln " +
                "compiles with that Python's Triton: pip install triton-windows into that Python " +
                "(& '$Path' -m pip install triton-windows), then re-run this script.")
        }
        $fields = @([IO.File]::ReadAllText($answer, [Text.Encoding]::UTF8) -split "`r?`n")
    } finally {
        Remove-Item -LiteralPath $answer -Force -ErrorAction SilentlyContinue
    }
    if ($fields.Count -lt 5) {
        throw "'$Path' gave an unexpected answer to the Triton probe: $($fields -join ' | ')"
    }
    return [pscustomobject]@{
        Path        = $Path
        Triton      = $fields[0].Trim()
        Version     = $fields[1].Trim()
        FullVersion = $fields[2].Trim()
        BasePrefix  = $fields[3].Trim()
        Platform    = $fields[4].Trim()
    }
}

# Gives a folder or file to Administrators, with Administrators and SYSTEM in full
# control and everyone else read-only. kilnd runs the configured Python and builds
# launcher modules with these headers as the service account, so whoever could
# change them could run code as that account.
function Protect-AdminOnly([string]$Path) {
    $inherit = ''
    $owner = @($Path, '/setowner', "*$SidAdministrators", '/Q')
    if (Test-Path -LiteralPath $Path -PathType Container) {
        $inherit = '(OI)(CI)'
        $owner += '/T'  # on a file, /T would also match same-named files in subfolders
    }
    Invoke-Native icacls.exe $owner
    Invoke-Native icacls.exe @($Path, '/inheritance:r', '/grant:r',
        "*$($SidSystem):$($inherit)F", "*$($SidAdministrators):$($inherit)F",
        "*$($SidUsers):$($inherit)RX", '/Q')
}

# Users may create folders in %ProgramData%, and whoever creates one owns it: a
# %ProgramData%\kiln made by someone else could be used to swap the configuration.
function Assert-TrustedOwner([string]$Path) {
    $acl = Get-Acl -LiteralPath $Path
    $owner = $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value
    $trusted = @($SidSystem, $SidAdministrators, 'S-1-5-19', 'S-1-5-20',
        [Security.Principal.WindowsIdentity]::GetCurrent().User.Value)
    try {
        $accountName = New-Object Security.Principal.NTAccount($Account)
        $trusted += $accountName.Translate([Security.Principal.SecurityIdentifier]).Value
    } catch {
        # An account name Windows cannot look up here is checked by kilnd install.
    }
    if ($trusted -notcontains $owner) {
        throw ("$Path belongs to $($acl.Owner), not to Administrators, so whoever that is could " +
            'change what the service runs. If you do not know why, delete the folder and re-run; ' +
            "if it is meant to be, make Administrators its owner (icacls `"$Path`" /setowner " +
            "*$SidAdministrators) and re-run.")
    }
}

# Appends the settings that are missing and keeps every existing line; no
# allowed_user when $User is empty. Written as
# UTF-8 without a byte order mark: PowerShell 5.1's -Encoding UTF8 writes one, and
# kilnd would read it as part of the first setting's name.
function Update-KilndConfig([string]$Path, [string]$Toolchain, [string]$User) {
    if ($Toolchain.Contains('#')) {
        throw "kilnd's config file treats '#' as a comment, so it cannot name '$Toolchain'; move that Python to a path without '#'."
    }
    $text = ''
    if (Test-Path -LiteralPath $Path) { $text = [IO.File]::ReadAllText($Path) }
    $settings = @()
    foreach ($line in ($text -split "`r?`n")) {
        $body = ($line -split '#', 2)[0]  # as kilnd reads it: '#' starts a comment
        $equals = $body.IndexOf('=')
        if ($equals -lt 0) { continue }
        $settings += [pscustomobject]@{
            Name  = $body.Substring(0, $equals).Trim().Replace('-', '_')
            Value = $body.Substring($equals + 1).Trim()
        }
    }
    $added = @()
    if (-not ($settings | Where-Object { $_.Name -eq 'toolchain' -and (Test-SamePath $_.Value $Toolchain) })) {
        $added += "toolchain = $Toolchain"
    }
    if ($User -and -not ($settings | Where-Object { $_.Name -eq 'allowed_user' -and $_.Value -eq $User })) {
        $added += "allowed_user = $User"
    }
    if ($added.Count -eq 0) { return @() }
    if ($text.Length -eq 0) {
        $text = "# kilnd configuration: one 'name = value' a line; kilnd --help lists the settings.`r`n"
    } elseif (-not $text.EndsWith("`n")) {
        $text += "`r`n"
    }
    $text += ($added -join "`r`n") + "`r`n"
    New-Item -ItemType Directory -Force -Path (Split-Path -Parent $Path) | Out-Null
    [IO.File]::WriteAllText($Path, $text, (New-Object Text.UTF8Encoding($false)))
    return $added
}

function Test-PythonBuildFiles([string]$Root, [string]$Version) {
    if (-not $Root) { return $false }
    $library = 'python' + $Version.Replace('.', '') + '.lib'
    return (Test-Path -LiteralPath (Join-Path $Root 'include\Python.h')) -and
        (Test-Path -LiteralPath (Join-Path $Root "libs\$library"))
}

# Launcher modules are C extensions: building one needs Python.h and python3XY.lib.
# Returns a line for the summary.
function Install-PythonBuildFiles($Info) {
    $version = $Info.Version
    $library = 'python' + $version.Replace('.', '') + '.lib'
    $pythonDir = Split-Path -Parent $Info.Path
    $target = Join-Path $PythonFilesDir $version
    if (Test-PythonBuildFiles $pythonDir $version) {
        return "in place ($pythonDir)"
    }
    if (Test-PythonBuildFiles $target $version) {
        return "$target (already there)"
    }
    if (-not $PerUser) {
        New-Item -ItemType Directory -Force -Path $PythonFilesDir | Out-Null
        Protect-AdminOnly $PythonFilesDir
    }
    # Start clean, so that nothing already in the folder is used with the new copy.
    if (Test-Path -LiteralPath $target) { Remove-Item -LiteralPath $target -Recurse -Force }
    New-Item -ItemType Directory -Force -Path $target | Out-Null

    # A venv's folder has neither, but the Python it was made from has both.
    if (Test-PythonBuildFiles $Info.BasePrefix $version) {
        Write-Step "Copying Python $version's include and libs from $($Info.BasePrefix) to $target"
        Copy-Item -LiteralPath (Join-Path $Info.BasePrefix 'include') -Destination (Join-Path $target 'include') -Recurse
        Copy-Item -LiteralPath (Join-Path $Info.BasePrefix 'libs') -Destination (Join-Path $target 'libs') -Recurse
        return "$target (copied from $($Info.BasePrefix))"
    }

    switch ($Info.Platform) {
        'win-amd64' { $package = 'python' }
        'win-arm64' { $package = 'pythonarm64' }
        'win32' { $package = 'pythonx86' }
        default { throw "Python at $($Info.Path) reports platform '$($Info.Platform)'; Kiln knows no python.org package for it." }
    }
    $url = "https://www.nuget.org/api/v2/package/$package/$($Info.FullVersion)"
    Write-Step ("$($Info.Path) has no include\Python.h or libs\$library (embedded Pythons ship " +
        "without them). Downloading python.org's NuGet package '$package' $($Info.FullVersion) " +
        "(about 15 MB) from $url, to copy only its include and libs folders to $target")
    $manual = ("To do it by hand: download $url in a browser, rename the file to .zip, extract " +
        "it, copy its tools\include and tools\libs folders to $target\include and $target\libs " +
        "(or copy include and libs from a full python.org install of Python $version), then " +
        're-run this script.')
    $temp = Join-Path ([IO.Path]::GetTempPath()) ('kiln-python-' + [guid]::NewGuid())
    New-Item -ItemType Directory -Path $temp | Out-Null
    try {
        $zip = Join-Path $temp 'python.zip'  # Expand-Archive accepts only .zip names
        try {
            # nuget.org requires TLS 1.2, which PowerShell 5.1 does not enable by default.
            [Net.ServicePointManager]::SecurityProtocol =
                [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
            Invoke-WebRequest -Uri $url -OutFile $zip -UseBasicParsing
        } catch {
            throw "Could not download $url ($($_.Exception.Message)). $manual"
        }
        $unpacked = Join-Path $temp 'package'
        Expand-Archive -LiteralPath $zip -DestinationPath $unpacked
        $tools = Join-Path $unpacked 'tools'
        if (-not (Test-PythonBuildFiles $tools $version)) {
            throw "$url has no tools\include\Python.h and tools\libs\$library. $manual"
        }
        Copy-Item -LiteralPath (Join-Path $tools 'include') -Destination (Join-Path $target 'include') -Recurse
        Copy-Item -LiteralPath (Join-Path $tools 'libs') -Destination (Join-Path $target 'libs') -Recurse
    } finally {
        Remove-Item -LiteralPath $temp -Recurse -Force -ErrorAction SilentlyContinue
    }
    return "$target (from $url)"
}

function Find-ClientWheel {
    if ($ClientWheel) {
        if (-not (Test-Path -LiteralPath $ClientWheel -PathType Leaf)) {
            throw "No wheel at -ClientWheel '$ClientWheel'."
        }
        return (Resolve-Path -LiteralPath $ClientWheel).ProviderPath
    }
    foreach ($dir in (@($PSScriptRoot, $KilnDir) | Where-Object { $_ } | Select-Object -Unique)) {
        $wheels = @(Get-ChildItem -LiteralPath $dir -Filter 'kiln_triton-*.whl' -File -ErrorAction SilentlyContinue |
            Sort-Object Name -Descending)
        if ($wheels.Count -gt 0) { return $wheels[0].FullName }
    }
    return $null
}

# The files to install: kilnd.exe and kiln_worker.py are required; kiln.exe and the
# DLLs (gRPC, OpenSSL, ... when built as shared libraries) come along when present.
function Get-KilnFiles {
    if (-not $KilnDir) { throw 'Pass -KilnDir <folder with kilnd.exe and kiln_worker.py>.' }
    $files = @()
    foreach ($name in @('kilnd.exe', 'kiln_worker.py')) {
        $path = Join-Path $KilnDir $name
        if (-not (Test-Path -LiteralPath $path -PathType Leaf)) {
            throw "No $name in '$KilnDir'. Run this script from the unzipped Kiln release, or pass -KilnDir <folder with kilnd.exe and kiln_worker.py>."
        }
        $files += $path
    }
    $cli = Join-Path $KilnDir 'kiln.exe'
    if (Test-Path -LiteralPath $cli -PathType Leaf) { $files += $cli }
    $files += @(Get-ChildItem -LiteralPath $KilnDir -Filter '*.dll' -File | ForEach-Object { $_.FullName })
    return $files
}

function Get-KilndProcesses([string]$Exe) {
    return @(Get-Process -Name 'kilnd' -ErrorAction SilentlyContinue |
        Where-Object { $_.Path -and (Test-SamePath $_.Path $Exe) })
}

# kilnd.exe and its DLLs cannot be replaced or deleted while it runs.
function Wait-KilndExit([string]$Exe, [switch]$Kill) {
    foreach ($process in (Get-KilndProcesses $Exe)) {
        if ($Kill) {
            Write-Step "Stopping kilnd (process $($process.Id)) so that its files can be replaced"
            # The store is crash-safe (a blob is in place before the transaction that
            # names it commits), so a hard stop loses nothing already stored.
            Stop-Process -Id $process.Id -Force
        }
        # kilnd lets in-flight calls finish for up to 30 s before it exits.
        if (-not $process.WaitForExit(60000)) {
            throw "kilnd (process $($process.Id)) is still running after 60 s; stop it and re-run."
        }
    }
}

function Remove-KilndService {
    $service = Get-Service -Name $ServiceName -ErrorAction SilentlyContinue
    if ($null -eq $service) { return }
    Write-Step "Removing the existing $ServiceName service"
    if (Test-Path -LiteralPath $InstalledKilnd) {
        if ($service.Status -ne 'Stopped') { Invoke-Native $InstalledKilnd @('stop') }
        Invoke-Native $InstalledKilnd @('uninstall')
        Wait-KilndExit $InstalledKilnd
    } else {
        # kilnd.exe is gone, or was installed elsewhere: the SCM can still remove it.
        if ($service.Status -ne 'Stopped') { Stop-Service -Name $ServiceName -Force }
        Invoke-Native sc.exe @('delete', $ServiceName)
    }
    # A deleted service lingers while anything holds a handle to it, and a new one of
    # the same name cannot be created until it is gone.
    $deadline = (Get-Date).AddSeconds(15)
    while (Get-Service -Name $ServiceName -ErrorAction SilentlyContinue) {
        if ((Get-Date) -gt $deadline) {
            throw "The $ServiceName service is marked for deletion but still exists; close Services (services.msc) and Event Viewer, then re-run."
        }
        Start-Sleep -Milliseconds 500
    }
}

function Show-KilnStatus([string]$PythonPath) {
    Write-Step "Checking the client: $PythonPath -m kiln status"
    & $PythonPath -m kiln status | Out-Host
    if ($LASTEXITCODE -ne 0) {
        Write-Warning ("'$PythonPath -m kiln status' failed with exit code $LASTEXITCODE. Kiln is " +
            "installed, but this Python cannot use kilnd yet: see $KilnHome\logs\kilnd.log" +
            $(if ($PerUser) { '.' } else { ", '$InstalledKilnd status' and Event Viewer (source kilnd)." }))
    }
}

function Install-Kiln {
    if (-not $Python) {
        throw ('-Python is required: the python.exe whose Triton kilnd compiles with, e.g. ' +
            '-Python C:\ComfyUI_windows_portable\python_embeded\python.exe')
    }
    if (-not $PerUser) { Assert-Administrator }

    # Everything that can fail without changing the machine comes first.
    Write-Step "Checking Triton in $Python"
    $info = Get-PythonInfo $Python
    Write-Host "    Python $($info.FullVersion) ($($info.Platform)), triton $($info.Triton)"
    $files = @(Get-KilnFiles)
    $wheel = Find-ClientWheel
    if (-not $wheel) {
        # Never a package index: an unrelated package under that name must not land in this Python.
        throw ("No kiln_triton-*.whl beside this script or in -KilnDir. Build one with " +
            "'pip wheel --no-deps ./client/python' (or use a release zip) and pass -ClientWheel.")
    }
    # Who may use a machine kilnd; a per-user kilnd serves only the user who runs it.
    $user = ''
    if (-not $PerUser) { $user = [Security.Principal.WindowsIdentity]::GetCurrent().Name }
    if (-not $PerUser -and (Test-Path -LiteralPath $KilnHome)) { Assert-TrustedOwner $KilnHome }
    if (-not $PerUser -and $env:USERPROFILE) {
        $profiles = Split-Path -Parent $env:USERPROFILE
        if ($info.Path.StartsWith("$profiles\", [StringComparison]::OrdinalIgnoreCase)) {
            Write-Warning ("$($info.Path) is inside a user profile, which $Account cannot read " +
                'by default, so the service may be unable to run it. Move that Python (e.g. to ' +
                "C:\ComfyUI_windows_portable), give $Account read access to its folder, or use -PerUser.")
        }
    }

    if ($PerUser) {
        Wait-KilndExit $InstalledKilnd -Kill
    } else {
        Remove-KilndService
    }

    Write-Step "Copying kilnd to $InstallDir"
    New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
    if (-not $PerUser) { Protect-AdminOnly $InstallDir }  # the service runs what is here
    if (Test-SamePath $KilnDir $InstallDir) {
        Write-Host '    already there'
    } else {
        foreach ($file in $files) { Copy-Item -LiteralPath $file -Destination $InstallDir -Force }
        # CPython's headers, which kilnd.exe looks for beside itself for embedded Pythons' launchers.
        $headers = Join-Path $KilnDir 'python'
        if (Test-Path -LiteralPath $headers -PathType Container) {
            $installedHeaders = Join-Path $InstallDir 'python'
            if (Test-Path -LiteralPath $installedHeaders) { Remove-Item -LiteralPath $installedHeaders -Recurse -Force }
            Copy-Item -LiteralPath $headers -Destination $installedHeaders -Recurse
        }
    }

    Write-Step "Writing $ConfigPath"
    New-Item -ItemType Directory -Force -Path $KilnHome | Out-Null
    $added = @(Update-KilndConfig $ConfigPath $info.Path $user)
    if (-not $PerUser) { Protect-AdminOnly $ConfigPath }
    if ($added.Count -eq 0) { Write-Host '    nothing to add' } else { $added | ForEach-Object { Write-Host "    + $_" } }

    Write-Step "Looking for Python $($info.Version)'s headers and import library"
    $pythonFiles = Install-PythonBuildFiles $info
    Write-Host "    $pythonFiles"

    if ($PerUser) {
        # The client starts kilnd when it finds none running; this tells it where kilnd is.
        [Environment]::SetEnvironmentVariable('KILN_KILND', $InstalledKilnd, 'User')
        $env:KILN_KILND = $InstalledKilnd
    } else {
        Write-Step "Registering the $ServiceName service (as $Account) and starting it"
        Invoke-Native $InstalledKilnd @('install', '--user', $Account, '--config', $ConfigPath)
        Invoke-Native $InstalledKilnd @('start')
    }

    Write-Step "Installing the client $wheel into $($info.Path)"
    Invoke-Native $info.Path @('-m', 'pip', 'install', '--no-warn-script-location', '--upgrade', $wheel)

    if ($PerUser) {
        # Started here so that the status check below finds it; later, the client does this.
        Write-Step "Starting $InstalledKilnd"
        Start-Process -FilePath $InstalledKilnd -ArgumentList "--config=`"$ConfigPath`"" -WindowStyle Hidden
        Start-Sleep -Seconds 2
    }
    Show-KilnStatus $info.Path

    Write-Host ''
    Write-Host 'Kiln is installed.' -ForegroundColor Green
    Write-Host "  binaries       $InstallDir"
    if ($PerUser) {
        Write-Host "  kilnd          started by the client when none runs (KILN_KILND=$InstalledKilnd; programs already open do not see it)"
    } else {
        Write-Host "  service        $ServiceName, as $Account ('$InstalledKilnd' status | start | stop)"
    }
    Write-Host "  configuration  $ConfigPath"
    Write-Host "  cache and logs $KilnHome"
    Write-Host "  Python headers $pythonFiles"
    Write-Host "  client         kiln-triton in $($info.Path)"
    Write-Host 'Use it: set KILN=1 before starting ComfyUI (or call kiln.enable()); KILN_STRICT=1 fails instead of falling back to stock Triton.'
    $scope = ''
    if ($PerUser) { $scope = ' -PerUser' }
    Write-Host "Uninstall: & '$PSCommandPath' -Uninstall$scope -Python '$($info.Path)'  (the cache stays unless -RemoveCache)"
}

function Uninstall-Kiln {
    if ($PerUser) {
        Wait-KilndExit $InstalledKilnd -Kill
        if ([Environment]::GetEnvironmentVariable('KILN_KILND', 'User') -eq $InstalledKilnd) {
            [Environment]::SetEnvironmentVariable('KILN_KILND', $null, 'User')
        }
    } else {
        Assert-Administrator
        Remove-KilndService
    }

    if (Test-Path -LiteralPath $InstallDir) {
        # Only a folder that holds Kiln is deleted whole: -InstallDir may have been
        # pointed at a shared folder.
        if ((Test-Path -LiteralPath $InstalledKilnd) -or (Test-Path -LiteralPath (Join-Path $InstallDir 'kiln_worker.py'))) {
            Write-Step "Deleting $InstallDir"
            Remove-Item -LiteralPath $InstallDir -Recurse -Force
        } else {
            Write-Warning "$InstallDir holds no kilnd.exe or kiln_worker.py; left as it is."
        }
    }

    if ($Python) {
        if (Test-Path -LiteralPath $Python -PathType Leaf) {
            Write-Step "Uninstalling kiln-triton from $Python"
            Invoke-Native $Python @('-m', 'pip', 'uninstall', '-y', 'kiln-triton')
        } else {
            Write-Warning "No python.exe at '$Python'; kiln-triton was not uninstalled from it."
        }
    }

    if ($RemoveCache -and (Test-Path -LiteralPath $KilnHome)) {
        Write-Step "Deleting $KilnHome (configuration, cache, logs, Python headers)"
        Remove-Item -LiteralPath $KilnHome -Recurse -Force
    }

    Write-Host ''
    Write-Host 'Kiln is uninstalled.' -ForegroundColor Green
    if (-not $RemoveCache) {
        Write-Host "  kept: $KilnHome (configuration, cache, logs, Python headers); -RemoveCache deletes it"
    }
    if (-not $Python) {
        Write-Host '  kiln-triton stays in the Pythons it was installed into: <python.exe> -m pip uninstall kiln-triton'
    }
}

try {
    if ($Uninstall) { Uninstall-Kiln } else { Install-Kiln }
} catch {
    Write-Host "install-kiln: $($_.Exception.Message)" -ForegroundColor Red
    exit 1
}
