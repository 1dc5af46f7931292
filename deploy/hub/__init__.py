"""The workshop room: JupyterHub for the course on one server (`make hub`); see docs/instructor/hub.md."""
