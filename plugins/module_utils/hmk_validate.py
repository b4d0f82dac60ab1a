# -*- coding: utf-8 -*-
"""The kit's one input validator: what argument_specs cannot say (formats, ranges, paths, URLs, secrets).

Every role's first step runs its inputs through `check_all` (the controller-side filter
`hmk.moe_kit.hmk_validate`) and, for what only the node can tell, through the `hmk_validate_node` module
(paths that must exist, sysctl keys under /proc/sys, ports other units listen on). A refusal is one
sentence that names the variable, shows the value (a secret only as its length) and says what is allowed.

Patterns are matched with `fullmatch`: Python's `$` also matches before a final newline, so
`re.match("^[0-9]+$", "80\n")` succeeds; a value with a trailing newline would then reach a config file.
Pure Python 3 standard library: the filter, the modules and the unit tests import this file.
"""
from __future__ import absolute_import, division, print_function

import functools
import inspect
import ipaddress
import json
import math
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_answer_probe import probe_problem

__metaclass__ = type

builtin_min, builtin_max = min, max  # the rules' options are named min and max, as the tables write them

# C0 controls, DEL, and the characters Unicode (and Python's splitlines) treats as line breaks.
CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
WHITESPACE = re.compile(r"\s")

# A name that becomes one path component (catalog ids, unit names, file names): no separator, no leading
# dot (so never "." or ".."), no shell or glob characters.
COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]{0,254}")
POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
UNIT_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,200}")
UNIT_SUFFIXES = ("service", "socket", "target", "mount", "timer", "path", "slice", "scope", "device", "swap")
SYSCTL_KEY = re.compile(r"[A-Za-z0-9_-]+([./][A-Za-z0-9_@:+-]+)+")
INT_LIST = re.compile(r"-?[0-9]+([ \t]+-?[0-9]+)*")
OCTAL_MODE = re.compile(r"0[0-7]{3}")
SHA1 = re.compile(r"[0-9a-f]{40}")
PATH_CHARS = re.compile(r"[A-Za-z0-9/_.+@:,=~-]+")
# URL characters kept: RFC 3986 unreserved and the delimiters a model store's path or query needs.
# $ ( ) ; ' " ` \ < > { } | ^ and spaces are refused: no store needs them, and they are what command or
# config injection is made of.
URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&*+,=%-]+")
PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})|%(0[0-9A-Fa-f]|1[0-9A-Fa-f]|7[Ff])")
SCP_LIKE = re.compile(r"([A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//)(?!-)[A-Za-z0-9._/~+-]+")
JOURNAL_UNITS = ("us|usec|ms|msec|s|sec|second|seconds|m|min|minute|minutes|h|hr|hour|hours|d|day|days|"
                 "w|week|weeks|M|month|months|y|year|years")
JOURNAL_RELATIVE = re.compile(r"[+-]? *([0-9]+ *(%s) *)+" % JOURNAL_UNITS)
JOURNAL_ABSOLUTE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{2}:[0-9]{2}(:[0-9]{2})?)?")
JOURNAL_WORDS = ("now", "today", "yesterday", "tomorrow")
KERNEL_ARG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:=/+@-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?")
CMAKE_DEFINE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=[^\s]*")
OT_BUFFER = re.compile(r"CPU|CUDA[0-9]+|ROCm[0-9]+|Vulkan[0-9]+|SYCL[0-9]+|Metal")
SYSTEMD_CALENDAR = re.compile(r"(minutely|hourly|daily|weekly|monthly|quarterly|semiannually|yearly|"
                              r"[A-Za-z0-9*:/,. ~-]{1,64})")

# A decimal number as YAML or an operator writes it. float() also takes "nan", "inf", "infinity", "1_000" and
# surrounding whitespace; none of those is a setting, and NaN passes every range comparison (NaN < 0 and NaN > 0
# are both false), so a NaN reserve would render as 0 bytes of headroom.
DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
# What YAML 1.1 (Ansible's inventories) reads as a boolean when unquoted, and Ansible's `| bool` as true/false.
BOOL_WORDS = ("yes", "no", "on", "off", "true", "false", "y", "n")
# An IPv6 zone ID: an interface name (Linux: at most 15 characters, IFNAMSIZ - 1) or an interface index. The zone
# reaches unit files and command lines beside the address, so it is one plain token.
ZONE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
PORT_MIN, PORT_MAX = 1, 65535

# Directories a role must never create, chown or chmod as its own (a models root of /etc, a config dir of /tmp).
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
               "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin",
               "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/sbin", "/var", "/var/lib", "/var/log", "/var/tmp")
