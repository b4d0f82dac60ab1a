"""scripts/pins: the engine pin-bump check, on the real ik_llama.cpp sources and on small trees made here."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
import unit_support

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HMK_CACHE", "/var/cache/hybrid-moe-kit"))
# scripts/lab-fixtures -> tests/fixtures/engines/make-ik-repo.sh: branch pin-55d3c05 (the PyPI sdist's tree) and main
# (the pin, 8337e4cd, from the tarball below)
OLD_REPO = CACHE / "fixtures" / "ik_llama.cpp.git"
SOURCES = Path(os.environ.get("HMK_SOURCES", REPO.parent / "shared" / "sources"))
NEW_TARBALL = SOURCES / "ik_llama.cpp" / "ik_llama.cpp-8337e4cd-src.tar.gz"
TABLE = REPO / "roles" / "llama_build" / "defaults" / "main.yml"


def _load():
    return unit_support.load_script("pins_script", REPO / "scripts" / "pins")


pins = _load()
ENGINE = "ik_llama.cpp"


def _old_spec():
    assert (OLD_REPO / "HEAD").exists(), "no fixture repository at %s: run scripts/lab-fixtures (make unit does)" % OLD_REPO
    return "%s@pin-55d3c05" % OLD_REPO  # main holds the pin since issue 25, 8337e4cd


@pytest.fixture(scope="session")
def real_sources():
    """(old, new) Source objects: the pin 55d3c05 from the fixture repository, 8337e4cd from its tarball."""
    if not NEW_TARBALL.is_file():
        pytest.skip("no %s" % NEW_TARBALL)
    return pins.Source(_old_spec(), ENGINE), pins.Source(str(NEW_TARBALL), ENGINE)


def _write_tree(root, files):
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(root)


def test_real_bump_passes_and_prints_the_default_changes(real_sources, capsys):
    old, new = real_sources
    assert "55d3c05bf7b3" in old.label and "8337e4cd" in new.label
    rc = pins.main(["--engine", ENGINE, old.spec, new.spec])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "  -amb: 0 -> 256  [params.attn_max_batch]" in out
    assert re.search(r"^  -ngl: 0 -> -1  \[mparams\.n_gpu_layers", out, re.M)
    assert "--defer-experts" in out and "--prefetch-experts" in out  # flags added between the two commits
    assert "flags removed (0)" in out


def test_the_fixture_repository_bump_is_the_same_check(real_sources, capsys):
    """What `make pins` runs by default: FROM is the fixture repository's main, which holds the pin (8337e4cd, the
    tarball's tree), and pin-55d3c05 the old pin; old -> main prints the same default changes and passes, and main ->
    the tarball finds nothing to change."""
    old, new = real_sources
    main = "%s@main" % OLD_REPO
    rc = pins.main(["--engine", ENGINE, old.spec, main])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "  -amb: 0 -> 256  [params.attn_max_batch]" in out
    assert "--defer-experts" in out and "flags removed (0)" in out
    assert pins.read_engine(pins.Source(main, ENGINE), ENGINE) == pins.read_engine(new, ENGINE)


def test_the_table_records_what_the_sources_say(real_sources):
    """The default_changes in llama_build_engine_flags are the moves read from the two commits, not typed in."""
    old, new = (pins.read_engine(s, ENGINE) for s in real_sources)
    entry, _unused = pins.kit_table(ENGINE)
    for item in entry["accepted"]:
        for change in item.get("default_changes") or []:
            flag = item["flag"]
            assert (old["flags"][flag][1], new["flags"][flag][1]) == (change["from"], change["to"]), flag
            assert new["flags"][flag][1] == item["default"], flag


def test_real_parser_with_a_rendered_flag_removed_fails_naming_it(real_sources, tmp_path, capsys):
    old, new = real_sources
    files = dict(new.files)
    parser = files["common/common.cpp"]
    files["common/common.cpp"] = parser.replace('arg == "-mla" || arg == "--mla-use"', 'arg == "--mla-gone"')
    assert files["common/common.cpp"] != parser
    tree = _write_tree(tmp_path / "ik_llama.cpp-deadbee", files)
    rc = pins.main(["--engine", ENGINE, old.spec, tree])
    out = capsys.readouterr().out
    assert rc == 1
    assert "flags removed (2): --mla-use -mla" in out
    assert re.search(r"^  -mla: the kit renders it and the new commit no longer parses it", out, re.M)
    assert "-amb:" not in out.split("FAIL:")[1]  # the recorded changes do not fail


# ------------------------------------------------------------------ small synthetic trees (no real source needed)

def _synthetic(flags, defaults, drop=(), options=None):
    """A parser in ik_llama.cpp's form with one branch per flag, each setting a field of gpt_params."""
    options = pins.kit_table(ENGINE)[0]["cmake_options"] if options is None else options
    branches, fields = [], []
    for index, flag in enumerate(sorted(flags)):
        if flag in drop:
            continue
        field = "f%d" % index
        branches.append('    if (arg == "%s") {\n        CHECK_ARG\n        params.%s = argv[i];\n        return true;\n    }'
                        % (flag, field))
        fields.append("    int %s = %s; // %s" % (field, defaults.get(flag, "0"), flag))
    return {
        "common/common.cpp": "bool gpt_params_find_arg(int argc, char ** argv, const std::string & arg, gpt_params & params) {\n"
                             + "\n".join(branches) + "\n    return false;\n}\n",
        "common/common.h": "struct gpt_params {\n    struct nested { int f0 = 7; } inner;\n" + "\n".join(fields) + "\n};\n",
        "CMakeLists.txt": "".join('option(%s "doc" ON)\n' % o for o in options),
    }


