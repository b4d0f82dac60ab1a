"""Filters for the NVIDIA driver and CUDA toolkit, shared by the roles that install or use them
(nvidia_driver, llama_build; ktransformers_build may use the toolkit ones): driver/toolkit/GPU
compatibility, the supported branches and the R590 package naming, version parsing, the apt sources
a node already has for NVIDIA's repository, OpenPGP key fingerprints, the DKMS signing generations,
module signatures against the enrolled MOKs, and the toolkit a build uses.

Pure Python (no Ansible import) so the unit tests load it directly.
"""
import base64
import binascii
import hashlib
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

# CUDA toolkit release -> minimum Linux driver (CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions"). Keys are (major, minor) for the GA release, (major, minor,
# update) where an update raised the minimum.
MIN_DRIVER = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 8, 1): "570.124.06",
    (12, 9): "575.51.03",
    # CUDA 13.x. 13.0 GA: BRIEF.md section 4 and NVIDIA's 13.0 release notes. The later rows are the
    # Linux x86_64 column of that table in the 13.1 to 13.3 Update 1 release notes, read as quoted
    # (identically) by several public repositories; NVIDIA's pages themselves were not readable here.
    (13, 0): "580.65.06",
    (13, 0, 1): "580.82.07",
    (13, 0, 2): "580.95.05",
    (13, 1): "590.44.01",
    (13, 1, 1): "590.48.01",
    (13, 2): "595.45.04",
    (13, 2, 1): "595.58.03",
    (13, 3): "610.43.02",
}

# From CUDA 13.4 NVIDIA no longer bundles a Linux driver with the toolkit, and the release notes
# list no toolkit driver for these releases (13.5 is current as of 2026-12, BRIEF.md section 9).
# They run on any driver of the 13.x minor-version floor; what they add over 13.3 needs a newer
# branch whose exact minimum is not recorded here, so the table cannot vouch for a branch: the
# role accepts them only through nvidia_driver_allow_minor_version_compat.
UNBUNDLED_TOOLKITS = {(13, 4), (13, 5)}

# Minor-version compatibility (NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility",
# table 1: 12.x >= 525 and < 580, 13.x >= 580): a toolkit runs, without PTX JIT of code newer than
# the driver and without the newer driver's APIs, on a driver of its major release's floor.
MINOR_COMPAT_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# Compute capability (x10) -> architecture name.
ARCH_NAMES = [
    (50, 53, "Maxwell"),
    (60, 62, "Pascal"),
    (70, 72, "Volta"),
    (75, 75, "Turing"),
    (80, 87, "Ampere"),
    (89, 89, "Ada Lovelace"),
    (90, 90, "Hopper"),
    (100, 129, "Blackwell"),
]

OPEN_MODULES_MIN_ARCH = 75      # open kernel modules support Turing and newer
BLACKWELL_MIN_ARCH = 100        # sm_100 (B200), sm_120 (RTX 50xx)
BLACKWELL_MIN_BRANCH = 570
CUDA13_MIN_ARCH = 75            # CUDA 13 dropped Maxwell, Pascal and Volta

_VERSION_RE = re.compile(r"^\s*(?:\d+:)?(\d+(?:\.\d+)*)(?:[-+~].*)?\s*$")


class CompatError(ValueError):
    """A version or architecture string that cannot be read."""


def parse_version(text):
    """'570.124.06' -> (570, 124, 6); '12.8.1' -> (12, 8, 1); '570' -> (570,).

    Accepts Debian package versions ('1:570.124.06-0ubuntu1', '535.261.03-1', '12.8.93-1')."""
    if isinstance(text, int):
        return (text,)
    match = _VERSION_RE.match(str(text)) if text is not None else None
    if not match:
        raise CompatError("cannot read version %r: expected digits separated by dots, e.g. 570, 570.124.06 or 12.8.1"
                          % (text,))
    return tuple(int(part) for part in match.group(1).split("."))


def _pad(version, width=3):
    return tuple(version) + (0,) * (width - len(version))


def version_ge(left, right):
    """left >= right, comparing numerically ('580.65.06' >= '580.9' is True)."""
    return _pad(parse_version(left)) >= _pad(parse_version(right))


def branch_of(version):
    """The driver branch (first number) of a version or branch string: '570.124.06' -> 570."""
    return parse_version(version)[0]


def toolkit_key(toolkit):
    """'12.8' -> (12, 8); '12.8.1' -> (12, 8, 1); '12-8' -> (12, 8); '13' -> (13, 0)."""
    parts = parse_version(str(toolkit).replace("-", "."))
    if len(parts) == 1:
        parts = (parts[0], 0)
    return parts


def toolkit_series(toolkit):
    """'12.8.1' -> '12.8' (the series the package names use: cuda-toolkit-12-8, /usr/local/cuda-12.8)."""
    key = toolkit_key(toolkit)
    return "%d.%d" % (key[0], key[1])


def _unbundled(key):
    return key[:2] in UNBUNDLED_TOOLKITS


def min_driver(toolkit):
    """Minimum driver for a toolkit version, or raise CompatError if the table lacks it. For a release
    NVIDIA ships without a Linux driver (13.4 on) this is its major release's minor-version floor: the
    oldest driver it runs on, not one that has all of its features."""
    key = toolkit_key(toolkit)
    if len(key) >= 3 and key[:3] in MIN_DRIVER:
        return MIN_DRIVER[key[:3]]
    if key[:2] in MIN_DRIVER:
        return MIN_DRIVER[key[:2]]
    if _unbundled(key):
        return MINOR_COMPAT_FLOOR[key[0]]
    known = ", ".join(".".join(str(p) for p in k) for k in sorted(set(MIN_DRIVER) | UNBUNDLED_TOOLKITS))
    raise CompatError("CUDA toolkit %s is not in the compatibility table (known: %s); add its minimum driver "
                      "to MIN_DRIVER in plugins/filter/hmk_nvidia.py" % (toolkit, known))


def required_driver(toolkit, minor_version_compat=False):
    """The driver version the role requires for a toolkit: its table minimum, or with minor-version
    compatibility accepted the floor of its major release where that is lower."""
    needed = min_driver(toolkit)
    floor = MINOR_COMPAT_FLOOR.get(toolkit_key(toolkit)[0])
    if minor_version_compat and floor and not version_ge(floor, needed):
        return floor
    return needed


def newest_toolkit_for(driver):
    """The newest toolkit series in the table whose minimum driver `driver` satisfies (or None)."""
    best = None
    for key, needed in sorted(MIN_DRIVER.items()):
        if driver_satisfies(driver, needed):
            best = "%d.%d" % (key[0], key[1]) if len(key) == 2 else ".".join(str(p) for p in key)
    return best


