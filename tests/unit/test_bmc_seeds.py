"""The bmc role's unattended installer seeds (roles/bmc/templates/) and boot parameters (roles/bmc/vars/main.yml),
rendered in process with Ansible's templar on the role's defaults and vars, as tasks/os_install.yml renders them.

What must hold for any node: the kit's SSH public key reaches the admin user, no password travels in plain text
(only a crypt(3) hash, and only when one is set; otherwise the account is locked), the autoinstall document is valid
YAML under #cloud-config, and the boot parameters point the installer at this node's seed before the `---` that
separates the installer's arguments from the installed system's.
"""
import re
from pathlib import Path

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
import unit_support

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "bmc"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH1mkEmB1pV9OY8Kp0m3G3x3oZ6yVw4yq0WmC8dYFQ0r hmk-kit@control"
HASH = "$6$hmksalt$Zq0u3kQ5y7Wm9P1Q2rS3tU4vW5xY6zA7bC8dE9fG0hI1jK2lM3nO4pQ5rS6tU7vW8xY9zA0bC1dE2fG3hI4jK5"
BMC_PASSWORD = "Redfish-secret-pw-42"


_trust = unit_support.trust


def _templar(**overrides):
    variables = {}
    variables.update(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    variables.update(yaml.safe_load((ROLE / "vars" / "main.yml").read_text()))
    variables.update({"inventory_hostname": "epyc-node", "ansible_managed": "Ansible managed",
                      "bmc_address": "10.0.0.5", "bmc_username": "hmk-admin", "bmc_password": BMC_PASSWORD,
                      "bmc_os_install_publish_url": "http://seeds.lab:8080/hmk/",
                      "bmc_os_install_package_mirror": "http://mirror.lab/debian",
                      "__bmc_os_ssh_key": KEY})
    variables.update(overrides)
    return Templar(loader=DataLoader(), variables=_trust(variables))


def render(template, **overrides):
    return str(_templar(**overrides).template(trust_as_template((ROLE / "templates" / template).read_text())))


def value(name, **overrides):
    return _templar(**overrides).template(trust_as_template("{{ %s }}" % name))


def test_every_seed_file_the_tasks_publish_exists():
    files = value("__bmc_os_seed_files")
    assert sorted(files) == ["debian", "ubuntu"]
    for family in files.values():
        for item in family:
            assert (ROLE / "templates" / item["src"]).exists(), item


def test_the_preseed_gives_the_admin_user_the_kits_key_and_a_locked_password():
    seed = render("preseed.cfg.j2")
    assert seed.startswith("#\n# Ansible managed\n#")
    assert "d-i passwd/username string hmk\n" in seed
    assert "echo '%s' > /target/home/hmk/.ssh/authorized_keys" % KEY in seed
    assert "d-i passwd/user-password-crypted password !\n" in seed
    assert "d-i passwd/root-login boolean false" in seed
    # no clear-text password question is answered, and the BMC's secret is nowhere
    assert not re.search(r"passwd/(user|root)-password(-again)? ", seed)
    assert BMC_PASSWORD not in seed


def test_the_preseed_uses_the_operators_mirror_and_the_named_disk():
    seed = render("preseed.cfg.j2", bmc_os_install_disk="/dev/nvme0n1", bmc_os_install_admin_password_hash=HASH)
    assert "d-i mirror/http/hostname string mirror.lab\n" in seed
    assert "d-i mirror/http/directory string /debian\n" in seed
    assert "d-i partman-auto/disk string /dev/nvme0n1\n" in seed
    assert "d-i grub-installer/bootdev string /dev/nvme0n1\n" in seed
    assert "d-i passwd/user-password-crypted password %s\n" % HASH in seed


def test_the_preseed_late_command_is_one_continued_line():
    """d-i reads a value over backslash-continued lines: a line without one would end the command early."""
    lines = render("preseed.cfg.j2").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("d-i preseed/late_command"))
    body = []
    for line in lines[start:]:
        body.append(line)
        if not line.endswith("\\"):
            break
    assert "sudoers.d/90-hmk-admin" in body[-1]
    assert len(body) >= 5


