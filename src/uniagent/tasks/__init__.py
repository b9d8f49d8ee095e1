"""Dataset rows -> episodes, and the verifiers that score them."""

from uniagent.tasks.base import Task
from uniagent.tasks.episode import run_episode
from uniagent.tasks.registry import SUITES, detect_family, load_tasks

__all__ = ["SUITES", "Task", "detect_family", "load_tasks", "run_episode"]
