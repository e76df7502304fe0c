# oxygen_ros: one-command environment, demo and tests.
#   make setup   create .venv with pinned dependencies and the built ROS 2 messages (idempotent)
#   make demo    closed loop over ROS 2: the node's embedded model drives the tabletop simulator (~20 s)
#   make test    run the whole test suite
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.oxygen-setup-stamp

.PHONY: setup demo test lint bench profile clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python requirements.txt constraints.txt setup.py setup.cfg \
		CMakeLists.txt package.xml tools/build_msgs.sh $(wildcard msg/*.msg)
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	bash tools/build_msgs.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python -m oxygen_ros.demo --duration 20

test: setup
	$(BIN)/python -m pytest -q test

lint: setup
	$(BIN)/ruff check .

profile: setup
	$(BIN)/oxygen-profile --config tiny

clean:
	rm -rf $(VENV) build install log .pytest_cache
