"""Unit tests for paddle_dist.config: defaults -> YAML file -> -o overrides, typed and validated."""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from paddle_dist.data import registry
from paddle_dist.sync import transports
import yaml

from paddle_dist import config, config_keys
from paddle_dist.config import CONFIG_DIR, Config, config_hash, dump, from_dict, load
from paddle_dist.config_keys import parse_override
from paddle_dist.errors import ConfigError
from paddle_dist.launch import launcher

BUNDLED = sorted(CONFIG_DIR.glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- loading
def test_load_without_arguments_reads_the_default_config():
    cfg = load()
    expected = yaml.safe_load((CONFIG_DIR / "mnist_lenet.yaml").read_text())
    assert isinstance(cfg, Config)
    assert cfg.train.epochs == expected["train"]["epochs"]
    assert cfg.train.batch_size == expected["train"]["batch_size"]
    assert cfg.train.lr == expected["train"]["lr"]
    assert cfg.model.name == expected["model"]["name"]
    assert cfg.output.name == "mnist_lenet"   # the file's stem, as output.name is unset


def test_keys_not_in_the_file_keep_their_typed_defaults():
    cfg = load()
    assert cfg.train.eval_batch_size == config.TrainConfig().eval_batch_size
    assert cfg.dist.gpus == ""
    assert cfg.dist.nccl.ib_disable is None
    assert cfg.dist.nccl.extra == {}


def test_train_api_and_epochs_keys_exist():
    keys = config_keys._all_keys()
    assert "train.api" in keys
    assert "train.epochs" in keys
    cfg = load(overrides=["train.api=hapi", "train.epochs=2"])
    assert (cfg.train.api, cfg.train.epochs) == ("hapi", 2)


def test_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "train:\n  epochs: 7\n  lr: 0.5\n")
    cfg = load(path, ["train.epochs=3"])
    assert cfg.train.epochs == 3
    assert cfg.train.lr == 0.5           # not overridden: the file's value


def test_later_overrides_win_over_earlier_ones():
    assert load(overrides=["train.epochs=3", "train.epochs=4"]).train.epochs == 4


def test_config_name_without_path_resolves_to_configs_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no file called mnist_lenet here
    assert config.resolve_path("mnist_lenet") == CONFIG_DIR / "mnist_lenet.yaml"
    assert load("mnist_lenet") == load(str(CONFIG_DIR / "mnist_lenet.yaml"))


def _plant_configs(folder: Path, names) -> None:
    """As another user (uid 65534, as root): configs under bundled names in a working
    directory anyone may add to, each resuming their own run."""
    folder.chmod(0o1777)
    for name in names:
        planted = folder / name
        planted.write_text("checkpoint:\n  resume: /theirs/run\ntrain:\n  lr: 0.123\n")
        if os.geteuid() == 0:
            os.chown(planted, 65534, 65534)


def test_a_bare_name_is_the_bundled_config_whatever_the_working_directory_holds(tmp_path, monkeypatch,
                                                                                capsys):
    """Issue 53, finding 4: `-c synthetic_lenet`, and no -c at all, read a file of that name
    the other user put in the working directory."""
    _plant_configs(tmp_path, ["synthetic_lenet", "mnist_lenet", "mnist_lenet.yaml"])
    monkeypatch.chdir(tmp_path)
    assert load("synthetic_lenet") == load(str(CONFIG_DIR / "synthetic_lenet.yaml"))
    assert load() == load(str(CONFIG_DIR / "mnist_lenet.yaml"))
    assert load().checkpoint.resume != "/theirs/run"
    said = capsys.readouterr().err.splitlines()
    assert said == [f"paddle_dist: config 'synthetic_lenet' is the bundled {CONFIG_DIR / 'synthetic_lenet.yaml'}; "
                    "the file synthetic_lenet in the working directory is not read (pass ./synthetic_lenet to use it)",
                    f"paddle_dist: config 'mnist_lenet' is the bundled {CONFIG_DIR / 'mnist_lenet.yaml'}; "
                    "the file mnist_lenet in the working directory is not read (pass ./mnist_lenet to use it)"]
    assert load("./synthetic_lenet").train.lr == 0.123      # asked for with a path: read


