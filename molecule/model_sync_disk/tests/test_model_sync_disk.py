"""The prepared model disk as an operator would check it: GPT partition named hmk-models on the NVMe found by id,
ext4 labelled hmk-models, mounted at /srv/models with noatime, and in fstab by UUID (so it survives renames)."""
import json

DEVICE = "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_TWINMODELS01"


def test_the_disk_has_one_gpt_partition_named_hmk_models(host):
    assert host.file(DEVICE).linked_to == "/dev/nvme0n1"
    tree = json.loads(host.check_output("lsblk --json --paths -o NAME,PTTYPE,PARTLABEL,FSTYPE,LABEL,UUID /dev/nvme0n1"))
    disk = tree["blockdevices"][0]
    assert disk["pttype"] == "gpt" and len(disk["children"]) == 1
    part = disk["children"][0]
    assert (part["name"], part["partlabel"], part["fstype"], part["label"]) == (
        "/dev/nvme0n1p1", "hmk-models", "ext4", "hmk-models")


def test_the_model_filesystem_is_mounted_with_noatime(host):
    mount = host.mount_point("/srv/models")
    assert mount.exists and mount.device == "/dev/nvme0n1p1" and mount.filesystem == "ext4"
    assert "noatime" in mount.options


def test_fstab_mounts_it_by_uuid_with_noatime_and_nofail(host):
    uuid = host.check_output("blkid -s UUID -o value /dev/nvme0n1p1")
    lines = [line.split() for line in host.file("/etc/fstab").content_string.splitlines()
             if line.strip() and not line.startswith("#")]
    entry = [fields for fields in lines if fields[1] == "/srv/models"]
    assert entry == [["UUID=" + uuid, "/srv/models", "ext4", "noatime,nofail", "0", "0"]]


def test_the_models_root_is_root_owned_and_readable(host):
    root = host.file("/srv/models")
    assert (root.user, root.group, root.mode) == ("root", "root", 0o755)
    assert host.user("moe").exists
