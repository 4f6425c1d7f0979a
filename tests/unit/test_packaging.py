"""setup.cfg ships the whole package: its packages are listed (the bundled configs/ ships
as paddle_dist.configs, which package discovery cannot express), so a new subpackage or
data file that is not listed would be missing from a wheel while an editable checkout
works. tests/integration/test_install.py builds and runs the wheel itself.
"""

import configparser
import fnmatch
from pathlib import Path

from paddle_dist.schema import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[2]


def _setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def _lines(text: str):
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def _mapping(text: str):
    return dict((k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in _lines(text)))


def source_dirs():
    """Package name -> its directory in the checkout, as setup.cfg maps them."""
    options = _setup_cfg()["options"]
    moved = _mapping(options.get("package_dir", ""))
    return {name: ROOT / moved.get(name, name.replace(".", "/")) for name in _lines(options["packages"])}


def test_every_directory_with_files_in_the_package_is_listed():
    listed = {path.resolve() for path in source_dirs().values()}
    holding = {path.parent.resolve() for path in (ROOT / "paddle_dist").rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in holding - listed)
    assert not missing, f"add to setup.cfg [options] packages: {missing}"


def test_every_listed_package_exists_and_its_data_files_are_package_data():
    globs = {name: _lines(pattern) for name, pattern in _setup_cfg()["options.package_data"].items()}
    for name, path in source_dirs().items():
        assert path.is_dir(), f"setup.cfg lists {name} but {path} does not exist"
        data = [p.name for p in path.iterdir() if p.is_file() and p.suffix != ".py"]
        left = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs.get(name, []))]
        assert not left, f"{name}: {left} would not be in the wheel; add them to package_data"


def test_the_bundled_configs_ship_from_the_top_level_configs_directory():
    assert source_dirs()["paddle_dist.configs"] == ROOT / "configs"
    assert CONFIG_DIR == ROOT / "configs"          # this checkout: the top-level directory
    assert sorted(CONFIG_DIR.glob("*.yaml")), "no bundled configs"
