"""Unit tests for the driver-path logic of plugins/filter/hmk_nvidia.py, on real outputs
(tests/fixtures/nvidia/INDEX.md names each one's source): the supported branches and the R590
package naming, the apt sources a node already has for NVIDIA's repository, the DKMS signing
generations, module signatures against the enrolled MOKs, and the toolkit a build uses."""
import base64
import importlib
import io
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))

nv = importlib.import_module("hmk_nvidia")

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "nvidia")
OWN = os.path.join(FIXTURES, "own")
REPO = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
NVIDIA_FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"
OWN_SOURCES = "/etc/apt/sources.list.d/hmk-nvidia-cuda.sources"


def read(name, directory=FIXTURES):
    with io.open(os.path.join(directory, name), encoding="utf-8") as handle:
        return handle.read()


def listing(files):
    """The role's reader output: '==> PATH <==' then the file's content, per file."""
    return "".join("==> %s <==\n%s\n" % (path, text) for path, text in files)


# --- branches and naming -----------------------------------------------------------------------

def test_the_default_branch_is_the_long_term_r580_and_supported():
    assert nv.DEFAULT_BRANCH == 580
    for branch in ("580", "595", "620", "580.95.05", "620.12.03"):
        assert nv.branch_support_errors(branch) == [], branch
        assert nv.branch_support_warnings(branch, allow_unsupported=True) == [], branch


def test_r535_is_refused_naming_its_end_of_life_and_the_supported_branches():
    errors = nv.branch_support_errors("535")
    assert len(errors) == 1
    text = errors[0]
    assert "branch 535 is outside NVIDIA's support table" in text and "end of life in June 2026" in text
    assert "R580 (long-term support branch, end of life June 2028)" in text
    assert "R595 (production branch, end of life March 2027)" in text
    assert "R620 (long-term support branch, end of life September 2029)" in text
    assert "R535" not in text.split("supported:", 1)[1]
    assert 'nvidia_driver_branch to "580" (the long-term branch' in text
    assert "nvidia_driver_allow_unsupported_branch: true" in text


def test_r535_kept_with_the_override_warns_with_its_end_of_life():
    assert nv.branch_support_errors("535", allow_unsupported=True) == []
    warnings = nv.branch_support_warnings("535", allow_unsupported=True)
    assert len(warnings) == 1 and "end of life in June 2026" in warnings[0]
    assert "kept because nvidia_driver_allow_unsupported_branch is true" in warnings[0]
    assert nv.branch_support_warnings("535") == []


def test_debians_own_r535_points_at_nvidias_repository():
    text = nv.branch_support_errors("535", False, "Debian 12")[0]
    assert "end of life in June 2026" in text and "Debian 12's own driver is branch 535" in text
    assert "nvidia_driver_source: nvidia" in text and 'nvidia_driver_branch: "580"' in text
    assert "nvidia_driver_allow_unsupported_branch: true" in text
    assert nv.branch_support_errors("535", True, "Debian 12") == []


def test_r570_is_refused_with_the_supported_branches_and_both_fixes():
    errors = nv.branch_support_errors("570")
    assert len(errors) == 1
    text = errors[0]
    assert "570" in text and "February 2026" in text and "R580" in text and "R595" in text and "R620" in text
    assert 'nvidia_driver_branch to "580"' in text and "nvidia_driver_allow_unsupported_branch: true" in text
    assert nv.branch_support_errors("570", allow_unsupported=True) == []


@pytest.mark.parametrize("branch", ["550", "590", "610", "630"])
def test_other_branches_outside_the_table_are_refused_without_a_date(branch):
    text = nv.branch_support_errors(branch)[0]
    assert "branch %s is outside NVIDIA's support table (supported: R580" % branch in text
    assert "end of life in" not in text


def _names(line):
    return [word.split("=")[0] for word in line.split('"', 1)[1].split() if not word.endswith("…")]


def test_every_580_name_of_the_ubuntu_repository_maps_to_its_590_name():
    old, new = [line for line in read("apt-packages--ubuntu2404-cuda-repo-580-vs-590-names--dsx-infra-controller-6049.txt")
                .splitlines() if line.strip()]
    old_names, new_names = _names(old), _names(new)
    suffixed = [n for n in old_names if n.endswith("-580")]
    assert len(suffixed) >= 9
    for name in suffixed:
        assert nv.unsuffixed_name(name) in new_names, name
    # The R590 list still has one branch-named package: naming is the repository's, not a rule to enforce.
    assert "nvidia-kernel-source-590-open" in new_names
    for name in new_names:
        if not re.search(r"-\d{3}(-|$)", name):
            assert nv.unsuffixed_name(name) == "", name


