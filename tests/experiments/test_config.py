"""Sweep configuration: validation, hashing, grid expansion and bad command-line input.

No TensorFlow runs here; the command-line checks call ``main`` in-process and
fail before any worker would start.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from experiments.__main__ import main
from experiments.config import (
    ConfigError,
    DatasetConfig,
    ImplementationConfig,
    ModelConfig,
    PatternConfig,
    RunConfig,
    ScheduleConfig,
    TrainingConfig,
    canonical_json,
    config_hash,
    from_dict,
    load_sweep,
    parse_sweep,
)
from experiments.grid import expand

REPO = Path(__file__).resolve().parents[2]

BASE = dict(
    name="t",
    implementations=["dense", "masked"],
    sparsities=[0.5],
    models=["lenet300"],
    datasets=["digits"],
)


def sweep(**changes):
    return parse_sweep({**BASE, **changes})


def error_of(**changes) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        expand(sweep(**changes))
    return info.value


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"implementations": ["maskd"]}, "implementations[0].name", ["'masked'", "did you mean"]),
        ({"models": ["lenet-300"]}, "models[0].name", ["'lenet300'"]),
        ({"datasets": ["mnist6k"]}, "datasets[0].name", ["'mnist5k'"]),
        ({"traning": {"epochs": 1}}, "traning", ["did you mean 'training'"]),
        ({"training": {"learning_rat": 0.1}}, "training.learning_rat", ["did you mean 'learning_rate'"]),
        ({"schedules": [{"kind": "polynomial", "frequncy": 3}]}, "schedules[0].frequncy", ["'frequency'"]),
        ({"training": {"learning_rate": "fast"}}, "training.learning_rate", ["must be a number"]),
        ({"training": {"epochs": 1.5}}, "training.epochs", ["must be an integer"]),
        ({"training": {"epochs": True}}, "training.epochs", ["must be an integer"]),
        ({"training": {"batch_size": 0}}, "training.batch_size", [">= 1"]),
        ({"training": {"learning_rate": -1.0}}, "training.learning_rate", ["> 0"]),
        ({"training": {"optimizer": "adamw"}}, "training.optimizer", ["unknown optimizer"]),
        ({"sparsities": [0.5, 1.0]}, "sparsities[1]", ["< 1.0"]),
        ({"sparsities": [-0.1]}, "sparsities[0]", [">= 0"]),
        ({"sparsities": 0.5}, "sparsities", ["must be a list"]),
        ({"sparsities": []}, "sparsities", ["empty"]),
        ({"seeds": []}, "seeds", ["empty"]),
        ({"implementations": []}, "implementations", ["empty"]),
        ({"models": [{"name": "mlp"}]}, "models[0].widths", ["needs hidden widths"]),
        ({"models": [{"name": "lenet300", "widths": [3]}]}, "models[0].widths", ["only model 'mlp'"]),
        ({"implementations": [{"name": "masked", "matmul": "csr"}]}, "implementations[0].matmul", ["sparse_tensor"]),
        ({"implementations": [{"name": "sparse_tensor", "matmul": "bsr"}]}, "implementations[0].matmul", ["coo"]),
        ({"schedules": [{"kind": "cubic"}]}, "schedules[0].kind", ["unknown schedule"]),
        ({"schedules": [{"begin": 2, "end": 1}]}, "schedules[0].end", [">= begin"]),
        ({"schedules": [{"unit": "steps", "end": 2.5}]}, "schedules[0].end", ["whole number"]),
        ({"schedules": [{"end": 5}], "training": {"epochs": 2}}, "schedule.end", ["training has 2 epochs"]),
        ({"models": ["lenet5"], "datasets": ["synthetic"]}, "model", ["image dataset"]),
        ({"name": "a/b"}, "name", ["letters"]),
    ],
)
def test_invalid_configs_name_the_field(changes, path, words):
    e = error_of(**changes)
    assert e.path == path, str(e)
    for w in words:
        assert w in str(e), str(e)


def test_missing_required_key():
    data = dict(BASE)
    del data["datasets"]
    with pytest.raises(ConfigError, match=r"^datasets: is required"):
        parse_sweep(data)


def test_values_are_typed_and_frozen():
    s = sweep(training={"learning_rate": 1, "epochs": 3}, schedules=[{"kind": "one_shot", "begin": 1}])
    assert isinstance(s.training.learning_rate, float) and s.training.learning_rate == 1.0
    assert s.schedules == (ScheduleConfig(kind="one_shot", begin=1.0),)
    assert s.implementations == (ImplementationConfig("dense"), ImplementationConfig("masked"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.training.epochs = 5  # type: ignore[misc]


def test_hash_leaves_out_defaulted_fields():
    run = RunConfig(ImplementationConfig("masked"), DatasetConfig("digits"), ModelConfig("lenet300"), 0, sparsity=0.5,
                    schedule=ScheduleConfig())
    explicit = from_dict(
        RunConfig,
        {
            "implementation": {"name": "masked", "matmul": "auto"},
            "dataset": {"name": "digits", "test_fraction": 0.2},
            "model": {"name": "lenet300", "widths": []},
            "seed": 0,
            "sparsity": 0.5,
            "schedule": {"kind": "polynomial", "frequency": 10},
            "training": {"optimizer": "adam"},
        },
    )
    assert explicit == run
    assert config_hash(explicit) == config_hash(run)
    assert json.loads(canonical_json(run)) == {
        "dataset": {"name": "digits"},
        "implementation": {"name": "masked"},
        "model": {"name": "lenet300"},
        "schedule": {},
        "seed": 0,
        "sparsity": 0.5,
    }
    # Pinned: a change here silently orphans every finished run of every sweep.
    assert config_hash(run) == "52f235208a0e317308ab1e0f332e9aca9ef39f56487b2b0a9f4190bdb9919326"
    assert run.run_id == "masked-52f235208a0e3173"
    changed = dataclasses.replace(run, training=TrainingConfig(epochs=3))
    assert config_hash(changed) != config_hash(run)


def test_grid_expansion_counts_and_dense_once_per_seed():
    s = sweep(
        implementations=["dense", "masked", {"name": "sparse_tensor", "matmul": "csr"}, "tfmot"],
        sparsities=[0.5, 0.8, 0.9],
        seeds=[0, 1],
        schedules=[{"kind": "polynomial"}, {"kind": "one_shot"}],
        models=["lenet300", {"name": "mlp", "widths": [16]}],
    )
    runs = expand(s)
    per_cell = 1 + 3 * 3 * 2  # dense once; 3 pruned implementations x 3 sparsities x 2 schedules
    assert len(runs) == 2 * 2 * per_cell
    assert len({r.run_id for r in runs}) == len(runs)
    dense = [r for r in runs if r.implementation.name == "dense"]
    assert len(dense) == 4 and all(r.sparsity == 0.0 and r.schedule is None for r in dense)
    assert {r.implementation.matmul for r in runs if r.implementation.name == "sparse_tensor"} == {"csr"}
    assert sorted({r.sparsity for r in runs if r.implementation.name == "tfmot"}) == [0.5, 0.8, 0.9]


def test_grid_deduplicates_repeated_values():
    assert len(expand(sweep(sparsities=[0.5, 0.5], seeds=[3, 3]))) == 2


def test_shipped_configs_are_valid():
    quick = load_sweep(REPO / "experiments/configs/quickstart.toml")
    runs = expand(quick)
    assert {r.implementation.name for r in runs} == {"dense", "masked", "sparse_tensor", "tfmot"}
    assert sorted({r.sparsity for r in runs if r.implementation.name != "dense"}) == [0.5, 0.8, 0.9, 0.95]
    paper = load_sweep(REPO / "experiments/configs/paper.toml")
    assert len(paper.seeds) == 3 and paper.datasets[0].name == "mnist5k" and max(paper.sparsities) == 0.98


# -- command line: bad input gives a clear message, exit status 2, nothing written ---------


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sweep.toml"
    p.write_text(text)
    return p


GOOD = 'name = "t"\nimplementations = ["dense"]\nsparsities = [0.5]\nmodels = ["lenet300"]\ndatasets = ["digits"]\n'


@pytest.mark.parametrize(
    "text, message",
    [
        (GOOD.replace('["dense"]', '["dens"]'), "unknown implementation 'dens'"),
        (GOOD.replace('["lenet300"]', '["resnet"]'), "unknown model 'resnet'"),
        (GOOD.replace('["digits"]', '["imagenet"]'), "unknown dataset 'imagenet'"),
        (GOOD.replace("[0.5]", "[1.5]"), "sparsities[0]: must be < 1.0"),
        (GOOD.replace("[0.5]", "[]"), "sparsities: is empty, so the grid is empty"),
        ("name = [unclosed", "is not valid TOML"),
        (GOOD.replace('["digits"]', '["cifar10"]'), "this runner never downloads"),
    ],
)
def test_bad_input_exits_nonzero_writing_nothing(tmp_path, capsys, monkeypatch, text, message):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty_keras_home"))  # an empty cache, whatever ~/.keras holds
    config = write(tmp_path, text)
    results = tmp_path / "results"
    assert main(["run", str(config), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ")
    assert not results.exists()


def test_unreadable_config(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml"), "--results", str(tmp_path / "r")]) == 2
    assert "cannot read config" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_results_folder_that_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = write(tmp_path, GOOD)
    assert main(["run", str(config), "--results", str(blocker / "sub")]) == 2
    assert "cannot be created" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"


def test_dry_run_lists_the_grid_and_writes_nothing(tmp_path, capsys):
    config = write(tmp_path, GOOD.replace('["dense"]', '["dense", "masked"]').replace("[0.5]", "[0.5, 0.9]"))
    results = tmp_path / "results"
    assert main(["run", str(config), "--results", str(results), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 runs in the grid, 3 not done" in out
    assert out.count("masked-") == 2 and out.count("dense-") == 1
    assert not results.exists()


# -- the pattern, criterion and distribution axes --------------------------------


@pytest.mark.parametrize(
    "changes, path, message",
    [
        ({"patterns": ["n:m"]}, "patterns[0].name", "unknown pattern 'n:m'; did you mean 'nm'? (valid: unstructured, block, nm, channel)"),
        ({"patterns": [{"name": "nm", "size": [2, 2]}]}, "patterns[0].size", "only pattern 'block' takes size, not 'nm'"),
        ({"patterns": [{"name": "unstructured", "m": 1}]}, "patterns[0].m", "only pattern 'nm' takes m, not 'unstructured'"),
        ({"patterns": [{"name": "nm", "m": 4, "n": 4}]}, "patterns[0].m", "must satisfy 0 <= m < n (n = 4), got 4"),
        ({"patterns": [{"name": "block", "pooling": "avg"}]}, "patterns[0].pooling", "unknown pooling 'avg'; did you mean 'AVG'? (valid: AVG, MAX)"),
        ({"patterns": [{"name": "block", "size": [4]}]}, "patterns[0].size", "must be two integers [r, c], got [4]"),
        ({"patterns": [{"name": "block", "size": [0, 4]}]}, "patterns[0].size[0]", "must be >= 1, got 0"),
        ({"patterns": [{"name": "block", "siz": [4, 4]}]}, "patterns[0].siz", "unknown key; did you mean 'size'? (valid keys: name, m, n, size, pooling)"),
        ({"criteria": ["snp"]}, "criteria[0]", "unknown criterion 'snp'; did you mean 'snip'? (valid: gradient, magnitude, movement, random, snip, taylor)"),
        ({"criteria": []}, "criteria", "is empty, so the grid is empty; give at least one value"),
        ({"distributions": ["erdos"]}, "distributions[0]", "unknown distribution 'erdos' (valid: layer, global, erk)"),
        ({"distributions": ["Global"]}, "distributions[0]", "unknown distribution 'Global'; did you mean 'global'? (valid: layer, global, erk)"),
        ({"criterion": ["snip"]}, "criterion", "unknown key; did you mean 'criteria'?"),
    ],
)
def test_axis_values_are_validated_with_the_closest_valid_one(changes, path, message):
    e = error_of(**changes)
    assert e.path == path
    assert e.message.startswith(message), e.message


@pytest.mark.parametrize(
    "changes, path, message",
    [
        (
            {"implementations": ["tfmot"], "criteria": ["snip"]},
            "criterion",
            "tfmot prunes by magnitude only; 'snip' runs with 'masked' or 'sparse_tensor' (grid cell datasets='digits', "
            "models='lenet300', implementations='tfmot', patterns='unstructured', criteria='snip', distributions='layer')",
        ),
        (
            {"implementations": ["tfmot"], "distributions": ["global"]},
            "distribution",
            "tfmot gives every layer the scheduled sparsity ('layer'); 'global' runs with 'masked' or 'sparse_tensor'",
        ),
        ({"implementations": ["tfmot"], "patterns": ["channel"]}, "pattern", "tfmot has no channel pattern"),
        ({"patterns": ["nm"], "distributions": ["erk"]}, "distribution", "pattern '2:4' fixes every group's sparsity, so it needs 'layer', not 'erk'"),
        ({"patterns": ["block"], "models": ["lenet5"]}, "pattern", "block needs 2-D weights; lenet5 has 4-D Conv2D kernels"),
    ],
)
def test_combinations_an_implementation_cannot_run_are_rejected_before_running(changes, path, message):
    e = error_of(**changes)
    assert e.path == path
    assert e.message.startswith(message), e.message


def test_tfmot_gets_what_tfmot_supports():
    runs = expand(sweep(implementations=["tfmot"], patterns=["unstructured", "nm", {"name": "block", "size": [2, 8], "pooling": "MAX"}]))
    assert [r.pattern.tfmot_kwargs() for r in runs] == [
        {},
        {"sparsity_m_by_n": (2, 4)},
        {"block_size": (2, 8), "block_pooling_type": "MAX"},
    ]


def test_nm_runs_get_the_sparsity_their_pattern_fixes_once():
    runs = expand(sweep(sparsities=[0.5, 0.9], patterns=["unstructured", {"name": "nm", "m": 1, "n": 4}], criteria=["magnitude", "snip"]))
    cells = sorted((r.implementation.name, r.pattern.label, r.criterion, r.sparsity) for r in runs)
    assert cells == [
        ("dense", "unstructured", "magnitude", 0.0),
        ("masked", "1:4", "magnitude", 0.25),
        ("masked", "1:4", "snip", 0.25),
        ("masked", "unstructured", "magnitude", 0.5),
        ("masked", "unstructured", "magnitude", 0.9),
        ("masked", "unstructured", "snip", 0.5),
        ("masked", "unstructured", "snip", 0.9),
    ]
    with pytest.raises(ConfigError, match=r"^sparsity: pattern '1:4' fixes the sparsity at m/n = 0.25"):
        dataclasses.replace(next(r for r in runs if r.pattern.name == "nm"), sparsity=0.5)


def test_patterns_sweep_expands_to_48_runs_over_pattern_and_criterion():
    runs = expand(load_sweep(REPO / "experiments" / "configs" / "patterns.toml"))
    assert len(runs) == 3 * (1 + 3 * (2 + 1 + 2))
    labels = {(r.pattern.label, r.criterion) for r in runs if r.implementation.name == "masked"}
    assert labels == {(p, c) for p in ("unstructured", "2:4", "block4x4") for c in ("magnitude", "snip", "random")}


def test_default_axes_leave_the_hash_and_run_id_unchanged():
    run = RunConfig(
        implementation=ImplementationConfig("masked"),
        dataset=DatasetConfig("mnist5k"),
        model=ModelConfig("lenet300"),
        seed=0,
        training=TrainingConfig(epochs=36),
        sparsity=0.9,
        schedule=ScheduleConfig(end=24.0),
    )
    explicit = dataclasses.replace(run, pattern=PatternConfig("unstructured"), criterion="magnitude", distribution="layer")
    assert canonical_json(explicit) == canonical_json(run)
    assert not {"pattern", "criterion", "distribution"} & set(json.loads(canonical_json(run)))
    assert explicit.run_id == run.run_id
    snip = dataclasses.replace(run, criterion="snip")
    assert json.loads(canonical_json(snip))["criterion"] == "snip" and snip.run_id != run.run_id
    block = dataclasses.replace(run, pattern=PatternConfig("block"))
    assert json.loads(canonical_json(block))["pattern"] == {"name": "block"}


def test_committed_paper_runs_keep_their_run_ids():
    """The committed paper sweep, expanded by today's code, names exactly the committed run folders and rows."""
    paper = REPO / "results" / "paper"
    expected = {r.run_id for r in expand(load_sweep(REPO / "experiments" / "configs" / "paper.toml"))}
    folders = {p.name for p in (paper / "runs").iterdir() if p.is_dir()}
    rows = {line.split(",", 1)[0] for line in (paper / "runs.csv").read_text().splitlines()[1:]}
    assert len(expected) == 66 and expected == folders == rows
    for folder in sorted(paper.glob("runs/*/config.json")):  # each recorded config hashes to its folder's name
        record = json.loads(folder.read_text())
        run = from_dict(RunConfig, record["run"])
        assert run.run_id == folder.parent.name and config_hash(run) == record["config_hash"]
    assert "dense-7df65fb5578f35cc" in folders  # a pinned id, in case the folders ever change with the code