def test_a_file_in_the_working_directory_needs_a_path(tmp_path, monkeypatch):
    write(tmp_path, "train:\n  epochs: 3\n", "mine.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'mine.yaml' is no bundled config; a file in the working "
                                          r"directory needs a path: pass -c \./mine.yaml"):
        load("mine.yaml")
    assert load("./mine.yaml").train.epochs == 3
    assert load(str(tmp_path / "mine.yaml")).train.epochs == 3


def test_output_name_defaults_to_the_config_file_stem(tmp_path):
    assert load(write(tmp_path, "train:\n  epochs: 1\n", "my_job.yaml")).output.name == "my_job"


def test_empty_yaml_file_means_all_defaults(tmp_path):
    cfg = load(write(tmp_path, "# nothing here\n"))
    assert cfg == config.derived(Config(), {"output.name": "job"})


def test_a_config_is_frozen_and_derived_is_a_changed_copy():
    cfg = load(overrides=["train.epochs=3"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dist = Config().dist
    changed = config.derived(cfg, {"train.epochs": 4, "dist.nnodes": "1:2",
                                   "dist.nccl.extra.NCCL_ALGO": "Ring"})
    assert (changed.train.epochs, changed.dist.min_nnodes, changed.dist.nnodes) == (4, 1, 2)
    assert changed.dist.nccl.extra == {"NCCL_ALGO": "Ring"}
    assert (cfg.train.epochs, cfg.dist.nnodes, cfg.dist.nccl.extra) == (3, 1, {})   # as it was
    assert changed.data is cfg.data        # a section left alone is shared: nothing can change it
    assert config.replace_key(cfg, "train.epochs", 4).train.epochs == 4
    with pytest.raises(ConfigError, match="train.epochs must be an integer"):
        config.derived(cfg, {"train.epochs": "four"})


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_every_bundled_config_loads(path):
    cfg = load(str(path))
    assert cfg.output.name == path.stem
    config.validate(cfg)


def test_there_is_at_least_one_bundled_config():
    assert (CONFIG_DIR / "mnist_lenet.yaml") in BUNDLED


# ---------------------------------------------------------------- override values
@pytest.mark.parametrize("item, key, text", [
    ("train.epochs=3", "train.epochs", "3"),
    (" train.epochs = 3", "train.epochs", "3"),
    ("dist.gpus=0,1", "dist.gpus", "0,1"),
    ("output.name=", "output.name", ""),
    ("dist.nccl.extra={NCCL_ALGO: Ring}", "dist.nccl.extra", "{NCCL_ALGO: Ring}"),
])
def test_parse_override_splits_key_and_text(item, key, text):
    # The text is read later, against the key's type (see the next test).
    assert parse_override(item) == (key, text)


@pytest.mark.parametrize("item, key, value", [
    ("train.epochs=3", "train.epochs", 3),
    ("train.lr=0.25", "train.lr", 0.25),
    ("train.lr=2", "train.lr", 2.0),
    ("train.shuffle=false", "train.shuffle", False),
    ("dist.gpus=0,1", "dist.gpus", "0,1"),
    ("dist.gpus=0", "dist.gpus", "0"),             # an int for a str key becomes its text
    ("output.name='007'", "output.name", "007"),   # quotes around a string are dropped
    ('output.name="true"', "output.name", "true"),
    ("output.name=true", "output.name", "true"),
    ("train.lr=1e-3", "train.lr", 0.001),
    ("dist.nccl.ib_disable=true", "dist.nccl.ib_disable", True),
    ("dist.nccl.ib_disable=null", "dist.nccl.ib_disable", None),
])
def test_override_values_get_the_key_type(item, key, value):
    got = config.get_key(load(overrides=[item]), key)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize("text, value", [("1e-3", 0.001), ("5e-4", 0.0005)])
def test_lr_in_exponent_notation_is_a_number(tmp_path, text, value):
    assert load(overrides=[f"train.lr={text}"]).train.lr == value
    assert load(write(tmp_path, f"train:\n  lr: {text}\n")).train.lr == value


@pytest.mark.parametrize("typed", ["2024_01", "1.10"])
def test_str_override_keeps_the_text_as_typed(typed):
    assert load(overrides=[f"output.name={typed}"]).output.name == typed


@pytest.mark.parametrize("item", ["train.epochs", "train.epochs3", "=3", ""])
def test_override_without_key_and_equals_is_an_error(item):
    with pytest.raises(ConfigError, match="section.key=value"):
        load(overrides=[item])


# ---------------------------------------------------------------- unknown keys
def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match="'train.nonsense_key'"):
        load(overrides=["train.nonsense_key=1"])


def test_typo_suggests_the_closest_key():
    with pytest.raises(ConfigError) as err:
        load(overrides=["train.epoch=3"])
    assert "'train.epoch'" in str(err.value)
    assert "did you mean train.epochs?" in str(err.value)


def test_typo_in_the_yaml_file_is_caught_too(tmp_path):
    with pytest.raises(ConfigError, match="did you mean train.batch_size"):
        load(write(tmp_path, "train:\n  batch_sise: 8\n"))


def test_unknown_section_names_it_and_lists_the_sections():
    with pytest.raises(ConfigError) as err:
        load(overrides=["bogus.key=1"])
    message = str(err.value)
    assert "'bogus'" in message
    for section in ("data", "model", "train", "dist", "checkpoint", "output"):
        assert section in message


def test_a_section_cannot_be_set_to_a_scalar():
    with pytest.raises(ConfigError, match="train is a section"):
        load(overrides=["train=3"])


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n"])
def test_yaml_file_must_hold_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="mapping of sections"):
        load(write(tmp_path, text))