# Trees whose content belongs to the kernel or the package manager.
FOREIGN_TREES = ("/proc", "/sys", "/dev", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/run")

# The GPU architectures (compute capability without the dot) the kit knows how to build and serve for.
GPU_ARCHS = ("75", "80", "86", "87", "89", "90", "100", "103", "120", "121")


def _huge(value):
    """An integer too long for Python to print (int <-> str stops at 4300 digits), described instead."""
    return "<an integer of about %d digits>" % int(abs(value).bit_length() * math.log10(2) + 1)


def show(value, secret=False, limit=120):
    """The value as a refusal shows it: JSON (control characters escaped), a secret only as its length."""
    if secret:
        if isinstance(value, str):
            return "<secret, %d characters>" % len(value)
        return "<secret>"
    if _is_int(value) and value.bit_length() > 4000:
        return _huge(value)
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except ValueError:  # a huge integer inside a list or dict
            text = "<%s that cannot be printed>" % type(value).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def refusal(var, value, allowed, secret=False):
    return "%s = %s refused: %s" % (var, show(value, secret), allowed)


def _control(value):
    """A sentence naming the first control character, or None."""
    match = CONTROL.search(value)
    if not match:
        return None
    char = match.group(0)
    name = {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab", "\x00": "a NUL byte"}.get(
        char, "the control character U+%04X" % ord(char))
    return "it contains %s at position %d" % (name, match.start())


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value):
    if _is_int(value):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value):
        try:
            return int(value)
        except ValueError:  # more digits than int() converts: no setting is that large
            return None
    return None


def _as_number(value):
    """The value as a finite int or float, or None: never a boolean, NaN or an infinity, in any spelling."""
    if _is_int(value):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str) and len(value) <= 64 and DECIMAL.fullmatch(value):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _not_a_number(value, what):
    """Why a value that is not a finite number was refused: booleans and NaN/infinity get their own words."""
    if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOL_WORDS):
        return ("%s, not a boolean (YAML reads unquoted yes/no/on/off/true/false as true or false, and Python counts "
                "true as 1)" % what)
    if isinstance(value, str) and len(value) <= 64:
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return "%s that is finite (not NaN or an infinity; NaN passes every range check)" % what
    return what


# ------------------------------------------------------------------------------------------------ rules
# Each rule takes the value and its options and returns None (accepted) or what is allowed (a sentence).

def rule_text(value, allow_empty=True, max_length=4096, pattern=None, pattern_text=None, no_whitespace=False,
              **_):
    if not isinstance(value, str):
        return "a string"
    if value == "":
        return None if allow_empty else "a non-empty string"
    problem = _control(value)
    if problem:
        return "a single line without control characters (%s)" % problem
    if len(value) > max_length:
        return "at most %d characters (it has %d)" % (max_length, len(value))
    if no_whitespace and WHITESPACE.search(value):
        return "no whitespace"
    if pattern and not re.fullmatch(pattern, value):
        return pattern_text or "text matching %s (whole value)" % pattern
    return None


def rule_secret(value, min_length=0, no_whitespace=False, allow_empty=True, **_):
    if not isinstance(value, str):
        return "a string"
    if value == "":
        return None if allow_empty else "a non-empty secret"
    problem = _control(value)
    if problem:
        return "a secret without line breaks or control characters (%s; a line break would split it)" % problem
    if no_whitespace and WHITESPACE.search(value):
        return "a secret without whitespace"
    if len(value) < min_length:
        return ("at least %d characters (the engine logs the last 4 characters of its key, so a short key is "
                "mostly in the log)" % min_length)
    return None


def rule_component(value, allow_empty=False, **_):
    if value == "" and allow_empty:
        return None
    if not isinstance(value, str) or not COMPONENT.fullmatch(value):
        return ("one path component: letters, digits and _ . + @ -, not starting with a dot, at most 255 "
                "characters (it names a file or directory, so / .. and spaces are not allowed)")
    return None


def _path_problem(value):
    if not isinstance(value, str) or not value.startswith("/"):
        return "an absolute path"
    problem = _control(value)
    if problem:
        return "an absolute path without control characters (%s)" % problem
    if not PATH_CHARS.fullmatch(value):
        bad = sorted(set(c for c in value if not PATH_CHARS.fullmatch(c)))
        return ("an absolute path of letters, digits and / _ . + @ : , = ~ - (not %s: paths go into unit files and "
                "command lines)" % " ".join(repr(c) for c in bad))
    parts = value.split("/")
    if ".." in parts or "." in parts[1:]:
        return "an absolute path without . or .. components"
    if "//" in value:
        return "an absolute path without empty components (//)"
    return None


def rule_abs_path(value, allow_empty=False, not_system=False, not_under=None, under=None, **_):
    """An absolute, normalised path; `not_system`: not a top-level system directory or a kernel/package tree."""
    if value == "" and allow_empty:
        return None
    problem = _path_problem(value)
    if problem:
        return problem
    path = value.rstrip("/") or "/"
    if not_system:
        if path in SYSTEM_DIRS:
            return "a directory of its own, not the system directory %s (the role sets its owner and mode)" % path
        not_under = list(not_under or []) + list(FOREIGN_TREES)
    for tree in not_under or []:
        if path == tree or path.startswith(tree.rstrip("/") + "/"):
            return "a path outside %s" % tree
    if under and not any(path == u or path.startswith(u.rstrip("/") + "/") for u in under):
        return "a path under %s" % " or ".join(under)
    return None