def test_a_missing_suffixed_package_on_r590_names_its_new_name():
    errors = nv.missing_package_errors(["nvidia-fabricmanager-595", "cuda-drivers-595"], "595")
    assert "use nvidia-fabricmanager." in errors[0] and "use cuda-drivers." in errors[1]
    assert "branch 595" in errors[0]


def test_a_missing_package_below_r590_gets_no_rename_hint():
    text = nv.missing_package_errors(["nvidia-fabricmanager-580"], "580")[0]
    assert "use nvidia-fabricmanager" not in text and "apt-cache search" in text


def test_a_missing_pinning_package_points_at_the_preferences_pin():
    text = nv.missing_package_errors(["nvidia-driver-pinning-580"], "580")[0]
    assert "nvidia_driver_pin_method: preferences" in text
    assert nv.unsuffixed_name("nvidia-driver-pinning-580") == ""


# --- apt sources -------------------------------------------------------------------------------

CUDA_KEYRING_LIST = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"


def test_cuda_keyrings_source_conflicts_with_the_roles_own():
    entries = nv.parse_apt_sources(listing([
        ("/etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main\n"),
        (CUDA_KEYRING_LIST, read("apt-source--cuda-keyring-debian12-x86_64-list--cuda-repo-management-30.txt")),
        (OWN_SOURCES, "# managed\nTypes: deb\nURIs: %s\nSuites: /\nSigned-By: /etc/apt/keyrings/hmk-nvidia-cuda.asc\n" % REPO),
    ]))
    assert [e["file"] for e in entries] == ["/etc/apt/sources.list", CUDA_KEYRING_LIST, OWN_SOURCES]
    conflicts = nv.repo_conflicts(entries, REPO, OWN_SOURCES)
    assert len(conflicts) == 1
    assert conflicts[0]["file"] == CUDA_KEYRING_LIST and conflicts[0]["line"] == 1 and conflicts[0]["dedicated"]
    assert conflicts[0]["signed_by"] == "/usr/share/keyrings/cuda-archive-keyring.gpg"
    assert nv.repo_reuse_keyring(conflicts) == "/usr/share/keyrings/cuda-archive-keyring.gpg"


def test_uri_without_trailing_slash_is_the_same_source_but_another_scheme_is_not():
    entries = nv.parse_apt_sources(listing([
        ("/etc/apt/sources.list.d/a.list", "deb [arch=amd64 signed-by=/k.gpg] %s /\n" % REPO.rstrip("/")),
        ("/etc/apt/sources.list.d/b.list", "deb %s /\n" % REPO.replace("https://", "http://")),
        ("/etc/apt/sources.list.d/c.list", "# deb %s /\n" % REPO),
    ]))
    conflicts = nv.repo_conflicts(entries, REPO, OWN_SOURCES)
    assert [c["file"] for c in conflicts] == ["/etc/apt/sources.list.d/a.list"]


def test_ubuntu_deb822_sources_hold_no_nvidia_entry():
    entries = nv.parse_apt_sources(listing([
        ("/etc/apt/sources.list.d/ubuntu.sources", read("apt-source--ubuntu2404-ubuntu-sources-deb822--ustclug-mirrorhelp-244.txt")),
    ]))
    assert [(e["uris"], e["suites"], e["line"]) for e in entries] == [
        (["http://archive.ubuntu.com/ubuntu/"], ["noble", "noble-updates", "noble-backports"], 2),
        (["http://security.ubuntu.com/ubuntu/"], ["noble-security"], 8)]
    assert all(e["signed_by"] == "/usr/share/keyrings/ubuntu-archive-keyring.gpg" for e in entries)
    assert nv.repo_conflicts(entries, REPO, OWN_SOURCES) == []


def test_a_disabled_deb822_stanza_and_an_inline_key_are_read():
    text = ("Types: deb\nURIs: %s\nSuites: /\nEnabled: no\n\nTypes: deb deb-src\nURIs: %s\nSuites: /\n"
            "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n -----END PGP PUBLIC KEY BLOCK-----\n" % (REPO, REPO))
    entries = nv.parse_apt_sources(listing([("/etc/apt/sources.list.d/x.sources", text)]))
    assert [e["enabled"] for e in entries] == [False, True]
    assert entries[1]["types"] == ["deb", "deb-src"]
    assert entries[1]["signed_by"].splitlines()[0:2] == ["-----BEGIN PGP PUBLIC KEY BLOCK-----", ""]
    assert len(nv.repo_conflicts(entries, REPO, OWN_SOURCES)) == 1