# ---------------------------------------------------------------- types, choices and ranges
@pytest.mark.parametrize("item, key", [
    ("train.epochs=abc", "train.epochs"),
    ("train.epochs=2.5", "train.epochs"),
    ("train.epochs=true", "train.epochs"),        # a bool is not an int here
    ("train.lr=true", "train.lr"),
    ("train.lr=fast", "train.lr"),
    ("train.shuffle=3", "train.shuffle"),
    ("train.shuffle=yes please", "train.shuffle"),
    ("dist.nccl.ib_disable=maybe", "dist.nccl.ib_disable"),
    ("dist.nccl.extra=NCCL_ALGO", "dist.nccl.extra"),
])
def test_wrong_type_is_a_config_error_naming_the_key(item, key):
    with pytest.raises(ConfigError) as err:
        load(overrides=[item])
    assert str(err.value).startswith(f"{key} must be")


def test_wrong_type_in_the_yaml_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="train.epochs must be an integer"):
        load(write(tmp_path, "train:\n  epochs: five\n"))


@pytest.mark.parametrize("item, key", [
    ("train.api=foo", "train.api"),
    ("train.optimizer=lbfgs", "train.optimizer"),
    ("dist.launcher=torchrun", "dist.launcher"),
    ("dist.backend=mpi", "dist.backend"),
    ("model.name=resnet", "model.name"),
])
def test_value_outside_the_choices_is_an_error(item, key):
    with pytest.raises(ConfigError, match=rf"^{key} must be one of"):
        load(overrides=[item])


@pytest.mark.parametrize("item, key, check", [
    ("data.name=cifar", "data.name", lambda cfg: registry.check(cfg)),
    ("sync.transport=rdma", "sync.transport", lambda cfg: transports.check(cfg.sync.transport)),
])
def test_a_name_with_no_entry_in_its_registry_is_an_error(item, key, check):
    """Data sets and transports are listed by their own packages (data/registry.py,
    sync/transports.py), which check the config's name."""
    with pytest.raises(ConfigError, match=rf"^{key} must be one of"):
        check(load(overrides=[item]))


def test_the_schemas_defaults_have_entries_in_their_registries():
    cfg = load(None, [])
    assert cfg.data.name in registry.REGISTRY and cfg.sync.transport in transports.names()
    assert list(registry.REGISTRY) == ["mnist", "cifar10", "imagefolder", "synthetic", "linear"]
    assert transports.names() == ("auto", "shm", "hierarchical", "backend")


@pytest.mark.parametrize("item, key", [
    ("train.epochs=-1", "train.epochs"),
    ("train.batch_size=-1", "train.batch_size"),
    ("dist.nprocs=0", "dist.nprocs"),
    ("checkpoint.keep_last=-1", "checkpoint.keep_last"),
    ("train.max_steps=-5", "train.max_steps"),
    ("train.lr=0", "train.lr"),
    ("train.lr=-0.1", "train.lr"),
])
def test_value_out_of_range_is_an_error(item, key):
    with pytest.raises(ConfigError, match=rf"^{key} must be .*>"):
        load(overrides=[item])


