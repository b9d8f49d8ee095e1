"""The dashboard: a JSON API over run stores (opened read-only) and training runs (a local
trainer's output directory, `training.py`), and a plain HTML/JS front end.

`uniagent.dashboard.app.create_app(run_dirs)` builds the FastAPI app; `uniagent dashboard
RUN_DIR ...` serves it. This package's `__init__` imports nothing heavy: the CLI imports
`uniagent.dashboard.cli` on every start.
"""