def test_sparse_tensor_takes_the_native_matmul() -> None:
    impl = ImplementationConfig("sparse_tensor", "native")
    assert impl.label == "sparse_tensor-native"
    with pytest.raises(ValueError, match="matmul"):
        ImplementationConfig("masked", "native")


@pytest.mark.parametrize(
    "sweep",
    ["paper", "patterns", "methods", "speed", "fmnist_lenet300", "fmnist_lenet300_small_dense", "fmnist_lenet300_patterns",
     "fmnist_lenet300_imp", "fmnist_lenet5", "fmnist_lenet5_small_dense", "fmnist_lenet5_patterns",
     "fmnist_lenet5_gmp", "fmnist_lenet5_small_dense_sizes"],
)
def test_every_committed_run_rehashes_to_its_folder(sweep):
    """Each committed run's recorded config, read by today's code, hashes to its folder and its recorded hash,
    and the sweep file, expanded today, names only committed folders (speed: a subset was run)."""
    folders = sorted((REPO / "results" / sweep / "runs").glob("*/config.json"))
    assert folders
    for path in folders:
        record = json.loads(path.read_text())
        run = from_dict(RunConfig, record["run"])
        assert run.run_id == path.parent.name and config_hash(run) == record["config_hash"]
    expected = {r.run_id for r in expand(load_sweep(REPO / "experiments" / "configs" / f"{sweep}.toml"))}
    names = {p.parent.name for p in folders}
    assert names <= expected if sweep == "speed" else names == expected


