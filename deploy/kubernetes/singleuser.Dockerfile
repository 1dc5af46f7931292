# The learners' image for Zero to JupyterHub (deploy/kubernetes/values.yaml), built from the repository's
# own pins: the course's requirements.txt in /opt/course/.venv, as `make setup` makes .venv, then the
# single-user server's packages added with that freeze as constraints (nothing the course pins changes).
# From the repository's root:
#
#   docker build -f deploy/kubernetes/singleuser.Dockerfile -t REGISTRY/pytorch-in-depth-singleuser:TAG .
#
# JUPYTERHUB_VERSION must match the major version of the hub (the z2jh chart 4.4.0 runs JupyterHub 5.5.0;
# the one-server room, deploy/hub/requirements.txt, runs 6.1.1).
FROM python:3.11-slim-bookworm

ARG JUPYTERHUB_VERSION=5.5.0
ARG NBGITPULLER_VERSION=1.3.0

RUN apt-get update && apt-get install -y --no-install-recommends git tini \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 --gid 100 --shell /bin/bash jovyan

COPY requirements.txt /opt/course/requirements.txt
# the course's pins; then the server's packages, refused if they would change one (the freezes compared);
# then matplotlib's font list, which start_server.py copies to each learner (no "building the font cache")
RUN python -m venv /opt/course/.venv \
    && /opt/course/.venv/bin/pip install --no-cache-dir --disable-pip-version-check -r /opt/course/requirements.txt \
    && /opt/course/.venv/bin/pip freeze --exclude-editable > /opt/course/constraints.txt \
    && /opt/course/.venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        --constraint /opt/course/constraints.txt \
        "jupyterhub==${JUPYTERHUB_VERSION}" "nbgitpuller==${NBGITPULLER_VERSION}" \
    && /opt/course/.venv/bin/pip freeze --exclude-editable > /opt/course/after.txt \
    && /opt/course/.venv/bin/python -c "import sys; a, b = (set(open(f)) for f in sys.argv[1:]); \
sys.exit('changed: %s' % sorted(a - b) if a - b else 0)" /opt/course/constraints.txt /opt/course/after.txt \
    && MPLCONFIGDIR=/opt/course/.venv/mplconfig /opt/course/.venv/bin/python -c "import matplotlib.font_manager"

# the start script (pulls the course into the learner's home, then starts JupyterLab)
COPY deploy/hub/start_server.py /opt/course/deploy/hub/start_server.py

ENV PATH=/opt/course/.venv/bin:$PATH \
    LANG=C.UTF-8
USER 1000
WORKDIR /home/jovyan
EXPOSE 8888
ENTRYPOINT ["tini", "--"]
CMD ["/opt/course/.venv/bin/python", "/opt/course/deploy/hub/start_server.py"]
