# hybrid-moe-kit: make lab (a twin of an EPYC node, site.yml against it), make test (everything CI runs).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export HMK_CACHE ?= /var/cache/hybrid-moe-kit
export HMK_STATE ?= /var/tmp/hybrid-moe-kit
export DOCKER_HOST := unix://$(HMK_STATE)/dockerd/docker.sock
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# xorriso: the bmc role rebuilds the installer ISO with it (tests/integration/test_bmc_remaster.py runs it).
# libvirt for molecule/bmc_libvirt (sushy-tools' emulator in front of a QEMU domain): the daemon and its QEMU driver,
# virsh, and libvirt-dev + pkg-config + gcc + python3-dev (the headers of the venv's interpreter, Debian's python3:
# scripts/venv) to build the libvirt-python binding into the venv (requirements.txt).
# Not libvirt-daemon-system (units that start at install) nor -config-network (the `default` network and virbr0):
# the scenario runs its own session daemon and stops it.
DEB_PACKAGES := qemu-system-x86 qemu-utils debootstrap grub-pc-bin grub2-common e2fsprogs fdisk \
	openssh-client docker.io python3-venv git rsync curl haproxy shellcheck xorriso \
	libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev pkg-config gcc python3-dev
# What only `make test-slow` needs: the UEFI firmware for QEMU, Debian's netboot installer and GRUB's signed CD image
# (molecule/bmc_os_install builds its stand-in of the netinst ISO from them), and the tools for that ISO's FAT image.
DEB_PACKAGES_SLOW := ovmf debian-installer-12-netboot-amd64 grub-efi-amd64-signed mtools dosfstools
LAB_ARGS ?=
# pytest-xdist workers for make unit and make integration (0: one process, as before).
PYTEST_WORKERS ?= 2
LAB_KIND ?= container

.PHONY: help deps deps-slow bmc-os-install venv image lab lab-down lint syntax unit pins sanity integration collection docs ee cuda-sample molecule kt-native test test-quick test-slow bench fleet-bench clean \
	gpu-bundle gpu-acceptance

help:
	@echo "make lab         twin of an EPYC node as epyc-node + site.yml against it (LAB_KIND=container|vm)"
	@echo "make lab-down    remove the twin"
	@echo "make test        everything CI runs: lint, syntax, unit tests, every Molecule scenario"
	@echo "make test-quick  lint, syntax, unit tests (no twins)"
	@echo "make test-slow   what does not fit in CI's time: kt-kernel built for this machine's NATIVE class, and"
	@echo "                 an OS installed through a BMC's virtual media (molecule/bmc_os_install)"
	@echo "make bench       the test bed's costs (image, boot, reboot, container, scenarios)"
	@echo "make gpu-bundle  stage what tests/gpu/acceptance.sh needs on a GPU machine without internet"
	@echo "make pins        check an engine pin bump: ENGINE=ik_llama.cpp FROM=<tree|tarball|gitdir@rev> TO=<...>"
	@echo "make sanity      ansible-test sanity (every test but pslint) on the collection, ignores in tests/sanity/"
	@echo "make collection  build the hmk.moe_kit tarball, install it apart, syntax-check every playbook by FQCN, galaxy-importer"
	@echo "make docs        the docs site as Galaxy builds it (antsibull-docs + Sphinx -W) in .cache/docs-site, linted"
	@echo "make ee          the execution environment's build context (ansible-builder create) in .cache/ee/context"
	@echo "make fleet-bench site.yml over a fleet of container twins, timed (benchmarks/fleet.sh; ~25 min, not in CI)"

# Debian packages the bed needs; apt-get only when one is missing.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

