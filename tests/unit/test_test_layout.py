"""Where a module's tests are: every module with logic under paddle_dist/<package>/ has a test file
named after it, tests/unit/<package>/test_<module>.py, or is listed in WITHOUT_A_TEST_FILE with
the reason it has none. A reader who opens a module finds its tests by its name, and a test file
that covers several modules is split by what it tests.

The name: a module of a subpackage has its test file in its top package's folder
(runtime/scripthooks/buffers.py: tests/unit/runtime/test_buffers.py); leading and trailing
underscores are dropped (__main__.py: test_main.py, _deadline.py: test_deadline.py). A
package's face (__init__.py: a docstring and re-exports) needs no file of its own. The
top-level modules (paddle_dist/*.py) are not under this rule; most have tests/unit/test_<module>.py.

The list must stay true: an entry for a module that has a test file, or that is gone, fails
(a folder's entry, once every module in it has one).
"""

from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "paddle_dist"
UNIT = ROOT / "tests" / "unit"

# module (relative to paddle_dist/) -> why it has no test file of its name. A folder ("trainer/")
# stands for each of its modules that has none.
WITHOUT_A_TEST_FILE: Dict[str, str] = {
    # No logic: a command's entry that runs another module's main, constants, records.
    "cifar/__main__.py": "`python -m paddle_dist.cifar`: options.run(fake.main); test_fake.py runs it",
    "doctor/__main__.py": "`python -m paddle_dist.doctor`: options.run(facts.main); test_facts.py runs it",
    "runs/__main__.py": "`python -m paddle_dist.runs`: options.run(listing.main); test_listing.py runs it",
    "cifar/layout.py": "constants, the one-line DataError and Paddle's cache path; test_read.py and "
                       "test_download.py check them in use",
    # Logic tested through the module that drives it.
    "launch/host.py": "node 0's side of the machines' meeting: test_rendezvous.py meets through it on loopback",
    "launch/mpirun.py": "mpirun's hostfile and command line: test_launcher.py plans mpirun jobs",
    "launch/outcome.py": "a job's typed result and its report: test_supervisor.py ends real ranks in one",
    "runs/status.py": "the status record type: test_listing.py, test_report.py and tests/unit/test_errors.py "
                      "write and read records",
    "runtime/_deadline.py": "the watchdog process, a plain script: test_watchdog.py checks its verdicts, "
                            "tests/integration/test_hangs.py runs it",
    "runtime/process.py": "a rank's set-up (process group, seeds, run directory) needs ranks: every job of "
                          "tests/integration runs it",
    "security/credentials.py": "each credential read once per process, over auth.py and tls.py (test_auth.py, "
                               "test_tls.py); the meeting's tests read through it",
    "security/safepickle.py": "the unpickler that builds arrays only: checkpoint/test_weights.py loads "
                              ".pdparams files through it",
    "security/storewire.py": "Paddle's TCPStore wire format: tests/integration/test_storewire.py speaks it "
                             "to a real store",
    "sync/collectives.py": "collectives watched by the hang watchdog: test_grad_sync.py, test_overlap.py and "
                           "the multi-rank integration tests run through them",
    "sync/wiring.py": "the optimizer's wiring: test_grad_sync.py attaches GradSync and closes it; what "
                      "DataParallel is built (a broadcast): tests/integration/test_sparse_tables.py in every mode",
    # The trainer's front ends and composition root: thin over tested modules, run by every job.
    "trainer/job.py": "train(), the composition root: every fit() and train() job of tests/integration "
                      "runs it (test_world_size_steps.py, test_whole_state.py, test_replay_matrix.py)",
    "trainer/loop.py": "the loop's front end, thin over engine.py (test_engine.py) and session.py: every "
                       "loop job of tests/integration runs it",
    "trainer/hapi.py": "the paddle.Model front end, thin over engine.py and session.py: every hapi job of "
                       "tests/integration runs it, and doctor/test_selftest.py its prepared model",
    "trainer/callbacks.py": "paddle.callbacks.Callback's events: tests/integration/test_fit_habits.py runs "
                            "users' callbacks (EarlyStopping, an EMA, a recorder) through fit() at both levels",
    "trainer/streamplan.py": "a stream's reader under the plan: tests/unit/trainer/test_streams.py reads "
                             "streams.py's lanes through it (every test there runs both)",
    "trainer/untrained.py": "the line for parameters no rank trained needs ranks: tests/integration/"
                            "test_fit_habits.py trains a model with a branch no batch reaches",
}


def package_modules() -> List[str]:
    """Every module of a package under paddle_dist/, relative to it, faces left out."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.glob("*/**/*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_file_of(module: str) -> Path:
    """The test file a module's name gives: runtime/scripthooks/buffers.py ->
    tests/unit/runtime/test_buffers.py, launch/__main__.py -> tests/unit/launch/test_main.py."""
    path = Path(module)
    return UNIT / path.parts[0] / f"test_{path.stem.strip('_')}.py"


test_file_of.__test__ = False       # a helper, not a test


def listed(module: str) -> bool:
    """Whether WITHOUT_A_TEST_FILE names the module, or a folder above it."""
    return module in WITHOUT_A_TEST_FILE or any(
        key.endswith("/") and module.startswith(key) for key in WITHOUT_A_TEST_FILE)


def test_every_module_with_logic_has_a_test_file_of_its_name_or_a_reason():
    missing = [m for m in package_modules() if not test_file_of(m).is_file() and not listed(m)]
    assert not missing, ("modules without a test file: " + ", ".join(
        f"paddle_dist/{m} (add {test_file_of(m).relative_to(ROOT)}, or list it in WITHOUT_A_TEST_FILE "
        "with the reason)" for m in missing))


def test_the_list_of_modules_without_a_test_file_is_true():
    modules = set(package_modules())
    folders = {key: [m for m in modules if m.startswith(key)] for key in WITHOUT_A_TEST_FILE if key.endswith("/")}
    gone = [m for m in WITHOUT_A_TEST_FILE if m not in modules and not folders.get(m)]
    tested = [m for m in WITHOUT_A_TEST_FILE if m in modules and test_file_of(m).is_file()]
    tested += [key for key, inside in folders.items() if inside and all(test_file_of(m).is_file() for m in inside)]
    assert not gone, f"WITHOUT_A_TEST_FILE lists modules that are gone: {', '.join(gone)}"
    assert not tested, f"WITHOUT_A_TEST_FILE lists modules that have a test file now: {', '.join(tested)}"


def test_the_name_rule():
    assert test_file_of("runtime/scripthooks/buffers.py") == UNIT / "runtime" / "test_buffers.py"
    assert test_file_of("launch/__main__.py") == UNIT / "launch" / "test_main.py"
    assert test_file_of("runtime/_deadline.py") == UNIT / "runtime" / "test_deadline.py"
    assert "checkpoint/io.py" in package_modules() and "checkpoint/__init__.py" not in package_modules()
    assert listed("cifar/layout.py") and not listed("checkpoint/io.py")
