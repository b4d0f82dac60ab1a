# -*- coding: utf-8 -*-
# The installer's UEFI GRUB menu (/boot/grub/grub.cfg of the Debian netinst and Ubuntu live-server ISOs), edited so
# that the entry GRUB boots by itself carries the unattended seed's boot parameters. The bmc role rebuilds the
# operator's ISO with this menu (roles/bmc/tasks/os_remaster.yml) because Redfish cannot pass a kernel command line.
#
# What the edit does, and why (tests/unit/test_bmc_grub.py runs it on menus with the real ISOs' layout,
# tests/fixtures/grub/INDEX.md names where each layout was seen):
# - Only the FIRST top-level menu entry changes: it is what GRUB boots when the timeout runs out (default 0), and
#   both installers put their plain install there (Debian: 'Graphical install', Ubuntu: 'Try or Install Ubuntu
#   Server'). Every other entry stays as it was, so an operator at the console can still pick an interactive,
#   expert or rescue boot: those entries must not wipe a disk unasked, and Debian's 'Automated install' and
#   'Expert install' already carry auto=/priority= values that a second copy would contradict.
# - The parameters go right after the kernel's path, so they sit before `---`: what follows `---` is copied onto
#   the installed system's kernel command line (d-i and subiquity both do), where an auto=true or autoinstall does
#   not belong. d-i reads its preseed/url, auto and priority from the installer's own command line; subiquity's
#   `autoinstall` and cloud-init's ds=nocloud;s=... are read there too (the role quotes the ds= word: `;` ends a
#   GRUB command).
# - Every top-level `set timeout=` becomes `set timeout=<timeout>` (the last one wins in GRUB, Ubuntu sets 30), or
#   one is added at the top (Debian's menu has none and waits for ever); `set default=` is pinned to 0 when present.
# - Running it again on its own output changes nothing.
# The ISO's /md5sum.txt (both ISOs have one; casper checks the medium against it at boot, d-i when asked to) gets
# the new menu's MD5 on the menu's line, so an integrity check does not report the rebuilt menu as corrupt.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

MARK = "# hmk.moe_kit bmc: the first entry boots unattended with the seed's parameters (timeout %d s)."
_LINUX = re.compile(r"^(\s*linux(?:efi)?\s+\S+)(.*)$")
_ENTRY = re.compile(r"^\s*(menuentry|submenu)\b")
_TIMEOUT = re.compile(r"^(\s*)set\s+timeout=\S*\s*$")
_DEFAULT = re.compile(r"^(\s*)set\s+default=\S*\s*$")


class MenuError(ValueError):
    """The menu has no first entry with one kernel line to edit."""


def _depth_change(line):
    code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
    return code.count("{") - code.count("}")


def first_entry(text):
    """(start, end) line indexes of the first top-level menu entry, the line with `{` to the one with the closing
    `}`; MenuError when the first top-level item is a submenu or there is none."""
    lines = text.splitlines()
    depth = 0
    for index, line in enumerate(lines):
        if depth == 0 and _ENTRY.match(line):
            if _ENTRY.match(line).group(1) == "submenu":
                raise MenuError("the first item of the GRUB menu is a submenu (%s): GRUB would not boot an install "
                                "entry by itself" % line.strip())
            level = 0
            for end in range(index, len(lines)):
                level += _depth_change(lines[end])
                if level <= 0 and "{" in "".join(lines[index:end + 1]):
                    return index, end
            raise MenuError("the first menu entry (%s) is never closed" % line.strip())
        depth = max(depth + _depth_change(line), 0)
    raise MenuError("the GRUB menu has no menuentry")


def seed_menu(text, params, timeout=5):
    """The menu with `params` on the first entry's kernel line (once) and the timeout set; see the header."""
    params = (params or "").strip()
    if not params:
        raise MenuError("no boot parameters to add")
    lines = text.splitlines()
    start, end = first_entry(text)
    kernels = [i for i in range(start, end + 1) if _LINUX.match(lines[i])]
    if len(kernels) != 1:
        raise MenuError("the first menu entry (%s) has %d linux lines, not one" % (lines[start].strip(), len(kernels)))
    head, rest = _LINUX.match(lines[kernels[0]]).groups()
    if not rest.startswith(" " + params + " ") and rest.strip() != params:
        lines[kernels[0]] = "%s %s%s" % (head, params, rest)

    depth, timeouts = 0, 0
    for index, line in enumerate(lines):
        if depth == 0 and _TIMEOUT.match(line):
            lines[index] = "%sset timeout=%d" % (_TIMEOUT.match(line).group(1), timeout)
            timeouts += 1
        elif depth == 0 and _DEFAULT.match(line):
            lines[index] = "%sset default=0" % _DEFAULT.match(line).group(1)
        depth = max(depth + _depth_change(line), 0)
    mark = MARK % timeout
    if lines and lines[0] == mark:
        lines.pop(0)
    if not timeouts:
        lines.insert(0, "set timeout=%d" % timeout)
    lines.insert(0, mark)
    return "\n".join(lines) + "\n"


def md5sums(listing, path, data):
    """md5sum.txt (`<md5>  ./<path>` lines) with `path`'s line carrying the MD5 of `data` (text); the listing as it
    was when it has no line for `path`."""
    digest = hashlib.md5(data.encode("utf-8")).hexdigest()
    wanted = path.lstrip("./")
    out = []
    for line in listing.splitlines():
        fields = line.split(None, 1)
        if len(fields) == 2 and fields[1].strip().lstrip("./") == wanted:
            line = digest + line[len(fields[0]):]
        out.append(line)
    return "\n".join(out) + ("\n" if listing.endswith("\n") or not listing else "")