def test_library_names_equal_the_library_registries():
    """experiments.library_names reads the library's registries (the report's columns are a checked copy)."""
    import prune
    from experiments import axes, library_names
    from prune.core import counting, distributions, patterns, scoring
    from prune.training import dst, imp, lottery

    assert set(library_names.CRITERIA) == set(scoring.criteria())
    gradient = {c for c in scoring.criteria() if "gradient" in scoring.get_criterion(c).needs}
    assert set(library_names.GRADIENT_CRITERIA) == gradient
    assert list(library_names.DISTRIBUTIONS) == distributions.distributions()
    assert set(library_names.IMP_SCOPES) <= set(distributions.distributions())  # the runner's IMP runs with these
    assert tuple(library_names.DST_METHODS) == dst.METHODS
    assert set(library_names.DST_DISTRIBUTION.values()) == set(distributions.distributions(with_zeros=True)) == {"layer", "erk"}
    assert library_names.PATTERN_CLASSES == tuple(patterns.patterns())
    assert library_names.REPORT_COLUMNS is counting.REPORT_COLUMNS
    assert {k.library for k in axes.PATTERNS} == set(patterns.patterns())
    assert library_names.imp is imp and axes.ImpParams is imp.ImpParams and prune.training.lottery is lottery


def test_mobilenet_takes_a_width_multiplier_and_the_others_refuse_one():
    assert ModelConfig("mobilenet", alpha=0.5).label == "mobilenet-a0.5" and ModelConfig("mobilenet").label == "mobilenet"
    with pytest.raises(ConfigError, match=r"alpha.*only model 'mobilenet' takes a width multiplier; 'lenet5' got 0.5"):
        ModelConfig("lenet5", alpha=0.5)
    with pytest.raises(ConfigError, match=r"alpha.*must be >= 0.0625, got 0.0"):
        ModelConfig("mobilenet", alpha=0.0)
    # the default is left out of the hash: every run hashed before alpha existed keeps its run_id
    assert "alpha" not in canonical_json(ModelConfig("lenet5"))
    with pytest.raises(ConfigError, match=r"model.*tfmot baseline prunes every layer; 'mobilenet' keeps \['conv_0'\] dense"):
        RunConfig(ImplementationConfig("tfmot"), DatasetConfig("digits"), ModelConfig("mobilenet"), 0, sparsity=0.5,
                  schedule=ScheduleConfig())
