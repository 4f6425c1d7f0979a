# `make demo` and `make test` set everything up themselves in .venv.
# GPU machines: make demo PADDLE=paddlepaddle-gpu   (or any pip requirement for Paddle)
PYTHON ?= python3
VENV ?= .venv
PADDLE ?= paddlepaddle==3.3.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(subst =,_,$(subst /,_,$(PADDLE)))
PIP_QUIET := --quiet --disable-pip-version-check
# pipefail: a failing pip must fail the target even though its output is filtered.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# paddlepaddle and paddlepaddle-gpu both provide `paddle`: remove the other one first.
OTHER_PADDLE := $(if $(findstring gpu,$(PADDLE)),paddlepaddle,paddlepaddle-gpu)
# Paddle 2.6 was built for numpy 1: with numpy 2, importing numpy.random after paddle crashes.
NUMPY := $(if $(findstring ==2.6,$(PADDLE)),"numpy<2" "pandas<3",)
# `import paddle` imports setuptools; before 66, setuptools imports pkg_resources, which
# scans every installed package: 0.2 CPU-s more per rank than a current one (Python 3.11's
# venv brings 65.5). <81: Paddle's cpp_extension imports setuptools' easy_install command.
SETUPTOOLS := "setuptools>=70,<81"

# The compat stage (.ci/run): the unit tests and the key flows on other supported Paddle
# versions, each in a venv of its own (.venv-<version>).
COMPAT_PADDLES ?= 2.6.2 3.2.2
COMPAT_MARK ?= compat

# `make test` runs the suite on TEST_WORKERS pytest-xdist workers (most tests wait on
# processes, sockets and timeouts: more workers than cores keep the cores busy; on 2 cores
# 3 take 10:03; measured before ranks imported paddle with the collector paused, 3 took
# 11:50 where 2 took 13:23 and 4 were slower still: more ranks contend), then the few
# marked `serial` alone (their outcome depends on how a job's ranks are scheduled). Tests
# marked `waits` (mostly a timeout running out) are spread over the run (tests/conftest.py).
# Tests that share a fixture built once per module or session (a trained run, the Slurm
# cluster) run on one worker (tests/conftest.py). TEST_WORKERS=0: one process, no xdist.
TEST_WORKERS ?= 3
# pytest keeps each test module's rewritten bytecode only where Python may write bytecode:
# without it, every xdist worker would rewrite every test module again.
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup)
# The files that hold `serial` tests: their run collects those alone (tests when none).
SERIAL_FILES = $(or $(shell grep -rl --include='test_*.py' 'mark\.serial' tests),tests)

.PHONY: demo test check compat bench setup system-deps bytecode clean

demo: $(STAMP)
	$(PY) train.py -o dist.nprocs=2

test: $(STAMP) system-deps bytecode
ifeq ($(TEST_WORKERS),0)
	$(PYTEST) tests -q -p no:xdist
else
	@status=0; \
	$(PYTEST) tests -q $(XDIST) -m "not serial" || status=$$?; \
	$(PYTEST) $(SERIAL_FILES) -q -p no:xdist -m serial || status=$$?; \
	exit $$status
endif

# The inner loop: the unit tests (the import rules among them), one process, about two minutes.
check: $(STAMP) bytecode
	$(PYTEST) tests/unit -q -p no:xdist

# The tests start hundreds of Python processes; with PYTHONDONTWRITEBYTECODE set (as in
# many containers) each would compile paddle_dist again. Compiled once here, they only read.
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 paddle_dist tests tools train.py >/dev/null

compat: system-deps
	@for v in $(COMPAT_PADDLES); do \
		echo "== compat: Paddle $$v"; \
		$(MAKE) --no-print-directory setup VENV=.venv-$$v PADDLE=paddlepaddle==$$v && \
		PYTHONDONTWRITEBYTECODE= .venv-$$v/bin/python -m pytest -q tests/unit && \
		PYTHONDONTWRITEBYTECODE= .venv-$$v/bin/python -m pytest -q tests/integration -m "$(COMPAT_MARK)" || exit 1; \
	done

