"""The bmc role's installer remaster (roles/bmc/tasks/os_remaster.yml) for real: xorriso builds a small ISO laid out
like the Debian 12 netinst or the Ubuntu 24.04 live-server image (their real GRUB menus, tests/fixtures/grub/; tiny
stand-ins for the kernel, the initrd and the El Torito boot images), ansible-playbook runs the role's remaster step on
it for a Debian and an Ubuntu node, and the test reads the ISO the role wrote back with xorriso: the menu's first
entry boots unattended with the node's seed, nothing else in the menu or the image changed, the boot records are the
input's, and a second run builds nothing.

xorriso comes from `make deps` (Debian's package). Without it every test here is skipped with the reason printed.
"""
import difflib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GRUB = REPO / "tests" / "fixtures" / "grub"
XORRISO = shutil.which("xorriso")
REASON = ("SKIPPED LOUDLY: xorriso is not installed: the bmc role's remaster test needs it (make deps installs it; "
          "Debian/Ubuntu: apt-get install xorriso).")
if XORRISO is None:
    print("\n" + REASON, file=sys.stderr)
pytestmark = pytest.mark.skipif(XORRISO is None, reason=REASON)

SEEDS = "http://seeds.lab:8080/hmk"
# The installers' layouts: the kernel and initrd paths the real menus name, and the El Torito images the real ISOs
# carry (Debian: isolinux for BIOS and boot/grub/efi.img for UEFI; Ubuntu: GRUB's eltorito.img and an EFI image).
LAYOUTS = {
    "debian": {"menu": "debian-12-netinst.grub.cfg",
               "files": ["install.amd/vmlinuz", "install.amd/initrd.gz", "install.amd/gtk/initrd.gz",
                         "isolinux/isolinux.bin", "boot/grub/efi.img"],
               "isolinux": "debian-12-netinst.isolinux-txt.cfg",
               "bios": "isolinux/isolinux.bin", "catalog": "isolinux/boot.cat", "efi": "boot/grub/efi.img",
               "params": "auto=true priority=critical interface=auto hostname={node} domain= "
                         "preseed/url=" + SEEDS + "/{node}/preseed.cfg"},
    "ubuntu": {"menu": "ubuntu-24.04-live-server.grub.cfg",
               "files": ["casper/vmlinuz", "casper/initrd", "casper/hwe-vmlinuz", "casper/hwe-initrd",
                         "boot/grub/i386-pc/eltorito.img", "EFI/boot/efi.img"],
               "bios": "boot/grub/i386-pc/eltorito.img", "catalog": "boot.catalog", "efi": "EFI/boot/efi.img",
               "params": "autoinstall 'ds=nocloud;s=" + SEEDS + "/{node}/'"},
}
NODES = {"deb-node": "debian", "ubu-node": "ubuntu"}


def xorriso(*args):
    return subprocess.run([XORRISO, *args], check=True, capture_output=True, text=True).stdout


def make_iso(tmp_path, family, menu=None, md5sums=True):
    """A small ISO with the family's layout, boot records and (like both real ISOs) /md5sum.txt listing every file
    (`<md5>  ./<path>`); returns (path, sha256)."""
    layout = LAYOUTS[family]
    tree = tmp_path / ("tree-" + family)
    for index, name in enumerate(layout["files"]):
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.sha256(("%s %d" % (name, index)).encode()).digest() * 64)  # 2 KiB, distinct
    (tree / "boot" / "grub" / "grub.cfg").write_text(menu if menu is not None else (GRUB / layout["menu"]).read_text())
    if "isolinux" in layout:
        (tree / "isolinux" / "txt.cfg").write_text((GRUB / layout["isolinux"]).read_text())
    listing = tree / "md5sum.txt"
    if listing.exists():
        listing.unlink()
    if md5sums:
        listing.write_text("".join("%s  ./%s\n" % (hashlib.md5(p.read_bytes()).hexdigest(), p.relative_to(tree))
                                   for p in sorted(tree.rglob("*")) if p.is_file()))
    iso = tmp_path / ("%s-installer%s.iso" % (family, "" if md5sums else "-nomd5"))
    xorriso("-as", "mkisofs", "-quiet", "-r", "-J", "-V", "HMK_" + family.upper(), "-o", str(iso),
            "-c", layout["catalog"], "-b", layout["bios"], "-no-emul-boot", "-boot-load-size", "4",
            "-eltorito-alt-boot", "-e", layout["efi"], "-no-emul-boot", str(tree))
    return iso, hashlib.sha256(iso.read_bytes()).hexdigest()


