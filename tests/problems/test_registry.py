"""The problem registry: built-ins by slug and KernelBench id, near-name suggestions, external folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.problems import UnknownProblem, find_problem, get_registry, load_kernelbench_dir
from harness.problems.spec import module_constants


def test_six_builtin_problems_answer_to_slug_kernelbench_id_and_file_stem():
    reg = get_registry()
    assert sorted(s.kernelbench_id for s in reg.all()) == [
        "level2/30", "level2/37", "level2/62", "level2/75", "level2/88", "level2/94"]
    spec = reg.get("level2/75")
    assert reg.get("gemm-groupnorm-min-biasadd") is spec and reg.get("75_Gemm_GroupNorm_Min_BiasAdd") is spec
    assert spec.init_arg_names == ["in_features", "out_features", "num_groups", "bias_shape"]


def test_every_builtin_has_metadata_and_a_small_size():
    for spec in get_registry().all():
        assert spec.version >= 1 and spec.tolerance.atol == 1e-4
        assert spec.compile_timeout_s > 0 and spec.run_timeout_s > 0
        for size in ("default", "small"):
            variant = spec.size(size)
            assert variant.flops and variant.min_bytes
        assert set(spec.size("small").overrides) <= set(module_constants(spec.source()))


def test_default_sizes_match_problems_md():
    consts = module_constants(get_registry().get("level2/37").source())
    assert (consts["batch_size"], consts["in_features"], consts["out_features"], consts["num_groups"]) == (
        "32768", "1024", "4096", "64")
    consts = module_constants(get_registry().get("level2/94").source())
    assert consts["num_groups"] == "256" and consts["bias_shape"] == "(out_features,)"


def test_unknown_problem_suggests_near_names():
    with pytest.raises(UnknownProblem) as e:
        get_registry().get("gemm_gn_hardtanh")
    assert "did you mean" in str(e.value) and "gemm-groupnorm-hardtanh" in str(e.value)
    with pytest.raises(UnknownProblem, match="level2/75"):
        get_registry().get("level2/57")


def test_external_kernelbench_folder_is_loaded_without_importing(tmp_path: Path):
    level = tmp_path / "level2"
    level.mkdir()
    (level / "99_Foo_Bar.py").write_text(
        "raise SystemExit('imported!')\nclass Model:\n    def __init__(self, a, b): pass\n")
    (level / "notes.txt").write_text("ignored")
    for root in (tmp_path, level):  # the suite's root or one level's folder
        specs = load_kernelbench_dir(root)
        assert [s.id for s in specs] == ["level2/99"] and specs[0].init_arg_names == ["a", "b"]
    reg = get_registry(tmp_path)
    assert reg.get("level2/99").name == "99_Foo_Bar" and reg.get("level2/75").builtin


def test_missing_external_folder_is_a_clear_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_kernelbench_dir(tmp_path / "nope")


def test_a_reference_that_draws_random_numbers_is_stochastic_and_others_are_not():
    from harness.api.views import problem_public
    from harness.problems.spec import model_randomness

    fixtures = Path(__file__).parents[1] / "fixtures" / "problems"
    dropout = get_registry(fixtures).get("level2/66")
    assert dropout.stochastic == ["Dropout"] and problem_public(dropout).stochastic == ["Dropout"]
    assert get_registry().get("level2/30").stochastic == []
    # Only what Model itself does counts: get_inputs draws its inputs with torch.rand in every problem.
    assert model_randomness("import torch\ndef get_inputs():\n    return [torch.rand(2)]\n") == []
    assert model_randomness("import torch.nn.functional as F\nclass Model:\n    def forward(self, x):\n"
                            "        return F.dropout(x, 0.1)\n") == ["dropout"]


def test_a_folder_given_as_a_relative_path_yields_absolute_problem_files(tmp_path: Path, monkeypatch):
    """Children run in temp dirs of their own: a relative source path reached them as a missing file."""
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "7_Foo.py").write_text("class Model:\n    def __init__(self): pass\n")
    monkeypatch.chdir(tmp_path)
    (spec,) = load_kernelbench_dir(Path("level2"))
    assert spec.source_path.is_absolute() and spec.source_path == tmp_path / "level2" / "7_Foo.py"


def test_a_problem_file_given_by_path_is_found_with_its_kernelbench_id(tmp_path, monkeypatch):
    level = tmp_path / "myprob" / "level1"
    level.mkdir(parents=True)
    (level / "1_Add.py").write_text("import torch\nclass Model(torch.nn.Module):\n    def __init__(self, n):\n"
                                    "        super().__init__()\n")
    (tmp_path / "plain.py").write_text("")
    monkeypatch.chdir(tmp_path)
    reg = get_registry()
    spec = find_problem(reg, "myprob/level1/1_Add.py")  # relative, as a user types it
    assert (spec.id, spec.kernelbench_id, spec.source_path) == ("level1/1", "level1/1", (level / "1_Add.py"))
    assert spec.init_arg_names == ["n"]
    assert find_problem(reg, "plain.py").id == "plain"  # outside a levelN folder: known by its stem
    assert find_problem(reg, "level2/75") is reg.get("level2/75")
    with pytest.raises(UnknownProblem, match="no such file"):
        find_problem(reg, "myprob/level1/2_Sub.py")
    with pytest.raises(UnknownProblem):  # the registry itself (what the API asks) never reads a path
        reg.get("myprob/level1/1_Add.py")