def driver_satisfies(driver, needed):
    """A driver given as a branch ('570') satisfies a minimum in that branch: the pin installs the
    newest release of the branch, which is never older than the branch's first CUDA-qualified one.
    A full version ('570.124.06') is compared exactly."""
    parsed = parse_version(driver)
    if len(parsed) == 1:
        return parsed[0] >= branch_of(needed)
    return version_ge(driver, needed)


def parse_arch(arch):
    """'89', 'sm_89', '8.9', 'compute_120', 120 -> compute capability x10 (89, 120)."""
    text = str(arch).strip().lower()
    text = re.sub(r"^(sm|compute)_", "", text)
    if re.match(r"^\d+\.\d$", text):
        major, minor = text.split(".")
        return int(major) * 10 + int(minor)
    if re.match(r"^\d{2,3}[a-z]?$", text):
        return int(re.sub(r"[a-z]$", "", text))
    raise CompatError("cannot read GPU architecture %r: use the compute capability as hmk_hardware.gpus.arch does, "
                      "e.g. \"89\" (RTX 4090) or \"120\" (RTX 5090)" % (arch,))


def arch_name(arch):
    value = parse_arch(arch)
    for low, high, name in ARCH_NAMES:
        if low <= value <= high:
            return name
    return "sm_%d" % value


def _as_list(archs):
    if archs is None or archs == "":
        return []
    if isinstance(archs, (list, tuple)):
        return [a for a in archs if a not in (None, "")]
    return [archs]


def compat_errors(branch, toolkit=None, open_modules=True, gpu_archs=None, minor_version_compat=False):
    """Every reason the combination cannot work, as sentences naming both versions and the fix.

    branch: driver branch or full version ('570', '570.124.06'); toolkit: '12.8', '12.8.1' or
    None/'' when no toolkit is installed; open_modules: True for nvidia-open; gpu_archs: compute
    capabilities of the node's GPUs; minor_version_compat: accept a toolkit on a driver below its own
    minimum but at its major release's floor (12.x >= 525, 13.x >= 580: CUDA minor-version
    compatibility, no PTX JIT for newer code), the only way the table accepts 13.4 and later."""
    errors = []
    try:
        driver_branch = branch_of(branch)
    except CompatError as exc:
        return [str(exc)]
    archs = []
    for arch in _as_list(gpu_archs):
        try:
            archs.append(parse_arch(arch))
        except CompatError as exc:
            errors.append(str(exc))

    if toolkit not in (None, ""):
        try:
            needed = min_driver(toolkit)
            key = toolkit_key(toolkit)
        except CompatError as exc:
            errors.append(str(exc))
        else:
            floor = MINOR_COMPAT_FLOOR.get(key[0])
            on_floor = bool(floor) and driver_satisfies(branch, floor)
            newest = newest_toolkit_for(branch)
            older = (("\"%s\" (the newest toolkit driver %s supports)" % (newest, branch)) if newest
                     else "an older release")
            if not driver_satisfies(branch, needed):
                if not (minor_version_compat and on_floor):
                    hint = (", or accept CUDA minor-version compatibility (driver >= %s for %d.x; no PTX JIT of newer "
                            "code) with nvidia_driver_allow_minor_version_compat: true" % (floor, key[0])) if on_floor else ""
                    errors.append(
                        "CUDA toolkit %s needs NVIDIA driver >= %s but the driver is %s (branch %d). Fix: set "
                        "nvidia_driver_branch to \"%d\" or newer%s, or nvidia_driver_cuda_toolkit_version to %s%s."
                        % (toolkit, needed, branch, driver_branch, branch_of(needed),
                           _supported_from(branch_of(needed)), older, hint))
            elif _unbundled(key) and not minor_version_compat:
                errors.append(
                    "CUDA toolkit %s comes without a Linux driver (NVIDIA stopped bundling one with CUDA 13.4) and the "
                    "table records none that has all of its features, so driver %s is not known to support it fully; it "
                    "runs on any driver >= %s through CUDA minor-version compatibility (no PTX JIT of newer code, no newer "
                    "driver APIs). Fix: set nvidia_driver_allow_minor_version_compat: true to accept that, or "
                    "nvidia_driver_cuda_toolkit_version to %s." % (toolkit, branch, floor, older))
            if key[0] >= 13:
                old = sorted(set(a for a in archs if a < CUDA13_MIN_ARCH))
                for arch in old:
                    errors.append(
                        "CUDA toolkit %s does not support sm_%d (%s): CUDA 13 dropped Maxwell, Pascal and Volta. Fix: "
                        "set nvidia_driver_cuda_toolkit_version to \"12.9\" or older (with driver %s)."
                        % (toolkit, arch, arch_name(arch), branch))

    blackwell = sorted(set(a for a in archs if a >= BLACKWELL_MIN_ARCH))
    if blackwell:
        if not open_modules:
            errors.append(
                "sm_%d (%s) GPUs run only on the open kernel modules, but nvidia_driver_open_modules is false "
                "(driver %s). Fix: set nvidia_driver_open_modules: true." % (blackwell[0], arch_name(blackwell[0]), branch))
        if driver_branch < BLACKWELL_MIN_BRANCH:
            errors.append(
                "sm_%d (%s) GPUs need driver branch %d or newer, but the driver is %s. Fix: set nvidia_driver_branch "
                "to \"%d\" or newer." % (blackwell[0], arch_name(blackwell[0]), BLACKWELL_MIN_BRANCH, branch,
                                         BLACKWELL_MIN_BRANCH))
    if open_modules:
        too_old = sorted(set(a for a in archs if a < OPEN_MODULES_MIN_ARCH))
        for arch in too_old:
            errors.append(
                "sm_%d (%s) is not supported by the open kernel modules (Turing and newer only; driver %s). Fix: set "
                "nvidia_driver_open_modules: false." % (arch, arch_name(arch), branch))
    return errors


# What the node itself shows, before the driver is installed (lspci) or while one runs (nvidia-smi):
# Blackwell by name where pci.ids or the driver knows the card (chips GB1xx/GB2xx, B100/B200/B300,
# GB200/GB300, RTX 50x0, RTX PRO ... Blackwell), and by PCI device id for the GeForce RTX 50 cards an
# older pci.ids (Debian 12's) prints as "Device 2b85" (ids from pci.ids: 2b85 RTX 5090, 2b87 5090 D,
# 2c02 5080, 2c05 5070 Ti, 2f04 5070, 2d04 5060 Ti, 2d05 5060). A data-center Blackwell board that an
# old pci.ids does not name is caught by the profile's compute capability (compat_errors) instead.
BLACKWELL_NAME_RE = re.compile(r"\b(?:GB[123]\d\d[A-Z]?|B[123]00[A-Z]?|RTX 50[5-9]0|RTX PRO \d+ Blackwell)\b|\bBlackwell\b")
BLACKWELL_DEVICE_IDS = frozenset(["2b85", "2b87", "2c02", "2c05", "2f04", "2d04", "2d05"])
_LSPCI_LINE_RE = re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\s", re.I)