def rule_rel_path(value, allow_empty=False, **_):
    """A relative path of safe components (a file's place under a model store's directory)."""
    if value == "" and allow_empty:
        return None
    if not isinstance(value, str) or value.startswith("/") or value == "":
        return "a relative path"
    for part in value.split("/"):
        if not COMPONENT.fullmatch(part):
            return ("a relative path of plain components (letters, digits and _ . + @ -, none starting with a "
                    "dot, no .. or empty components)")
    return None


def _url_port_problem(host):
    """The port of a URL's host[:port] outside 1-65535, as a sentence, or None."""
    port = re.search(r":([0-9]+)$", host) if not host.endswith("]") else None
    if port and not PORT_MIN <= int(port.group(1)) <= PORT_MAX:
        return "a port from %d to %d after the host" % (PORT_MIN, PORT_MAX)
    return None


def loopback_address(host):
    """Whether `host` is a loopback IP literal (127.0.0.0/8, ::1; [::1] as a URL writes it). Names are not: the kit
    does not know what they resolve to. An address with a zone ID (::1%eth0) never is: a zone scopes a link-local
    address to an interface, and what follows % is not checked by the address parser."""
    if not isinstance(host, str) or "%" in host:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rule_url(value, schemes=("http", "https"), allow_empty=False, carries_secret=False, **_):
    """A URL of one of `schemes`; `carries_secret`: the kit sends a token to it, so https, and http only to a loopback
    address (where the token does not cross a network: the test beds' stand-in servers on 127.0.0.1)."""
    if value == "" and allow_empty:
        return None
    if not isinstance(value, str):
        return "a URL"
    allowed = "a URL starting with %s" % " or ".join(s + "://" for s in schemes)
    problem = _control(value)
    if problem:
        return "%s without control characters (%s)" % (allowed, problem)
    if WHITESPACE.search(value):
        return "%s without whitespace" % allowed
    match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", value)
    if not match or match.group(1).lower() not in schemes:
        return allowed
    if not URL_CHARS.fullmatch(value):
        bad = sorted(set(c for c in value if not URL_CHARS.fullmatch(c)))
        return "%s of letters, digits and - . _ ~ : / ? # [ ] @ ! & * + , = %% (not %s)" % (allowed, " ".join(bad))
    if PERCENT.search(value):
        return "%s whose %%-escapes are two hex digits and encode no control character" % allowed
    host = match.group(2)
    userinfo, at, host = host.rpartition("@")
    if at and (":" in userinfo or match.group(1).lower() in ("http", "https")):
        return "%s without credentials in it (give a token through its own variable, kept in a vault)" % allowed
    if match.group(1).lower() != "file" and not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?",
                                                             host):
        return "%s with a host name" % allowed
    problem = _url_port_problem(host)
    if problem:
        return "%s with %s" % (allowed, problem)
    if carries_secret and match.group(1).lower() != "https":
        name = re.sub(r":[0-9]+$", "", host) if not host.endswith("]") else host
        if not (match.group(1).lower() == "http" and loopback_address(name)):
            return ("an https:// URL: the kit sends a token to it, which http:// would carry in cleartext (http:// "
                    "only to a loopback address, 127.0.0.0/8 or [::1], where the token does not leave the machine)")
    return None


def rule_git_url(value, **_):
    """A git remote git can only fetch from: https/http/ssh/git/file URLs or scp-like user@host:path."""
    if not isinstance(value, str):
        return "a git URL"
    if value.startswith("-"):
        return "a git URL, not an option"
    if SCP_LIKE.fullmatch(value):
        return None
    problem = rule_url(value, schemes=("https", "http", "ssh", "git", "file"))
    if problem:
        return "%s, or user@host:path (transports like ext:: or fd:: run commands and are refused)" % problem
    return None


def rule_rsync_source(value, allow_empty=False, **_):
    if value == "" and allow_empty:
        return None
    if not isinstance(value, str) or value.startswith("-"):
        return "user@host:/path or rsync://host/module/path"
    if SCP_LIKE.fullmatch(value) or not rule_url(value, schemes=("rsync",)):
        return None
    return "user@host:/path or rsync://host/module/path, of letters, digits and . _ / ~ + - (no spaces or quotes)"