def extract(iso, path, dest):
    xorriso("-osirrox", "on", "-indev", str(iso), "-extract", path, str(dest))
    return Path(dest).read_bytes()


def boot_records(iso):
    """The El Torito boot images as `-report_el_torito plain` shows them, without the LBA (a new session puts the
    same image at another block): [(number, platform, bootable, emulation, load segment, header, load size, path)]."""
    report = xorriso("-indev", str(iso), "-report_el_torito", "plain")
    images = [line.split(":", 1)[1].split() for line in report.splitlines() if line.startswith("El Torito boot img")]
    paths = dict(line.split(":", 1)[1].split(None, 1) for line in report.splitlines()
                 if line.startswith("El Torito img path"))
    return [tuple(fields[:-1]) + (paths.get(fields[0], "").strip(),) for fields in images]


def run_remaster(tmp_path, nodes, check=False):
    """The role's remaster step (tasks_from os_remaster.yml) with ansible-playbook, for each node {name: (family,
    iso, sha256)}; returns (CompletedProcess, {node: changed count})."""
    hosts = {}
    for name, (family, iso, digest) in nodes.items():
        hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                       "bmc_os_install_family": family, "bmc_os_install_image_checksum": "sha256:" + digest,
                       "__bmc_os_image": {"dest": str(iso)}}
    (tmp_path / "inventory.yml").write_text(json.dumps({"all": {"hosts": hosts}}))
    (tmp_path / "remaster.yml").write_text(
        "- name: The installer ISO is rebuilt for each node\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: The bmc role's remaster step runs\n      ansible.builtin.include_role:\n"
        "        name: hmk.moe_kit.bmc\n        tasks_from: os_remaster.yml\n")
    variables = {"bmc_os_install_publish_dir": str(tmp_path / "seeds"), "bmc_os_install_publish_url": SEEDS + "/"}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.yml"),
           str(tmp_path / "remaster.yml"), "-e", json.dumps(variables)] + (["--check"] if check else [])
    r = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300, check=False)
    changed = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", r.stdout, re.M)}
    return r, changed


def built(tmp_path, node):
    return sorted((tmp_path / "seeds" / node).glob("installer-*.iso"))


def first_kernel_line(menu):
    """The `linux` line of the first top-level menuentry, as GRUB would split it into words."""
    depth, inside = 0, False
    for line in menu.splitlines():
        if depth == 0 and line.startswith("menuentry"):
            inside = True
        if inside and line.strip().startswith("linux"):
            return shlex.split(line)
        depth += line.count("{") - line.count("}")
    raise AssertionError("no first entry with a linux line")


@pytest.fixture
def images(tmp_path):
    return {node: (family,) + make_iso(tmp_path, family) for node, family in NODES.items()}