@pytest.mark.parametrize("item", ["train.max_steps=0", "checkpoint.keep_last=0",
                                  "checkpoint.every_epochs=0", "dist.nprocs=1"])
def test_range_boundaries_are_accepted(item):
    load(overrides=[item])


# ---------------------------------------------------------------- files
def test_missing_config_file_lists_the_bundled_configs(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(str(tmp_path / "nope.yaml"))
    message = str(err.value)
    assert "nope.yaml" in message and "not found" in message
    for path in BUNDLED:
        assert path.stem in message


def test_unknown_config_name_lists_the_bundled_configs():
    with pytest.raises(ConfigError, match="mnist_lenet"):
        load("no_such_config_name")


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "train:\n  epochs: 3\n  lr: [0.1\nmodel:\n  name: lenet\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    message = str(err.value)
    assert path in message
    assert "not valid YAML" in message
    line = int(message.split(" line ")[1].split()[0])
    assert 3 <= line <= 5          # the unclosed bracket opens on line 3


def test_malformed_yaml_tab_indent_names_line_2(tmp_path):
    path = write(tmp_path, "train:\n\tepochs: 3\n")
    with pytest.raises(ConfigError, match=" line 2 "):
        load(path)


# ---------------------------------------------------------------- round trips
def test_dump_then_load_round_trips(tmp_path):
    cfg = load(overrides=["train.epochs=2", "dist.nccl.ib_disable=false", "dist.gpus=0,1",
                          "dist.nccl.extra={NCCL_ALGO: Ring}", "train.lr=0.5",
                          "output.name=round"])
    path = tmp_path / "resolved.yaml"
    dump(cfg, path)
    again = load(str(path))
    assert again.to_dict() == cfg.to_dict()
    assert again == cfg


def test_dumped_yaml_is_plain_safe_yaml(tmp_path):
    path = tmp_path / "resolved.yaml"
    dump(load(), path)
    assert yaml.safe_load(path.read_text()) == load().to_dict()


def test_from_dict_of_to_dict_is_equal():
    cfg = load(overrides=["train.api=hapi", "dist.nprocs=2", "dist.nccl.debug=INFO",
                          "dist.nccl.p2p_disable=true"])
    again = from_dict(cfg.to_dict())
    assert again == cfg
    assert again is not cfg


def test_from_dict_validates():
    data = load().to_dict()
    data["train"]["epochs"] = 0
    with pytest.raises(ConfigError, match="train.epochs"):
        from_dict(data)


def test_to_dict_is_a_copy():
    cfg = load()
    data = cfg.to_dict()
    data["train"]["epochs"] = 99
    data["dist"]["nccl"]["extra"]["NCCL_X"] = "1"
    assert cfg.train.epochs != 99
    assert cfg.dist.nccl.extra == {}


# ---------------------------------------------------------------- dist.nccl.extra
def test_nccl_extra_accepts_nccl_variables(tmp_path):
    path = write(tmp_path, "dist:\n  nccl:\n    extra:\n      NCCL_ALGO: Ring\n"
                           "      NCCL_BUFFSIZE: 4194304\n")
    cfg = load(path)
    assert cfg.dist.nccl.extra == {"NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "4194304"}


def test_nccl_extra_accepts_a_mapping_override():
    cfg = load(overrides=["dist.nccl.extra={NCCL_ALGO: Tree, NCCL_PROTO: Simple}"])
    assert cfg.dist.nccl.extra == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}


@pytest.mark.parametrize("item", ["dist.nccl.extra={OMP_NUM_THREADS: 4}",
                                  "dist.nccl.extra={nccl_algo: Ring}"])
def test_nccl_extra_rejects_non_nccl_names(item):
    with pytest.raises(ConfigError) as err:
        load(overrides=[item])
    name = item.split("{")[1].split(":")[0]
    assert f"dist.nccl.extra.{name}" in str(err.value)
    assert "NCCL_" in str(err.value)


def test_nccl_extra_single_entry_override():
    # The form dist.nccl.extra's own error message uses: dist.nccl.extra.<NAME>.
    cfg = load(overrides=["dist.nccl.extra.NCCL_ALGO=Ring"])
    assert cfg.dist.nccl.extra == {"NCCL_ALGO": "Ring"}


def test_with_overrides_starts_from_the_typed_defaults():
    cfg = config.with_overrides(["train.epochs=1"])
    assert cfg.train.epochs == 1 and cfg.train.lr == config.TrainConfig().lr
    with pytest.raises(ConfigError, match="train.epochs"):
        config.with_overrides(["train.epochs=x"])


def test_the_differences_of_two_configs_are_said_key_by_key_without_what_a_resume_may_change():
    ran = config.load(None, ["train.lr=0.1"]).to_dict()
    now = config.load(None, ["train.lr=0.05", "train.epochs=9", "model.name=mlp", "dist.nprocs=4"]).to_dict()
    assert config.config_differences(ran, now) == "model.name lenet -> mlp, train.lr 0.1 -> 0.05"
    assert config.config_differences(ran, ran) == ""


# ---------------------------------------------------------------- dist.nnodes=MIN:MAX (elastic jobs)
def test_nnodes_takes_min_colon_max_as_torchrun_does():
    cfg = config.with_overrides(["dist.nnodes=1:2", "dist.master=10.0.0.1:6170"])
    assert (cfg.dist.nnodes, cfg.dist.min_nnodes) == (2, 1)
    plain = config.with_overrides(["dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    assert (plain.dist.nnodes, plain.dist.min_nnodes) == (2, 0)
    gate = launcher.gate_of(cfg, 2)
    assert (gate.min_nodes, gate.last_call) == (1, 30.0)
    assert launcher.gate_of(plain, 2).min_nodes == 0


@pytest.mark.parametrize("overrides, says", [
    (["dist.nnodes=2:1"], "must be N or MIN:MAX with 1 <= MIN <= MAX, e.g. 1:2"),
    (["dist.nnodes=0:2"], "must be N or MIN:MAX"),
    (["dist.nnodes=2", "dist.min_nnodes=3"], "dist.min_nnodes=3 is above dist.nnodes=2; give dist.nnodes=3:3"),
])
def test_a_wrong_range_is_refused_with_the_fix(overrides, says):
    with pytest.raises(ConfigError) as e:
        config.with_overrides(overrides + ["dist.master=10.0.0.1:6170"])
    assert says in str(e.value)


# ---------------------------------------------------------------- config_hash (a checkpoint's meta records it)
HASHED = {"data": {"name": "mnist"}, "model": {"name": "lenet"},
          "train": {"lr": 0.001, "epochs": 5, "max_steps": 0, "log_every": 20, "seed": 2024},
          "dist": {"nprocs": 2, "max_restarts": 0},
          "checkpoint": {"every_epochs": 1, "keep_last": 3, "resume": "auto"},
          "output": {"root": "runs", "run_dir": ""}, "faults": {"inject": ""}}


def changed(dotted, value):
    cfg = json.loads(json.dumps(HASHED))
    section, key = dotted.split(".")
    cfg[section][key] = value
    return cfg


def test_config_hash_is_16_hex_digits_and_stable():
    digest = config_hash(HASHED)
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert config_hash(json.loads(json.dumps(HASHED, sort_keys=True))) == digest


@pytest.mark.parametrize("dotted, value", [
    ("train.epochs", 50), ("train.max_steps", 7), ("train.log_every", 1), ("dist.max_restarts", 3),
    ("checkpoint.resume", "none"), ("checkpoint.keep_last", 9), ("output.run_dir", "/x"),
    ("faults.inject", "raise:1:5"), ("dist.nprocs", 3)])
def test_config_hash_ignores_what_a_resume_may_change(dotted, value):
    assert config_hash(changed(dotted, value)) == config_hash(HASHED)


@pytest.mark.parametrize("dotted, value", [
    ("train.lr", 0.01), ("train.seed", 1), ("model.name", "mlp"), ("data.name", "cifar10")])
def test_config_hash_sees_what_changes_training(dotted, value):
    assert config_hash(changed(dotted, value)) != config_hash(HASHED)


def test_config_hash_leaves_its_input_alone():
    cfg = json.loads(json.dumps(HASHED))
    config_hash(cfg)
    assert cfg == HASHED
