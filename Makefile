# The README's commands. Python packages go into the active Python environment (use a venv
# if you want isolation: `python3 -m venv .venv && . .venv/bin/activate` before `make`).
PYTHON ?= python3
JOBS ?= 2
APT_PACKAGES := xtensor-dev libgtest-dev g++ cmake openmpi-bin libopenmpi-dev
export CMAKE_BUILD_PARALLEL_LEVEL := $(JOBS)

.PHONY: conformance fuzz notebooks demo test system-deps install cpp-test cpp-test-sanitize py-test mpi-test bench docs

demo: install
	$(PYTHON) -m shardlab.demo

test: install cpp-test cpp-test-sanitize py-test mpi-test

# Debian packages, installed only when missing (so a second run does nothing).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# The package with its test extra (jax, hypothesis, nbclient, ...). build/wheel keeps the CMake
# build between runs, so a second install only relinks what changed.
install: system-deps
	$(PYTHON) -m pip install -q --upgrade "pip>=23" "scikit-build-core>=0.10" "pybind11>=3" ninja cmake
	$(PYTHON) -m pip install -q --no-build-isolation ".[test]"

cpp-test: system-deps
	cmake -S . -B build/ctest -G Ninja -DSHARDLAB_BUILD_TESTS=ON -DSHARDLAB_BUILD_PYTHON=OFF
	cmake --build build/ctest
	ctest --test-dir build/ctest --output-on-failure -j $(JOBS)

# The same GoogleTest suites under AddressSanitizer + UndefinedBehaviorSanitizer.
cpp-test-sanitize: system-deps
	cmake -S . -B build/asan -G Ninja -DSHARDLAB_BUILD_TESTS=ON -DSHARDLAB_BUILD_PYTHON=OFF \
	  -DSHARDLAB_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build/asan
	ASAN_OPTIONS=detect_leaks=0 SHARDLAB_TEST_QUICK=1 ctest --test-dir build/asan --output-on-failure -j $(JOBS)

# tests/python (JAX comparisons and notebooks included) and the docstring examples of the
# installed package, in one pytest run.
py-test:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/python --doctest-modules --pyargs shardlab

# The MPI suite (tests/mpi) on 2 ranks, and a smoke run on 4: every rank compares the MPI run
# with the one-process run. Open MPI comes with system-deps, mpi4py with the [test] extra; the
# OMPI_* variables let mpirun run as root (in a container).
MPIRUN := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe
# On 2 ranks: tests/mpi, the shard_map suites and the global-view suites (JAX comparisons
# included; tests marked one_process read every device's data and are left out).
MPI_SUITES := tests/mpi tests/python/test_shard_map.py tests/python/test_shard_map_api.py \
  tests/python/test_global_ops.py tests/python/test_explicit_ops.py tests/python/test_global_numpy.py \
  tests/python/test_explicit_types.py tests/python/test_sharding.py
mpi-test: install
	$(MPIRUN) -n 2 $(PYTHON) -m pytest -q -p no:cacheprovider -m "not one_process" $(MPI_SUITES)
	$(MPIRUN) -n 4 $(PYTHON) -m pytest -q -p no:cacheprovider tests/mpi -k "reductions or all_gather or faults or global or serving or trainer"

# Every benchmark script in benchmarks/ with their extra (torch for SDPA, threadpoolctl for the
# OpenBLAS kernel name), OpenBLAS on its best kernel for this CPU; each prints ours, the
# competitor's figure from the same run and the ratio (docs/benchmarks.md keeps the current ones).
BENCHMARKS := $(filter-out benchmarks/bench_mpi.py,$(sort $(wildcard benchmarks/bench_*.py))) benchmarks/attention_memory.py
bench: install
	$(PYTHON) -m pip install -q --no-build-isolation ".[bench]" "mpi4py>=3.1"
	@for b in $(BENCHMARKS); do echo "== $$b"; \
	  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PYTHON) $$b || exit 1; done
	@echo "== benchmarks/bench_mpi.py (2 ranks)"; $(MPIRUN) -n 2 $(PYTHON) benchmarks/bench_mpi.py collectives
	@echo "== benchmarks/bench_mpi.py train (1, 2 and 4 ranks)"; $(PYTHON) benchmarks/bench_mpi.py train

# The docs site (MkDocs strict mode: broken links and docstring warnings fail) into site/.
docs: install
	$(PYTHON) -m pip install -q ".[docs]"
	$(PYTHON) -m mkdocs build --strict -d site

# Re-executes the notebooks in place (their committed outputs are the current code's).
notebooks: install
	$(PYTHON) docs/run_notebooks.py

# The hypothesis fuzzing of tests/python/test_fuzz*.py (collectives and cost arguments, shard_map
# programs against JAX, the global view, Trainer steps, serve generate / estimate) with the long
# profile: 10,000 examples per test (hours; the test command runs a few per test).
fuzz:
	HYPOTHESIS_PROFILE=fuzz $(PYTHON) -m pytest -q -p no:cacheprovider tests/python/test_fuzz*.py

# The import-swap acceptance (issue #24 §6): every committed document of tests/data/conformance run
# cell by cell with JAX and with shardlab's imports; writes docs/conformance.md.
conformance:
	$(PYTHON) tests/python/conformance.py --report docs/conformance.md
