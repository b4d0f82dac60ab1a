"""molecule/shared/create.yml, the create step of every delegated scenario, run by ansible-playbook on this machine
with a recording stand-in for scripts/twin (the real one starts QEMU or a container; what is under test here is what
the playbook hands it): each platform's `twin.volumes` reach `twin up` as --volume, and a writable volume's missing
host directory is made first while a read-only one (a fixture) is left for twin up to refuse."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def run_create(tmp_path, platforms):
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    calls = tmp_path / "twin-calls.jsonl"
    twin = project / "scripts" / "twin"
    twin.write_text("#!%s\nimport json, sys\nwith open(%r, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    % (sys.executable, str(calls)))
    twin.chmod(0o755)
    extra = tmp_path / "extra.json"
    instances = tmp_path / "instance_config.yml"
    extra.write_text(json.dumps({"molecule_yml": {"platforms": platforms}, "molecule_instance_config": str(instances),
                                 "ansible_python_interpreter": sys.executable, "ansible_connection": "local"}))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(MOLECULE_PROJECT_DIRECTORY=str(project), HMK_CACHE=str(tmp_path / "cache"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_HOME=str(tmp_path / "home"),
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"), ANSIBLE_LOCALHOST_WARNING="False")
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                          str(REPO / "molecule" / "shared" / "create.yml"), "-e", "@" + str(extra)],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    argv = [json.loads(line) for line in calls.read_text().splitlines()]
    return argv, yaml.safe_load(instances.read_text())


def test_volumes_reach_twin_up_and_only_writable_host_directories_are_made(tmp_path):
    kept = tmp_path / "kept-cache"
    kept.mkdir(mode=0o700)
    kept.chmod(0o700)
    volumes = ["%s/new-cache:/var/cache/a" % tmp_path, "%s/fixture:/srv/fixture:ro" % tmp_path,
               "%s:/var/cache/b:rw" % kept]
    platforms = [{"name": "ct", "twin": {"kind": "container", "port": 2499, "args": ["--memory", "4096"],
                                         "volumes": volumes}},
                 {"name": "vm", "twin": {"kind": "vm", "port": 2498}}]
    argv, instances = run_create(tmp_path, platforms)
    assert argv[0] == ["up", "--name", "ct", "--kind", "container", "--port", "2499", "--wait", "420", "--memory",
                       "4096"] + ["--volume=" + v for v in volumes]
    assert argv[1] == ["up", "--name", "vm", "--kind", "vm", "--port", "2498", "--wait", "420"]
    # The writable cache is made; the read-only fixture is not (docker would make it empty and the twin would see
    # nothing; twin up names it instead); an existing directory keeps its mode.
    assert (tmp_path / "new-cache").is_dir()
    assert not (tmp_path / "fixture").exists()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert [(i["instance"], i["port"]) for i in instances] == [("ct", 2499), ("vm", 2498)]


def test_every_delegated_container_scenario_names_the_shared_create_and_destroy():
    """A twin: block only means something to molecule/shared/create.yml: a scenario that declares one with
    another driver or another create step would start no twin of that kind."""
    for path in sorted((REPO / "molecule").glob("*/molecule.yml")):
        scenario = yaml.safe_load(path.read_text())
        if not any("twin" in platform for platform in scenario.get("platforms") or []):
            continue
        assert scenario["driver"]["name"] == "default", path
        playbooks = scenario["provisioner"].get("playbooks") or {}
        assert playbooks.get("create") == "../shared/create.yml", path
        assert playbooks.get("destroy") == "../shared/destroy.yml", path
