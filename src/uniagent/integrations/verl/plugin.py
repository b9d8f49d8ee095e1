"""What verl's plugin hook loads in every verl process of a uniagent launch: uniagent's step metrics.

`uniagent train --engine verl`, `uniagent verl command|launch` put this module in
`VERL_USE_EXTERNAL_MODULES` (`launch.recipe_env`), so verl imports it from inside `import verl` in
the driver and every Ray worker, before its trainers import `compute_data_metrics`; it installs
`cpu/compat.py:log_uniagent_step_metrics`. The CPU plugin (`uniagent.integrations.verl.cpu`)
installs the same, so a command that names only that one gets the metrics too. Importing the `cpu`
package registers its platform, engines and rollout as well; none is selected unless asked for
(`VERL_PLATFORM=cpu`, `rollout.name=uniagent_local`), so a GPU run is unaffected.
"""

from __future__ import annotations

from uniagent.integrations.verl.cpu.compat import log_uniagent_step_metrics

log_uniagent_step_metrics()