@pytest.mark.parametrize("disk", ["", "/dev/nvme1n1"])
def test_the_autoinstall_user_data_is_valid_cloud_config_with_the_key(disk):
    text = render("autoinstall-user-data.j2", bmc_os_install_disk=disk,
                  bmc_os_install_package_mirror="http://mirror.lab/ubuntu")
    assert text.splitlines()[0] == "#cloud-config"
    doc = yaml.safe_load(text)
    auto = doc["autoinstall"]
    assert auto["version"] == 1
    assert auto["ssh"] == {"install-server": True, "allow-pw": False, "authorized-keys": [KEY]}
    assert auto["identity"]["username"] == "hmk" and auto["identity"]["hostname"] == "epyc-node"
    assert auto["identity"]["password"] == "!"
    assert auto["apt"]["primary"] == [{"arches": ["default"], "uri": "http://mirror.lab/ubuntu"}]
    assert auto["storage"]["layout"] == ({"name": "direct", "match": {"path": disk}} if disk else {"name": "direct"})
    assert BMC_PASSWORD not in text


def test_the_autoinstall_carries_a_set_hash_and_never_a_clear_text_password():
    auto = yaml.safe_load(render("autoinstall-user-data.j2", bmc_os_install_admin_password_hash=HASH))["autoinstall"]
    assert auto["identity"]["password"] == HASH
    assert "password" not in auto["ssh"]


def test_the_meta_data_names_the_node():
    doc = yaml.safe_load(render("autoinstall-meta-data.j2"))
    assert doc == {"instance-id": "hmk-epyc-node", "local-hostname": "epyc-node"}


def _grub(params):
    """What tasks/os_remaster.yml does to the Debian netinst's GRUB menu (the hmk_bmc_grub_seed filter)."""
    from ansible_collections.hmk.moe_kit.plugins.filter import bmc as bmc_filter
    remaster = (ROLE / "tasks" / "os_remaster.yml").read_text()
    assert "hmk.moe_kit.hmk_bmc_grub_seed(__bmc_os_boot_params)" in remaster
    menu = (REPO / "tests" / "fixtures" / "grub" / "debian-12-netinst.grub.cfg").read_text()
    return bmc_filter.hmk_bmc_grub_seed(menu, params)


def test_the_debian_boot_parameters_fetch_this_nodes_preseed_before_the_separator():
    params = str(value("__bmc_os_boot_params"))
    assert params == ("auto=true priority=critical interface=auto hostname=epyc-node domain= "
                      "preseed/url=http://seeds.lab:8080/hmk/epyc-node/preseed.cfg")
    line = [x for x in _grub(params).splitlines() if "vmlinuz" in x][0]
    assert line.index("preseed/url=") < line.index("---")


def test_the_ubuntu_boot_parameters_start_autoinstall_from_this_nodes_nocloud_seed():
    params = str(value("__bmc_os_boot_params", bmc_os_install_family="ubuntu"))
    assert params == "autoinstall 'ds=nocloud;s=http://seeds.lab:8080/hmk/epyc-node/'"


def test_the_rebuilt_iso_is_named_by_its_inputs_and_is_what_the_bmc_inserts():
    first = str(value("__bmc_os_boot_url"))
    assert re.fullmatch(r"http://seeds\.lab:8080/hmk/epyc-node/installer-[0-9a-f]{12}\.iso", first)
    assert str(value("__bmc_os_boot_url", bmc_os_install_family="ubuntu")) != first
    assert str(value("__bmc_os_boot_url", bmc_os_install_remaster=False,
                     bmc_os_install_image_url="http://mirror.lab/d.iso")) == "http://mirror.lab/d.iso"


def test_the_bmc_fetches_the_rebuilt_iso_at_the_media_url_and_the_installer_the_seed_at_the_publish_url():
    """BMCs on a management network see the mirror at another address than the nodes' installers."""
    iso = str(value("__bmc_os_boot_url", bmc_os_install_media_url="http://10.9.0.5:8080/hmk/"))
    assert re.fullmatch(r"http://10\.9\.0\.5:8080/hmk/epyc-node/installer-[0-9a-f]{12}\.iso", iso)
    assert iso.rsplit("/", 1)[1] == str(value("__bmc_os_boot_url")).rsplit("/", 1)[1]  # the same build
    params = str(value("__bmc_os_boot_params", bmc_os_install_media_url="http://10.9.0.5:8080/hmk/"))
    assert "preseed/url=http://seeds.lab:8080/hmk/epyc-node/preseed.cfg" in params


def test_the_preseed_installs_the_asked_tasks_and_grub_at_the_removable_path():
    assert "tasksel tasksel/first multiselect standard, ssh-server\n" in render("preseed.cfg.j2")
    seed = render("preseed.cfg.j2", bmc_os_install_debian_tasks=["ssh-server"])
    assert "tasksel tasksel/first multiselect ssh-server\n" in seed
    assert "d-i grub-installer/force-efi-extra-removable boolean true\n" in seed