def rule_int(value, min=None, max=None, **_):  # noqa: A002 - the option names read as the table does
    number = _as_int(value)
    if number is None:
        return _not_a_number(value, "an integer")
    if (min is not None and number < min) or (max is not None and number > max):
        if min is not None and max is not None:
            return "an integer from %d to %d" % (min, max)
        return "an integer %s %d" % ((">=", min) if min is not None else ("<=", max))
    return None


def rule_number(value, min=None, max=None, **_):  # noqa: A002
    number = _as_number(value)
    if number is None:
        return _not_a_number(value, "a number")
    value = number
    if (min is not None and value < min) or (max is not None and value > max):
        return "a number from %s to %s" % (min if min is not None else "-inf", max if max is not None else "inf")
    return None


def rule_bool(value, **_):
    return None if isinstance(value, bool) else "true or false"


def rule_choice(value, choices=(), **_):
    return None if value in list(choices) else "one of %s" % ", ".join(str(c) for c in choices)


def rule_ip(value, **_):
    if not isinstance(value, str):
        return "an IP address"
    # Python's parser takes anything after % as the zone (newlines, quotes, $(...), spaces) and still calls ::1%x
    # loopback; the address goes into unit files and command lines, and loopback drops the API key requirement.
    zone = value.partition("%")[2] if "%" in value else None
    if zone is not None and not ZONE_ID.fullmatch(zone):
        return ("an IPv6 address whose zone ID (after %%) is an interface name or index: letters, digits and _ . -, "
                "at most 15 characters (not %s)" % show(zone))
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return "an IPv4 or IPv6 address (like 127.0.0.1 or ::1; host names are not resolved here)"
    if zone is not None and not address.is_link_local:
        return "an IPv6 address with a zone ID (%%%s) only when it is link-local (fe80::/10)" % zone
    return None


def rule_cidr(value, **_):
    if not isinstance(value, str):
        return "an IP network"
    if "%" in value:
        return "an IP address or network in CIDR form without a zone ID (%): an allow-list names networks, not links"
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return "an IP address or network in CIDR form (like 10.0.0.0/24)"
    if network.prefixlen == 0:
        return "a network narrower than /0 (an allow-list that allows everyone is none)"
    return None


def rule_port(value, min=PORT_MIN, max=PORT_MAX, **_):  # noqa: A002
    # A caller's bounds narrow the range, never widen it: port 0 asks the kernel for any free port, and 65536 and
    # above wrap or fail, wherever a port is accepted.
    low, high = builtin_max(PORT_MIN, _as_int(min) or PORT_MIN), builtin_min(PORT_MAX, _as_int(max) or PORT_MAX)
    number = _as_int(value)
    if number is None or not low <= number <= high:
        return _not_a_number(value, "a TCP port from %d to %d" % (low, high))
    return None


def rule_service_port(value, **_):
    number = _as_int(value)
    if number is None or not 1024 <= number <= PORT_MAX:
        return _not_a_number(value, "a TCP port from 1024 to 65535: the service runs without capabilities "
                             "(CapabilityBoundingSet= is empty), so it cannot bind a privileged port")
    return None


def rule_unit_name(value, suffix_optional=True, suffixes=UNIT_SUFFIXES, **_):
    """A systemd unit name (NAME or NAME.service): no template @, no path, at most 255 characters."""
    if not isinstance(value, str):
        return "a systemd unit name"
    name, dot, suffix = value.rpartition(".")
    if not dot or suffix not in suffixes:
        name, suffix = value, ""
    if (not suffix and not suffix_optional) or not UNIT_PREFIX.fullmatch(name) or len(value) > 255:
        return ("a systemd unit name: letters, digits and _ . : -%s, no @ or /"
                % (" with a suffix (.%s)" % ", .".join(suffixes) if not suffix_optional else ""))
    return None


def rule_user(value, not_root=True, allow_group=False, **_):
    if not isinstance(value, str):
        return "a user name"
    name = value[1:] if allow_group and value.startswith("@") else value
    if not POSIX_NAME.fullmatch(name):
        return "a user name%s: lower-case letters, digits, _ and -, starting with a letter or _, at most 32" % (
            " (or @group)" if allow_group else "")
    if not_root and name == "root":
        return "a dedicated unprivileged account, never root"
    return None


def rule_mode(value, forbid=0o022, **_):
    if not isinstance(value, str) or not OCTAL_MODE.fullmatch(value):
        return 'a quoted four-digit octal mode like "0644" (unquoted 0644 is read by YAML as the number 420)'
    if int(value, 8) & forbid:
        return ("a mode without group or world write (%s): the service user or another account could change "
                "what the service runs or serves" % format(int(value, 8) & forbid, "04o"))
    return None


def rule_sysctl_key(value, **_):
    if not isinstance(value, str) or not SYSCTL_KEY.fullmatch(value):
        return "a sysctl key like vm.max_map_count: dot-separated names of letters, digits, _ and -"
    return None


