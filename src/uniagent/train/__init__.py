"""Single-machine RL trainer: rollouts through `run_episode`, losses from verl's `core_algos`.

See `uniagent.train.local` for the design and `configs/train_local.yaml` for a runnable recipe.
"""