def blackwell_gpus(text):
    """The Blackwell GPUs among `lspci -nn -d 10de:` lines (display and 3D controllers only, not the
    cards' audio functions; as "slot device") and `nvidia-smi --query-gpu=name` lines (as the name)."""
    found = []
    for line in str(text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        if _LSPCI_LINE_RE.match(line):
            if not re.search(r"\[03[0-9a-f]{2}\]", line, re.I):
                continue
            ids = re.search(r"\[10de:([0-9a-f]{4})\]", line, re.I)
            if BLACKWELL_NAME_RE.search(line) or (ids and ids.group(1).lower() in BLACKWELL_DEVICE_IDS):
                slot, _unused, device = line.partition(" ")
                device = device.split(": ", 1)[-1]
                found.append("%s %s" % (slot, re.sub(r"\s*\(rev [0-9a-f]+\)$", "", device)))
        elif BLACKWELL_NAME_RE.search(line):
            found.append(line)
    return found


def node_gpu_errors(text, branch, open_modules=True):
    """Blackwell GPUs seen on the node (blackwell_gpus) that the chosen module flavour or branch cannot
    drive, whatever the hardware profile says, as sentences with the fix."""
    gpus = blackwell_gpus(text)
    if not gpus:
        return []
    seen = "; ".join(gpus)
    errors = []
    if not open_modules:
        errors.append(
            "The node has Blackwell GPUs (%s), which run only on the open kernel modules, but nvidia_driver_open_modules "
            "is false. Fix: set nvidia_driver_open_modules: true (and hmk_hardware.gpus.arch to the cards' compute "
            "capability, e.g. \"120\" for RTX 50 cards, \"100\" for B200)." % seen)
    try:
        value = branch_of(branch)
    except CompatError as exc:
        return errors + [str(exc)]
    if value < BLACKWELL_MIN_BRANCH:
        errors.append(
            "The node has Blackwell GPUs (%s), which need driver branch %d or newer, but the branch is %s. Fix: set "
            "nvidia_driver_branch to \"%d\" (the long-term branch)." % (seen, BLACKWELL_MIN_BRANCH, branch, DEFAULT_BRANCH))
    return errors


def _dearmor(text):
    """The binary packets of an ASCII-armored OpenPGP public key block."""
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
        raise CompatError("the repository key is not an ASCII-armored OpenPGP public key")
    body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].split("-----END PGP PUBLIC KEY BLOCK-----", 1)[0]
    lines = [line.strip() for line in body.strip().splitlines()]
    # Armor headers end at the first empty line; the CRC line starts with '='.
    if "" in lines:
        lines = lines[lines.index("") + 1:]
    payload = "".join(line for line in lines if line and not line.startswith("="))
    try:
        return base64.b64decode(payload)
    except (binascii.Error, ValueError) as exc:
        raise CompatError("the repository key's armor is not base64: %s" % exc)