def rule_kernel_arg(value, **_):
    if not isinstance(value, str) or not KERNEL_ARG.fullmatch(value):
        return ("one kernel argument word of letters, digits and _ . , : = / + @ - (no spaces, quotes or shell "
                "characters; give several as separate items)")
    if value == "pcie_aspm=off":
        return ("not pcie_aspm=off: it does not disable ASPM, it only stops Linux from changing what the firmware "
                "set; use pcie_aspm.policy=performance (the default) or disable ASPM in the BIOS")
    return None


def rule_regex(value, **_):
    if not isinstance(value, str) or value == "":
        return "a regular expression"
    problem = _control(value)
    if problem or WHITESPACE.search(value):
        return "a regular expression without whitespace or control characters"
    try:
        re.compile(value)
    except re.error as exc:
        return "a regular expression that compiles (%s)" % exc
    return None


def rule_override_tensor(value, **_):
    """One -ot rule, REGEX=BUFFER (first match wins)."""
    if not isinstance(value, str) or "=" not in value:
        return "REGEX=BUFFER, e.g. exps=CPU or blk\\.(3|4)\\.ffn_.*_exps=CUDA0"
    pattern, _, buffer = value.rpartition("=")
    problem = rule_regex(pattern)
    if problem:
        return "REGEX=BUFFER where REGEX is %s" % problem
    if not OT_BUFFER.fullmatch(buffer):
        return "REGEX=BUFFER where BUFFER is CPU or CUDA0, CUDA1..."
    return None


def rule_sha1(value, **_):
    return None if isinstance(value, str) and SHA1.fullmatch(value) else "a full 40-character commit SHA (lower-case hex)"


def rule_journal_since(value, **_):
    if isinstance(value, str) and (value in JOURNAL_WORDS or JOURNAL_RELATIVE.fullmatch(value)
                                   or JOURNAL_ABSOLUTE.fullmatch(value)):
        return None
    return ('a journalctl time: a relative time like -1h or "-2h 30min", today/yesterday/now, or '
            "YYYY-MM-DD[ HH:MM[:SS]]")


def rule_env_name(value, **_):
    return None if isinstance(value, str) and ENV_NAME.fullmatch(value) else "an environment variable name"


def rule_package(value, **_):
    return None if isinstance(value, str) and DEB_PACKAGE.fullmatch(value) else "a Debian package name[=version]"


def rule_cmake_define(value, **_):
    if isinstance(value, str) and CMAKE_DEFINE.fullmatch(value) and not _control(value):
        return None
    return "a cmake definition -DNAME=VALUE without whitespace"


def rule_calendar(value, **_):
    """A systemd OnCalendar= expression (the node's systemd-analyze has the last word; this keeps out lines)."""
    if isinstance(value, str) and not _control(value) and SYSTEMD_CALENDAR.fullmatch(value):
        return None
    return "a systemd calendar expression on one line, like weekly or Sun *-*-* 03:00"


def _as_text(item):
    """str() of a value, with None as empty and an integer too long to print as ?."""
    if item is None:
        return ""
    if _is_int(item) and item.bit_length() > 64:  # str() refuses integers of more than 4300 digits
        return "?"
    return str(item)


def rule_gpu_arch(value, **_):
    items = [part for item in (value if isinstance(value, (list, tuple)) else [value])
             for part in re.split(r"[;,\s]+", _as_text(item)) if part]
    unknown = [i for i in items if i not in GPU_ARCHS]
    if unknown or not items:
        return "compute capabilities the kit knows (%s: 89 RTX 4090, 120 RTX 5090, 90 H100/H200)" % ", ".join(GPU_ARCHS)
    return None


def rule_answer_probe(value, **_):
    # The probe's own rules live with its judge (one place for what a probe is).
    return probe_problem(value)


RULES = {
    "answer_probe": rule_answer_probe,
    "text": rule_text, "secret": rule_secret, "component": rule_component, "abs_path": rule_abs_path,
    "rel_path": rule_rel_path, "url": rule_url, "git_url": rule_git_url, "rsync_source": rule_rsync_source,
    "int": rule_int, "number": rule_number, "bool": rule_bool, "choice": rule_choice, "ip": rule_ip,
    "cidr": rule_cidr, "port": rule_port, "service_port": rule_service_port, "unit_name": rule_unit_name,
    "user": rule_user, "mode": rule_mode, "sysctl_key": rule_sysctl_key, "kernel_arg": rule_kernel_arg,
    "regex": rule_regex, "override_tensor": rule_override_tensor, "sha1": rule_sha1,
    "journal_since": rule_journal_since, "env_name": rule_env_name, "package": rule_package,
    "cmake_define": rule_cmake_define, "calendar": rule_calendar, "gpu_arch": rule_gpu_arch,
}


# ------------------------------------------------------------------------------------------ composites