def _conflict(path, signed_by, dedicated=True, line=1):
    return {"file": path, "line": line, "signed_by": signed_by, "dedicated": dedicated, "uris": [REPO], "suites": ["/"]}


def test_cuda_keyrings_source_with_nvidias_key_is_reused():
    plan = nv.repo_source_plan([_conflict(CUDA_KEYRING_LIST, "/usr/share/keyrings/cuda-archive-keyring.gpg")],
                               "eb69 3b30 35cd 5710 e231  e123 a4b4 6996 3bf8 63cc",
                               {"/usr/share/keyrings/cuda-archive-keyring.gpg": [NVIDIA_FPR]})
    assert plan["mode"] == "reuse" and plan["signed_by"] == "/usr/share/keyrings/cuda-archive-keyring.gpg"
    assert plan["files"] == [CUDA_KEYRING_LIST]


@pytest.mark.parametrize("keyrings, why", [
    ({"/usr/share/keyrings/cuda-archive-keyring.gpg": ["A" * 40]}, "holds " + "A" * 40),
    ({"/usr/share/keyrings/cuda-archive-keyring.gpg": [NVIDIA_FPR, "A" * 40]}, "not only the expected"),
    ({}, "holds no key"),
])
def test_a_source_trusting_another_key_in_a_file_of_its_own_is_replaced(keyrings, why):
    plan = nv.repo_source_plan([_conflict(CUDA_KEYRING_LIST, "/usr/share/keyrings/cuda-archive-keyring.gpg")],
                               NVIDIA_FPR, keyrings)
    assert plan["mode"] == "replace" and plan["files"] == [CUDA_KEYRING_LIST]
    assert why in plan["reason"]


def test_a_source_without_signed_by_in_the_main_sources_list_is_refused_with_the_line():
    plan = nv.repo_source_plan([_conflict("/etc/apt/sources.list", "", dedicated=False, line=3)], NVIDIA_FPR)
    assert plan["mode"] == "refuse"
    assert "/etc/apt/sources.list:3" in plan["message"] and "Nothing was changed" in plan["message"]
    assert "without Signed-By" in plan["message"] and "Conflicting values set for option Signed-By" in plan["message"]


def test_signed_by_fingerprints_are_compared_directly():
    plan = nv.repo_source_plan([_conflict(CUDA_KEYRING_LIST, NVIDIA_FPR.lower())], NVIDIA_FPR)
    assert plan["mode"] == "reuse"


def test_no_existing_source_means_the_roles_own():
    assert nv.repo_source_plan([], NVIDIA_FPR)["mode"] == "own"


@pytest.mark.parametrize("name, source, values", [
    ("apt-get-update--conflicting-signed-by-none--cuda-repo-management-4.txt",
     "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu1804/x86_64/ /",
     ["/usr/share/keyrings/cuda-archive-keyring.gpg", ""]),
    ("apt-get-update--conflicting-signed-by-none--nvidia-docker-1631.txt",
     "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64/ /",
     ["/usr/share/keyrings/cuda-archive-keyring.gpg", ""]),
    ("own/apt-get-update--conflicting-signed-by.txt", REPO + " /",
     ["/usr/share/keyrings/cuda-archive-keyring.gpg", "/etc/apt/keyrings/hmk-nvidia-cuda.asc"]),
])
def test_apts_conflict_message_is_read(name, source, values):
    assert nv.apt_signed_by_conflicts(read(name)) == [{"source": source, "values": values}]


def test_apt_cache_fails_the_same_way_on_conflicting_sources():
    text = read("apt-cache-policy--conflicting-signed-by.txt", OWN)
    assert "[exit status 100]" in text and len(nv.apt_signed_by_conflicts(text)) == 1


# --- OpenPGP keyrings ---------------------------------------------------------------------------

def _armored(fixture_test_key):
    body = "".join(line for line in fixture_test_key.splitlines()[2:-2] if not line.startswith("="))
    return base64.b64decode(body)


