# oxygen_ros: one-command environment, demo and tests.
#   make setup   create .venv with pinned dependencies and the built ROS 2 messages (idempotent)
#   make demo    closed loop over ROS 2: the node's embedded model drives the tabletop simulator (~20 s)
#   make demo-executor   the same through the chunk executor (node -> executor setpoints -> simulator)
#   make test    run the whole test suite
#   make env     print the shell environment `oxygen-launch` needs: eval "$(make -s env)" (or . tools/ros_env.sh)
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.oxygen-setup-stamp
SHARE := $(VENV)/share/oxygen_ros
# launch / launch_ros / launch_pytest / launch_testing wheels (not on PyPI) and composition_interfaces' source:
# installed into the venv when this folder is there, else skipped (the launch tests then skip with the reason).
ROS2_LAUNCH_DIR ?= ../shared/ros2_launch
LAUNCH_WHEELS := $(sort $(wildcard $(ROS2_LAUNCH_DIR)/wheels/*.whl))
LAUNCH_IFACE := $(ROS2_LAUNCH_DIR)/src/composition_interfaces
LAUNCH_STAMP := $(VENV)/.oxygen-launch-stamp
SETUP_STAMPS := $(STAMP) $(if $(LAUNCH_WHEELS),$(LAUNCH_STAMP))

.PHONY: setup demo demo-executor test lint bench profile clean env

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The share copies of launch/ and config/ that `pip install -e .` makes are replaced by symlinks to the repository's
# directories (tools/build_msgs.sh), so the launch file that runs is the edited one; the links are removed first so
# that pip never writes through them.
$(STAMP): $(BIN)/python requirements.txt requirements-nodeps.txt constraints.txt setup.py setup.cfg Makefile \
		CMakeLists.txt package.xml tools/build_msgs.sh tools/wheel_include_fix.cmake $(wildcard msg/*.msg action/*.action)
	$(BIN)/pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	for d in launch config; do if [ -L $(SHARE)/$$d ]; then rm $(SHARE)/$$d; fi; done
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	bash tools/build_msgs.sh $(VENV)
	touch $(STAMP)

# --no-deps: launch_ros declares ament-index-python, which PyPI names ros-ament-index-python (installed above).
$(LAUNCH_STAMP): $(STAMP) requirements-launch.txt $(LAUNCH_WHEELS) tools/wheel_include_fix.cmake \
		$(wildcard $(LAUNCH_IFACE)/CMakeLists.txt $(LAUNCH_IFACE)/package.xml $(LAUNCH_IFACE)/srv/*.srv)
	$(BIN)/pip install -q -r requirements-launch.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps $(LAUNCH_WHEELS)
	bash tools/build_msgs.sh $(VENV) $(LAUNCH_IFACE)
	touch $(LAUNCH_STAMP)

setup: $(SETUP_STAMPS)

env: setup
	@bash tools/ros_env.sh --print $(VENV)

demo: setup
	$(BIN)/python -m oxygen_ros.demo --duration 20

demo-executor: setup
	$(BIN)/python -m oxygen_ros.demo --duration 20 --executor

test: setup
	$(BIN)/python -m pytest -q test

lint: setup
	$(BIN)/ruff check .

profile: setup
	$(BIN)/oxygen-profile --config tiny

clean:
	rm -rf $(VENV) build install log .pytest_cache