def _items(var, value):
    if isinstance(value, dict):
        return [("%s[%s]" % (var, show(k)), k, v) for k, v in value.items()]
    return [("%s[%d]" % (var, i), i, v) for i, v in enumerate(value)]


def check(spec):
    """Refusals (list of sentences) for one spec: {var, value, rule, secret?, elements?, keys?, values?, ...}.

    `elements` (lists) and `keys`/`values` (dicts) are specs (without var/value) applied to every item;
    `min_items` / `max_items` bound a list; `skip: true` checks nothing.
    """
    if spec.get("skip"):
        return []
    var, value, rule = spec["var"], spec.get("value"), spec.get("rule")
    secret = bool(spec.get("secret"))
    opts = dict((k, v) for k, v in spec.items() if k not in ("var", "value", "rule", "secret", "elements", "keys",
                                                             "values", "skip", "min_items", "max_items", "hint"))
    out = []
    if rule in ("list", "dict"):
        expected = list if rule == "list" else dict
        if not isinstance(value, (list, tuple) if expected is list else dict):
            return [refusal(var, value, "a " + rule, secret)]
        hint = "; %s" % spec["hint"] if spec.get("hint") else ""
        if "min_items" in spec and len(value) < spec["min_items"]:
            out.append(refusal(var, value, "at least %d item(s)%s" % (spec["min_items"], hint), secret))
        if "max_items" in spec and len(value) > spec["max_items"]:
            out.append(refusal(var, value, "at most %d item(s)%s" % (spec["max_items"], hint), secret))
        for name, key, item in _items(var, value):
            if rule == "dict" and spec.get("keys"):
                out += check(dict(spec["keys"], var="%s key" % name, value=key, secret=secret))
            sub = spec.get("elements") if rule == "list" else spec.get("values")
            if sub:
                out += check(dict(sub, var=name, value=item, secret=secret or sub.get("secret", False)))
        return out
    if rule == "sysctl":
        return _check_sysctl(var, value, spec.get("string_keys") or [])
    if rule not in RULES:
        raise ValueError("hmk_validate: unknown rule %r for %s" % (rule, var))
    allowed = RULES[rule](value, **opts)
    if allowed:
        out.append(refusal(var, value, allowed + ("; %s" % spec["hint"] if spec.get("hint") else ""), secret))
    return out


def _check_sysctl(var, value, string_keys):
    """Sysctl keys and values as a drop-in writes them: KEY = VALUE on one line."""
    if not isinstance(value, dict):
        return [refusal(var, value, "a dict of sysctl key: value")]
    out = []
    for key, item in value.items():
        name = "%s[%s]" % (var, show(key))
        problem = rule_sysctl_key(key)
        if problem:
            out.append(refusal(name + " key", key, problem))
            continue
        if _is_int(item) and item.bit_length() > 64:
            problem = "an integer the kernel can hold (64 bits)"
        elif key in string_keys:
            problem = rule_text(item if isinstance(item, str) else _as_text(item), allow_empty=False)
        elif _is_int(item):
            problem = None
        elif not isinstance(item, str) or not INT_LIST.fullmatch(item):
            problem = ("an integer or space-separated integers (list string-valued keys in "
                       "kernel_tuning_sysctl_string_keys)")
        if problem:
            out.append(refusal(name, item, problem))
    return out


def check_all(specs):
    """Refusals of every spec, in order; an empty list means every input is acceptable."""
    out = []
    for spec in specs or []:
        out += check(spec)
    return out


# -------------------------------------------------------------------------------- the hardware profile

