# Two commands do everything on a fresh machine: `make test` and `make figures`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: test figures lint bench clean native

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# the compiled backend (precision_lab._native): rebuilt when its sources change; `make test`
# requires it to load (PRECISION_LAB_REQUIRE_NATIVE=1: a missing or stale build fails the run)
NATIVE_SRC = setup.py precision_lab/native/sources.py \
             $(wildcard precision_lab/native/*.cpp precision_lab/native/*.h precision_lab/native/*.inc \
               precision_lab/cuda/*.cuh)
NATIVE     = $(VENV)/.native

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	PRECISION_LAB_REQUIRE_NATIVE=1 $(PY) -c "import precision_lab" 2>/dev/null || \
		$(PY) -m pip install -q --no-deps -e .
	touch $(NATIVE)

native: $(NATIVE)

test: $(NATIVE)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	PRECISION_LAB_REQUIRE_NATIVE=1 $(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile

figures: $(NATIVE)
	$(PY) -m precision_lab.figures

bench: $(NATIVE)
	$(PY) benchmarks/bench_cast.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
	rm -f precision_lab/*.so precision_lab/*.pyd
