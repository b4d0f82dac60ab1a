#!/usr/bin/env bash
# Runs inside a throw-away container of the twin image (molecule/gpu_devices/prepare.yml): builds the STAND-IN
# modules with DKMS against Debian's headers for KVER (the twin image's kernel, which is also the VM's) and
# fetches Debian's real nvidia-modprobe (contrib) for the VM, into /out.
#   build-in-container.sh KVER     (the source is mounted at /src, the result goes to /out)
set -euo pipefail
kver=${1:?usage: build-in-container.sh KVER}
export DEBIAN_FRONTEND=noninteractive
# contrib for nvidia-modprobe; the image's own sources file is left alone.
printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  > /etc/apt/sources.list.d/hmk-contrib.sources
apt-get update -qq
apt-get install -qq -y --no-install-recommends dkms "linux-headers-$kver" >/dev/null
mkdir -p /usr/src/hmk-nvidia-standin-1.0
cp /src/Kbuild /src/dkms.conf /src/standin.h /src/standin-nvidia.c /src/standin-uvm.c /usr/src/hmk-nvidia-standin-1.0/
dkms add -m hmk-nvidia-standin -v 1.0 >/dev/null
dkms build -m hmk-nvidia-standin -v 1.0 -k "$kver"
dkms install -m hmk-nvidia-standin -v 1.0 -k "$kver" --force >/dev/null
dkms status -m hmk-nvidia-standin -k "$kver"
install -m 0644 "/lib/modules/$kver/updates/dkms/nvidia.ko" "/lib/modules/$kver/updates/dkms/nvidia-uvm.ko" /out/
cd /out && apt-get download -qq nvidia-modprobe
ls -l /out