def check_profile(profile, var="hmk_hardware", complete=False):
    """Refusals for a hardware profile: the keys the roles read, with their types and ranges.

    complete: every section (cpu, memory, gpus) and the models keys must be there - the preflight judges the
    whole machine against it. Otherwise (a role that reads a part) an empty profile means "no expectations" and
    only the keys present are checked.
    """
    if not isinstance(profile, dict):
        return [refusal(var, profile, "a dict (the schema of inventories/production/group_vars/*/hardware.yml)")]
    if not profile and not complete:
        return []
    out = []
    for section in ("cpu", "memory", "gpus"):
        value = profile.get(section)
        if (complete or value is not None) and not isinstance(value, dict):
            out.append(refusal("%s.%s" % (var, section), value,
                               "a dict: the profile says what it expects of the %s" % section))
    for key in ("models_path", "models_min_free_gb"):
        if complete and key not in profile:
            out.append(refusal("%s.%s" % (var, key), None, "the models' place and the space they need"))
    if out:
        return out
    cpu, memory, gpus = (profile.get(k) or {} for k in ("cpu", "memory", "gpus"))
    specs = []
    if cpu or complete:
        specs += [
            {"var": var + ".cpu.sockets", "value": cpu.get("sockets", 1), "rule": "int", "min": 1, "max": 8},
            {"var": var + ".cpu.numa_nodes_per_socket", "value": cpu.get("numa_nodes_per_socket", 1), "rule": "int",
             "min": 1, "max": 8},
            {"var": var + ".cpu.smt", "value": cpu.get("smt", False), "rule": "bool"},
            {"var": var + ".cpu.isa_required", "value": cpu.get("isa_required", []), "rule": "list",
             "elements": {"rule": "text", "pattern": r"[a-z0-9_]+",
                          "pattern_text": "CPU flags as /proc/cpuinfo names them"}},
        ]
        if "threads" in cpu:
            specs.append({"var": var + ".cpu.threads", "value": cpu["threads"], "rule": "int", "min": 0, "max": 4096})
    if memory or complete:
        specs += [
            {"var": var + ".memory.channels_per_socket", "value": memory.get("channels_per_socket"), "rule": "int",
             "min": 1, "max": 24},
            {"var": var + ".memory.dimms_per_socket",
             "value": memory.get("dimms_per_socket", memory.get("channels_per_socket")), "rule": "int", "min": 1,
             "max": 48},
            {"var": var + ".memory.min_speed_mts", "value": memory.get("min_speed_mts"), "rule": "int", "min": 800,
             "max": 20000},
            {"var": var + ".memory.type", "value": memory.get("type", "DDR5"), "rule": "choice",
             "choices": ["DDR4", "DDR5"]},
        ]
    if gpus or complete:
        specs.append({"var": var + ".gpus.count", "value": gpus.get("count"), "rule": "int", "min": 0, "max": 16})
    if "models_path" in profile:
        specs.append({"var": var + ".models_path", "value": profile["models_path"], "rule": "abs_path",
                      "not_system": True})
    if "models_min_free_gb" in profile:
        specs.append({"var": var + ".models_min_free_gb", "value": profile["models_min_free_gb"], "rule": "int",
                      "min": 0, "max": 1000000})
    count = _as_int(gpus.get("count"))
    if count and count > 0:
        specs += [
            {"var": var + ".gpus.vram_gib", "value": gpus.get("vram_gib"), "rule": "number", "min": 1, "max": 1024},
            {"var": var + ".gpus.min_link_width", "value": gpus.get("min_link_width", 16), "rule": "int", "min": 1,
             "max": 32},
        ]
        if gpus.get("arch") not in (None, "", []):
            specs.append({"var": var + ".gpus.arch", "value": gpus["arch"], "rule": "gpu_arch"})
        elif not gpus.get("model"):
            out.append(refusal(var + ".gpus", gpus, "gpus.arch (e.g. \"89\") or gpus.model when gpus.count > 0"))
    return out + check_all(specs)


# ------------------------------------------------------------------------------------------ filters

SECRET_NAME = re.compile(r"(^|_)(api_?key|token|secret|password|passwd|credentials?)($|_)", re.IGNORECASE)
# What Python raises when a filter is handed the wrong type or shape (a list where a string belongs, None, a dict
# without the key it reads, a number too large to convert).
WRONG_INPUT = (TypeError, AttributeError, KeyError, ValueError, IndexError, OverflowError, ZeroDivisionError,
               RecursionError)


def describe(name, value):
    """A filter argument as a refusal shows it: a dict by its keys, a list by its length, a secret by its length."""
    if isinstance(value, str) and SECRET_NAME.search(name):
        return show(value, secret=True)
    if isinstance(value, dict):
        return "a dict with keys %s" % show(sorted(str(k) for k in value)[:12], limit=100)
    if isinstance(value, (list, tuple)):
        return "a list of %d item(s)" % len(value)
    return show(value, limit=80)


