#!/bin/sh
# Fingerprint of everything kernel_tuning may touch (boot, live kernel state, config files), written to $1.
set -eu
{
  echo "boot_id $(cat /proc/sys/kernel/random/boot_id)"
  echo "cmdline $(cat /proc/cmdline)"
  for key in kernel.numa_balancing vm.max_map_count vm.swappiness; do
    echo "sysctl $key $(sysctl -n "$key")"
  done
  echo "aspm $(cat /sys/module/pcie_aspm/parameters/policy 2>/dev/null || true)"
  find /etc/default /etc/sysctl.d /etc/security/limits.d /etc/systemd/system /usr/local/sbin /boot/grub/grub.cfg \
    /etc/kernel /boot/efi/loader \
    -xdev 2>/dev/null | LC_ALL=C sort | while read -r path; do
    if [ -f "$path" ] && [ ! -L "$path" ]; then
      echo "file $path $(sha256sum < "$path" | cut -d' ' -f1)"
    else
      echo "path $path"
    fi
  done
} > "$1"