def _openpgp_packets(data):
    """(tag, body) of every packet of a binary OpenPGP stream (RFC 4880 section 4.2, both formats)."""
    pos = 0
    while pos < len(data):
        first = data[pos]
        if not first & 0x80:
            raise CompatError("the key data has no OpenPGP packet at byte %d" % pos)
        if first & 0x40:  # new packet format
            tag = first & 0x3F
            if pos + 1 >= len(data):
                raise CompatError("the key data ends inside a packet header")
            octet = data[pos + 1]
            if octet < 192:
                length, offset = octet, 2
            elif octet < 224:
                length, offset = ((octet - 192) << 8) + data[pos + 2] + 192, 3
            elif octet == 255:
                length, offset = int.from_bytes(data[pos + 2:pos + 6], "big"), 6
            else:
                raise CompatError("the key data uses a partial body length, which keys never do")
        else:
            tag = (first >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(first & 0x03)
            if size is None:
                raise CompatError("the key data uses an indeterminate packet length")
            length, offset = int.from_bytes(data[pos + 1:pos + 1 + size], "big"), 1 + size
        body = data[pos + offset:pos + offset + length]
        if len(body) != length:
            raise CompatError("the key data ends inside a packet")
        yield tag, body
        pos += offset + length


def openpgp_fingerprints(key):
    """Fingerprints (40 upper-case hex digits) of every primary key in an OpenPGP key or keyring:
    ASCII-armored text, binary bytes (a `gpg --dearmor`ed keyring such as cuda-keyring's
    /usr/share/keyrings/cuda-archive-keyring.gpg) or either of those base64-encoded, as
    ansible.builtin.slurp returns a file. Version 4 keys: SHA-1 over 0x99, the 2-byte length and the
    packet body (RFC 4880 section 12.2)."""
    if isinstance(key, (bytes, bytearray)):
        data = bytes(key)
        if data.lstrip().startswith(b"-----BEGIN PGP"):
            data = _dearmor(data.decode("ascii", "replace"))
    else:
        text = str(key)
        data = _dearmor(text) if "-----BEGIN PGP" in text else None
        if data is None:
            try:
                data = base64.b64decode("".join(text.split()), validate=True)
            except (binascii.Error, ValueError):
                raise CompatError("the repository key is neither an OpenPGP key block nor base64 of one")
            return openpgp_fingerprints(data)
    if not data:
        raise CompatError("the repository key is empty")
    fingerprints = []
    for tag, body in _openpgp_packets(data):
        if tag != 6:
            continue
        if not body or body[0] != 4:
            raise CompatError("the repository key is an OpenPGP v%d key; only v4 fingerprints are computed here"
                              % (body[0] if body else 0))
        fingerprints.append(hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper())
    if not fingerprints:
        raise CompatError("the repository key's data holds no public key packet")
    return fingerprints


def openpgp_fingerprint(armored):
    """Fingerprint of the first primary key of an ASCII-armored or binary OpenPGP public key."""
    if isinstance(armored, (bytes, bytearray)):
        data = bytes(armored)
    else:
        data = _dearmor(str(armored))
    if not data or not data[0] & 0x80:
        raise CompatError("the repository key does not start with an OpenPGP packet")
    tag, _unused = next(_openpgp_packets(data))
    if tag != 6:
        raise CompatError("the repository key's first packet is not a public key (tag %d)" % tag)
    return openpgp_fingerprints(data)[0]


def normalize_fingerprint(fingerprint):
    """'eb69 3B30 ...' -> 'EB693B30...' (spaces and 0x dropped, upper case)."""
    text = re.sub(r"\s+", "", str(fingerprint or "")).upper()
    return text[2:] if text.startswith("0X") else text


def parse_nvidia_smi_gpus(text):
    """Rows of `nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader,nounits`."""
    gpus = []
    for line in str(text or "").splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 3 or not re.match(r"^\d+$", fields[0]):
            continue
        gpu = {"index": int(fields[0]), "name": fields[1], "driver_version": fields[2], "power_limit_w": None}
        if len(fields) > 3:
            try:
                gpu["power_limit_w"] = float(fields[3])
            except ValueError:
                gpu["power_limit_w"] = None
        gpus.append(gpu)
    return gpus


def nvcc_release(text):
    """'Cuda compilation tools, release 12.8, V12.8.93' -> '12.8' (None when absent)."""
    match = re.search(r"release (\d+\.\d+)", str(text or ""))
    return match.group(1) if match else None


def driver_in_branch(version, branch):
    """'570.124.06' is in branch '570'."""
    try:
        return branch_of(version) == branch_of(branch)
    except CompatError:
        return False


def boot_kernel(candidates):
    """The newest kernel release among /boot/vmlinuz-* suffixes and linux-image-* package names.

    Drops variants that are not a kernel release (-unsigned, -dbg, meta packages)."""
    releases = set()
    for item in candidates or []:
        name = str(item).strip()
        name = re.sub(r"^(/boot/vmlinuz-|linux-image-)", "", name)
        if not re.match(r"^\d+\.\d+", name) or re.search(r"-(unsigned|dbg|dbgsym)$", name):
            continue
        releases.add(name)
    if not releases:
        return ""

    def key(release):
        return [int(part) if part.isdigit() else part for part in re.split(r"[.\-+~]", release)]
    return sorted(releases, key=lambda r: [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in key(r)])[-1]


# --- driver branches and package naming -------------------------------------------------------

# NVIDIA's data-center driver branches in support, as of 2026-12 (BRIEF.md section 9, "Upstream as of
# 2026-12"; NVIDIA's "Supported Drivers and CUDA Toolkit Versions" page names the designations). A stored
# copy of that page from early 2026 gives R580 "August 2028"; the brief's June 2028 holds here.
SUPPORTED_BRANCHES = {
    580: ("long-term support branch", "June 2028"),
    595: ("production branch", "March 2027"),
    620: ("long-term support branch", "September 2029"),
}
DEFAULT_BRANCH = 580

# Branches NVIDIA supported until recently, with the month support ended (same sources; R570's date from
# NVIDIA's page, R535's from the brief). Every other branch older than the supported ones (R575, R565,
# R560, R550, R525...) is past its end of life too; these two are named because nodes still run them
# (R535 is what Debian 12 ships).
END_OF_LIFE_BRANCHES = {
    535: "June 2026",
    570: "February 2026",
}

# From R590 NVIDIA's Ubuntu repositories name the driver packages without the branch
# (nvidia-dkms-580-open became nvidia-dkms-open, cuda-drivers-580 has no R590 successor); the
# branch is chosen by the pinning package nvidia-driver-pinning-<branch> or an apt preferences pin.
# Debian's repositories carry unsuffixed names for every branch (plus a cuda-drivers-<branch> whose
# dependencies are open-ended, ">= 580.65.06", so only a pin keeps the branch).
UNSUFFIXED_FROM_BRANCH = 590
_BRANCH_SUFFIX_RE = re.compile(r"^(?P<base>(?:lib)?(?:nvidia|cuda)[a-z0-9-]*?)-(?P<branch>[3-9]\d\d)(?P<rest>(?:-[a-z]+)*)$")


def _supported_from(value):
    """' (supported: "620")': the supported branches at or above a needed one, or '' when none is."""
    fitting = sorted(b for b in SUPPORTED_BRANCHES if b >= value)
    return " (supported: %s)" % ", ".join('"%d"' % b for b in fitting) if fitting and fitting[0] != value else ""


def _supported_listing():
    return ", ".join("R%d (%s, end of life %s)" % (b, kind, eol) for b, (kind, eol) in sorted(SUPPORTED_BRANCHES.items()))


def _outside_support(branch, value):
    """Why a branch is outside NVIDIA's support table, naming the end of life where it is known."""
    ended = END_OF_LIFE_BRANCHES.get(value)
    return "NVIDIA driver branch %s is outside NVIDIA's support table%s (supported: %s), so it gets no more security or bug fixes" % (
        branch, (": it reached its end of life in %s" % ended) if ended else "", _supported_listing())


def branch_support_errors(branch, allow_unsupported=False, shipped_by=""):
    """The branch outside NVIDIA's support table, as one sentence with the fix (empty when supported, or
    accepted knowingly with allow_unsupported; branch_support_warnings then says so).

    shipped_by: the distribution whose own driver is this branch (e.g. "Debian 12") when the role installs
    the distribution's packages, which cannot change the branch: the fix is NVIDIA's repository then."""
    try:
        value = branch_of(branch)
    except CompatError as exc:
        return [str(exc)]
    if value in SUPPORTED_BRANCHES or allow_unsupported:
        return []
    if shipped_by:
        fix = ("%s's own driver is branch %s and cannot be moved to a supported one: set nvidia_driver_source: nvidia and "
               "nvidia_driver_branch: \"%d\" (the long-term branch, the default, from NVIDIA's repository for %s), or set "
               "nvidia_driver_allow_unsupported_branch: true to keep %s's branch %s knowingly"
               % (shipped_by, branch, DEFAULT_BRANCH, shipped_by, shipped_by, branch))
    else:
        fix = ("set nvidia_driver_branch to \"%d\" (the long-term branch, the default), or set "
               "nvidia_driver_allow_unsupported_branch: true to keep branch %s knowingly" % (DEFAULT_BRANCH, branch))
    return ["%s. Fix: %s." % (_outside_support(branch, value), fix)]


def branch_support_warnings(branch, allow_unsupported=False):
    """The warning a run gives when nvidia_driver_allow_unsupported_branch keeps a branch outside the table."""
    try:
        value = branch_of(branch)
    except CompatError:
        return []
    if value in SUPPORTED_BRANCHES or not allow_unsupported:
        return []
    return ["%s; kept because nvidia_driver_allow_unsupported_branch is true. Move to a supported branch "
            "(nvidia_driver_branch: \"%d\") as soon as the node allows." % (_outside_support(branch, value), DEFAULT_BRANCH)]


def unsuffixed_name(name):
    """'nvidia-dkms-595-open' -> 'nvidia-dkms-open', 'cuda-drivers-580' -> 'cuda-drivers' ('' when the
    name carries no branch)."""
    match = _BRANCH_SUFFIX_RE.match(str(name))
    if not match or str(name).startswith("nvidia-driver-pinning-"):
        return ""
    return match.group("base") + match.group("rest")


def missing_package_errors(missing, branch):
    """Sentences for packages apt has no candidate for, with the R590 rename where it explains the miss.

    Not every R590+ name lost its branch (Ubuntu's repository still has nvidia-kernel-source-590-open),
    so the repository decides; this only explains what it does not carry."""
    try:
        value = branch_of(branch)
    except CompatError as exc:
        return [str(exc)]
    errors = []
    for name in missing or []:
        plain = unsuffixed_name(name)
        if plain and value >= UNSUFFIXED_FROM_BRANCH:
            errors.append("%s is not in the configured sources. From R590 NVIDIA's repositories name the driver packages "
                          "without the branch (the pinning package or the apt preferences pin keeps branch %d): use %s."
                          % (name, value, plain))
        elif str(name).startswith("nvidia-driver-pinning-"):
            errors.append("%s is not in the configured sources, so the branch cannot be locked with NVIDIA's pinning "
                          "package. Fix: check that branch %d exists in the repository (apt-cache policy cuda-drivers "
                          "nvidia-open), or set nvidia_driver_pin_method: preferences." % (name, value))
        else:
            errors.append("%s is not in the configured sources (apt-cache policy %s shows no candidate). Fix: check the "
                          "name against the repository (apt-cache search --names-only '%s')."
                          % (name, name, re.sub(r"-\d{3}(?=-|$)", "", str(name))))
    return errors


# --- apt sources: a node already set up NVIDIA's way ------------------------------------------

def _norm_uri(uri):
    """apt compares source URIs with a trailing slash added."""
    uri = str(uri or "").strip()
    return uri if uri.endswith("/") else uri + "/"


def _one_line_entry(line):
    """'deb [opt=value ...] uri suite [component...]' -> types, uris, suites, options (None if not an entry)."""
    words = line.split()
    if not words or words[0] not in ("deb", "deb-src"):
        return None
    kind, rest = words[0], " ".join(words[1:])
    options = {}
    if rest.startswith("["):
        inner, _unused, rest = rest[1:].partition("]")
        for word in inner.split():
            key, _unused, value = word.partition("=")
            options[key.lower()] = value
    parts = rest.split()
    if len(parts) < 2:
        return None
    return {"types": [kind], "uris": [parts[0]], "suites": [parts[1]], "signed_by": options.get("signed-by", ""),
            "enabled": True}


def _deb822_stanzas(lines):
    """[(first line number, {field: value})] of a deb822 .sources file; continuation lines keep their newline."""
    stanzas, fields, start, key = [], {}, None, None
    for number, raw in enumerate(lines + [""], 1):
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                stanzas.append((start, fields))
            fields, start, key = {}, None, None
            continue
        if raw[0] in " \t" and key:
            piece = raw.strip()
            fields[key] += "\n" + ("" if piece == "." else piece)
            continue
        name, sep, value = raw.partition(":")
        if not sep:
            continue
        key = name.strip().lower()
        fields[key] = value.strip()
        if start is None:
            start = number
    return stanzas


def parse_apt_sources(text):
    """Entries of the apt source files the role's reader printed, each block starting with
    '==> PATH <==': one-line .list files (and /etc/apt/sources.list) and deb822 .sources files.

    Each entry: file, line, types, uris, suites, signed_by (a keyring path, fingerprints or an inline
    key block; '' when absent) and enabled."""
    entries = []
    blocks = re.split(r"^==> (.+?) <==[ \t]*$", str(text or ""), flags=re.M)
    for path, body in zip(blocks[1::2], blocks[2::2]):
        lines = body.split("\n")
        if lines and not lines[0].strip():
            lines = lines[1:]
        if path.endswith(".sources"):
            for start, fields in _deb822_stanzas(lines):
                entries.append({
                    "file": path, "line": start,
                    "types": fields.get("types", "").split(), "uris": fields.get("uris", "").split(),
                    "suites": fields.get("suites", "").split(), "signed_by": fields.get("signed-by", "").strip(),
                    "enabled": fields.get("enabled", "yes").strip().lower() not in ("no", "false", "0"),
                })
            continue
        for number, raw in enumerate(lines, 1):
            entry = _one_line_entry(raw.split("#", 1)[0].strip())
            if entry:
                entry.update({"file": path, "line": number})
                entries.append(entry)
    return entries


def repo_conflicts(entries, repo_url, own_file):
    """Enabled entries outside own_file for the same repository (URI and the flat suite '/'):
    apt refuses every source when two of them disagree on Signed-By. Each carries 'dedicated':
    whether its file holds nothing but entries for this repository (so it can be set aside whole)."""
    want = _norm_uri(repo_url)

    def same_repo(entry):
        return want in [_norm_uri(u) for u in entry["uris"]] and "/" in entry["suites"]

    by_file = {}
    for entry in entries or []:
        if entry.get("enabled", True):
            by_file.setdefault(entry["file"], []).append(entry)
    found = []
    for path, items in sorted(by_file.items()):
        if path == own_file:
            continue
        dedicated = path != "/etc/apt/sources.list" and all(same_repo(e) for e in items)
        for entry in items:
            if same_repo(entry):
                found.append(dict(entry, dedicated=dedicated))
    return found


def repo_reuse_keyring(conflicts):
    """The keyring file to read when every existing entry names the same Signed-By file ('' otherwise)."""
    values = {e.get("signed_by", "") for e in conflicts or []}
    if len(values) != 1:
        return ""
    value = values.pop()
    return value if value.startswith("/") and "\n" not in value else ""


def _signed_by_fingerprints(value, keyrings):
    """Fingerprints a Signed-By value trusts: an inline key block, a list of fingerprints, or a keyring
    file the role read (keyrings: {path: [fingerprint...]} or {path: the file as slurp's base64})."""
    if "-----BEGIN PGP" in value:
        return openpgp_fingerprints(value)
    words = [normalize_fingerprint(w) for w in re.split(r"[\s,]+", value) if w]
    if words and all(re.match(r"^[0-9A-F]{40}!?$", w) for w in words):
        return [w.rstrip("!") for w in words]
    found = (keyrings or {}).get(value, [])
    if isinstance(found, str):
        return openpgp_fingerprints(found) if found else []
    return [normalize_fingerprint(f) for f in found]


def repo_source_plan(conflicts, expected_fingerprint, keyrings=None):
    """How the role adds NVIDIA's repository next to what the node already has.

    own: nothing else carries it; reuse: the existing entries all trust exactly the expected key
    (cuda-keyring's source on a node set up NVIDIA's way), so the role adds no second source;
    replace: the existing entries trust something else and sit in files of their own, which the role
    renames to <file>.disabled (apt ignores that suffix silently; the file stays for the operator);
    refuse: an existing entry shares its file with other sources, which the role does not edit."""
    expected = normalize_fingerprint(expected_fingerprint)
    if not conflicts:
        return {"mode": "own", "files": [], "signed_by": "", "reason": ""}
    files = sorted({e["file"] for e in conflicts})
    where = ", ".join("%s:%d" % (e["file"], e["line"]) for e in conflicts)
    values = sorted({e.get("signed_by", "") for e in conflicts})
    if len(values) == 1 and values[0]:
        try:
            trusted = _signed_by_fingerprints(values[0], keyrings)
        except CompatError as exc:
            trusted, unreadable = [], str(exc)
        else:
            unreadable = ""
        if trusted == [expected]:
            return {"mode": "reuse", "files": files, "signed_by": values[0],
                    "reason": "%s already carries the repository, signed by %s, which holds exactly the expected key %s"
                              % (where, values[0], expected)}
        reason = ("%s carries the repository signed by %s, which %s, not only the expected %s"
                  % (where, values[0].splitlines()[0],
                     ("cannot be read (%s)" % unreadable) if unreadable else
                     ("holds %s" % (", ".join(trusted) or "no key")), expected))
    elif len(values) == 1:
        reason = "%s carries the repository without Signed-By (trusting every key in apt's global keyrings)" % where
    else:
        reason = "%s carry the repository with different Signed-By values (%s)" % (where, " / ".join(v or "none" for v in values))
    shared = [e for e in conflicts if not e["dedicated"]]
    if shared:
        return {"mode": "refuse", "files": files, "signed_by": "", "reason": reason,
                "message": "%s. A second source for the same repository with another Signed-By makes apt refuse every "
                           "source (\"Conflicting values set for option Signed-By\"), and %s also holds other sources, which "
                           "the role does not edit. Nothing was changed. Fix: remove or comment out the NVIDIA line(s) at %s "
                           "(or point them at a keyring holding only %s), then run the role again."
                           % (reason, ", ".join(sorted({e["file"] for e in shared})),
                              ", ".join("%s:%d" % (e["file"], e["line"]) for e in shared), expected)}
    return {"mode": "replace", "files": files, "signed_by": "", "reason": reason}


def apt_signed_by_conflicts(text):
    """The sources apt named in "Conflicting values set for option Signed-By regarding source URI
    SUITE: A != B" (apt wraps long lines with indented continuations): [{'source', 'values'}]."""
    lines = []
    for raw in str(text or "").splitlines():
        if raw[:1] in (" ", "\t") and lines:
            lines[-1] += " " + raw.strip()
        else:
            lines.append(raw.rstrip())
    found = []
    for line in lines:
        match = re.search(r"Conflicting values set for option Signed-By regarding source (\S+) (\S+): (.*?) != ?(.*?)\s*$", line)
        if match:
            found.append({"source": "%s %s" % (match.group(1), match.group(2)),
                          "values": [match.group(3).strip(), match.group(4).strip()]})
    return found


# --- DKMS module signing, by generation --------------------------------------------------------

# dkms 3.0.4 (dkms-project/dkms 1c79926 "Add /etc/dkms/framework.conf.d directory" and 3323033
# "Rework signing") reads /etc/dkms/framework.conf.d/*.conf and takes the key from mok_signing_key /
# mok_certificate. Before that (Ubuntu 22.04 ships 2.8.7) dkms sources only /etc/dkms/framework.conf
# and its sign_build() signs with kmodsign, /var/lib/shim-signed/mok/MOK.priv and MOK.der, and only
# where Ubuntu's update-secureboot-policy exists.
DKMS_CONF_D_FROM = (3, 0, 4)


def dkms_version(text):
    """The dkms version in `dkms --version` ('dkms-3.0.10'), a package version ('2.8.7-2ubuntu2',
    '3.0.10-8+deb12u1') or `apt-cache policy dkms` (the installed one, else the candidate); '' if none."""
    text = str(text or "")
    for field in ("Installed", "Candidate"):
        match = re.search(r"^\s*%s:\s*(\S+)" % field, text, re.M)
        if match and match.group(1) != "(none)":
            text = match.group(1)
            break
    else:
        if re.search(r"^\s*(Installed|Candidate):", text, re.M):
            return ""
    match = re.search(r"(?:^|dkms-|\s)(?:\d+:)?(\d+\.\d+(?:\.\d+)*)", text)
    return match.group(1) if match else ""


def dkms_signing(version):
    """Where DKMS of this version takes the module signing key from, and how the role configures it."""
    parsed = _pad(parse_version(version))
    if parsed >= DKMS_CONF_D_FROM:
        return {"generation": "framework.conf.d", "dkms_version": version,
                "conf": "/etc/dkms/framework.conf.d/hmk-signing.conf",
                "key": "/var/lib/dkms/hmk-mok.key", "cert": "/var/lib/dkms/hmk-mok.der",
                "variables": ["mok_signing_key", "mok_certificate"]}
    return {"generation": "shim-mok", "dkms_version": version, "conf": "",
            "key": "/var/lib/shim-signed/mok/MOK.priv", "cert": "/var/lib/shim-signed/mok/MOK.der",
            "variables": []}


# --- module signatures against the enrolled MOKs ----------------------------------------------

def _der_element(data, pos):
    """(tag, content start, end) of the DER element at pos."""
    tag = data[pos]
    length = data[pos + 1]
    start = pos + 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[start:start + count], "big")
        start += count
    return tag, start, start + length


