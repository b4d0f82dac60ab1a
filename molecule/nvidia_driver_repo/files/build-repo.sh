#!/usr/bin/env bash
# Builds the local stand-in of NVIDIA's CUDA repository, inside a throwaway twin container (Debian's
# dpkg-deb, apt-ftparchive and gpg): STAND-IN packages carrying NVIDIA's names and versions, a flat
# repository like NVIDIA's (Packages + Release at the top, "Suites: /"), an InRelease signed with a
# throwaway key generated here, that key (key.asc, and key.gpg in binary as cuda-keyring ships its
# keyring) and its fingerprint (fingerprint).
# Two branches are offered, R580 and R595, with the unsuffixed names NVIDIA's Debian repository uses
# on every branch and its Ubuntu repository from R590, and with NVIDIA's open-ended dependencies
# (nvidia-open depends on ">=" its version), so without the branch lock apt would pick R595.
# Usage: build-repo.sh <work dir with this script> ; the repository ends up in <work dir>/repo.
set -euo pipefail
work=${1:?work dir}
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
apt-get update -qq
apt-get install -y -qq --no-install-recommends apt-utils gpg gpg-agent >/dev/null

pkgs="$work/pkgs"
repo="$work/repo"
rm -rf "$pkgs" "$repo"
mkdir -p "$pkgs" "$repo"

# stand_in <name> <version> <arch> <depends> <summary>: a package with a marker file and a
# description that says it is a stand-in. Extra files are put under $pkgs/<name>_<version>/ first.
stand_in() {
  local name=$1 version=$2 arch=$3 depends=$4 summary=$5
  local root="$pkgs/${name}_${version}"
  mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$name"
  echo "hybrid-moe-kit test STAND-IN for NVIDIA's $name $version; not NVIDIA software" \
    > "$root/usr/share/doc/$name/STAND-IN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: hybrid-moe-kit tests <tests@hybrid-moe-kit.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Section: non-free/misc"
    echo "Priority: optional"
    echo "Description: STAND-IN for NVIDIA's $name (hybrid-moe-kit test, not NVIDIA software)"
    echo " $summary"
    echo " Built by molecule/nvidia_driver_repo to exercise the nvidia_driver role without NVIDIA's servers."
  } > "$root/DEBIAN/control"
  dpkg-deb --root-owner-group -Zgzip --build "$root" "$repo/${name}_${version}_${arch}.deb" >/dev/null
}

# Branch lock, as NVIDIA's nvidia-driver-pinning-<branch> package does it: an apt preferences file.
root="$pkgs/nvidia-driver-pinning-580_580-1"
mkdir -p "$root/etc/apt/preferences.d"
cat > "$root/etc/apt/preferences.d/nvidia-driver-pinning-580" <<'PREF'
# STAND-IN of NVIDIA's branch pin (hybrid-moe-kit test)
Package: nvidia-* libnvidia-* cuda-drivers*
Pin: version 580.*
Pin-Priority: 1000
PREF
stand_in nvidia-driver-pinning-580 580-1 all "" "Pins the NVIDIA driver packages to branch 580."

# A kernel module DKMS really builds (it does nothing but log that it is a stand-in).
for version in 580.95.05 595.71.05; do
  root="$pkgs/nvidia-kernel-open-dkms_${version}-1"
  src="$root/usr/src/nvidia-$version"
  mkdir -p "$src" "$root/DEBIAN"
  cat > "$src/nvidia.c" <<'C'