deps-slow: deps
	@missing=$$(for p in $(DEB_PACKAGES_SLOW); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The venv: built once per requirements.txt (and interpreter) in $(HMK_CACHE)/venv/KEY, linked as $(VENV) (scripts/venv).
venv:
	@scripts/venv $(VENV)

image: deps
	scripts/twin image

# A container twin (default) gets the offline fixtures mounted (scripts/lab-fixtures: the engine's repository,
# the tiny model, the compiler cache) and runs every stage. A VM twin shares no directories with the host, so
# it runs the stages that need nothing from outside: preflight, gpu, kernel and the reboot.
lab: deps venv image
ifeq ($(LAB_KIND),vm)
	scripts/twin up --name epyc-node --port 2222 --kind vm $(LAB_ARGS)
	ansible-playbook site.yml -l epyc-node --tags preflight,gpu,kernel,reboot
else
	scripts/twin up --name epyc-node --port 2222 --kind $(LAB_KIND) $$(scripts/lab-fixtures --volume-args) $(LAB_ARGS)
	ansible-playbook site.yml -l epyc-node
endif

lab-down:
	scripts/twin down epyc-node

lint: venv
	yamllint --strict .
	ansible-lint --profile production

syntax: venv
	ansible-playbook --syntax-check -i inventories/lab/hosts.yml site.yml playbooks/*.yml
	ansible-playbook --syntax-check -i inventories/production/hosts.yml site.yml

# The fixture repository of the engine pin is made first (scripts/lab-fixtures, cached): the pin-bump and
# architecture-list tests read the engine's own sources from it, and fail rather than skip without it.
unit: deps venv
	scripts/lab-fixtures >/dev/null
	python -m pytest -q -n $(PYTEST_WORKERS) --durations=15 tests/unit

# An engine pin bump, checked before the pin moves (docs/docsite/rst/test_bed.rst, "Bumping an engine pin"): the engine's parser and
# build options at FROM and TO against llama_build_engine_flags; fails naming each rendered flag that changed.
ENGINE ?= ik_llama.cpp
FROM ?= $(HMK_CACHE)/fixtures/ik_llama.cpp.git@main
TO ?=
pins: venv
	@test -n "$(TO)" || { echo "make pins: set TO=<source tree, tarball or gitdir@rev> (and FROM, ENGINE)"; exit 2; }
	scripts/pins --engine $(ENGINE) $(FROM) $(TO)

# ansible-test sanity as Galaxy's checkers run it, with the pinned ansible-core (scripts/sanity: the
# ansible_collections/hmk/moe_kit layout in .cache/sanity, a get-pip stand-in where ansible-test's host is unreachable).
sanity: deps venv
	scripts/sanity

# The bed's own fault paths, with the real tools. --dist loadfile: a module's tests share their fixtures (a HAProxy
# fleet, a Redfish emulator, the twin's fixed fault ports) and stay on one worker.
integration: deps venv
	python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15 tests/integration

molecule: deps venv image
	scripts/run-molecule

# Slow, optional (not in `make test`): molecule/ktransformers with kt-kernel built for the NATIVE class of this
# machine (-march=native, AMX where the CPU has it) instead of AVX2; a second cold kt-kernel build, ~15 min on 2 cores.
kt-native: deps venv image
	tests/fixtures/engines/make-kt-repo.sh >/dev/null
	HMK_KT_CPU_INSTRUCT=auto HMK_KT_ENABLE_AMX=auto molecule test -s ktransformers

# The kit as users install it: the collection tarball, installed apart and resolved by FQCN, and imported by
# galaxy-importer with no ERROR or WARNING line (tests/galaxy-importer.cfg: offline); the execution environment's
# definition validated and its build context created (no container image is built here).
collection: venv
	scripts/collection-check collection

# The collection's docs site as Galaxy builds it (scripts/docs-site): antsibull-docs + Sphinx with warnings as
# errors, the extra pages of docs/docsite/, then antsibull-docs lint-collection-docs --plugin-docs.
docs: venv
	scripts/docs-site

ee: venv
	scripts/collection-check ee

# The CUDA path of the engine build: configure ik_llama.cpp with CUDA 13.0 (+ cuBLAS and cmake
# from PyPI, pinned by hash) through the role's own flag derivation, compile a few CUDA objects.
cuda-sample: venv
	tests/cuda/configure-and-compile-sample.sh

# What tests/gpu/acceptance.sh needs on a GPU machine without internet (the pinned engine source, cmake, the tiny
# model, the role data), staged into .cache/gpu-bundle (29 MiB); then, on the GPU machine, `make gpu-acceptance`.
gpu-bundle: venv
	scripts/make-gpu-bundle

gpu-acceptance:
	tests/gpu/acceptance.sh .cache/gpu-bundle gpu-acceptance

test-quick: lint syntax unit

# Not in `make test` (CI's 90 minutes): see the README's Tests section.
test-slow: kt-native bmc-os-install

# An OS installed through the BMC's virtual media on a machine with an empty disk, then preflight on it
# (molecule/bmc_os_install): about 40 minutes on 2 cores, most of it the Debian installer under TCG.
bmc-os-install: deps-slow venv
	molecule test -s bmc_os_install

# Each part timed; reports/timing.json and reports/timing.md say what each cost and which caches it hit.
# Parts joined by + run at once (scripts/test-run): each keeps one of the two cores busy, and none reads what
# another writes. (integration beside lint and unit was tried on 2026-12-03 and cost more than it saved: that group
# took 385 s against 138 + 249 s before, since integration's emulated boots and HAProxy tests need CPU too. The
# static parts after unit one after the other beside Molecule (a lane syntax, removed again) were tried on 2026-12-04:
# 2905 s in all against 2876 s for this order, both on the same machine that evening.)
# image beside lint and unit: a hit costs nothing, and a cold build (debootstrap from the archive, 78-241 s) waits on
# the network more than it computes, so it takes the CPU the CPU-bound parts leave; integration, after it, finds the
# image built. cuda-sample beside collection and docs: 13-29 s, half of it waiting. ee reads collection's tarball.
TEST_PARTS := deps venv lint+unit+syntax+image sanity+integration collection+docs+cuda-sample ee molecule
test:
	python3 scripts/test-run $(TEST_PARTS)

bench: deps venv image
	benchmarks/bed.sh
	python benchmarks/model_sync.py
	benchmarks/engine_build.sh

# Not part of bench or CI: N container twins rebuilt with site.yml at once, ~25 min on 2 cores (operator's guide, "A fleet").
fleet-bench: deps venv image
	benchmarks/fleet.sh

clean: lab-down
	rm -rf .cache reports
