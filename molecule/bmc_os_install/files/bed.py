"""The bmc_os_install scenario's bare node: a QEMU machine with an EMPTY disk, UEFI firmware and a NIC, behind
sushy-tools' Redfish emulator (its libvirt driver, with virtual media), plus the operator's HTTP mirror on 127.0.0.1.

    python bed.py up DIR FIXTURE      (create.yml)      python bed.py down DIR      (destroy.yml)

The libvirt session daemon of `nobody` and the emulator's TLS + basic auth are the bmc_libvirt scenario's
(../../bmc_libvirt/files/bed.py, imported: one copy). What this bed adds, and why:
- The installer ISO on the "mirror" is built here from Debian's own packages, because Debian's ISO images are not in
  any registry this machine reaches: debian-installer-12-netboot-amd64's kernel, initrd and its own GRUB menu
  (/debian-installer/amd64/grub/grub.cfg, unchanged except `console=ttyS0,115200` on every kernel line, so the
  installer's screens land in DIR/console.log) made bootable from a CD for UEFI as debian-cd does it (below). It is a
  stand-in for debian-12.x-amd64-netinst.iso: same installer build, the netboot flavour (it takes its own components
  and every package from the archive, where the netinst ISO carries the base system). The kit rebuilds it with its
  seed (roles/bmc/tasks/os_remaster.yml) exactly as it would the netinst.
- The machine: 2 vCPUs, 1.5 GiB, TCG, UEFI (libvirt picks Debian's OVMF build without Secure Boot), an empty
  8 GiB qcow2 disk, powered off, as a server waiting for its first install. Its NIC is QEMU's user-mode network
  (no bridge, no tap, no firewall rule): the guest reaches the host's 127.0.0.1 at 10.0.2.2, the archive through
  the host's resolver, and the host reaches its SSH port at 127.0.0.1:<ssh_port> only.
- The mirror: Python's http.server on 127.0.0.1:<http_port>, serving DIR/www; the kit publishes its seed and its
  rebuilt ISO under DIR/www/seeds. The BMC (the emulator, on the host) fetches the ISO at 127.0.0.1, the installer
  (in the guest) fetches the seed at 10.0.2.2: two addresses of one server, as a BMC on a management network and a
  node on the data network see one mirror (bmc_os_install_media_url).
- A libvirt storage pool "default" in DIR/pool: sushy-tools' driver uploads an inserted image there.
- A one-time boot that lasts one boot (emulator.py): sushy-tools' driver keeps every boot override ("continuous").
  On a real BMC a one-time boot from the virtual CD is used by the next start and the node then boots its disk:
  without that, the installer's final reboot would start the installer again.
Every process started here is recorded by PID in DIR/bed.json; `down` ends those and no others.
"""
import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

HERE = Path(__file__).resolve().parent
# The bmc_libvirt scenario's bed (libvirtd, the emulator, PIDs), loaded under its own name: both files are bed.py.
_spec = importlib.util.spec_from_file_location("bmc_libvirt_bed", HERE.parent.parent / "bmc_libvirt" / "files" / "bed.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

DOMAIN = base.DOMAIN
UUID = "5f0f2c8e-4b1e-4c55-9d2a-6c1e8a7b3d10"
NETBOOT = Path("/usr/lib/debian-installer/images/12/amd64/text")
ISO_NAME = "debian-12-amd64-netboot-cd.iso"
GRUB_CD = Path("/usr/lib/grub/x86_64-efi-signed/gcdx64.efi.signed")
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"


def build_installer_iso(work, www):
    """The stand-in of the netinst ISO on the operator's mirror (see the header); its SHA-256. Built as debian-cd
    builds the netinst's UEFI boot: GRUB's signed CD image (gcdx64.efi, grub-efi-amd64-signed) as
    EFI/boot/bootx64.efi in a FAT El Torito image, finding the disc by /.disk/info and reading /boot/grub/grub.cfg."""
    tree = work / "iso-tree"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(NETBOOT / "debian-installer", tree / "debian-installer")
    (tree / ".disk").mkdir()
    (tree / ".disk" / "info").write_text("Debian GNU/Linux 12 (bookworm) - hybrid-moe-kit test bed netboot CD\n")
    menu = (NETBOOT / "debian-installer" / "amd64" / "grub" / "grub.cfg").read_text()
    lines = []
    for line in menu.splitlines():
        if line.split()[:1] == ["linux"] and " ---" in line:
            line = line.replace(" ---", " console=ttyS0,115200 ---", 1)
        lines.append(line)
    grub = tree / "boot" / "grub"
    grub.mkdir(parents=True)
    (grub / "grub.cfg").write_text("\n".join(lines) + "\n")
    shutil.copy(NETBOOT / "debian-installer" / "amd64" / "grub" / "font.pf2", grub / "font.pf2")
    efi = grub / "efi.img"
    with open(efi, "wb") as image:
        image.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.vfat", "-n", "DEBIAN_EFI", str(efi)], check=True, capture_output=True)
    mtools = dict(os.environ, MTOOLS_SKIP_CHECK="1")
    for folder in ("::/EFI", "::/EFI/boot"):
        subprocess.run(["mmd", "-i", str(efi), folder], check=True, env=mtools)
    subprocess.run(["mcopy", "-i", str(efi), str(GRUB_CD), "::/EFI/boot/bootx64.efi"], check=True, env=mtools)
    iso = www / "mirror" / ISO_NAME
    iso.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["xorriso", "-as", "mkisofs", "-r", "-J", "-joliet-long", "-V", "Debian 12 amd64 n", "-o", str(iso),
                    "-eltorito-alt-boot", "-e", "boot/grub/efi.img", "-no-emul-boot", "-isohybrid-gpt-basdat",
                    str(tree)], check=True, capture_output=True)
    shutil.rmtree(tree)
    return hashlib.sha256(iso.read_bytes()).hexdigest()