def test_the_rebuilt_isos_boot_the_first_entry_unattended_keep_everything_else_and_are_built_once(tmp_path, images):
    dry, dry_changed = run_remaster(tmp_path, images, check=True)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert all(not built(tmp_path, node) for node in NODES), "check mode wrote an ISO"

    r, changed = run_remaster(tmp_path, images)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for node, (family, source, digest) in images.items():
        layout = LAYOUTS[family]
        params = layout["params"].format(node=node)
        assert changed[node] > 0
        isos = built(tmp_path, node)
        # The name is the digest of the image's checksum and the parameters (roles/bmc/vars/main.yml).
        expected = "installer-%s.iso" % hashlib.sha1(("sha256:" + digest + params).encode()).hexdigest()[:12]
        assert [p.name for p in isos] == [expected]
        out = isos[0]
        leftovers = sorted(p.name for p in out.parent.iterdir())
        assert leftovers == sorted([expected, "grub.cfg", "md5sum.txt"]), "a leftover of the build"

        before = (GRUB / layout["menu"]).read_text()
        after = extract(out, "/boot/grub/grub.cfg", tmp_path / (node + ".grub.cfg")).decode()
        # The first entry's kernel line: the kernel path, then the seed's parameters once, then what was there,
        # `---` last but the installed system's own options.
        words, seed = first_kernel_line(after), shlex.split(params)
        original = first_kernel_line(before)
        assert words == original[:2] + seed + original[2:]
        assert words.index(seed[-1]) < words.index("---")
        assert after.count(params) == 1
        # Every other line is as it was, but the timeout (5 s: the menu must not wait for a choice) and a comment.
        diff = [d for d in difflib.ndiff(before.splitlines(), after.splitlines()) if d[:2] in ("- ", "+ ")]
        removed = [d[2:] for d in diff if d.startswith("- ")]
        added = [d[2:] for d in diff if d.startswith("+ ")]
        assert len(removed) == len([x for x in removed if x.strip().startswith(("linux", "set timeout="))]) <= 2
        assert [x for x in added if not x.startswith("#")] == (["set timeout=5"] + [
            a for a in added if a.strip().startswith("linux")])
        assert [ln for ln in after.splitlines() if ln.strip().startswith("set timeout=")] == ["set timeout=5"]

        # Nothing else in the image changed, and the BIOS menu (isolinux) is left as it was.
        for name in layout["files"]:
            assert (extract(out, "/" + name, tmp_path / "f") == extract(source, "/" + name, tmp_path / "g")), name
            (tmp_path / "f").unlink()
            (tmp_path / "g").unlink()
        if "isolinux" in layout:
            assert extract(out, "/isolinux/txt.cfg", tmp_path / (node + ".txt")).decode() == (
                GRUB / layout["isolinux"]).read_text()
        # md5sum.txt has the new menu's MD5 on the menu's line and every other line as it was.
        sums_before = extract(source, "/md5sum.txt", tmp_path / (node + ".md5.in")).decode().splitlines()
        sums_after = extract(out, "/md5sum.txt", tmp_path / (node + ".md5.out")).decode().splitlines()
        menu_line = "%s  ./boot/grub/grub.cfg" % hashlib.md5(after.encode()).hexdigest()
        assert menu_line in sums_after and menu_line not in sums_before
        assert [x for x in sums_after if x != menu_line] == [x for x in sums_before if "./boot/grub/grub.cfg" not in x]
        # The boot records are the input's: the same images, platforms and load sizes.
        assert boot_records(out) == boot_records(source)
        assert [r[1] for r in boot_records(out)] == ["BIOS", "UEFI"]

    stamps = {node: built(tmp_path, node)[0].stat() for node in NODES}
    again, changed = run_remaster(tmp_path, images)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert changed == {"deb-node": 0, "ubu-node": 0}
    for node, stamp in stamps.items():
        (iso,) = built(tmp_path, node)
        assert (iso.stat().st_ino, iso.stat().st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)

    # Another image (another checksum) is another name: built beside the first, which stays as it was. This one
    # has no md5sum.txt, and the rebuilt image has none either.
    newer = ("debian",) + make_iso(tmp_path, "debian", md5sums=False)
    other, changed = run_remaster(tmp_path, {"deb-node": newer})
    assert other.returncode == 0 and changed["deb-node"] > 0, other.stdout[-3000:]
    isos = built(tmp_path, "deb-node")
    assert len(isos) == 2 and stamps["deb-node"].st_ino in [p.stat().st_ino for p in isos]
    (second,) = [p for p in isos if p.stat().st_ino != stamps["deb-node"].st_ino]
    assert "md5sum.txt" not in xorriso("-indev", str(second), "-ls", "/")
    assert first_kernel_line(extract(second, "/boot/grub/grub.cfg", tmp_path / "second.cfg").decode())[2] == "auto=true"


def test_a_menu_whose_first_item_is_a_submenu_stops_with_the_reason_and_leaves_no_iso(tmp_path):
    menu = "submenu 'Advanced options ...' {\n    menuentry 'Install' {\n        linux /install.amd/vmlinuz ---\n" \
           "    }\n}\n"
    node = {"deb-node": ("debian",) + make_iso(tmp_path, "debian", menu=menu)}
    r, _unused = run_remaster(tmp_path, node)
    assert r.returncode != 0
    assert "cannot be made unattended: the first item of the GRUB menu is a submenu" in r.stdout
    assert not built(tmp_path, "deb-node") and not list((tmp_path / "seeds" / "deb-node").glob("*.part"))
