"""paddle_dist.cifar as a package: importing it imports no paddle. The fake copies and helpers here
serve its modules' tests (test_read, test_download, test_augmentation, test_fake): real files in
tmp_path, a real HTTP server on 127.0.0.1."""

import subprocess
import sys
from pathlib import Path

import pytest

from paddle_dist import cifar

from tests.oracles import free_port

REPO = Path(__file__).resolve().parents[3]
TRAIN, TEST = cifar.fake_arrays(50, 10, seed=0)


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """{form: the data.root write_fake returned}, each in its own directory, written once."""
    base = tmp_path_factory.mktemp("forms")
    return {form: cifar.write_fake(base / form.replace(".", "_"), form) for form in cifar.FORMS}


def assert_one_line_naming(info, path):
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message


def closed_port_url():
    return f"http://127.0.0.1:{free_port()}/{cifar.ARCHIVE}"


def test_import_does_not_import_paddle():
    code = "import paddle_dist.cifar, sys; assert 'paddle' not in sys.modules, 'paddle imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