#include <linux/module.h>
#include <linux/init.h>
static int __init hmk_stand_in_init(void) { pr_info("hybrid-moe-kit STAND-IN nvidia module\n"); return 0; }
static void __exit hmk_stand_in_exit(void) { }
module_init(hmk_stand_in_init);
module_exit(hmk_stand_in_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("hybrid-moe-kit test STAND-IN, not NVIDIA's driver");
C
  echo 'obj-m := nvidia.o' > "$src/Makefile"
  cat > "$src/dkms.conf" <<CONF
PACKAGE_NAME="nvidia"
PACKAGE_VERSION="$version"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
MAKE[0]="make -C \${kernel_source_dir} M=\${dkms_tree}/\${PACKAGE_NAME}/\${PACKAGE_VERSION}/build modules"
CLEAN="make -C \${kernel_source_dir} M=\${dkms_tree}/\${PACKAGE_NAME}/\${PACKAGE_VERSION}/build clean"
AUTOINSTALL="yes"
CONF
  # Registers the source with DKMS, like dh_dkms's postinst; the build is the role's job for the boot kernel.
  cat > "$root/DEBIAN/postinst" <<POST
#!/bin/sh
set -e
if [ "\$1" = configure ] && ! dkms status -m nvidia -v $version | grep -q .; then
  dkms add -m nvidia -v $version
fi
POST
  cat > "$root/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
dkms remove -m nvidia -v $version --all >/dev/null 2>&1 || true
PRERM
  chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
  stand_in nvidia-kernel-open-dkms "${version}-1" all "dkms" "Open kernel module source for DKMS ($version)."
  stand_in libnvidia-compute "${version}-1" amd64 "" "Compute libraries ($version)."
  stand_in nvidia-open "${version}-1" amd64 \
    "nvidia-kernel-open-dkms (>= ${version}), libnvidia-compute (>= ${version}), nvidia-persistenced" \
    "Metapackage of the open-module driver ($version)."
done

# Persistence daemon with a unit the role enables; it cannot run without a GPU.
root="$pkgs/nvidia-persistenced_580.95.05-1"
mkdir -p "$root/usr/bin" "$root/lib/systemd/system"
printf '#!/bin/sh\necho "hybrid-moe-kit STAND-IN nvidia-persistenced: no GPU here" >&2\nexit 1\n' > "$root/usr/bin/nvidia-persistenced"
chmod 0755 "$root/usr/bin/nvidia-persistenced"
cat > "$root/lib/systemd/system/nvidia-persistenced.service" <<'UNIT'
[Unit]
Description=STAND-IN NVIDIA Persistence Daemon (hybrid-moe-kit test)

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced

[Install]
WantedBy=multi-user.target
UNIT
stand_in nvidia-persistenced 580.95.05-1 amd64 "" "Persistence daemon."

# Toolkit whose nvcc answers --version the way NVIDIA's does for 12.8 Update 1.
root="$pkgs/cuda-toolkit-12-8_12.8.1-1"
mkdir -p "$root/usr/local/cuda-12.8/bin" "$root/usr/local/cuda-12.8/lib64"
cat > "$root/usr/local/cuda-12.8/bin/nvcc" <<'NVCC'
#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver (hybrid-moe-kit STAND-IN, not NVIDIA's compiler)"
echo "Copyright (c) 2005-2025 NVIDIA Corporation"
echo "Built on Fri_Feb_21_20:23:50_PST_2025"
echo "Cuda compilation tools, release 12.8, V12.8.93"
echo "Build cuda_12.8.r12.8/compiler.35583870_0"
NVCC
chmod 0755 "$root/usr/local/cuda-12.8/bin/nvcc"
stand_in cuda-toolkit-12-8 12.8.1-1 amd64 "" "CUDA 12.8 toolkit (only an nvcc that prints its version)."

# Flat repository, signed with a throwaway key.
cd "$repo"
apt-ftparchive packages . > Packages
gzip -9kn Packages
apt-ftparchive -o APT::FTPArchive::Release::Origin="hybrid-moe-kit STAND-IN of NVIDIA CUDA" \
  -o APT::FTPArchive::Release::Label="hmk-test" release . > Release
export GNUPGHOME="$work/gnupg"
rm -rf "$GNUPGHOME"; mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --pinentry-mode loopback --passphrase '' \
  --quick-gen-key 'hybrid-moe-kit throwaway repository key <repo@hybrid-moe-kit.invalid>' rsa3072 sign 1d
gpg --batch --quiet --clearsign --digest-algo SHA256 -o InRelease Release
gpg --batch --armor --export > key.asc
gpg --batch --export > key.gpg
gpg --batch --with-colons --list-keys | awk -F: '$1 == "fpr" {print $10; exit}' > fingerprint
gpgconf --kill gpg-agent
chmod -R a+rX "$repo"
echo "repository built: $(find "$repo" -mindepth 1 -maxdepth 1 ! -name '.*' | wc -l) files, key $(cat fingerprint)"