def _der_children(data, start, end):
    pos = start
    while pos < end:
        tag, cstart, cend = _der_element(data, pos)
        yield tag, cstart, cend
        pos = cend


def _common_name(data, start, end):
    """The commonName (2.5.4.3) of a DER Name, or ''."""
    for _unused, set_start, set_end in _der_children(data, start, end):
        for _unused, seq_start, seq_end in _der_children(data, set_start, set_end):
            parts = list(_der_children(data, seq_start, seq_end))
            if len(parts) == 2 and data[parts[0][1]:parts[0][2]] == b"\x55\x04\x03":
                return data[parts[1][1]:parts[1][2]].decode("utf-8", "replace")
    return ""


def _hex(value):
    """Colon-separated or plain hex -> lower-case hex without leading zero bytes (how both modinfo and
    OpenSSL print a positive serial number)."""
    digits = re.sub(r"[^0-9a-fA-F]", "", str(value or "")).lower()
    if len(digits) % 2:
        digits = "0" + digits
    while digits.startswith("00") and len(digits) > 2:
        digits = digits[2:]
    return digits


def x509_identity(cert):
    """serial, issuer_cn, subject_cn and sha1 of an X.509 certificate given as PEM or base64 DER."""
    text = str(cert or "").strip()
    if "-----BEGIN CERTIFICATE-----" in text:
        text = text.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    try:
        der = base64.b64decode("".join(text.split()), validate=True)
        _unused, start, end = _der_element(der, 0)
        _unused, tbs_start, tbs_end = _der_element(der, start)
        fields = list(_der_children(der, tbs_start, tbs_end))
    except (binascii.Error, ValueError, IndexError) as exc:
        raise CompatError("the certificate is neither PEM nor base64 DER X.509 (%s)" % exc)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    if len(fields) < 5 or fields[0][0] != 0x02:
        raise CompatError("the certificate's TBSCertificate does not start with a serial number")
    return {
        "serial": _hex(binascii.hexlify(der[fields[0][1]:fields[0][2]]).decode()),
        "issuer_cn": _common_name(der, fields[2][1], fields[2][2]),
        "subject_cn": _common_name(der, fields[4][1], fields[4][2]),
        "sha1": ":".join("%02x" % b for b in hashlib.sha1(der).digest()),
        "der_b64": base64.b64encode(der).decode("ascii"),
    }