def test_a_binary_keyring_with_two_keys_yields_both_fingerprints_also_as_slurp_base64():
    compat = importlib.import_module("test_nvidia_compat")
    ed = _armored(compat.ED25519_KEY)
    rsa = base64.b64decode("".join(l for l in compat.RSA_KEY.splitlines()[3:-2] if not l.startswith("=")))
    keyring = ed + rsa
    assert nv.openpgp_fingerprints(keyring) == [compat.ED25519_FPR, compat.RSA_FPR]
    assert nv.openpgp_fingerprints(base64.b64encode(keyring).decode()) == [compat.ED25519_FPR, compat.RSA_FPR]
    assert nv.openpgp_fingerprints(base64.b64encode(compat.RSA_KEY.encode()).decode()) == [compat.RSA_FPR]
    with pytest.raises(nv.CompatError):
        nv.openpgp_fingerprints("bm90IGEga2V5")


# --- DKMS signing generations ------------------------------------------------------------------

@pytest.mark.parametrize("text, version", [
    (read("dkms--version.txt", OWN), "3.0.10"),
    (read("apt-cache-policy-dkms--installed.txt", OWN), "3.0.10"),
    (read("apt-cache-policy-dkms--not-installed.txt", OWN), "3.0.10"),   # the candidate apt would install
    ("2.8.7-2ubuntu2", "2.8.7"),                                         # Ubuntu 22.04's package version
    ("3.0.11-1ubuntu13", "3.0.11"),
    ("dkms:\n  Installed: (none)\n  Candidate: (none)\n", ""),
])
def test_dkms_version_from_every_place_the_role_reads_it(text, version):
    assert nv.dkms_version(text) == version


@pytest.mark.parametrize("version, generation, key", [
    ("2.8.7", "shim-mok", "/var/lib/shim-signed/mok/MOK.priv"),
    ("3.0.3", "shim-mok", "/var/lib/shim-signed/mok/MOK.priv"),
    ("3.0.4", "framework.conf.d", "/var/lib/dkms/hmk-mok.key"),
    ("3.0.10", "framework.conf.d", "/var/lib/dkms/hmk-mok.key"),
    ("3.2.2", "framework.conf.d", "/var/lib/dkms/hmk-mok.key"),
])
def test_dkms_before_3_0_4_signs_with_the_shim_mok_and_later_reads_framework_conf_d(version, generation, key):
    signing = nv.dkms_signing(version)
    assert signing["generation"] == generation and signing["key"] == key
    if generation == "shim-mok":
        assert signing["cert"] == "/var/lib/shim-signed/mok/MOK.der" and signing["conf"] == ""
    else:
        assert signing["conf"].startswith("/etc/dkms/framework.conf.d/") and signing["conf"].endswith(".conf")
        assert signing["variables"] == ["mok_signing_key", "mok_certificate"]
        assert signing["cert"].endswith(".der")


# --- module signatures against the enrolled MOKs ------------------------------------------------

def test_modinfo_reports_the_signing_certificates_issuer_and_serial():
    cert = nv.x509_identity(read("throwaway-mok.pem", OWN))
    sig = nv.modinfo_signature(read("modinfo--signed-by-throwaway-mok.txt", OWN))
    assert sig["signed"] and sig["signer"] == cert["issuer_cn"] == "hybrid-moe-kit throwaway mok key"
    assert sig["sig_key"] == cert["serial"] and sig["sig_hashalgo"] == "sha512"
    field = read("modinfo-F-signer-sig_key--signed-by-throwaway-mok.txt", OWN).splitlines()
    assert field[1] == sig["signer"] and nv._hex(field[4]) == cert["serial"]


@pytest.mark.parametrize("name, directory, signed, signer, version", [
    ("modinfo--unsigned.txt", OWN, False, "", ""),
    ("modinfo--nvidia-510-unsigned-fedora36--silverblue-272.txt", FIXTURES, False, "", "510.68.02"),
    ("modinfo--nvidia-470-signed-local-build-opensuse--mokutil-70.txt", FIXTURES, True,
     "Local build for nvidia-gfxG05 470.199.02 on 2023-08-27", "470.199.02"),
])
def test_modinfo_signature_fields(name, directory, signed, signer, version):
    sig = nv.modinfo_signature(read(name, directory))
    assert (sig["signed"], sig["signer"], sig["version"]) == (signed, signer, version)
    if signed:
        assert sig["sig_key"] == "278e60d276aaa70f6cc78715e67f24416b9d1d26"


