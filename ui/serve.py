"""Start the lab's server: `python -m ui.serve [streamlit run options]` (what `make run` does).

The same as `streamlit run app.py [options]`, with Streamlit's legacy `pages/`-folder mode
turned off before the first session (ui/navigation.py), so no page ever runs outside app.py's
navigation.
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.web import cli

from ui.navigation import use_app_navigation

APP = Path(__file__).resolve().parents[1] / "app.py"


def main() -> None:
    use_app_navigation()
    sys.argv = ["streamlit", "run", str(APP), *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