def guard_filters(filters, error, prefix="hmk.moe_kit."):
    """The filters of a FilterModule, each turning the Python exception a wrong-typed argument causes into `error`
    (AnsibleFilterError) with a sentence that names the filter and each argument (name and value), never a traceback.

    The filters' own refusals (already `error`) and Ansible's (undefined variables) pass through unchanged.
    """
    def wrap(name, function):
        try:
            params = [p.name for p in inspect.signature(function).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            params = []

        @functools.wraps(function)
        def guarded(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except WRONG_INPUT as exc:
                if isinstance(exc, error) or type(exc).__module__ != "builtins":
                    raise
                named = [(params[i] if i < len(params) else "argument %d" % (i + 1), arg) for i, arg in enumerate(args)]
                named += sorted(kwargs.items())
                raise error("%s%s refused its input (%s: %s): %s" % (
                    prefix, name, type(exc).__name__, show(str(exc), limit=160)[1:-1],
                    "; ".join("%s = %s" % (n, describe(n, v)) for n, v in named)))
        return guarded
    return dict((name, wrap(name, function)) for name, function in filters.items())


# ---------------------------------------------------------------------------------- on the node itself

def proc_sys_path(key):
    """/proc/sys path of a sysctl key. As sysctl(8) reads it: when the first separator is a dot, dots separate
    and a slash stands for a dot inside a name (net.ipv4.conf.eth0/100.rp_filter)."""
    first = re.search(r"[./]", key)
    if first and first.group(0) == ".":
        key = key.translate(str.maketrans("./", "/."))
    return "/proc/sys/" + key


def sysctl_key_refusals(var, keys, exists):
    """Refusals for sysctl keys this kernel lacks; `exists(path)` answers for /proc/sys paths (os.path.exists on the
    node, or the paths a role's live read found)."""
    out = []
    for key in keys or []:
        key = str(key)
        path = proc_sys_path(key)
        if not exists(path):
            out.append(refusal("%s[%s]" % (var, key), key, "a sysctl key this kernel has (%s does not exist; the drop-in "
                               "would fail at every boot)" % path))
    return out


def parse_proc_net_tcp(text, ipv6=False):
    """Listening sockets of /proc/net/tcp{,6}: [(address, port, inode)]."""
    out = []
    for line in str(text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        addr_hex, port_hex = fields[1].split(":")
        raw = bytes.fromhex(addr_hex)
        if ipv6:
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            address = str(ipaddress.IPv6Address(raw))
        else:
            address = str(ipaddress.IPv4Address(raw[::-1]))
        out.append((address, int(port_hex, 16), fields[9]))
    return out


def unit_of_cgroup(text):
    """The systemd unit a process belongs to, from /proc/PID/cgroup (v1 name=systemd or v2 line)."""
    paths = []
    for line in str(text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "name=systemd" or parts[0] == "0"):
            paths.append(parts[2])
    for path in paths:
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def addresses_overlap(a, b):
    wildcard = ("0.0.0.0", "::")
    return a == b or a in wildcard or b in wildcard


def port_holders(port, host, listeners, owners):
    """The listeners on `port` whose address overlaps `host`: [(address, inode, owner description)]."""
    out = []
    for address, lport, inode in listeners:
        if lport == int(port) and addresses_overlap(address, host):
            out.append((address, inode, owners.get(inode, "")))
    return out


# ---------------------------------------------------------------------------------- the kit's service accounts
# hmk_service_account creates them; hmk_validate_node refuses a bad one with the node's other checks, in the same
# words, and says whether anything is pending (so that a converged node is not visited a second time).

MARK = "hybrid-moe-kit service account"


def _gecos_mark(entry):
    return entry.pw_gecos.split(",")[0]


def account_problems(name, group, mark, users, groups, user_var="service user", group_var="service group"):
    """Refusals for using `name`:`group` as the kit's account; `users`/`groups` are pwd/grp entries."""
    out = []
    for var, value in ((user_var, name), (group_var, group)):
        problem = rule_user(value)
        if problem:
            out.append(refusal(var, value, problem))
    if out:
        return out
    by_name = dict((u.pw_name, u) for u in users)
    ours = set(u.pw_name for u in users if _gecos_mark(u) == mark)
    user = by_name.get(name)
    if user is not None:
        if user.pw_uid == 0:
            out.append(refusal(user_var, name, "a dedicated unprivileged account, never uid 0"))
        elif name not in ours:
            out.append(refusal(
                user_var, name,
                "a new account the kit creates, or one it created before (GECOS \"%s\"); %s exists as uid %d "
                "(home %s, shell %s) and was not created by this kit, so it is left untouched. Choose another name; "
                "if this is the account an earlier version of the kit created, mark it with: usermod -c '%s' %s"
                % (mark, name, user.pw_uid, user.pw_dir, user.pw_shell, mark, name)))
    existing = dict((g.gr_name, g) for g in groups).get(group)
    if existing is not None:
        foreign = sorted(set([u.pw_name for u in users if u.pw_gid == existing.gr_gid and u.pw_name not in ours]
                             + [m for m in existing.gr_mem if m not in ours]))
        if existing.gr_gid == 0:
            out.append(refusal(group_var, group, "a dedicated group, never gid 0"))
        elif foreign:
            out.append(refusal(group_var, group, "a group of the kit's accounts only; %s also belongs to %s, "
                               "who would share what the service reads"
                               % (group, ", ".join(foreign))))
    return out


def account_pending(name, group, users, groups):
    """What creating `name`:`group` as the kit's account would change; `users`/`groups` are pwd/grp entries."""
    by_name = dict((u.pw_name, u) for u in users)
    gids = dict((g.gr_name, g.gr_gid) for g in groups)
    user = by_name.get(name)
    group_missing = group not in gids
    user_missing = user is None
    wrong_group = not user_missing and (group_missing or user.pw_gid != gids[group])
    answer = {"group_missing": group_missing, "user_missing": user_missing, "wrong_group": wrong_group,
              "pending": group_missing or user_missing or wrong_group}
    if user is not None:
        answer["uid"] = user.pw_uid
    return answer
