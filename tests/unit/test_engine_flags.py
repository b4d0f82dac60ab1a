"""Issue 25 item 2: what the engine decides unless told is rendered explicitly, and the opt-in flags only at commits that
accept them. The flag table (llama_build_engine_flags) and the MLA lists are checked against ik_llama.cpp's own
sources at the pin 55d3c05 (the fixture repository) and at 8337e4cd (../shared/sources), the rendering per commit
date and opt-in, and the prompt cache (-cram) in the RAM plan on both seed machines."""
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_arch, hmk_gguf
import unit_support

REPO = Path(__file__).resolve().parents[2]
GIB = 1024 ** 3
MIB = 1024 ** 2
CACHE = Path(os.environ.get("HMK_CACHE", "/var/cache/hybrid-moe-kit"))
FIXTURE = CACHE / "fixtures" / "ik_llama.cpp.git"
NEW_TARBALL = Path(os.environ.get("HMK_SOURCES", REPO.parent / "shared" / "sources")) / "ik_llama.cpp" / \
    "ik_llama.cpp-8337e4cd-src.tar.gz"
PIN_DATE, NEW_DATE = "2026-04-13", "2026-08-15"
# R1 IQ4_XS at the default -cram: (GiB needed, GiB of RAM, fits) per seed machine
EXPECTED_RAM = {"genoa-1x4090": (327.8, 357.6, True), "genoa-1x5090": (316.8, 357.6, True),
                "milan-4x4090": (267.7, 476.8, True)}


_load = unit_support.load_script


pins = _load("pins_for_flags", REPO / "scripts" / "pins")
catalog_table = _load("catalog_table_for_flags", REPO / "scripts" / "gen-catalog-table")
svc, layouts = catalog_table.modules()
ERROR = getattr(svc, "AnsibleFilterError", ValueError)
TABLE = yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml").read_text())["llama_build_engine_flags"]


# ------------------------------------------------------------------------------------ the engine's own sources

