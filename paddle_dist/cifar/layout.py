"""What CIFAR-10 is on disk: its three forms, file names, sizes, classes and statistics,
where Paddle keeps it, and the one-line error every problem with its files becomes.

Example:
    default_root() / ARCHIVE    # ~/.cache/paddle/dataset/cifar/cifar-10-python.tar.gz
"""

from pathlib import Path

from ..errors import DataError

NUM_CLASSES = 10
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Where and what paddle.vision.datasets.Cifar10 downloads.
URL = "https://dataset.bj.bcebos.com/cifar/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE = "cifar-10-python.tar.gz"
PY_DIR = "cifar-10-batches-py"
BIN_DIR = "cifar-10-batches-bin"
FORMS = ("tar.gz", "batches-py", "batches-bin")
BATCHES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
_PIXELS = 3 * 32 * 32
_RECORD = 1 + _PIXELS           # a .bin record: the label byte, then 1024 R, 1024 G, 1024 B
_PAD = 4
_MARKERS = {"batches-py": ("data_batch_1", "test_batch"),
            "batches-bin": ("data_batch_1.bin", "test_batch.bin")}
_EXPECTED = (f"{ARCHIVE} (tar.gz), a {PY_DIR}/ directory with data_batch_1..data_batch_5 and "
             f"test_batch (batches-py), or a {BIN_DIR}/ directory with data_batch_1.bin.."
             "data_batch_5.bin and test_batch.bin (batches-bin)")
_FIX_MISSING = ("set data.root to one of them (or to the directory holding it), or leave data.root "
                f"empty to download {ARCHIVE} into ~/.cache/paddle/dataset/cifar")
_FIX_CORRUPT = ("replace it with an intact copy of CIFAR-10 (if it is Paddle's cached archive, "
                "delete it and leave data.root empty to download it again)")
_FIX_DOWNLOAD = f"check the network or proxy, or download {ARCHIVE} by hand and set data.root to it"
_PROGRESS_SECONDS = 5.0


def _error(where, what, fix=_FIX_CORRUPT):
    """A one-line DataError: the file, what is wrong with it, how to fix it."""
    return DataError(" ".join(f"{where}: {what}; {fix}".split()))


def default_root() -> Path:
    """Paddle's CIFAR cache, where paddle.vision.datasets.Cifar10 keeps cifar-10-python.tar.gz.

    Example:
        default_root()   # PosixPath('/home/me/.cache/paddle/dataset/cifar')
    """
    # Resolved at every call (Paddle does it once, at import), so a changed $HOME is honoured.
    return Path("~/.cache/paddle/dataset/cifar").expanduser()