def test_mokutil_lists_every_enrolled_certificate_with_serial_and_names():
    certs = nv.mokutil_certificates(read("mokutil--list-enrolled--two-keys.txt", OWN))
    other = nv.x509_identity(read("throwaway-other.pem", OWN))
    mine = nv.x509_identity(read("throwaway-mok.pem", OWN))
    assert [(c["serial"], c["issuer_cn"], c["subject_cn"], c["sha1"]) for c in certs] == [
        (other["serial"], other["issuer_cn"], other["subject_cn"], other["sha1"]),
        (mine["serial"], mine["issuer_cn"], mine["subject_cn"], mine["sha1"])]


def test_a_short_serial_number_and_a_multi_part_name_are_read():
    cert = nv.mokutil_certificates(read("mokutil--list-enrolled--small-serial.txt", OWN))[0]
    identity = nv.x509_identity(read("throwaway-small.pem", OWN))
    assert cert["serial"] == identity["serial"] == "1234"
    assert cert["issuer_cn"] == identity["issuer_cn"] == "hybrid-moe-kit throwaway small-serial key"


def test_the_module_signed_by_an_enrolled_key_passes():
    check = nv.module_signer_check(read("modinfo--signed-by-throwaway-mok.txt", OWN),
                                   read("mokutil--list-enrolled--two-keys.txt", OWN), read("throwaway-mok.pem", OWN))
    assert check["ok"] and check["own_enrolled"] is True and check["message"] == ""


def test_the_roles_key_not_yet_enrolled_fails_with_the_enrollment_steps():
    check = nv.module_signer_check(read("modinfo--signed-by-throwaway-mok.txt", OWN),
                                   read("mokutil--list-enrolled--other-key-only.txt", OWN), read("throwaway-mok.pem", OWN))
    assert not check["ok"] and check["own_enrolled"] is False
    text = check["message"]
    assert '"hybrid-moe-kit throwaway mok key"' in text and '"hybrid-moe-kit throwaway other key"' in text
    assert "mokutil --import" in text and "Key was rejected by service" in text and "not enrolled yet" in text


def test_a_module_signed_by_a_key_other_than_the_roles_says_so():
    check = nv.module_signer_check(read("modinfo--nvidia-470-signed-local-build-opensuse--mokutil-70.txt"),
                                   read("mokutil--list-enrolled--throwaway-mok.txt", OWN), read("throwaway-mok.pem", OWN))
    assert not check["ok"] and "was not signed with the role's key" in check["message"]
    assert "Local build for nvidia-gfxG05" in check["message"]


def test_an_unsigned_module_under_secure_boot_fails_naming_the_build_log():
    check = nv.module_signer_check(read("modinfo--nvidia-510-unsigned-fedora36--silverblue-272.txt"),
                                   read("mokutil--list-enrolled--throwaway-mok.txt", OWN))
    assert not check["ok"] and "carries no signature" in check["message"] and "make.log" in check["message"]


def test_mokutil_test_key_exit_status_cannot_be_trusted_on_0_6():
    # mokutil 0.6.0 exits 1 for an enrolled key and 0 for one that is not: the role reads the text.
    assert "is already enrolled\n[exit status 1]" in read("mokutil--test-key--enrolled.txt", OWN)
    assert "is not enrolled\n[exit status 0]" in read("mokutil--test-key--not-enrolled.txt", OWN)


# --- the toolkit a build uses -------------------------------------------------------------------

def test_the_floating_link_is_not_a_toolkit_and_nvcc_gives_its_full_version():
    text = read("nvcc-version--13.0-and-floating-link--dev-host.txt", OWN)
    assert nv.cuda_toolkits(text) == ["13.0"]
    assert nv.nvcc_version(text) == "13.0.88" and nv.nvcc_release(text) == "13.0"


def test_toolkit_choice_by_series():
    installed = nv.cuda_toolkits("/usr/local/cuda-12.8/bin/nvcc\n/usr/local/cuda-13.0/bin/nvcc\n/usr/local/cuda-12.10/bin/nvcc\n")
    assert installed == ["12.8", "12.10", "13.0"]
    assert nv.cuda_toolkit_choice(installed, "12.8.1") == {"series": "12.8", "home": "/usr/local/cuda-12.8", "error": ""}
    several = nv.cuda_toolkit_choice(installed)
    assert several["home"] == "" and "/usr/local/cuda-12.8, /usr/local/cuda-12.10, /usr/local/cuda-13.0" in several["error"]
    assert nv.cuda_toolkit_choice(["13.0"])["home"] == "/usr/local/cuda-13.0"
    missing = nv.cuda_toolkit_choice(["13.0"], "12.9")["error"]
    assert "cuda-toolkit-12-9" in missing and "/usr/local/cuda-13.0" in missing
    assert "no CUDA toolkit" in nv.cuda_toolkit_choice([])["error"]


