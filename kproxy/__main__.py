"""``python -m kproxy``: the same as the ``kproxy`` console script."""

from kproxy.cli import main

raise SystemExit(main())
