"""Filters for the nvidia_driver role: driver/toolkit/GPU compatibility, version parsing, the
OpenPGP fingerprint of the repository key and the parsers the post-checks use.

Pure Python (no Ansible import) so tests/unit/test_nvidia_compat.py loads it directly.
"""
import base64
import hashlib
import re

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
    (13, 0): "580.65.06",
}

# Minor-version compatibility: a 12.x toolkit runs (without PTX JIT of newer code) on >= 525;
# 13.x has no such floor below 580.
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


def min_driver(toolkit):
    """Minimum driver for a toolkit version, or raise CompatError if the table lacks it."""
    key = toolkit_key(toolkit)
    if len(key) >= 3 and key[:3] in MIN_DRIVER:
        return MIN_DRIVER[key[:3]]
    if key[:2] in MIN_DRIVER:
        return MIN_DRIVER[key[:2]]
    known = ", ".join(".".join(str(p) for p in k) for k in sorted(MIN_DRIVER))
    raise CompatError("CUDA toolkit %s is not in the compatibility table (known: %s); add its minimum driver "
                      "to MIN_DRIVER in roles/nvidia_driver/filter_plugins/hmk_nvidia.py" % (toolkit, known))


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
    capabilities of the node's GPUs; minor_version_compat: accept 12.x on a driver >= 525 below
    the toolkit's own minimum (CUDA minor-version compatibility: no PTX JIT for newer code)."""
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
            if not driver_satisfies(branch, needed):
                if minor_version_compat and key[0] == 12 and floor and driver_satisfies(branch, floor):
                    pass
                else:
                    newest = newest_toolkit_for(branch)
                    errors.append(
                        "CUDA toolkit %s needs NVIDIA driver >= %s but the driver is %s (branch %d). Fix: set "
                        "nvidia_driver_branch to \"%d\" or newer, or nvidia_driver_cuda_toolkit_version to %s."
                        % (toolkit, needed, branch, driver_branch, branch_of(needed),
                           ("\"%s\" (the newest toolkit driver %s supports)" % (newest, branch)) if newest
                           else "an older release"))
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


def openpgp_fingerprint(armored):
    """Fingerprint (40 upper-case hex digits) of the primary key of an ASCII-armored or binary
    OpenPGP public key (version 4 keys: SHA-1 over 0x99, the 2-byte length and the packet body)."""
    if isinstance(armored, bytes):
        data = armored
    else:
        text = str(armored)
        if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
            raise CompatError("the repository key is not an ASCII-armored OpenPGP public key")
        body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].split("-----END PGP PUBLIC KEY BLOCK-----", 1)[0]
        lines = [line.strip() for line in body.strip().splitlines()]
        # Armor headers end at the first empty line; the CRC line starts with '='.
        if "" in lines:
            lines = lines[lines.index("") + 1:]
        payload = "".join(line for line in lines if line and not line.startswith("="))
        data = base64.b64decode(payload)
    if not data or not data[0] & 0x80:
        raise CompatError("the repository key does not start with an OpenPGP packet")
    first = data[0]
    if first & 0x40:  # new packet format
        tag = first & 0x3F
        length_octet = data[1]
        if length_octet < 192:
            length, offset = length_octet, 2
        elif length_octet < 224:
            length, offset = ((length_octet - 192) << 8) + data[2] + 192, 3
        else:
            length, offset = int.from_bytes(data[2:6], "big"), 6
    else:
        tag = (first >> 2) & 0x0F
        length_type = first & 0x03
        size = {0: 1, 1: 2, 2: 4}.get(length_type)
        if size is None:
            raise CompatError("the repository key uses an indeterminate packet length")
        length, offset = int.from_bytes(data[1:1 + size], "big"), 1 + size
    if tag != 6:
        raise CompatError("the repository key's first packet is not a public key (tag %d)" % tag)
    packet = data[offset:offset + length]
    if packet[0] != 4:
        raise CompatError("the repository key is an OpenPGP v%d key; only v4 fingerprints are computed here" % packet[0])
    return hashlib.sha1(b"\x99" + len(packet).to_bytes(2, "big") + packet).hexdigest().upper()


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


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return {
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
        }
