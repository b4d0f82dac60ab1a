#!/usr/bin/env bash
# Build the twin's Debian root filesystem and its bootable disk image from Debian packages only.
#
#   build-image.sh OUT_DIR SSH_PUBKEY
#
# Writes OUT_DIR/rootfs/ (the debootstrapped tree, also imported as the container twin) and
# OUT_DIR/base.qcow2 (BIOS/MBR disk: GRUB 2 + ext4 root, no loop devices or mounts of the image:
# mkfs.ext4 -d fills the partition from the tree, GRUB's boot.img/core.img are written by hand).
# Environment: HMK_SUITE (bookworm), HMK_MIRROR (http://deb.debian.org/debian),
# HMK_APT_CACHE (debootstrap's .deb cache), HMK_DISK_MB (6144).
set -euo pipefail

out=${1:?usage: build-image.sh OUT_DIR SSH_PUBKEY}
pubkey=${2:?usage: build-image.sh OUT_DIR SSH_PUBKEY}
suite=${HMK_SUITE:-bookworm}
mirror=${HMK_MIRROR:-http://deb.debian.org/debian}
apt_cache=${HMK_APT_CACHE:-$out/apt-cache}
disk_mb=${HMK_DISK_MB:-6144}
fs_uuid=8d3c2a1e-4b5f-4c6d-9e7f-a0b1c2d3e4f5
part_start=2048
root=$out/rootfs
log=$out/build.log

# Packages the twin needs: boot (kernel, GRUB, initramfs), management (sshd, python3, dbus for
# systemctl/reboot over SSH) and the hardware tools the roles read (dmidecode, numactl, lspci...).
packages=(
  linux-image-amd64 initramfs-tools systemd-sysv udev dbus kmod
  openssh-server python3 python3-apt sudo ca-certificates
  iproute2 procps util-linux e2fsprogs parted
  numactl dmidecode pciutils nvme-cli mokutil
  curl rsync less zstd busybox
)

mkdir -p "$out" "$apt_cache"
: > "$log"
say() { printf '[build-image] %s\n' "$*"; }
die() { say "ERROR: $*"; say "log: $log"; tail -n 25 "$log" >&2 || true; exit 1; }

chroot_mounts=(proc sys dev/pts dev)
unmount_all() {
  local m
  for m in "${chroot_mounts[@]}"; do
    if mountpoint -q "$root/$m"; then umount -l "$root/$m" || true; fi
  done
}
trap unmount_all EXIT

# Free space: the tree (~1 GiB), the raw disk while it is assembled (sparse) and the qcow2.
avail_kb=$(df -Pk "$out" | awk 'NR==2 {print $4}')
need_kb=$(( 4 * 1024 * 1024 ))
[ "$avail_kb" -ge "$need_kb" ] || die "not enough disk in $out: $(( avail_kb / 1024 )) MiB free, $(( need_kb / 1024 )) MiB needed"

if [ ! -e "$out/.rootfs-done" ]; then
  rm -rf "$root"
  mkdir -p "$root"
  say "debootstrap $suite from $mirror (log: $log)"
  include=$(IFS=,; echo "${packages[*]}")
  debootstrap --variant=minbase --include="$include" --cache-dir="$apt_cache" \
    "$suite" "$root" "$mirror" >>"$log" 2>&1 || die "debootstrap failed"

  mount -t proc proc "$root/proc"
  mount -t sysfs sys "$root/sys"
  mount --bind /dev "$root/dev"
  mount --bind /dev/pts "$root/dev/pts"
  in_root() { chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }

  # grub-pc must not run grub-install inside a directory: preseed "no install device".
  in_root debconf-set-selections <<'SEL'
grub-pc grub-pc/install_devices multiselect
grub-pc grub-pc/install_devices_empty boolean true
SEL
  say "installing grub-pc in the tree"
  in_root apt-get install -y --no-install-recommends grub-pc >>"$log" 2>&1 || die "grub-pc install failed"
  in_root apt-get clean

  echo epyc-node > "$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 epyc-node\n' > "$root/etc/hosts"
  printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$fs_uuid" > "$root/etc/fstab"

  # VM networking: DHCP from QEMU's user-mode network. Never in the container twin, which shares
  # the host's network namespace: networkd there would reconfigure the host's interfaces.
  mkdir -p "$root/etc/systemd/network" "$root/etc/systemd/system/systemd-networkd.service.d"
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/10-twin.network"
  printf '[Unit]\nConditionVirtualization=!container\n' \
    > "$root/etc/systemd/system/systemd-networkd.service.d/10-twin.conf"
  in_root systemctl enable systemd-networkd >>"$log" 2>&1
  # A container on the host network must not open sshd on the host's port 22: sshd starts there
  # only when `twin up` mounted a config that moves it to 127.0.0.1:PORT.
  mkdir -p "$root/etc/systemd/system/ssh.service.d"
  printf '[Unit]\nConditionVirtualization=|!container\nConditionPathExists=|/etc/ssh/sshd_config.d/twin.conf\n' \
    > "$root/etc/systemd/system/ssh.service.d/10-twin.conf"
  # The container twin has no root block device to remount and no NVMe-oF: keep its boot clean.
  for unit in systemd-remount-fs.service nvmf-autoconnect.service; do
    mkdir -p "$root/etc/systemd/system/$unit.d"
    printf '[Unit]\nConditionVirtualization=!container\n' > "$root/etc/systemd/system/$unit.d/10-twin.conf"
  done
  # Units a throw-away twin does not want: timers that reach for the network, boot-time scrubs.
  in_root systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service \
    e2scrub_all.timer fstrim.timer dpkg-db-backup.timer getty@tty1.service >>"$log" 2>&1 || true

  # A small initramfs: only the drivers QEMU's q35 machine needs.
  sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
  printf '%s\n' virtio_pci virtio_blk virtio_net nvme ahci sd_mod ext4 crc32c_generic \
    > "$root/etc/initramfs-tools/modules"
  kver=$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
  in_root update-initramfs -u -k "$kver" >>"$log" 2>&1 || die "update-initramfs failed"

  # The bed's compiled-code cache for the modules Ansible sends as zips (scripts/twin-pyc.py says why): loaded by a
  # .pth file in the tree's /usr/local site directory, so every python3 on the twin has it and no node ever does.
  pyver=$(in_root python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  site=$root/usr/local/lib/python$pyver/dist-packages
  install -D -m 0644 "$(dirname "$0")/twin-pyc.py" "$site/hmk_twin_pyc.py"
  printf 'import hmk_twin_pyc\n' > "$site/hmk-twin-pyc.pth"

  install -d -m 0700 "$root/root/.ssh"
  install -m 0600 "$pubkey" "$root/root/.ssh/authorized_keys"
  sed -i 's/^#\?UseDNS.*/UseDNS no/' "$root/etc/ssh/sshd_config"
  # One machine-id per instance, made at first boot.
  : > "$root/etc/machine-id"
  rm -f "$root/var/lib/dbus/machine-id"

  # GRUB: serial console (the twin's boot log), no menu delay. The kit's roles add their
  # arguments through /etc/default/grub.d/ drop-ins and update-grub.
  # mitigations=off: under software emulation the twin's CPU model (Nehalem) gets page-table isolation, so every
  # system call switches page tables and QEMU flushes its software TLB; an Ansible task costs 1.8x as much with it
  # (benchmarks/twin_mitigations.sh). A twin is a test stand-in: the kit sets nothing about mitigations on a node.
  # norandmaps (kernel.randomize_va_space=0): QEMU's software emulation keys the code it has translated by the guest's
  # virtual addresses, so with address-space randomisation every new process (each Ansible task starts python3) maps
  # its binary and libraries elsewhere and is translated again, and the 128 MB cache is flushed every three or four
  # tasks; without it a python3 start costs the guest 1.3-1.6x less and the cache stops being flushed
  # (benchmarks/twin_aslr.sh). VM twins only, like mitigations=off; the kit sets nothing about ASLR on a node.
  cat > "$root/etc/default/grub" <<'GRUB'
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="mitigations=off norandmaps console=tty0 console=ttyS0,115200n8"
GRUB_TERMINAL="serial console"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_OS_PROBER=true
GRUB
  # First grub.cfg by hand (grub-mkconfig cannot probe a directory); update-grub in the guest
  # replaces it.
  mkdir -p "$root/boot/grub/i386-pc"
  cat > "$root/boot/grub/grub.cfg" <<CFG
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set timeout=0
insmod part_msdos
insmod ext2
search --no-floppy --fs-uuid --set=root $fs_uuid
menuentry 'Debian $suite ($kver)' {
  linux /boot/vmlinuz-$kver root=UUID=$fs_uuid ro mitigations=off norandmaps console=tty0 console=ttyS0,115200n8
  initrd /boot/initrd.img-$kver
}
CFG
  cp "$root"/usr/lib/grub/i386-pc/*.mod "$root"/usr/lib/grub/i386-pc/*.lst "$root/boot/grub/i386-pc/"
  in_root grub-editenv /boot/grub/grubenv create
  in_root grub-mkimage -O i386-pc -o /tmp/core.img -p '(hd0,msdos1)/boot/grub' \
    biosdisk part_msdos ext2 search search_fs_uuid
  mv "$root/tmp/core.img" "$out/core.img"
  cp "$root/usr/lib/grub/i386-pc/boot.img" "$out/boot.img"
  unmount_all
  touch "$out/.rootfs-done"
fi

say "assembling the disk image"
raw=$out/disk.raw
rm -f "$raw" "$out/base.qcow2.tmp"
truncate -s "${disk_mb}M" "$raw"
echo "start=$part_start, type=83, bootable" | sfdisk -q "$raw" >>"$log" 2>&1 || die "sfdisk failed"
fs_kb=$(( (disk_mb * 2048 - part_start) / 2 ))
mkfs.ext4 -q -F -L root -U "$fs_uuid" -E "root_owner=0:0,nodiscard,offset=$(( part_start * 512 ))" \
  -d "$root" "$raw" "${fs_kb}k" >>"$log" 2>&1 || die "mkfs.ext4 failed"
core_sectors=$(( ($(stat -c %s "$out/core.img") + 511) / 512 ))
[ "$core_sectors" -lt "$part_start" ] || die "GRUB core.img does not fit before the partition"
dd if="$out/boot.img" of="$raw" bs=440 count=1 conv=notrunc status=none
dd if="$out/core.img" of="$raw" bs=512 seek=1 conv=notrunc status=none
qemu-img convert -f raw -O qcow2 -o cluster_size=65536 "$raw" "$out/base.qcow2.tmp" >>"$log" 2>&1 \
  || die "qemu-img convert failed"
rm -f "$raw"
mv "$out/base.qcow2.tmp" "$out/base.qcow2"
say "done: $out/base.qcow2"
