# Two commands do everything on a fresh machine: `make test` and `make figures`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: test figures docs lint bench clean native

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# the compiled backend (precision_lab.backends._native and _native_kernels): rebuilt when its sources change; `make test`
# requires it to load (PRECISION_LAB_REQUIRE_NATIVE=1: a missing or stale build fails the run)
B          = precision_lab/backends
NATIVE_SRC = setup.py $(B)/native/sources.py \
             $(wildcard $(B)/native/*.cpp $(B)/native/*.h $(B)/native/*.inc $(B)/cuda/*.cuh)
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
	$(VENV)/bin/lint-imports
	PRECISION_LAB_REQUIRE_NATIVE=1 $(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

figures: $(NATIVE)
	$(PY) -m precision_lab.figures

# the documentation site: executes the notebooks once into docs/notebooks/ (ignored), then Sphinx
# with warnings as errors; open docs/_build/html/index.html
docs: $(NATIVE)
	rm -rf docs/_build/html
	$(PY) docs/execute_notebooks.py
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

bench: $(NATIVE)
	$(PY) benchmarks/bench_cast.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache docs/_build docs/notebooks docs/api
	rm -f precision_lab/backends/*.so precision_lab/backends/*.pyd