def _pin_commit():
    assert (FIXTURE / "HEAD").exists(), "no fixture repository at %s: run scripts/lab-fixtures (make unit does)" % FIXTURE
    log = subprocess.run(["git", "-C", str(FIXTURE), "log", "--all", "--format=%H %s"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return next(line.split()[0] for line in log if hmk_engine_arch.IK_55D3C05 in line)


def _pin_file(path):
    return subprocess.run(["git", "-C", str(FIXTURE), "show", "%s:%s" % (_pin_commit(), path)], capture_output=True,
                          text=True, check=True, errors="replace").stdout


@pytest.fixture(scope="module")
def new_files():
    if not NEW_TARBALL.is_file():
        pytest.skip("no %s" % NEW_TARBALL)
    wanted = ("common/common.cpp", "common/speculative.cpp", "src/llama-arch.cpp", "src/llama-model.h",
              "src/llama-model.cpp", "src/llama.cpp")
    out = {}
    with tarfile.open(str(NEW_TARBALL)) as tar:
        for member in tar:
            parts = member.name.split("/", 1)
            if len(parts) == 2 and parts[1] in wanted and member.isfile():
                out[parts[1]] = tar.extractfile(member).read().decode("utf-8", "replace")
    return out


@pytest.fixture(scope="module")
def parsers(new_files):
    """{flag: (aliases, default, where)} of ik's parser at the pin and at 8337e4cd (scripts/pins' reader)."""
    old = pins.read_engine(pins.Source("%s@%s" % (FIXTURE, _pin_commit()), "ik_llama.cpp"), "ik_llama.cpp")["flags"]
    new = pins.read_engine(pins.Source(str(NEW_TARBALL), "ik_llama.cpp"), "ik_llama.cpp")["flags"]
    return old, new


def _current(engine):
    return [e for e in TABLE[engine] if not e.get("until")][0]


def _branch(parser_text, flag):
    """The body of ik's `if (arg == "<flag>" ...)` branch."""
    start = re.search(r'if \(arg == "[^)]*"%s"' % re.escape(flag), parser_text) or \
        re.search(r'if \(arg == "%s"' % re.escape(flag), parser_text)
    assert start, flag
    end = parser_text.find("\n    if (arg ==", start.end())
    return parser_text[start.start():end]


def test_every_new_flag_is_parsed_where_the_table_says(parsers, new_files):
    old, new = parsers
    items = {str(i["flag"]): i for i in _current("ik_llama.cpp")["accepted"]}
    for flag in ("-cram", "--ctx-checkpoints", "-sm", "--defer-experts", "--prefetch-experts", "-mtp", "--spec-type"):
        item = items[flag]
        at_pin = flag in old and not (item.get("since") and item["since"] > PIN_DATE)
        assert at_pin == (not item.get("since")), flag
        assert flag in new, flag  # parsed at 8337e4cd (-mtp only to refuse it, below)
        if item.get("since"):
            assert item["since"] == NEW_DATE
    # --defer-experts / --prefetch-experts: not at the pin at all
    assert "--defer-experts" not in old and "--prefetch-experts" not in old
    # -mtp: a switch at the pin, a refusal at 8337e4cd; --spec-type takes "mtp" only at 8337e4cd
    assert "has_mtp = true" in _branch(_pin_file("common/common.cpp"), "-mtp")
    assert "legacy_option_error" in _branch(new_files["common/common.cpp"], "-mtp")
    assert items["-mtp"]["until"] == NEW_DATE and items["-mtp"]["renamed_to"] == "--spec-type"
    assert '"mtp"' not in _branch(_pin_file("common/common.cpp"), "--spec-type")
    assert re.search(r'\{"mtp",\s*COMMON_SPECULATIVE_TYPE_MTP\}', new_files["common/speculative.cpp"])
    # -sm graph at both
    for text in (_pin_file("common/common.cpp"), new_files["common/common.cpp"]):
        assert 'arg_next == "graph"' in _branch(text, "-sm")


def test_the_explicit_defaults_are_the_engines(parsers):
    old, new = parsers
    items = {str(i["flag"]): i for i in _current("ik_llama.cpp")["accepted"]}
    for flag in ("-cram", "--ctx-checkpoints"):
        assert old[flag][1] == new[flag][1] == items[flag]["default"] == items[flag]["arg"], flag
    assert (old["-amb"][1], new["-amb"][1]) == ("0", "256")  # why the kit renders -amb always


def test_the_mla_lists_are_the_engines_own(new_files):
    pin_names = hmk_engine_arch.read_arch_names(_pin_file("src/llama-arch.cpp"))
    pin = hmk_engine_arch.read_mla_archs([_pin_file("src/llama-model.cpp"), _pin_file("src/llama.cpp")], pin_names)
    assert pin == hmk_engine_arch.mla_archs("ik_llama.cpp", PIN_DATE) == {"deepseek2", "glm-dsa", "mistral4"}
    new_names = hmk_engine_arch.read_arch_names(new_files["src/llama-arch.cpp"])
    new = hmk_engine_arch.read_mla_archs([new_files["src/llama-model.h"]], new_names)
    assert new == hmk_engine_arch.mla_archs("ik_llama.cpp", NEW_DATE)
    assert new - pin == {"bailingmoe3"}
    # the arch-name reader is the one model_sync's lists come from
    assert set(pin_names.values()) == set(hmk_engine_arch.IK_ARCHS_55D3C05)


def test_mla_by_commit_date_not_sha():
    assert hmk_engine_arch.is_mla("ik_llama.cpp", "2026-09-01", "bailingmoe3")
    assert not hmk_engine_arch.is_mla("ik_llama.cpp", PIN_DATE, "bailingmoe3")
    assert hmk_engine_arch.is_mla("ik_llama.cpp", "2025-06-01", "deepseek2")  # older than every list: the oldest
    assert not hmk_engine_arch.is_mla("ik_llama.cpp", NEW_DATE, "qwen3moe")
    assert not hmk_engine_arch.is_mla("llama.cpp", NEW_DATE, "deepseek2")


# ------------------------------------------------------------------------------------ rendering per commit

def _argv(engine="ik_llama.cpp", date=PIN_DATE, **opts):
    base = {"engine": engine, "accepted": svc.engine_flag_set(TABLE, engine, date), "commit_date": date,
            "model": "/m.gguf", "arch": "deepseek2", "threads": 32, "gpus": 1}
    base.update(opts)
    return svc.llama_argv(base)


def _value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_engine_decisions_are_rendered_explicitly_at_both_commits():
    for date in (PIN_DATE, NEW_DATE):
        argv = _argv(date=date, amb=0)
        assert _value(argv, "-amb") == "0"  # no limit said out loud: the engine's default is 256 at 8337e4cd
        assert _value(argv, "-cram") == "8192" and _value(argv, "--ctx-checkpoints") == "32"
        argv = _argv(date=date, amb=1024, cache_ram_mib=0, ctx_checkpoints=4)
        assert (_value(argv, "-amb"), _value(argv, "-cram"), _value(argv, "--ctx-checkpoints")) == ("1024", "0", "4")
        assert "-amb" not in _argv(date=date, arch="qwen3moe")  # not an MLA model
        assert "-fit" not in argv


def test_mla_follows_the_engines_list_at_the_commit():
    assert "-mla" in _argv(arch="glm-dsa") and "-amb" in _argv(arch="glm-dsa")
    assert "-mla" not in _argv(arch="bailingmoe3", date=PIN_DATE)
    assert _value(_argv(arch="bailingmoe3", date=NEW_DATE), "-mla") == "3"


def test_a_prompt_cache_without_limit_is_refused():
    with pytest.raises(ERROR, match="no limit"):
        _argv(cache_ram_mib=-1)


def test_opt_ins_are_off_by_default_and_rendered_only_where_the_commit_accepts_them():
    for date in (PIN_DATE, NEW_DATE):
        argv = _argv(date=date, gpus=4, mtp_layers=1)
        for flag in ("--defer-experts", "--prefetch-experts", "-sm", "-mtp", "--spec-type"):
            assert flag not in argv
    new = _argv(date=NEW_DATE, defer_experts=True, prefetch_experts=True)
    assert "--defer-experts" in new and "--prefetch-experts" in new
    for key, flag in (("defer_experts", "--defer-experts"), ("prefetch_experts", "--prefetch-experts")):
        with pytest.raises(ERROR, match="does not accept %s" % flag):
            _argv(date=PIN_DATE, **{key: True})


def test_split_mode_graph_needs_several_gpus():
    assert _value(_argv(gpus=4, split_mode_graph=True), "-sm") == "graph"
    with pytest.raises(ERROR, match="this node has 1"):
        _argv(gpus=1, split_mode_graph=True)


def test_mtp_in_each_commits_spelling_and_only_with_mtp_layers():
    pin = _argv(date=PIN_DATE, arch="glm4moe", mtp=True, mtp_layers=1)
    assert "-mtp" in pin and "--spec-type" not in pin
    new = _argv(date=NEW_DATE, arch="glm4moe", mtp=True, mtp_layers=1)
    assert _value(new, "--spec-type") == "mtp" and "-mtp" not in new
    with pytest.raises(ERROR, match="no MTP layers"):
        _argv(date=NEW_DATE, arch="glm4moe", mtp=True, mtp_layers=0)
    with pytest.raises(ERROR, match="does not accept -mtp"):
        _argv(engine="llama.cpp", date="2026-10-01", arch="glm4moe", mtp=True, mtp_layers=1)


def test_a_flag_past_its_until_is_checked_as_rejected():
    new = svc.engine_flag_set(TABLE, "ik_llama.cpp", NEW_DATE)
    pin = svc.engine_flag_set(TABLE, "ik_llama.cpp", PIN_DATE)
    assert "-mtp" in new["rejected"] and "-mtp" not in [i["flag"] for i in new["accepted"]]
    assert "-mtp" not in pin["rejected"]
    # the engine's refusal at 8337e4cd is recognised as one by the smoke check and the dry parse
    line = "legacy speculative option '-mtp' is disabled; use --spec-type mtp:n_max=1,p_min=0.0"
    assert svc.dry_parse_errors(line) == [line]


def test_mainline_never_re_plans_the_kits_placement():
    assert _value(_argv(engine="llama.cpp", date="2026-10-01", arch="qwen3moe"), "-fit") == "off"
    assert "-fit" not in _argv(engine="llama.cpp", date="2025-10-01", arch="qwen3moe")  # before -fit existed
    assert "-cram" not in _argv(engine="llama.cpp", date="2026-10-01", arch="qwen3moe")


# ------------------------------------------------------------------------------------ -cram in the RAM plan

@pytest.mark.parametrize("machine, cram_gib_fits", [
    # R1 IQ4_XS on Genoa's 384 GB (357.6 GiB): 327.8 GiB needed at the default 8 GiB prompt cache; 40 GiB misses
    ("genoa-1x4090", {0: True, 8: True, 32: True, 40: False}),
    # on Milan's 512 GB (476.8 GiB) there is room for a 64 GiB prompt cache, not for 256
    ("milan-4x4090", {0: True, 8: True, 64: True, 256: False}),
])
def test_the_prompt_cache_is_counted_in_the_ram_plan(machine, cram_gib_fits):
    layout = layouts.r1("IQ4_XS")
    plan = catalog_table.plan_on(svc, layout, catalog_table.MACHINES[[m[0] for m in catalog_table.MACHINES].index(machine)])
    ram = plan["memory"]["ram_bytes"]
    base = svc.memory_plan(layout, plan["plan"], ram, cache_ram=0)["ram_needed_bytes"]
    for gib, fits in cram_gib_fits.items():
        mem = svc.memory_plan(layout, plan["plan"], ram, cache_ram=gib * 1024)
        assert mem["prompt_cache_bytes"] == gib * GIB
        assert mem["ram_needed_bytes"] == base + gib * GIB
        assert mem["fits_ram"] is fits, (machine, gib, mem["ram_needed_bytes"] / GIB, ram / GIB)
    # the default is the engine's 8192 MiB, and with it the plan reserves what it always did (16 GiB)
    assert plan["memory"]["prompt_cache_bytes"] + svc.HOST_RESERVE == 16 * GIB


def test_the_ram_plan_numbers_on_both_seed_machines():
    """R1 IQ4_XS, 32k q8_0: GiB needed with the default -cram, per seed machine (weights not on the GPUs + 8 + 8)."""
    layout = layouts.r1("IQ4_XS")
    got = {}
    for machine in catalog_table.MACHINES:
        mem = catalog_table.plan_on(svc, layout, machine)["memory"]
        got[machine[0]] = (round(mem["ram_needed_bytes"] / GIB, 1), round(mem["ram_bytes"] / GIB, 1), mem["fits_ram"])
    assert got == EXPECTED_RAM, got


# ------------------------------------------------------------------------------------ MTP layers in the GGUF

def test_the_gguf_reader_tells_mtp_layers(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "glm4moe")
    writer.add_block_count(2)
    writer.add_uint32("glm4moe.nextn_predict_layers", 1)
    writer.add_tensor("blk.0.attn_norm.weight", numpy.zeros(4, dtype=numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert hmk_gguf.layout(str(path))["metadata"]["nextn_predict_layers"] == 1


def test_mtp_from_a_build_records_name_list():
    """Without the table in the play the service reads the build record's flag names (no values)."""
    for date, flag in ((PIN_DATE, "-mtp"), (NEW_DATE, "--spec-type")):
        names = [i["flag"] for i in svc.engine_flag_set(TABLE, "ik_llama.cpp", date)["accepted"]]
        argv = _argv(date=date, accepted=names, arch="glm4moe", mtp=True, mtp_layers=1)
        assert flag in argv and ({"-mtp", "--spec-type"} - {flag}).isdisjoint(argv)


@pytest.mark.parametrize("date", [PIN_DATE, NEW_DATE])
def test_the_smoke_check_finds_every_help_listed_flag_in_the_engines_help(date, new_files):
    """The build's smoke check asks --help for each accepted flag with in_help: the option column of the engine's
    usage table (options.push_back in common.cpp) at that commit lists them."""
    lb = _load("llama_build_filters_for_flags", REPO / "plugins" / "filter" / "llama_build.py")
    text = _pin_file("common/common.cpp") if date == PIN_DATE else new_files["common/common.cpp"]
    usage = "\n".join(re.findall(r'options\.push_back\(\{\s*"[^"]*",\s*"([^"]*)"', text))
    flag_set = lb.engine_flag_set(TABLE, "ik_llama.cpp", date)
    assert lb.missing_in_help(usage, lb.help_flags(flag_set)) == []


def test_validate_and_tune_map_the_opt_ins_onto_llama_bench():
    val = _load("validate_filters_for_flags", REPO / "plugins" / "filter" / "validate.py")
    server = ["/bin/llama-server"] + _argv(date=NEW_DATE, gpus=4, split_mode_graph=True, defer_experts=True)
    # llama-bench --help at 8337e4cd lists -sm (none|layer|graph) and --defer-experts
    help_new = ("  -o, --output <csv|json|md|sql>\n  -sm, --split-mode <none|layer|graph>(default: layer)\n"
                "  --defer-experts                     (Linux only, default: 0)\n")
    bench = val.bench_argv(server, help_new, "/bin/llama-bench")
    assert bench["base"][bench["base"].index("-sm") + 1] == "graph" and "--defer-experts" in bench["base"]
    older = val.bench_argv(server, "  -o, --output <csv|json|md|sql>\n", "/bin/llama-bench")
    assert {"-sm", "--defer-experts"} <= set(older["dropped"]) and "--defer-experts" not in older["base"]


# ------------------------------------------------------------------------------------ the role's own plan.yml

def _run_plan(**overrides):
    """plan.yml's set_fact tasks evaluated in process with Ansible's templar (the collection's filters), on the role's
    defaults, a deepseek2 layout and a build record of the given commit date; returns the facts they set."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    trust = unit_support.trust

    role = REPO / "roles" / "inference_service"
    variables = dict(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    variables.update(yaml.safe_load((role / "vars" / "main.yml").read_text()))
    layout = layouts.r1("IQ4_XS")
    variables.update({
        "llama_build_engine_flags": TABLE, "inference_service_model_path": "/srv/models/r1/R1-00001-of-00009.gguf",
        "hmk_hardware": yaml.safe_load((REPO / "inventories/production/group_vars/milan_4gpu/hardware.yml").read_text())[
            "hmk_hardware"],
        "__inference_service_layout": dict(layout, metadata=dict(layout["metadata"], nextn_predict_layers=1)),
        "__inference_service_record": {"commit_date": PIN_DATE}, "__inference_service_numa_count": 1,
        "__inference_service_binary": "/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server",
        "__inference_service_kt": {}, "__inference_service_kt_cores": 1, "__inference_service_kt_pools": 1,
        "ansible_facts": {"processor_cores": 64, "processor_count": 1, "processor_vcpus": 64, "memtotal_mb": 512000},
    })
    variables.update(overrides)
    variables = trust(variables)
    for task in yaml.safe_load((role / "tasks" / "plan.yml").read_text()):
        facts = task.get("ansible.builtin.set_fact")
        if not facts:
            continue
        templar = Templar(loader=DataLoader(), variables=dict(variables, **trust(task.get("vars") or {})))
        if "when" in task and not templar.evaluate_conditional(trust_as_template(str(task["when"]))):
            continue
        for name, expression in facts.items():
            variables[name] = templar.template(trust(expression))
    return variables


def test_plan_yml_renders_the_explicit_flags_and_counts_the_prompt_cache():
    facts = _run_plan(inference_service_cache_ram_mib=16384, inference_service_mtp=True,
                      inference_service_split_mode_graph=True)
    argv = facts["__inference_service_argv"]
    assert _value(argv, "-mla") == "3" and _value(argv, "-amb") == "512"
    assert _value(argv, "-cram") == "16384" and _value(argv, "--ctx-checkpoints") == "32"
    assert "-mtp" in argv and _value(argv, "-sm") == "graph" and "--defer-experts" not in argv
    memory = facts["__inference_service_memory"]
    assert memory["prompt_cache_bytes"] == 16 * GIB and memory["ram_bytes"] == 512000 * MIB
    assert memory["ram_needed_bytes"] == memory["ram_weight_bytes"] + 16 * GIB + svc.HOST_RESERVE
    newer = _run_plan(__inference_service_record={"commit_date": NEW_DATE}, inference_service_mtp=True,
                      inference_service_defer_experts=True)["__inference_service_argv"]
    assert _value(newer, "--spec-type") == "mtp" and "--defer-experts" in newer and "-mtp" not in newer


def test_the_pin_bump_check_fails_on_a_rendered_flag_the_new_commit_refuses(tmp_path, capsys, parsers):
    """8337e4cd still names -mtp in its parser, only to throw "legacy speculative option"; make pins counts that as
    gone: without the table's `until` for -mtp the bump fails naming it."""
    table = yaml.safe_load((REPO / "roles" / "llama_build" / "defaults" / "main.yml").read_text())
    entry = [e for e in table["llama_build_engine_flags"]["ik_llama.cpp"] if not e.get("until")][0]
    for item in entry["accepted"]:
        if item["flag"] == "-mtp":
            item.pop("until")
            item.pop("renamed_to")
    path = tmp_path / "table.yml"
    path.write_text(yaml.safe_dump(table))
    old_spec = "%s@%s" % (FIXTURE, _pin_commit())
    assert pins.main(["--engine", "ik_llama.cpp", "--table", str(path), old_spec, str(NEW_TARBALL)]) == 1
    out = capsys.readouterr().out
    assert re.findall(r"^  (\S+): ", out.split("FAIL:")[1], re.M) == ["-mtp"]
    assert re.search(r"^flags now refused with a message \(\d+\): .*(?<!\S)-mtp(?!\S)", out, re.M)
    assert pins.main(["--engine", "ik_llama.cpp", old_spec, str(NEW_TARBALL)]) == 0  # the real table records it
