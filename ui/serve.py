"""Start the lab's server: `python -m ui.serve [streamlit run options]` (what `make run` does).

The same as `streamlit run app.py [options]`, with Streamlit's legacy `pages/`-folder mode
turned off before the first session (ui/navigation.py), so no page ever runs outside app.py's
navigation. Before the first session it also:

* starts the kernel-check worker processes (lab/scenarios/live_workers.py): as many as
  PAGED_LAB_LIVE_WORKERS says, by default one per CPU beyond the first (at least one), so
  sessions' interpreted kernels run side by side instead of taking turns in this process;
* gives torch one thread per operation, unless OMP_NUM_THREADS says otherwise: the lab's
  tensors are tiny, and with two threads each operation waits for a second core, which a
  busy server does not have (while the load benchmark was built, a fragmentation step cost
  2-5x the CPU with two); sessions and workers are the parallelism;
* imports pandas: plotly and Streamlit import it lazily, and a session that finds it half
  imported by another session's thread fails (plotly's `get_module` hands out the module
  from sys.modules before it is initialised).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas  # noqa: F401  (see above: imported once, before any session thread)
import torch
from streamlit.web import cli

from lab.scenarios.live_workers import WORKERS_ENV, live_checks
from ui.navigation import use_app_navigation

APP = Path(__file__).resolve().parents[1] / "app.py"


def main() -> None:
    use_app_navigation()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    os.environ.setdefault(WORKERS_ENV, str(max(1, (os.cpu_count() or 1) - 1)))
    live_checks()
    sys.argv = ["streamlit", "run", str(APP), *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
