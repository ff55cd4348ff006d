"""What the installers of kilnd as the machine's service share: their error,
and the settings they add to kilnd's config file. The installers themselves:
machine_service_windows (an elevated prompt, the Service Control Manager) and
machine_service_linux (root, systemd); kiln.commands.service runs them."""

import os


class ServiceError(Exception):
    """What went wrong, and what to do about it."""


def add_settings(path, settings, newline):
    """Appends each (name, value) that `path` lacks, keeping every line there
    (read as kilnd reads it: '#' starts a comment, '-' equals '_' in names);
    returns the lines it added. Lines end with `newline`, the platform's."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    present = set()
    for line in text.splitlines():
        body = line.split("#", 1)[0]
        if "=" in body:
            name, value = body.split("=", 1)
            present.add((name.strip().replace("-", "_"), os.path.normcase(value.strip())))
    added = []
    for name, value in settings:
        if "#" in value:
            raise ServiceError(f"kilnd's config file treats '#' as a comment, so it cannot name {value!r}; "
                               "move it to a path without '#'")
        if (name, os.path.normcase(value)) not in present:
            added.append(f"{name} = {value}")
    if added:
        if not text:
            text = "# kilnd configuration: one 'name = value' a line; kilnd --help lists the settings." + newline
        elif not text.endswith("\n"):
            text += newline
        path.parent.mkdir(parents=True, exist_ok=True)
        # UTF-8 without a byte order mark: kilnd would read one as part of a name.
        path.write_text(text + "".join(line + newline for line in added), encoding="utf-8", newline="")
    return added

