#!/usr/bin/env bash
# Prints what the test bed costs on this machine, measured in this run:
#   cold image build (debootstrap from the .deb cache), cached image lookup, VM boot-to-SSH,
#   in-guest reboot-to-SSH, container start-to-systemd-running, and the bed's Molecule
#   scenarios' wall times. Numbers, not gates: nothing here fails on a slow machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/molecule ] && export PATH="$PWD/.venv/bin:$PATH"
export HMK_CACHE=${HMK_CACHE:-/var/cache/hybrid-moe-kit}
export DOCKER_HOST=unix://${HMK_STATE:-/var/tmp/hybrid-moe-kit}/dockerd/docker.sock
now() { date +%s.%N; }
secs() { printf '%.1f' "$(echo "$2 - $1" | bc)"; }
declare -A result

# Cold: a scratch cache that shares only the downloaded .debs (the archive is not the bed's cost).
scratch=$(mktemp -d /var/tmp/hmk-bench.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/keys" "$scratch/apt-archives"
cp "$HMK_CACHE/keys/id_ed25519" "$HMK_CACHE/keys/id_ed25519.pub" "$scratch/keys/" 2>/dev/null || true
[ -d "$HMK_CACHE/apt-archives" ] && cp -al "$HMK_CACHE/apt-archives/." "$scratch/apt-archives/"
t0=$(now); HMK_CACHE=$scratch scripts/twin image >/dev/null; t1=$(now)
result[image_cold]=$(secs "$t0" "$t1")
t0=$(now); scripts/twin image >/dev/null; t1=$(now)
result[image_cached]=$(secs "$t0" "$t1")

port=2395
t0=$(now); scripts/twin up --kind vm --name bench-vm --port $port >/dev/null; t1=$(now)
result[vm_boot_to_ssh]=$(secs "$t0" "$t1")
boot_before=$(scripts/twin ssh bench-vm cat /proc/sys/kernel/random/boot_id)
t0=$(now)
scripts/twin ssh bench-vm 'systemd-run --on-active=1 systemctl reboot' >/dev/null 2>&1 || true
while boot=$(timeout 10 scripts/twin ssh bench-vm cat /proc/sys/kernel/random/boot_id 2>/dev/null) \
      && [ "$boot" = "$boot_before" ]; do sleep 0.5; done
until boot=$(timeout 10 scripts/twin ssh bench-vm cat /proc/sys/kernel/random/boot_id 2>/dev/null) \
      && [ -n "$boot" ] && [ "$boot" != "$boot_before" ]; do sleep 0.5; done
t1=$(now)
result[vm_reboot_to_ssh]=$(secs "$t0" "$t1")
scripts/twin down bench-vm >/dev/null 2>&1

t0=$(now); scripts/twin up --kind container --name bench-ct --port $port >/dev/null; t1=$(now)
result[container_to_systemd_running]=$(secs "$t0" "$t1")
scripts/twin down bench-ct >/dev/null 2>&1

for s in twin_vm twin_container; do
  t0=$(now); molecule test -s "$s" >/dev/null 2>&1 && ok=pass || ok=FAIL; t1=$(now)
  result[molecule_$s]="$(secs "$t0" "$t1") ($ok)"
done

printf '%-32s %s\n' measure seconds
for k in image_cold image_cached vm_boot_to_ssh vm_reboot_to_ssh container_to_systemd_running \
         molecule_twin_vm molecule_twin_container; do
  printf '%-32s %s\n' "$k" "${result[$k]}"
done
printf 'accelerator: %s\n' "$(grep -qE '\b(vmx|svm)\b' /proc/cpuinfo && echo kvm || echo 'tcg (software emulation)')"
