"""The bmc role's edit of the installer's UEFI GRUB menu (plugins/module_utils/hmk_bmc_grub.py, through the
hmk_bmc_grub_seed filter), on menus with the layout of the real Debian 12 netinst and Ubuntu 24.04 live-server ISOs
(tests/fixtures/grub/INDEX.md): the entry GRUB boots by itself carries the seed's parameters once, before `---`;
every other line of the menu is as it was, except the timeout; a second run changes nothing; a menu the edit cannot
make unattended stops the role with the reason."""
import difflib
import shlex
from pathlib import Path

import pytest

from ansible.errors import AnsibleFilterError
from ansible_collections.hmk.moe_kit.plugins.filter import bmc as bmc_filter
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_bmc_grub as grub

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grub"
DEBIAN = (FIXTURES / "debian-12-netinst.grub.cfg").read_text()
UBUNTU = (FIXTURES / "ubuntu-24.04-live-server.grub.cfg").read_text()
DEBIAN_PARAMS = ("auto=true priority=critical interface=auto hostname=epyc-node domain= "
                 "preseed/url=http://seeds.lab:8080/hmk/epyc-node/preseed.cfg")
UBUNTU_PARAMS = "autoinstall 'ds=nocloud;s=http://seeds.lab:8080/hmk/epyc-node/'"


def seed(menu, params):
    return bmc_filter.FilterModule().filters()["hmk_bmc_grub_seed"](menu, params)


def changed_lines(before, after):
    """(removed, added) lines of the edit."""
    diff = list(difflib.ndiff(before.splitlines(), after.splitlines()))
    return ([d[2:] for d in diff if d.startswith("- ")], [d[2:] for d in diff if d.startswith("+ ")])


def test_debian_graphical_install_boots_with_the_preseed_before_the_separator():
    out = seed(DEBIAN, DEBIAN_PARAMS)
    removed, added = changed_lines(DEBIAN, out)
    assert removed == ["    linux    /install.amd/vmlinuz vga=788 --- quiet "]
    assert added == [grub.MARK % 5, "set timeout=5",
                     "    linux    /install.amd/vmlinuz " + DEBIAN_PARAMS + " vga=788 --- quiet "]
    words = shlex.split(added[2])
    assert words[:2] == ["linux", "/install.amd/vmlinuz"]
    assert words.index("preseed/url=http://seeds.lab:8080/hmk/epyc-node/preseed.cfg") < words.index("---")
    assert out.count("preseed/url=") == 1
    # The entry edited is the first top-level one, the one GRUB boots at the timeout.
    start, _end = grub.first_entry(out)
    assert out.splitlines()[start].startswith("menuentry --hotkey=g 'Graphical install'")


def test_debian_other_entries_keep_their_own_parameters():
    out = seed(DEBIAN, DEBIAN_PARAMS)
    assert out.count("auto=true priority=critical") == DEBIAN.count("auto=true priority=critical") + 1
    assert "    linux    /install.amd/vmlinuz vga=788 --- quiet \n    initrd   /install.amd/initrd.gz" in out
    assert "priority=low vga=788 --- \n" in out and "rescue/enable=true --- quiet " in out


def test_ubuntu_first_entry_starts_autoinstall_and_the_menu_waits_five_seconds():
    out = seed(UBUNTU, UBUNTU_PARAMS)
    removed, added = changed_lines(UBUNTU, out)
    assert removed == ["set timeout=30", "\tlinux\t/casper/vmlinuz  ---"]
    assert added == [grub.MARK % 5, "set timeout=5", "\tlinux\t/casper/vmlinuz " + UBUNTU_PARAMS + "  ---"]
    # GRUB's parser (like a shell) keeps the quoted ds= word whole: `;` would end the command otherwise.
    words = shlex.split(added[2])
    assert words == ["linux", "/casper/vmlinuz", "autoinstall", "ds=nocloud;s=http://seeds.lab:8080/hmk/epyc-node/",
                     "---"]
    assert "\tlinux\t/casper/hwe-vmlinuz  ---" in out and "\tlinux16 /boot/memtest86+x64.bin" in out


@pytest.mark.parametrize("menu,params", [(DEBIAN, DEBIAN_PARAMS), (UBUNTU, UBUNTU_PARAMS)], ids=["debian", "ubuntu"])
def test_a_second_edit_changes_nothing(menu, params):
    once = seed(menu, params)
    assert seed(once, params) == once
    assert once.count(params) == 1


def test_other_parameters_replace_nothing_and_are_added_once():
    once = seed(UBUNTU, UBUNTU_PARAMS)
    other = "autoinstall 'ds=nocloud;s=http://other/'"
    twice = seed(once, other)
    assert twice.count(other) == 1 and twice.count(UBUNTU_PARAMS) == 1


def test_an_existing_default_is_pinned_to_the_edited_entry():
    out = seed("set default=2\n" + UBUNTU, UBUNTU_PARAMS)
    assert "set default=0" in out.splitlines() and "set default=2" not in out


@pytest.mark.parametrize("menu,why", [
    ("set timeout=5\n", "no menuentry"),
    ("submenu 'Advanced' {\n  menuentry 'x' {\n    linux /vmlinuz ---\n  }\n}\n", "is a submenu"),
    ("menuentry 'Boot from next volume' {\n\texit 1\n}\n", "has 0 linux lines"),
    ("menuentry 'x' {\n  linux /vmlinuz ---\n", "never closed"),
])
def test_a_menu_that_cannot_boot_unattended_stops_with_the_reason(menu, why):
    with pytest.raises(AnsibleFilterError, match=why):
        seed(menu, DEBIAN_PARAMS)


def test_no_parameters_is_refused():
    with pytest.raises(AnsibleFilterError, match="no boot parameters"):
        seed(DEBIAN, " ")


def test_md5sum_txt_gets_the_new_menus_md5_and_keeps_every_other_line():
    import hashlib
    listing = ("0123456789abcdef0123456789abcdef  ./README.txt\n"
               "fedcba9876543210fedcba9876543210  ./boot/grub/grub.cfg\n"
               "00112233445566778899aabbccddeeff  ./install.amd/vmlinuz\n")
    menu = seed(DEBIAN, DEBIAN_PARAMS)
    out = bmc_filter.FilterModule().filters()["hmk_bmc_md5sum_update"](listing, menu)
    lines = listing.splitlines()
    assert out.splitlines() == [lines[0], hashlib.md5(menu.encode()).hexdigest() + "  ./boot/grub/grub.cfg", lines[2]]
    assert bmc_filter.hmk_bmc_md5sum_update("aa  ./other\n", menu) == "aa  ./other\n"