def modinfo_signature(text):
    """The signature fields of `modinfo` output: signed, signer (the signing certificate's issuer
    CN, as kmod reports it), sig_key (its serial number), sig_hashalgo, plus filename and version."""
    fields = {}
    for line in str(text or "").splitlines():
        match = re.match(r"^([a-z_]+):\s*(.*?)\s*$", line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2)
    return {
        "signed": bool(fields.get("sig_id") or fields.get("signer") or fields.get("sig_key")),
        "signer": fields.get("signer", ""),
        "sig_key": _hex(fields.get("sig_key", "")),
        "sig_hashalgo": fields.get("sig_hashalgo", ""),
        "filename": fields.get("filename", ""),
        "version": fields.get("version", ""),
    }


def _dn_cn(line):
    match = re.search(r"\bCN\s*=\s*(.+?)(?:,\s*[A-Za-z][A-Za-z0-9.]*\s*=|\s*$)", line)
    return match.group(1).strip() if match else ""


def mokutil_certificates(text):
    """Certificates of `mokutil --list-enrolled` (its X.509 text form, mokutil 0.3-0.7): sha1,
    serial, issuer_cn and subject_cn each."""
    certs = []
    for block in re.split(r"^\[key \d+\]\s*$", str(text or ""), flags=re.M):
        if "Certificate:" not in block:
            continue
        cert = {"sha1": "", "serial": "", "issuer_cn": "", "subject_cn": ""}
        match = re.search(r"SHA1 Fingerprint:\s*([0-9a-fA-F:]+)", block)
        if match:
            cert["sha1"] = match.group(1).lower()
        match = re.search(r"Serial Number:[ \t]*(\S.*)?\n(?:[ \t]+([0-9a-fA-F:]+)\s*\n)?", block)
        if match:
            inline, below = match.group(1), match.group(2)
            small = re.search(r"\(0x([0-9a-fA-F]+)\)", inline or "")
            cert["serial"] = _hex(small.group(1) if small else (below or inline or ""))
        for field in ("Issuer", "Subject"):
            match = re.search(r"^\s*%s:\s*(.*)$" % field, block, re.M)
            if match:
                cert[field.lower() + "_cn"] = _dn_cn(match.group(1))
        certs.append(cert)
    return certs