@pytest.mark.parametrize("name, version, source", [
    ("proc-driver-nvidia-version--open-565-ubuntu2404--nixgl-186.txt", "565.57.01", "loaded module"),
    ("proc-driver-nvidia-version--open-525-arch--nixgl-121.txt", "525.60.11", "loaded module"),
    ("proc-driver-nvidia-version--proprietary-580-mismatch--truenas-nvidia-drivers-19.txt", "580.173.02", "loaded module"),
])
def test_the_loaded_driver_version_is_read_from_proc(name, version, source):
    found = nv.installed_driver_version(read(name))
    assert found["version"] == version and found["source"].startswith(source)


def test_without_a_loaded_module_the_module_file_then_dkms_decide():
    text = read("dkms-status--old-and-jammy-formats--diskimage-builder-dkms.txt")
    lines = re.findall(r"nvidia[/,] ?[0-9.]+, [^,]+, x86_64: installed", text)
    assert len(lines) == 2
    assert nv.installed_driver_version("\n".join(lines)) == {"version": "510.47.03", "source": "DKMS (dkms status)"}
    assert nv.installed_driver_version("modinfo: 580.95.05\n" + lines[0])["version"] == "580.95.05"
    assert nv.installed_driver_version(read("dkms-status--other-module.txt", OWN))["version"] == ""


def test_a_toolkit_newer_than_the_driver_is_refused_naming_both_versions():
    errors = nv.toolkit_driver_errors("13.0", "565.57.01")
    assert len(errors) == 1
    assert "13.0" in errors[0] and "580.65.06" in errors[0] and "565.57.01" in errors[0] and "up to CUDA 12.6" in errors[0]
    assert nv.toolkit_driver_errors("12.8", "580.173.02") == []
    assert nv.toolkit_driver_errors("12.8", "570.26") == []
    assert "run the gpu stage" in nv.toolkit_driver_errors("12.8", "")[0]


def test_the_keyring_file_as_slurp_returns_it_decides_reuse():
    compat = importlib.import_module("test_nvidia_compat")
    binary = base64.b64encode(_armored(compat.ED25519_KEY)).decode()
    conflicts = [_conflict(CUDA_KEYRING_LIST, "/usr/share/keyrings/cuda-archive-keyring.gpg")]
    keyring = {"/usr/share/keyrings/cuda-archive-keyring.gpg": binary}
    assert nv.repo_source_plan(conflicts, compat.ED25519_FPR, keyring)["mode"] == "reuse"
    assert nv.repo_source_plan(conflicts, NVIDIA_FPR, keyring)["mode"] == "replace"
    garbage = {"/usr/share/keyrings/cuda-archive-keyring.gpg": base64.b64encode(b"not a key").decode()}
    plan = nv.repo_source_plan(conflicts, NVIDIA_FPR, garbage)
    assert plan["mode"] == "replace" and "cannot be read" in plan["reason"]


# --- the branch lock covers both namings -------------------------------------------------------

def test_the_preferences_pin_and_the_holds_cover_both_namings():
    import yaml
    with io.open(os.path.join(ROOT, "roles", "nvidia_driver", "vars", "main.yml"), encoding="utf-8") as handle:
        role_vars = yaml.safe_load(handle)
    patterns = [p.strip("/") for p in role_vars["__nvidia_driver_pin_patterns"]]
    hold = role_vars["__nvidia_driver_hold_regex"]
    old, new = [line for line in read("apt-packages--ubuntu2404-cuda-repo-580-vs-590-names--dsx-infra-controller-6049.txt")
                .splitlines() if line.strip()]
    driver = [n for n in _names(old) + _names(new) if not n.startswith("datacenter-gpu-manager")]
    # Debian's names for the same driver parts (Debian 12's non-free packages, as nvidia_driver_distro installs them).
    driver += ["libcuda1", "nvidia-kernel-open-dkms", "firmware-nvidia-gsp", "libgl1-nvidia-glvnd-glx", "libnvcuvid1"]
    for name in driver:
        assert any(re.search(p, name) for p in patterns), name   # apt preferences: /regex/ is searched
        assert re.search(hold, name), name
    assert not any(re.search(p, "cuda-toolkit-12-8") for p in patterns)