# The numbers in docs/benchmarks.md (about 80 minutes on 2 cores; run nothing else meanwhile;
# bench_link needs root and skips otherwise).
# PyTorch, when installed in the venv, adds the torch_ddp variant.
BENCH_OUT ?= bench-results
bench: $(STAMP)
	mkdir -p $(BENCH_OUT)
	$(PY) tools/bench_train.py --model lenet --nprocs 2 --reps 5 \
		--variants paddle_dist,paddle_dist_hapi,paddle_dist_dpsync,paddle_dataparallel$$($(PY) -c 'import torch' 2>/dev/null && echo ,torch_ddp) \
		--variant gloo=sync.transport=backend --json $(BENCH_OUT)/train_lenet.json
	$(PY) tools/bench_train.py --model mlp --nprocs 2 --reps 5 \
		--variants paddle_dist,paddle_dist_hapi,paddle_dist_dpsync,paddle_dataparallel$$($(PY) -c 'import torch' 2>/dev/null && echo ,torch_ddp) \
		--variant gloo=sync.transport=backend --variant bf16=sync.compress=bf16 --json $(BENCH_OUT)/train_mlp.json
	for m in lenet mlp; do $(PY) tools/bench_train.py --model $$m --nprocs 2 --reps 4 \
		--variants paddle_dist --variant dataloader=data.batched=false --json $(BENCH_OUT)/data_$$m.json; done
	for t in backend shm; do $(PY) -m paddle_dist.launch --nprocs 2 --log_dir $(BENCH_OUT)/log \
		tools/allreduce_perf.py -b 1K -e 64M -f 4 --transport $$t --json $(BENCH_OUT)/allreduce_$$t.json; done
	for m in lenet mlp; do $(PY) tools/bench_overhead.py --model $$m \
		--variants paddle_dist_dpsync,paddle_dist_hapi_dpsync --json $(BENCH_OUT)/overhead_$$m.json; done
	$(PY) tools/bench_tokens.py --variants fit,fit_mean,fit_hapi,fit_dpsync --launches 2 --steps 200 \
		--eval-every 40 --json $(BENCH_OUT)/tokens.json
	$(PY) tools/bench_startup.py --runs 10 --json $(BENCH_OUT)/startup.json
	$(PY) tools/bench_batchstats.py --nprocs 2 --pairs 6 --json $(BENCH_OUT)/batchstats.json
	$(PY) tools/bench_sync_buffers.py --nprocs 2 --chunks 30 --chunk 20 --batch 32 --json $(BENCH_OUT)/sync_buffers.json
	for n in 2 4 8; do for m in lenet mlp; do $(PY) tools/bench_train.py --model $$m --nprocs $$n --reps 2 \
		--variants paddle_dist,paddle_dataparallel,no_sync --json $(BENCH_OUT)/scale_$${m}_$$n.json; done; done
	for t in backend shm; do for n in 4 8; do $(PY) -m paddle_dist.launch --nprocs $$n --log_dir $(BENCH_OUT)/log \
		tools/allreduce_perf.py -b 64K -e 16M -f 4 --transport $$t --json $(BENCH_OUT)/ranks$${n}_$$t.json; done; done
	$(PY) tools/bench_link.py --model lenet --link 100mbit --reps 3 \
		--variant overlap_bf16=sync.mode=overlap,sync.compress=bf16 --json $(BENCH_OUT)/link_lenet.json
	$(PY) tools/bench_link.py --model lenet --link 100mbit --reps 3 --ranks-per-host 2 --variants dataparallel \
		--variant hierarchical=sync.mode=overlap --variant flat=sync.mode=overlap,sync.transport=backend \
		--json $(BENCH_OUT)/link_lenet_2x2.json
	$(PY) tools/plot_bench.py $(BENCH_OUT) docs/img

# OpenMPI (mpirun tests), iproute2 (two-host tests in network namespaces), Chromium
# (the VisualDL page rendered by tools/visualdl_shot.py) and Slurm with munge (a one-node
# cluster that tests/integration/slurm.py starts for the test run and stops after it):
# installed when we may (root with apt-get); otherwise the tests that need them skip, saying why.
SYSTEM_COMMANDS := mpirun ip chromium slurmd slurmctld srun munged
SYSTEM_PACKAGES := openmpi-bin iproute2 chromium slurmd slurmctld slurm-client munge
system-deps:
	@missing=$$(for c in $(SYSTEM_COMMANDS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$c >/dev/null || echo $$c; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing $(SYSTEM_PACKAGES) (missing: $$(echo $$missing))"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
		else echo "note: $$(echo $$missing) missing and not root: their tests will be skipped"; fi; \
	fi

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 9))' || \
		{ echo "error: Python 3.9+ is needed (found $$($(PYTHON) --version 2>&1)); set PYTHON=python3.X"; exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
		rm -rf $(VENV); \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); \
		else echo "error: '$(PYTHON) -m venv' failed; install your distribution's venv package (Debian: apt-get install python3-venv)"; exit 2; fi; }
	$(PY) -m pip uninstall $(PIP_QUIET) -y $(OTHER_PADDLE) 2>&1 | { grep -v -e "^WARNING" -e "not installed" || true; }
	$(PY) -m pip install $(PIP_QUIET) "$(PADDLE)" $(NUMPY) $(SETUPTOOLS) -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -c "import paddle_dist, paddle, visualdl, yaml"
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

clean:
	rm -rf runs log .pytest_cache bench-results .venv-*
