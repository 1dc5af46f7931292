# Every target calls tasks.py, so `python tasks.py <target>` does the same without make.
PYTHON ?= python3

.PHONY: lab test execute bench setup doctor lint
lab:
	@$(PYTHON) tasks.py lab
test:
	@$(PYTHON) tasks.py test
execute:
	@$(PYTHON) tasks.py execute
bench:
	@$(PYTHON) tasks.py bench
setup:
	@$(PYTHON) tasks.py setup
doctor: setup
	@.venv/bin/python -m course_utils doctor
lint: setup
	@.venv/bin/python -m ruff check course_utils tests notebooks/scripts tasks.py