def bios_rows(fixture):
    """The HPE DL325 Gen11's attributes with NPS1 and SMT off: the BIOS stage passes before the install."""
    attributes = base.bios_attributes(fixture)
    attributes.update(NumaMemoryDomainsPerSocket="OneMemoryDomainPerSocket", ProcSMT="Disabled")
    return "\n".join("        <sushy:attribute name=%s value=%s/>" % (quoteattr(k), quoteattr(str(v)))
                     for k, v in sorted(attributes.items()))


def domain_xml(disk, console, ssh_port, fixture):
    return """<domain type='qemu' xmlns:qemu='%(ns)s'>
  <name>%(name)s</name>
  <uuid>%(uuid)s</uuid>
  <metadata>
    <sushy:bios xmlns:sushy='%(sushy)s'>
      <sushy:attributes>
%(rows)s
      </sushy:attributes>
    </sushy:bios>
  </metadata>
  <memory unit='MiB'>1536</memory>
  <vcpu>2</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='pc'>hvm</type>
    <firmware><feature enabled='no' name='secure-boot'/></firmware>
    <boot dev='hd'/>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='unsafe'/>
      <source file='%(disk)s'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'><source path='%(console)s' append='on'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value='user,id=hmknet,hostfwd=tcp:127.0.0.1:%(ssh_port)d-:22'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev=hmknet,addr=0x9'/>
  </qemu:commandline>
</domain>
""" % {"ns": QEMU_NS, "name": DOMAIN, "uuid": UUID, "disk": disk, "console": console, "ssh_port": ssh_port,
       "sushy": base.SUSHY_NS, "rows": bios_rows(fixture)}


def pool_xml(path):
    return "<pool type='dir'><name>default</name><target><path>%s</path></target></pool>" % path


def start_mirror(work, www, port, state):
    log = open(work / "mirror.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(www),
                             str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    state["mirror_pid"] = proc.pid
    base.save(work, state)
    base.wait_for("the mirror's HTTP server", lambda: _answers(port), 30, work / "mirror.log")


def _answers(port):
    import urllib.request
    try:
        return urllib.request.urlopen("http://127.0.0.1:%d/mirror/" % port, timeout=2).status == 200
    except OSError:
        return False


def up(work, fixture):
    state = base.new_bed(work, UUID)
    account = pwd.getpwnam(base.DAEMON_USER)

    # The kit's SSH key for this run: the seed puts its public half on the node, Molecule logs in with it.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hmk-bmc-os-install", "-f",
                    str(work / "id_ed25519")], check=True)
    www = work / "www"
    (www / "seeds").mkdir(parents=True)
    state["image_sha256"] = build_installer_iso(work, www)
    http_port, ssh_port, redfish_port = base.free_port(), base.free_port(), base.free_port()
    state.update(http_port=http_port, ssh_port=ssh_port, image_path="/mirror/" + ISO_NAME)
    start_mirror(work, www, http_port, state)

    base.start_libvirtd(work, state)
    pool, disk, console = work / "pool", work / "disk.qcow2", work / "console.log"
    pool.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "8G"], check=True)
    console.touch()
    for path in (pool, disk, console):
        os.chown(path, account.pw_uid, account.pw_gid)
    (work / "pool.xml").write_text(pool_xml(pool))
    base.virsh(work, "pool-define", str(work / "pool.xml"))
    base.virsh(work, "pool-start", "default")
    (work / "domain.xml").write_text(domain_xml(disk, console, ssh_port, fixture))
    base.virsh(work, "define", str(work / "domain.xml"))  # defined, powered off: no OS to run yet

    state["address"] = "127.0.0.1:%d" % redfish_port
    base.start_emulator(work, sys.executable, redfish_port, state, emulator=HERE / "emulator.py", uuid=UUID)
    base.save(work, state)
    print(json.dumps(state))


def down(work):
    state_file = work / "bed.json"
    if not state_file.exists():
        print("nothing to stop: %s not found" % state_file)
        return
    state = json.loads(state_file.read_text())
    base.stop(state.get("mirror_pid"), "http.server")
    base.down(work)
    for name in ("disk.qcow2", "pool"):
        path = work / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "up":
        up(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "down":
        down(Path(sys.argv[2]))
    else:
        sys.exit("usage: bed.py up DIR FIXTURE | down DIR")
