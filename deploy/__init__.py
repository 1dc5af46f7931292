"""How the course is served beyond one laptop: a JupyterHub for a workshop room (hub/), and Kubernetes."""