def _rendered():
    entry, stable = pins.kit_table(ENGINE)
    return {str(i["flag"]) for i in entry["accepted"]} | set(stable)


def test_synthetic_removed_flag_fails_naming_it(tmp_path, capsys):
    flags = _rendered()
    old = _write_tree(tmp_path / "a", _synthetic(flags, {}))
    new = _write_tree(tmp_path / "b", _synthetic(flags, {}, drop=("-ot",)))
    assert pins.main(["--engine", ENGINE, old, new]) == 1
    out = capsys.readouterr().out
    failed = re.findall(r"^  (\S+): ", out.split("FAIL:")[1], re.M)
    assert failed == ["-ot"]


def test_synthetic_unrecorded_default_change_fails_and_a_recorded_one_passes(tmp_path, capsys):
    flags = _rendered()
    old = _write_tree(tmp_path / "a", _synthetic(flags, {"-amb": "0", "-t": "4"}))
    new = _write_tree(tmp_path / "b", _synthetic(flags, {"-amb": "256", "-t": "8"}))
    assert pins.main(["--engine", ENGINE, old, new]) == 1
    out = capsys.readouterr().out
    assert "-t: the default moved from 4 to 8" in out
    assert "-amb: the default moved" not in out  # recorded in the table: 0 -> 256
    same = _write_tree(tmp_path / "c", _synthetic(flags, {"-amb": "0", "-t": "4"}))
    assert pins.main(["--engine", ENGINE, old, same]) == 0


def test_synthetic_rename_and_cmake_option_against_a_table_made_here(tmp_path, capsys):
    table = yaml.safe_load(TABLE.read_text())
    entry = [e for e in table["llama_build_engine_flags"][ENGINE] if not e.get("until")][0]
    flags = _rendered()
    old = _write_tree(tmp_path / "a", _synthetic(flags, {}, options=("GGML_NATIVE", "GGML_CUDA")))
    new_flags = (flags - {"-rtr"}) | {"--repack"}
    new = _write_tree(tmp_path / "b", _synthetic(new_flags, {}, options=("GGML_NATIVE",)))
    entry["cmake_options"] = ["GGML_NATIVE", "GGML_CUDA"]
    for item in entry["accepted"]:
        if item["flag"] == "-rtr":
            item.update(until="feedbee", renamed_to="--repack")
    path = tmp_path / "table.yml"
    path.write_text(yaml.safe_dump(table))
    assert pins.main(["--engine", ENGINE, "--table", str(path), old, new]) == 1
    out = capsys.readouterr().out
    assert re.findall(r"^  (.+?): ", out.split("FAIL:")[1], re.M) == ["cmake GGML_CUDA"]
    assert "cmake options removed (1): GGML_CUDA" in out


def test_git_revision_source_reads_without_writing(tmp_path):
    if not shutil.which("git"):
        pytest.skip("no git")
    files = _synthetic(_rendered(), {"-amb": "128"})
    work = tmp_path / "work"
    _write_tree(work, files)
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t.invalid", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t.invalid")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "ik_llama.cpp " + "ab" * 20 + " (test)"]):
        subprocess.run(["git", "-C", str(work)] + cmd, check=True, env=env)
    source = pins.Source("%s@HEAD" % work, ENGINE)
    assert source.label.startswith("abababababab (")
    assert pins.read_engine(source, ENGINE)["flags"]["-amb"][1] == "128"


def test_mainline_parser_and_library_default():
    arg_cpp = '''
    add_opt(common_arg(
        {"-ngl", "--gpu-layers", "--n-gpu-layers"}, "N",
        string_format("max. number of layers to store in VRAM (default: %d)", params.n_gpu_layers),
        [](common_params & params, int value) {
            params.n_gpu_layers = value;
        }
    ).set_env("LLAMA_ARG_N_GPU_LAYERS"));
    add_opt(common_arg(
        {"-fit", "--fit"}, "[on|off]",
        "fit unset arguments to the device memory",
        [](common_params & params, const std::string & value) {
            params.fit_params = value == "on";
        }
    ));
    if (params.n_gpu_layers != -1) {
        mparams.n_gpu_layers = params.n_gpu_layers;
    }
    '''
    header = "struct common_params {\n    int32_t n_gpu_layers = -1; // -1: library default\n    bool fit_params = true;\n};\n"
    library = ("struct llama_model_params llama_model_default_params() {\n    llama_model_params result = {\n"
               "        /*.devices =*/ nullptr,\n        /*.n_gpu_layers =*/ 999,\n    };\n    return result;\n}\n")
    branches = pins.parse_mainline(arg_cpp)
    assert branches == [(["-ngl", "--gpu-layers", "--n-gpu-layers"], "n_gpu_layers"), (["-fit", "--fit"], "fit_params")]
    assert pins.struct_defaults(header) == {"n_gpu_layers": "-1", "fit_params": "true"}
    assert pins.library_defaults(library)["mparams"]["n_gpu_layers"] == "999"


def test_a_path_that_is_no_source_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a ik_llama.cpp source"):
        pins.Source(str(tmp_path), ENGINE)
    with pytest.raises(SystemExit, match="neither a source tree"):
        pins.Source(str(tmp_path / "missing"), ENGINE)
