# Every target calls tasks.py, so `python tasks.py <target>` does the same without make.
PYTHON ?= python3

.PHONY: lab lab-zh test test-spawn test-pythons test-gpu test-slurm test-browser test-portable book test-book hub test-hub execute bench stress setup doctor lint wheelhouse check-wheelhouse slides guide
lab:
	@$(PYTHON) tasks.py lab
# the Chinese edition (notebooks-zh/), in a JupyterLab in Chinese
lab-zh:
	@$(PYTHON) tasks.py lab-zh
test:
	@$(PYTHON) tasks.py test
test-spawn:
	@$(PYTHON) tasks.py test-spawn
test-pythons:
	@$(PYTHON) tasks.py test-pythons
test-gpu:
	@$(PYTHON) tasks.py test-gpu
test-slurm:
	@$(PYTHON) tasks.py test-slurm
test-browser:
	@$(PYTHON) tasks.py test-browser
# strict nbval of both editions under other CPU levels (no vector extensions, AVX2) and on one core
test-portable:
	@$(PYTHON) tasks.py test-portable
# the workshop room on a Linux server, as root: a JupyterHub for the class (`python3 tasks.py hub --help`)
hub:
	@$(PYTHON) tasks.py hub
test-hub:
	@$(PYTHON) tasks.py test-hub
# the course as a static website, both editions, from the stored outputs (_build/book/; README), and its
# checks in headless Chromium
book:
	@$(PYTHON) tasks.py book
test-book:
	@$(PYTHON) tasks.py test-book
execute:
	@$(PYTHON) tasks.py execute
bench:
	@$(PYTHON) tasks.py bench
stress:
	@$(PYTHON) tasks.py stress
setup:
	@$(PYTHON) tasks.py setup
# the offline install for a workshop room (README): every pinned package as wheels in wheelhouse/,
# which setup then installs from alone; check-wheelhouse proves it in a fresh venv
wheelhouse:
	@$(PYTHON) tasks.py wheelhouse
check-wheelhouse:
	@$(PYTHON) tasks.py check-wheelhouse
doctor: setup
	@.venv/bin/python -m course_utils doctor
# for instructors: each cell's slide type from the notebooks' headings (tools/slides.py), and the
# instructor guide's generated parts and answer key from the exercises (tools/workshop.py)
slides:
	@$(PYTHON) tasks.py slides
guide:
	@$(PYTHON) tasks.py guide
lint: setup
	@.venv/bin/python -m ruff check course_utils tests notebooks/scripts tasks.py tools benchmarks deploy