def module_signer_check(modinfo_text, mokutil_text, cert=None, module="nvidia"):
    """Whether the module's signature comes from an enrolled MOK, with the fix when it does not.

    ok, signer, sig_key, enrolled (CNs), own_enrolled (the role's certificate in the list; None
    without one) and message."""
    sig = modinfo_signature(modinfo_text)
    certs = mokutil_certificates(mokutil_text)
    own = x509_identity(cert) if cert else None
    own_enrolled = None if own is None else any(
        c["serial"] == own["serial"] and c["issuer_cn"] == own["issuer_cn"] for c in certs)
    names = ", ".join('"%s"' % (c["subject_cn"] or c["sha1"]) for c in certs) or "none"
    result = {"ok": False, "signer": sig["signer"], "sig_key": sig["sig_key"], "enrolled": [c["subject_cn"] for c in certs],
              "own_enrolled": own_enrolled, "message": ""}
    enroll = ("enroll the role's certificate: mokutil --import <its DER file> (choose a one-time password), reboot, pick "
              "\"Enroll MOK\" in MokManager at the console and enter the password")
    if not sig["signed"]:
        result["message"] = (
            "Secure Boot is on but module %s (%s) carries no signature, so the kernel will refuse to load it. DKMS did not "
            "sign it: check the signing configuration the role wrote and /var/lib/dkms/%s/*/build/make.log, then rebuild "
            "(dkms autoinstall -k <kernel>)." % (module, sig["filename"] or "?", module))
        return result
    if any(c["serial"] == sig["sig_key"] and c["issuer_cn"] == sig["signer"] for c in certs):
        result["ok"] = True
        return result
    if own is not None and own["serial"] == sig["sig_key"] and own["issuer_cn"] == sig["signer"]:
        fix = "it was signed with the role's key, which is not enrolled yet: %s." % enroll
    elif own is not None:
        fix = ("it was not signed with the role's key (\"%s\", serial %s): DKMS used another key; check the signing "
               "configuration the role wrote, rebuild (dkms autoinstall -k <kernel>), and %s if needed."
               % (own["issuer_cn"], own["serial"], enroll))
    else:
        fix = "enroll the certificate of that key (mokutil --import <DER file>, reboot, \"Enroll MOK\" in MokManager)."
    result["message"] = (
        "Secure Boot is on and module %s (%s) is signed by \"%s\" (key serial %s), which is not among the keys enrolled in "
        "the MOK list (%s); the kernel will refuse it (\"Key was rejected by service\"). Fix: %s"
        % (module, sig["filename"] or "?", sig["signer"], sig["sig_key"], names, fix))
    return result


# --- the CUDA toolkit a build uses ------------------------------------------------------------

