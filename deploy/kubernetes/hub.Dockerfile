# The hub's image for Zero to JupyterHub (deploy/kubernetes/values.yaml): the chart's own hub image with
# the course's sign-in (deploy/hub/authenticator.py) and the instructor's live view
# (deploy/hub/progress_view.py, which reads the chapters' exercises from course_utils) added in
# /srv/course. Only the standard library and what the hub image has are needed. From the repository's root:
#
#   docker build -f deploy/kubernetes/hub.Dockerfile -t REGISTRY/pytorch-in-depth-hub:TAG .
FROM quay.io/jupyterhub/k8s-hub:4.4.0

USER root
COPY course_utils /srv/course/course_utils
COPY deploy/__init__.py /srv/course/deploy/__init__.py
COPY deploy/hub/__init__.py deploy/hub/room.py deploy/hub/authenticator.py deploy/hub/progress_view.py \
     /srv/course/deploy/hub/
RUN chmod -R a+rX /srv/course
USER ${NB_USER}