def cuda_toolkits(text):
    """Toolkit series installed side by side, from paths like /usr/local/cuda-12.8/bin/nvcc (oldest first)."""
    found = set(re.findall(r"/cuda-(\d+\.\d+)/bin/nvcc\b", str(text or "")))
    return sorted(found, key=toolkit_key)


def cuda_toolkit_choice(installed, wanted="", prefix="/usr/local"):
    """The toolkit series a build uses and its home /usr/local/cuda-X.Y (never the floating
    /usr/local/cuda, which follows whichever toolkit was installed last). error explains a miss."""
    installed = list(installed or [])
    listing = ", ".join("%s/cuda-%s" % (prefix, s) for s in installed) or "none"
    if wanted not in (None, ""):
        series = toolkit_series(wanted)
        if series not in installed:
            return {"series": series, "home": "%s/cuda-%s" % (prefix, series),
                    "error": "CUDA toolkit %s is not installed (no %s/cuda-%s/bin/nvcc; installed: %s). Install "
                             "cuda-toolkit-%s (the nvidia_driver role does with nvidia_driver_cuda_toolkit_version) or choose "
                             "an installed series." % (series, prefix, series, listing, series.replace(".", "-"))}
        return {"series": series, "home": "%s/cuda-%s" % (prefix, series), "error": ""}
    if len(installed) == 1:
        return {"series": installed[0], "home": "%s/cuda-%s" % (prefix, installed[0]), "error": ""}
    if not installed:
        return {"series": "", "home": "", "error": "no CUDA toolkit is installed as %s/cuda-X.Y/bin/nvcc. Install one "
                                                   "(the nvidia_driver role) before a CUDA build." % prefix}
    return {"series": "", "home": "", "error": "several CUDA toolkits are installed (%s) and none was chosen; %s/cuda "
                                               "follows whichever was installed last, so the role does not guess. Set the "
                                               "series to build with." % (listing, prefix)}


def nvcc_version(text):
    """'Cuda compilation tools, release 12.8, V12.8.93' -> '12.8.93' ('' when absent)."""
    match = re.search(r"\bV(\d+\.\d+\.\d+)\b", str(text or ""))
    if match:
        return match.group(1)
    return nvcc_release(text) or ""


def installed_driver_version(text):
    """The NVIDIA driver version from what a node shows, best source first: the loaded module
    (/proc/driver/nvidia/version), the module file (`modinfo -F version nvidia`, prefixed
    'modinfo: '), then DKMS (`dkms status` lines 'nvidia/580.95.05, <kernel>, x86_64: installed').
    Returns {'version', 'source'}; version '' when no driver is installed."""
    text = str(text or "")
    match = re.search(r"^NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text, re.M)
    if match:
        return {"version": match.group(1), "source": "loaded module (/proc/driver/nvidia/version)"}
    match = re.search(r"^modinfo:\s*(\d+\.\d+(?:\.\d+)?)\s*$", text, re.M)
    if match:
        return {"version": match.group(1), "source": "module file (modinfo)"}
    found = re.findall(r"^nvidia(?:-current)?[/,]\s*(\d+\.\d+(?:\.\d+)?),[^:\n]*:\s*installed", text, re.M)
    if found:
        best = sorted(found, key=lambda v: _pad(parse_version(v)))[-1]
        return {"version": best, "source": "DKMS (dkms status)"}
    return {"version": "", "source": ""}


def toolkit_driver_errors(toolkit, driver):
    """A toolkit newer than the installed driver supports, named with both versions and the fix."""
    if not driver:
        return ["No NVIDIA driver is installed (no loaded module, no module file, no DKMS build), so nothing built with "
                "CUDA toolkit %s could run. Fix: run the gpu stage (nvidia_driver) first." % toolkit]
    try:
        needed = min_driver(toolkit)
    except CompatError as exc:
        return [str(exc)]
    if version_ge(driver, needed):
        return []
    newest = newest_toolkit_for(driver)
    return ["CUDA toolkit %s needs NVIDIA driver >= %s, but the installed driver is %s: a binary built with it fails at "
            "start (\"CUDA driver version is insufficient for CUDA runtime version\"). Fix: build with an older toolkit%s, "
            "or upgrade the driver (nvidia_driver_branch) and reboot." % (
                toolkit, needed, driver, (" (driver %s supports up to CUDA %s)" % (driver, newest)) if newest else "")]


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return guard_filters({
            "hmk_nvidia_compat_errors": compat_errors,
            "hmk_nvidia_min_driver": min_driver,
            "hmk_nvidia_toolkit_series": toolkit_series,
            "hmk_nvidia_version_ge": version_ge,
            "hmk_nvidia_driver_in_branch": driver_in_branch,
            "hmk_nvidia_smi_gpus": parse_nvidia_smi_gpus,
            "hmk_nvidia_nvcc_release": nvcc_release,
            "hmk_openpgp_fingerprint": openpgp_fingerprint,
            "hmk_fingerprint_normalize": normalize_fingerprint,
            "hmk_boot_kernel": boot_kernel,
            "hmk_openpgp_fingerprints": openpgp_fingerprints,
            "hmk_nvidia_branch_support_errors": branch_support_errors,
            "hmk_nvidia_branch_support_warnings": branch_support_warnings,
            "hmk_nvidia_required_driver": required_driver,
            "hmk_nvidia_blackwell_gpus": blackwell_gpus,
            "hmk_nvidia_node_gpu_errors": node_gpu_errors,
            "hmk_nvidia_missing_package_errors": missing_package_errors,
            "hmk_nvidia_apt_sources": parse_apt_sources,
            "hmk_nvidia_repo_conflicts": repo_conflicts,
            "hmk_nvidia_repo_reuse_keyring": repo_reuse_keyring,
            "hmk_nvidia_repo_source_plan": repo_source_plan,
            "hmk_nvidia_apt_signed_by_conflicts": apt_signed_by_conflicts,
            "hmk_nvidia_dkms_version": dkms_version,
            "hmk_nvidia_dkms_signing": dkms_signing,
            "hmk_nvidia_x509_identity": x509_identity,
            "hmk_nvidia_modinfo_signature": modinfo_signature,
            "hmk_nvidia_mokutil_certificates": mokutil_certificates,
            "hmk_nvidia_module_signer_check": module_signer_check,
            "hmk_nvidia_cuda_toolkits": cuda_toolkits,
            "hmk_nvidia_cuda_toolkit_choice": cuda_toolkit_choice,
            "hmk_nvidia_nvcc_version": nvcc_version,
            "hmk_nvidia_installed_driver_version": installed_driver_version,
            "hmk_nvidia_toolkit_driver_errors": toolkit_driver_errors,
        }, AnsibleFilterError)
